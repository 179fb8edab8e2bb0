"""Loading a real-width layer: its weights in a `weights_file:` .npz against the same
weights in YAML. Run by hand:

    python benchmarks/weights_file.py          # the .npz only (seconds)
    python benchmarks/weights_file.py --yaml   # and the YAML (minutes, 2 GB)

The layer has torch's default TransformerEncoderLayer's shapes (d_model 512, 8 heads,
d_ff 2048, biases and norms: 3.2 million numbers), random weights, 10 tokens. It
prints the time to write each file, its size, and `trace-tf encode`'s wall time
(median of 3; the YAML once) with its peak memory, and checks that both give the
same steps.
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
    args = parser.parse_args()
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
