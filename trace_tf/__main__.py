"""`python -m trace_tf`, and the `trace-tf` script (pyproject's [project.scripts])."""

import sys


def main() -> None:
    """The command line, with Ctrl-C (exit 130, one line) caught from the first moment:
    loading the command line's own modules takes a tenth of a second, and a Ctrl-C then
    printed a traceback (cli.main guards everything after)."""
    try:
        from trace_tf.cli import main as run

        run()
    except KeyboardInterrupt:
        sys.stderr.write("trace-tf: interrupted\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
