from trace_tf.cli import main

main()
