"""trace-tf performance ratios (issue 6), measured in one run. Run by hand:

    python benchmarks/perf.py            # everything (a few minutes on 2 cores)
    python benchmarks/perf.py --quick    # fewer repeats, skips the large JSON run
    OPENBLAS_NUM_THREADS=1 python benchmarks/perf.py   # one BLAS thread: steadier on a busy machine

It prints the machine, then RATIOS, each measured here and now against a floor
measured in the same run (absolute times depend on the machine; ratios much
less), with the issue's target beside each:

  a. traced forward / the same engine untraced                  <= 1.3 (large config)
  b. untraced engine / a plain numpy forward of the same math    <= 1.1 (large config)
     (written inline below, checked to give the same outputs)
  c. `trace-tf encode` (whole process, packaged example)
     / `python -c "import numpy, typer, rich, yaml"`             <= 1.3
     (and, for comparison, / the library modules encode loads: LIBRARIES)
     and: `trace-tf --help` and `trace-tf examples` import no numpy
  d. `trace-tf encode` of the large config as (elided) tables
     / the same with `--format json`                             <= 2   (output sizes shown)
  e. peak memory of the large traced run / bytes of the recorded arrays  <= 1.5

a is measured for the two kinds of trace trace-tf makes: the whole record (every
step's array, what `--format json` and `npz` write) and the trace `encode` makes
for its tables ("tables": of each step, only the numbers its elided table shows,
render.View.part; the engine's arrays are freed as in an untraced run). Each twice.
As a command runs it: one forward pass per fresh process,
its memory new from the system (medians of interleaved processes, taken first,
before the in-process runs churn the machine's memory), beside a third kind of
process that only copies the trace's bytes into the tracer's blocks: the cost
of the memory alone, a floor for any tracer that keeps every step. The traced
and the copying processes each follow an untraced one (the same state of the
machine's memory), and each process's kernel time is printed beside its wall
time: what its fresh memory cost. And in one process:
in-process times (a, b) are the fastest of interleaved repeats, as on a shared
machine the fastest run is the one least disturbed by other processes (medians
printed too); there a traced run may reuse memory an earlier one freed.
Whole processes (c, d) are medians of interleaved runs, with bytecode caching
on (as an installed package has it) after a warm-up.
The load average is printed before and after: figures taken on a busy machine
are noise.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from trace_tf import model, runner
from trace_tf.cli import Common
from trace_tf.config import Config, Document, build
from trace_tf.cost import ShapeTracer
from trace_tf.loader import Lines
from trace_tf.render import View
from trace_tf.trace import _Blocks

# From the hello example's size up to the large model.
SIZES: dict[str, dict[str, int]] = {
    "small": dict(d_model=64, n_heads=4, layers=2, tokens=16, vocab=100),
    "medium": dict(d_model=256, n_heads=8, layers=4, tokens=64, vocab=500),
    "large": dict(d_model=512, n_heads=8, layers=6, tokens=128, vocab=1000),
}


def tables_view() -> View:
    """The view `trace-tf encode` elides its tables to, on a terminal of 120 columns
    (the COLUMNS the whole-process runs below are given)."""
    os.environ["COLUMNS"] = "120"
    try:
        return Common([], None, "table", None, False, 4, False, False, False, 0).view()
    finally:
        del os.environ["COLUMNS"]


def config_data(d_model: int, n_heads: int, layers: int, tokens: int, vocab: int) -> dict[str, Any]:
    """An encoder-decoder of the given size; every weight drawn from the seed."""
    words = [f"w{i}" for i in range(vocab)]
    rng = np.random.default_rng(0)
    src = [words[i] for i in rng.integers(2, vocab, tokens)]
    tgt = ["w0"] + [words[i] for i in rng.integers(2, vocab, tokens - 1)]
    return {
        "title": f"benchmark d_model {d_model}, {layers}+{layers} layers, {tokens} tokens",
        "model": {
            "d_model": d_model,
            "n_heads": n_heads,
            "encoder_layers": layers,
            "decoder_layers": layers,
            "init_std": round(1 / math.sqrt(d_model), 6),
        },
        "vocab": words,
        "tokens": {"bos": "w0", "eos": "w1"},
        "source": " ".join(src),
        "target": " ".join(tgt),
    }


def load(data: dict[str, Any]) -> Config:
    cfg = build(Document("benchmark", data, Lines()))
    assert isinstance(cfg, Config)
    return cfg


# ---------------------------------------------------------------------------
# b. The numpy floor: the same forward pass, written inline, nothing else
# ---------------------------------------------------------------------------


def numpy_forward(cfg: Config) -> np.ndarray:
    """Post-norm encoder-decoder, ReLU, sinusoidal positions (the benchmark configs)."""
    m = cfg.model
    eps, scale = m.norm_eps, m.scale

    def layer_norm(x: np.ndarray, nw: Any) -> np.ndarray:
        mean = np.mean(x, axis=-1, keepdims=True)
        var = np.mean((x - mean) ** 2, axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps) * nw.gamma + nw.beta

    def softmax(s: np.ndarray) -> np.ndarray:
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        return e / np.sum(e, axis=-1, keepdims=True)

    def mha(xq: np.ndarray, xkv: np.ndarray, aw: Any, mask: np.ndarray | None) -> np.ndarray:
        heads = []
        for hw in aw.heads:
            q, k, v = xq @ hw.W_q, xkv @ hw.W_k, xkv @ hw.W_v
            s = (q @ k.T) / scale
            if mask is not None:
                s = s + mask
            heads.append(softmax(s) @ v)
        return np.concatenate(heads, axis=-1) @ aw.W_o

    def ffn(x: np.ndarray, fw: Any) -> np.ndarray:
        return np.maximum(x @ fw.W_1, 0.0) @ fw.W_2

    def embed(tokens: tuple[str, ...]) -> np.ndarray:
        L, d = len(tokens), m.d_model
        angles = np.arange(L)[:, None] / np.power(m.pe_base, np.arange(0, d, 2) / d)
        pe = np.empty((L, d))
        pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles[:, : d // 2])
        return np.stack([cfg.embeddings[t] for t in tokens]) + pe

    assert cfg.source is not None and cfg.source.tokens is not None
    assert cfg.target is not None and cfg.target.tokens is not None
    x = embed(cfg.source.tokens)
    for lw in cfg.encoder:
        x = layer_norm(x + mha(x, x, lw.self_attn, None), lw.self_attn.norm)
        x = layer_norm(x + ffn(x, lw.ffn), lw.ffn.norm)
    enc = x
    y = embed(cfg.target.tokens)
    causal = np.triu(np.full((len(y), len(y)), -np.inf), k=1)
    for lw in cfg.decoder:
        assert lw.cross_attn is not None
        y = layer_norm(y + mha(y, y, lw.self_attn, causal), lw.self_attn.norm)
        y = layer_norm(y + mha(y, enc, lw.cross_attn, None), lw.cross_attn.norm)
        y = layer_norm(y + ffn(y, lw.ffn), lw.ffn.norm)
    assert cfg.output_W is not None
    return softmax(y @ cfg.output_W)


# ---------------------------------------------------------------------------
# Timing helpers
# ---------------------------------------------------------------------------


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    t = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - t
    del result
    return elapsed


def interleaved(
    fns: dict[str, Callable[[], object]], repeat: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Fastest and median time of each function, taking turns (drift hits all alike)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        timed(fn)
    for _ in range(repeat):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    best = {name: min(ts) for name, ts in times.items()}
    return best, {name: statistics.median(ts) for name, ts in times.items()}


def verdict(ratio: float, target: float) -> str:
    return "meets" if ratio <= target else "MISSES"


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = ""
    try:
        info: Any = np.show_config(mode="dicts")
        blas = info["Build Dependencies"]["blas"]["name"]
    except Exception:
        pass
    threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
        f"numpy {np.__version__}{' with ' + blas if blas else ''}"
        f" ({threads or 'default'} BLAS threads), {platform.system()}"
    )


def recorded_bytes(trace: Any) -> int:
    """Bytes of the recorded arrays, each array once (a step may be another's array)."""
    arrays = {(s.value.__array_interface__["data"][0], s.value.nbytes) for s in trace}
    return sum(nbytes for _, nbytes in arrays)


# ---------------------------------------------------------------------------
# a, b, e: in-process
# ---------------------------------------------------------------------------


def _ratio(x: float) -> str:
    """A ratio as printed; — where there is no floor to measure against (hello)."""
    return "—" if math.isnan(x) else f"{x:.2f}"


def engine_ratios(repeat: int) -> dict[str, tuple[float, float, float]]:
    from trace_tf.config import load as load_file

    hello = load_file(None)
    assert isinstance(hello, Config)
    configs: dict[str, Config] = {"hello": hello}
    configs.update({name: load(config_data(**size)) for name, size in SIZES.items()})
    tables = tables_view().part
    print("\na. traced / untraced engine, b. untraced engine / numpy floor (fastest runs);")
    print("   traced: the whole record (json, npz); tables: what encode's tables show")
    print(
        f"  {'config':8s} {'steps':>6s} {'recorded':>9s} {'untraced':>10s} {'traced':>10s} "
        f"{'a':>6s} {'tables':>10s} {'a':>6s} {'numpy':>10s} {'b':>6s}   (a, a, b of medians)"
    )
    out: dict[str, tuple[float, float, float]] = {}
    for name, cfg in configs.items():
        trace = runner.run(cfg, "full")
        untraced = model.run_full(cfg)
        np.testing.assert_array_equal(trace.value("probs"), untraced)
        fns: dict[str, Callable[[], object]] = {
            "untraced": partial(model.run_full, cfg),
            "traced": partial(runner.run, cfg, "full"),
            "tables": partial(runner.run, cfg, "full", part=tables),
        }
        if name != "hello":  # the floor is written for the benchmark configs' conventions
            np.testing.assert_allclose(numpy_forward(cfg), untraced, rtol=1e-9, atol=1e-12)
            fns["numpy"] = partial(numpy_forward, cfg)
        n = repeat if name in ("large", "medium") else max(repeat, 30)
        mb = recorded_bytes(trace) / 2**20
        steps = len(trace)
        del trace, untraced
        t, med = interleaved(fns, n)
        a = t["traced"] / t["untraced"]
        a_tables = t["tables"] / t["untraced"]
        b = t["untraced"] / t["numpy"] if "numpy" in t else float("nan")
        a_med = med["traced"] / med["untraced"]
        a_tables_med = med["tables"] / med["untraced"]
        b_med = med["untraced"] / med["numpy"] if "numpy" in med else float("nan")
        floor = f"{t['numpy'] * 1e3:8.1f}ms" if "numpy" in t else f"{'—':>10s}"
        print(
            f"  {name:8s} {steps:6d} {mb:7.1f}MB {t['untraced'] * 1e3:8.1f}ms "
            f"{t['traced'] * 1e3:8.1f}ms {a:6.2f} {t['tables'] * 1e3:8.1f}ms {a_tables:6.2f} "
            f"{floor} {_ratio(b):>6s}   ({a_med:.2f}, {a_tables_med:.2f}, {_ratio(b_med)})"
        )
        out[name] = (a, a_tables, b)
    a, a_tables, b = out["large"]
    # Where the tracer's time goes: a run that records every step but stores none
    # (names, labels, NaN checks) beside the full run (which also copies each step
    # into the tracer's blocks, whose memory is fresh).
    large = configs["large"]
    # And the floor of storing: one copy of as many bytes into one fresh array.
    source = np.ones(recorded_bytes(runner.run(large, "full")) // 8)
    t, _ = interleaved(
        {
            "untraced": lambda: model.run_full(large),
            "nothing stored": lambda: runner.run(large, "full", keep=lambda path: False),
            "traced": lambda: runner.run(large, "full"),
            "one copy": lambda: np.copyto(np.empty_like(source), source),
        },
        repeat,
    )
    bookkeeping = t["nothing stored"] - t["untraced"]
    storing = t["traced"] - t["nothing stored"]
    print(
        f"  the tracer's cost at the large config: recording (paths, labels, NaN checks) "
        f"{bookkeeping * 1e3:.1f} ms, storing (a copy into fresh memory) {storing * 1e3:.1f} ms, "
        f"over the untraced {t['untraced'] * 1e3:.1f} ms"
    )
    copy_floor = (t["untraced"] + t["one copy"]) / t["untraced"]
    print(
        f"  the same bytes copied at once into one fresh array: {t['one copy'] * 1e3:.1f} ms, "
        f"so no tracer that keeps a copy of every step can be under {copy_floor:.3f}x here"
    )
    print(f"  a at the large config: {a:.3f}x (target <= 1.3: {verdict(a, 1.3)})")
    print(
        f"  a at the large config, as encode's tables trace it: {a_tables:.3f}x "
        f"(target <= 1.3: {verdict(a_tables, 1.3)})"
    )
    print(f"  b at the large config: {b:.3f}x (target <= 1.1: {verdict(b, 1.1)})")
    return out


def one_run(kind: str) -> None:
    """(In a fresh process, from fresh_process_ratio.) Time one forward pass, as one
    `trace-tf` command makes: its memory comes new from the system, not reused.
    Prints the wall time and the kernel time (page faults: the memory's cost) in s."""
    cfg = load(config_data(**SIZES["large"]))
    part = tables_view().part
    if kind == "storing":  # the copies alone: each step's shape (on stdin), one source each
        shapes = [tuple(shape) for shape in json.load(sys.stdin)]
        sources = {shape: np.ones(shape) for shape in shapes}
        values = [sources[shape] for shape in shapes]
    gc.collect()
    sys_before = os.times().system
    t = time.perf_counter()
    if kind == "traced":
        runner.run(cfg, "full")
    elif kind == "tables":
        runner.run(cfg, "full", part=part)
    elif kind == "storing":
        blocks = _Blocks()
        for value in values:
            blocks.store(value)
    else:
        model.run_full(cfg)
    print(time.perf_counter() - t, os.times().system - sys_before)


def fresh_process_ratio(repeat: int) -> float:
    """a as a command sees it: one forward pass per fresh process, traced or not
    (loading the config not timed); medians of interleaved processes.

    Each round runs untraced, traced, untraced, storing, untraced, tables: the traced
    process, the storing floor and the tables' trace each follow an untraced one, so
    all find the machine's memory in the same state (a process that follows a traced
    one can reuse the memory that it just gave back, which on some VMs is much cheaper
    than memory left unused for a while). The kernel time of each process shows what
    its memory cost."""
    tracer = ShapeTracer()  # the shape of every step, for "storing"
    model.run_full(load(config_data(**SIZES["large"])), tracer)
    shapes = json.dumps([shape for _, shape, _, _ in tracer.shapes])
    times: dict[str, list[float]] = {"untraced": [], "traced": [], "storing": [], "tables": []}
    kernel: dict[str, list[float]] = {kind: [] for kind in times}
    for _ in range(repeat):
        for kind in ("untraced", "traced", "untraced", "storing", "untraced", "tables"):
            out = subprocess.run(
                [sys.executable, __file__, "--one-run", kind],
                input=shapes,
                capture_output=True,
                text=True,
                env=_env(),
                check=True,
            )
            wall, system = (float(x) for x in out.stdout.split())
            times[kind].append(wall)
            kernel[kind].append(system)
    med = {kind: statistics.median(ts) for kind, ts in times.items()}
    ratio = med["traced"] / med["untraced"]
    tables = med["tables"] / med["untraced"]
    floor = (med["untraced"] + med["storing"]) / med["untraced"]
    print("\na. traced / untraced, as a command runs it: one run per fresh process, large config")
    print(f"  medians of {repeat}: untraced {med['untraced'] * 1e3:.1f} ms, traced ", end="")
    print(f"{med['traced'] * 1e3:.1f} ms: {ratio:.3f}x (target <= 1.3: {verdict(ratio, 1.3)})")
    print(
        f"  as encode's tables trace it (only the numbers they show): {med['tables'] * 1e3:.1f}"
        f" ms: {tables:.3f}x (target <= 1.3: {verdict(tables, 1.3)})"
    )
    print(
        "  the memory floor: the trace's bytes copied into the tracer's blocks, in a fresh "
        f"process, nothing else: {med['storing'] * 1e3:.1f} ms, so no tracer that keeps "
        f"every step can be under {floor:.3f}x here"
    )
    print("  each process, wall / kernel time in ms (the kernel's: page faults, zeroing):")
    for kind in times:
        each = ", ".join(
            f"{w * 1e3:.0f}/{k * 1e3:.0f}" for w, k in zip(times[kind], kernel[kind], strict=True)
        )
        print(f"    {kind:9s} {each}")
    return ratio


def memory_ratio() -> float:
    cfg = load(config_data(**SIZES["large"]))
    gc.collect()
    tracemalloc.start()
    trace = runner.run(cfg, "full")
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    total = recorded_bytes(trace)
    ratio = peak / total
    print("\ne. peak memory of the large traced run (tracemalloc) / bytes of the recorded arrays")
    print(
        f"  recorded {total / 2**20:.1f} MiB in {len(trace)} steps, peak {peak / 2**20:.1f} MiB, "
        f"held after the run {current / 2**20:.1f} MiB: {ratio:.3f}x "
        f"(target <= 1.5: {verdict(ratio, 1.5)})"
    )
    return ratio


# ---------------------------------------------------------------------------
# c, d: whole processes
# ---------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode
    env["COLUMNS"] = "120"
    return env


def trace_tf_cmd() -> list[str]:
    script = Path(sys.executable).with_name("trace-tf")
    return [str(script)] if script.exists() else [sys.executable, "-m", "trace_tf"]


def run_process(cmd: list[str]) -> tuple[float, int]:
    """Wall time and bytes on stdout of one process (which must succeed)."""
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, env=_env(), check=False)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.decode()[-2000:]}")
    return elapsed, len(proc.stdout)


def process_medians(cmds: dict[str, list[str]], repeat: int) -> dict[str, tuple[float, int]]:
    times: dict[str, list[float]] = {name: [] for name in cmds}
    sizes: dict[str, int] = {}
    for cmd in cmds.values():  # warm-up: writes the bytecode caches
        run_process(cmd)
    for _ in range(repeat):
        for name, cmd in cmds.items():
            elapsed, sizes[name] = run_process(cmd)
            times[name].append(elapsed)
    return {name: (statistics.median(ts), sizes[name]) for name, ts in times.items()}


NO_NUMPY = (
    "import sys\n"
    "from typer.testing import CliRunner\n"
    "from trace_tf.cli import app\n"
    "r = CliRunner().invoke(app, [{arg!r}])\n"
    "assert r.exit_code == 0, r.output\n"
    "print('numpy' in sys.modules)\n"
)


# The library modules `trace-tf encode` needs beyond the floor: `import rich`
# loads almost none of rich (its console and tables are submodules), and `import
# numpy` does not load numpy.random, which draws the weights a file does not give.
LIBRARIES = "import numpy, numpy.random, typer, yaml, rich.console, rich.table, rich.panel"


def startup_ratio(repeat: int) -> float:
    tt = trace_tf_cmd()
    t = process_medians(
        {
            "floor": [sys.executable, "-c", "import numpy, typer, rich, yaml"],
            "libraries": [sys.executable, "-c", LIBRARIES],
            "encode": [*tt, "encode"],
            "help": [*tt, "--help"],
            "examples": [*tt, "examples"],
        },
        repeat,
    )
    ratio = t["encode"][0] / t["floor"][0]
    print("\nc. whole process: `trace-tf encode` (packaged example) / the import floor")
    print(f"  python -c 'import numpy, typer, rich, yaml': {t['floor'][0] * 1e3:7.1f} ms")
    print(f"  python -c '{LIBRARIES}':")
    print(f"  {'':45s}{t['libraries'][0] * 1e3:7.1f} ms")
    print(f"  trace-tf encode:                             {t['encode'][0] * 1e3:7.1f} ms")
    print(f"  trace-tf --help:                             {t['help'][0] * 1e3:7.1f} ms")
    print(f"  trace-tf examples:                           {t['examples'][0] * 1e3:7.1f} ms")
    print(f"  ratio {ratio:.2f}x (target <= 1.3: {verdict(ratio, 1.3)})")
    fair = t["encode"][0] / t["libraries"][0]
    print(f"  against the library modules encode loads: {fair:.2f}x")
    for arg in ("--help", "examples"):
        out = subprocess.run(
            [sys.executable, "-c", NO_NUMPY.format(arg=arg)],
            capture_output=True,
            text=True,
            env=_env(),
            check=True,
        ).stdout.strip()
        print(f"  `trace-tf {arg}` imports numpy: {out}")
    return ratio


def output_ratio(repeat: int, tmp: Path) -> float:
    path = tmp / "large.yaml"
    path.write_text(yaml.safe_dump(config_data(**SIZES["large"])), encoding="utf-8")
    tt = trace_tf_cmd()
    t = process_medians(
        {
            "table": [*tt, "encode", str(path)],
            "json": [*tt, "encode", str(path), "--format", "json"],
        },
        repeat,
    )
    ratio = t["table"][0] / t["json"][0]
    print("\nd. `trace-tf encode` of the large config: elided tables / --format json")
    for name in ("table", "json"):
        print(f"  {name:5s}: {t[name][0]:6.2f} s, {t[name][1] / 2**20:8.2f} MiB of output")
    print(f"  ratio {ratio:.2f}x (target <= 2: {verdict(ratio, 2.0)})")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats; skip d")
    parser.add_argument("--repeat", type=int, default=0, help="repeats per measurement")
    parser.add_argument(
        "--one-run", choices=("traced", "untraced", "storing", "tables"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.one_run:
        one_run(args.one_run)
        return
    repeat = args.repeat or (3 if args.quick else 7)
    print("trace-tf performance ratios")
    print("machine:", machine())
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    fresh_process_ratio(max(repeat, 5))  # first: before the runs below churn the memory
    engine_ratios(repeat)
    memory_ratio()
    startup_ratio(max(repeat, 5))
    if not args.quick:
        with tempfile.TemporaryDirectory() as tmp:
            output_ratio(3, Path(tmp))
    print("\nload average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
