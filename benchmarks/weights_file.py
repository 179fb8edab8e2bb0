"""Loading a real-width layer: its weights in a `weights_file:` .npz against the same
weights in YAML. Run by hand:

    python benchmarks/weights_file.py          # the .npz only (seconds)
    python benchmarks/weights_file.py --yaml   # and the YAML (minutes, 2 GB)
    python benchmarks/weights_file.py --gpt2   # GPT-2 small's shapes (a minute, 3 GB)

The layer has torch's default TransformerEncoderLayer's shapes (d_model 512, 8 heads,
d_ff 2048, biases and norms: 3.2 million numbers), random weights, 10 tokens. It
prints the time to write each file, its size, and `trace-tf encode`'s wall time
(median of 3; the YAML once) with its peak memory, and checks that both give the
same steps.

With --gpt2 it writes GPT-2 small's arrays instead (12 layers, d_model 768, 12 heads,
d_ff 3072, 1024 learned positions, a tied output, 50,257 tokens: one `embeddings.<token>`
array each, as README's "From Hugging Face GPT-2" recipe writes them; 124 M numbers,
random) and prints `trace-tf step --stage logits` of a 5-token prompt against reading
the same .npz with `numpy.load` (every array), both in fresh processes.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

D, H, FF, L = 512, 8, 2048, 10


def arrays() -> dict[str, np.ndarray]:
    """The layer's arrays under their key paths below `weights`."""
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    block = "encoder.0.self_attn"
    for k in ("W_q", "W_k", "W_v", "W_o"):
        out[f"{block}.{k}"] = rng.standard_normal((D, D)) / np.sqrt(D)
    for k in ("b_q", "b_k", "b_v", "b_o"):
        out[f"{block}.{k}"] = 0.1 * rng.standard_normal(D)
    out["encoder.0.ffn.W_1"] = rng.standard_normal((D, FF)) / np.sqrt(D)
    out["encoder.0.ffn.b_1"] = 0.1 * rng.standard_normal(FF)
    out["encoder.0.ffn.W_2"] = rng.standard_normal((FF, D)) / np.sqrt(FF)
    out["encoder.0.ffn.b_2"] = 0.1 * rng.standard_normal(D)
    for norm in (f"{block}.norm", "encoder.0.ffn.norm"):
        out[f"{norm}.gamma"] = 1 + 0.1 * rng.standard_normal(D)
        out[f"{norm}.beta"] = 0.1 * rng.standard_normal(D)
    return out


def gpt2_arrays() -> dict[str, np.ndarray]:
    """GPT-2 small's arrays under their trace-tf key paths (README's recipe's names)."""
    rng = np.random.default_rng(0)
    d, ff = 768, 3072
    out = {f"embeddings.t{i}": 0.02 * rng.standard_normal(d) for i in range(GPT2_VOCAB)}
    out["positional"] = 0.01 * rng.standard_normal((1024, d))
    for l in range(12):
        block = f"decoder.{l}"
        for k in ("W_q", "W_k", "W_v", "W_o"):
            out[f"{block}.self_attn.{k}"] = rng.standard_normal((d, d)) / np.sqrt(d)
        for k in ("b_q", "b_k", "b_v", "b_o"):
            out[f"{block}.self_attn.{k}"] = 0.1 * rng.standard_normal(d)
        out[f"{block}.ffn.W_1"] = rng.standard_normal((d, ff)) / np.sqrt(d)
        out[f"{block}.ffn.b_1"] = 0.1 * rng.standard_normal(ff)
        out[f"{block}.ffn.W_2"] = rng.standard_normal((ff, d)) / np.sqrt(ff)
        out[f"{block}.ffn.b_2"] = 0.1 * rng.standard_normal(d)
        for norm in (f"{block}.self_attn.norm", f"{block}.ffn.norm", "decoder_final_norm"):
            out[f"{norm}.gamma"] = 1 + 0.1 * rng.standard_normal(d)
            out[f"{norm}.beta"] = 0.1 * rng.standard_normal(d)
    return out


GPT2_VOCAB = 50257
GPT2_MODEL = {
    "d_model": 768,
    "n_heads": 12,
    "d_ff": 3072,
    "encoder_layers": 0,
    "decoder_layers": 12,
    "positional": "learned",
    "max_len": 1024,
    "norm_position": "pre",
    "activation": "gelu_tanh",
    "tie_embeddings": True,
}


def timed(cmd: list[str]) -> float:
    """Wall seconds of a fresh process running `cmd` (which must succeed)."""
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True)
    if proc.returncode:
        raise SystemExit(proc.stderr.decode())
    return time.perf_counter() - t


def gpt2() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        np.savez(d / "gpt2.npz", **gpt2_arrays())  # type: ignore[arg-type]
        config = {
            "model": GPT2_MODEL,
            "vocab": [f"t{i}" for i in range(GPT2_VOCAB)],
            "target": ["t464", "t2068", "t7586", "t21831", "t18045"],
            "weights_file": "gpt2.npz",
        }
        (d / "gpt2.yaml").write_text(yaml.safe_dump(config))
        script = Path(sys.executable).with_name("trace-tf")
        cmd = [str(script)] if script.exists() else [sys.executable, "-m", "trace_tf"]
        step = [*cmd, "step", str(d / "gpt2.yaml"), "--stage", "logits", "--format", "json"]
        read = [sys.executable, "-c", "import numpy, sys; z = numpy.load(sys.argv[1]); "
                "[z[k] for k in z.files]", str(d / "gpt2.npz")]  # fmt: skip
        ours = statistics.median(timed(step) for _ in range(3))
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        numpy_load = statistics.median(timed(read) for _ in range(3))
        size = (d / "gpt2.npz").stat().st_size / 1e6
        print(f"gpt2: {size:.0f} MB npz; trace-tf step --stage logits {ours:.2f} s, ", end="")
        print(f"peak {peak:.0f} MB; numpy.load of every array {numpy_load:.2f} s: ", end="")
        print(f"{ours / numpy_load:.2f}x (medians of 3)")


def nested(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    """The same arrays as YAML's `weights` mapping (lists of numbers)."""
    layer: dict[str, Any] = {}
    for name, value in flat.items():
        *parts, last = name.split(".")[2:]  # below encoder.0
        node = layer
        for part in parts:
            node = node.setdefault(part, {})
        node[last] = value.tolist()
    return {"encoder": [layer]}


def encode(config: Path) -> tuple[float, float, list[Any]]:
    """Wall seconds, peak MB and the steps of `trace-tf encode` (the peak is the largest
    child's so far: the npz runs come first, the YAML's is larger)."""
    script = Path(sys.executable).with_name("trace-tf")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "trace_tf"]
    t = time.perf_counter()
    proc = subprocess.run([*cmd, "encode", str(config), "--format", "json"], capture_output=True)
    elapsed = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(proc.stderr.decode())
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return elapsed, peak, json.loads(proc.stdout)["steps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--yaml", action="store_true", help="also write and load the YAML")
    parser.add_argument("--gpt2", action="store_true", help="GPT-2 small's shapes instead")
    args = parser.parse_args()
    if args.gpt2:
        return gpt2()
    flat = arrays()
    base = {
        "model": {"d_model": D, "n_heads": H, "d_ff": FF, "positional": "none"},
        "source": np.random.default_rng(1).standard_normal((L, D)).tolist(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        t = time.perf_counter()
        np.savez(d / "layer.npz", **flat)  # type: ignore[arg-type]
        written = time.perf_counter() - t
        (d / "npz.yaml").write_text(yaml.safe_dump({**base, "weights_file": "layer.npz"}))
        size = (d / "layer.npz").stat().st_size / 1e6
        runs = [encode(d / "npz.yaml") for _ in range(3)]
        wall = statistics.median(r[0] for r in runs)
        print(f"npz:  write {written:.2f} s, {size:.0f} MB; trace-tf encode {wall:.2f} s, ", end="")
        print(f"peak {runs[0][1]:.0f} MB (median of 3)")
        if args.yaml:
            t = time.perf_counter()
            with open(d / "all.yaml", "w") as f:
                yaml.safe_dump({**base, "weights": nested(flat)}, f)
            written = time.perf_counter() - t
            size = (d / "all.yaml").stat().st_size / 1e6
            wall, peak, steps = encode(d / "all.yaml")
            print(
                f"yaml: write {written:.2f} s, {size:.0f} MB; trace-tf encode {wall:.2f} s, ",
                end="",
            )
            print(f"peak {peak:.0f} MB; the same steps: {steps == runs[0][2]}")


if __name__ == "__main__":
    main()
