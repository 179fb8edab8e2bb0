"""Benchmark of `generate`: the KV cache against recomputing the whole prefix.

A model with d_model 256, 8 heads, 4 encoder and 4 decoder layers, a vocabulary of
1000 tokens and a 16-token source, every weight drawn (seed 0, N(0, 1/256)).
Greedy decoding of 256 tokens; the output bias of EOS is -1e9, so EOS is never
produced and every run makes exactly 256 tokens.

Prints the time per token with the cache and without (and their ratio), the cached
per-token time over the first 16 and the last 16 tokens (it should stay nearly
flat: each cached iteration computes one new row and reads L cached keys), and the
cached time per token when tracing (the CLI's tracer without --trace, which records
nothing but checks every value for NaN, and a tracer that records every step).

    python benchmarks/generate.py [--tokens 256] [--repeat 1]

Not a test: timings depend on the machine. The figures in README.md come from it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from trace_tf import generate
from trace_tf.config import Config, Document, build
from trace_tf.loader import Lines
from trace_tf.trace import CheckingTracer, NullTracer, Tracer

D_MODEL, HEADS, LAYERS, VOCAB, SOURCE = 256, 8, 4, 1000, 16


def benchmark_config() -> Config:
    vocab = ["BOS", "EOS", *(f"w{i}" for i in range(VOCAB - 2))]
    bias = [0.0] * VOCAB
    bias[1] = -1e9  # EOS is never the most probable: exactly --max-tokens tokens
    data: dict[str, Any] = {
        "title": "generate benchmark",
        "model": {
            "d_model": D_MODEL,
            "n_heads": HEADS,
            "encoder_layers": LAYERS,
            "decoder_layers": LAYERS,
            "init_std": 1 / 16,
        },
        "vocab": vocab,
        "tokens": {"bos": "BOS", "eos": "EOS"},
        "source": [f"w{i}" for i in range(SOURCE)],
        "weights": {"output": {"b": bias}},
    }
    cfg = build(Document("benchmark", data, Lines()))
    assert isinstance(cfg, Config)
    return cfg


def clocked(base: type[Tracer]) -> type[Tracer]:
    """`base` that also times each iteration (scope t<i>) of the decoding loop."""

    class Clocked(base):  # type: ignore[valid-type,misc]
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            self.times: list[float] = []

        @contextmanager
        def scope(
            self, name: str | int | None, rows: Any = None, keys: Any = None
        ) -> Iterator[None]:
            start = time.perf_counter()
            with super().scope(name, rows, keys):
                yield
            if isinstance(name, str) and name[:1] == "t" and name[1:].isdigit():
                self.times.append(time.perf_counter() - start)

    return Clocked


def timed(cfg: Config, tokens: int, cache: bool, tracer: Any) -> tuple[float, list[float]]:
    s = generate.settings(greedy=True, max_tokens=tokens, cache=cache)
    start = time.perf_counter()
    result = generate.run(cfg, s, tracer)
    total = time.perf_counter() - start
    assert len(result.generated) == tokens and "EOS" not in result.generated
    return total, tracer.times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=1, help="take the best of this many runs")
    args = parser.parse_args()
    n = args.tokens
    cfg = benchmark_config()
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"{os.cpu_count()} cores ({platform.machine()}), {platform.system()}"
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    print(f"load average {load}; OPENBLAS_NUM_THREADS={threads}")
    print(
        f"model: d_model {D_MODEL}, {HEADS} heads, {LAYERS} + {LAYERS} layers, "
        f"vocab {VOCAB}, source {SOURCE} tokens; greedy, {n} tokens"
    )

    def best(cache: bool, make: Any) -> tuple[float, list[float]]:
        runs = [timed(cfg, n, cache, make()) for _ in range(args.repeat)]
        return min(runs, key=lambda r: r[0])

    cached_total, cached = best(True, clocked(NullTracer))
    full_total, full = best(False, clocked(NullTracer))
    per_cached, per_full = sum(cached) / n, sum(full) / n
    print(f"with the KV cache:   {1e3 * per_cached:8.3f} ms/token ({cached_total:.2f} s in all)")
    print(f"without (--no-cache): {1e3 * per_full:7.3f} ms/token ({full_total:.2f} s in all)")
    print(f"ratio without / with: {per_full / per_cached:.1f}x")
    k = min(16, n // 2)
    first, last = statistics.mean(cached[:k]), statistics.mean(cached[-k:])
    print(
        f"cached per-token time, first {k}: {1e3 * first:.3f} ms, last {k}: {1e3 * last:.3f} ms "
        f"(last / first {last / first:.2f})"
    )
    _, quiet = best(True, clocked(CheckingTracer))
    print(f"cached, CLI tracer (records nothing, NaN checks): {1e3 * sum(quiet) / n:.3f} ms/token")
    _, traced = best(True, clocked(Tracer))
    print(f"cached, --trace (records every step): {1e3 * sum(traced) / n:.3f} ms/token")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
