"""What each stage costs: multiply-adds per step, and how they grow with L or D.

Lecture 000, section 5.4: the projections cost O(L D^2) and attention O(L^2 D),
so attention dominates once the sequence is longer than the model is wide. The
ledger is read off the engine itself: a tracer that keeps only shapes runs the
model, and every matrix product's multiply-adds are rows x inner x columns of the
step it makes. Nothing about the model's structure is written twice here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trace_tf import model
from trace_tf.config import Config, Document, build, overridden
from trace_tf.errors import InputError
from trace_tf.trace import Labels, Tracer

# Stages made by a matrix product: their kind and multiply-adds in symbols, in the
# order rows · inner · columns of the product.
MATMULS: dict[str, tuple[str, str]] = {
    "q": ("projection", "L_q·d_model·d_k"),
    "q_raw": ("projection", "L_q·d_model·d_k"),
    "k": ("projection", "L_k·d_model·d_k"),
    "k_raw": ("projection", "L_k·d_model·d_k"),
    "v": ("projection", "L_k·d_model·d_v"),
    "wo": ("projection", "L·(H·d_v)·d_model"),
    "scores": ("attention", "L_q·d_k·L_k"),
    "context": ("attention", "L_q·L_k·d_v"),
    "hidden": ("ffn", "L·d_model·d_ff"),
    "out": ("ffn", "L·d_ff·d_model"),
    "logits": ("output", "L·d_model·V"),
}
KINDS = ("projection", "attention", "ffn", "output")
GROWTH = {
    "projection": "O(L·D²)",
    "attention": "O(L²·D)",
    "ffn": "O(L·D·d_ff)",
    "output": "O(L·D·V)",
}
VARY = {"L": "sequence length (source and target)", "D": "d_model"}


@dataclass(frozen=True)
class Cost:
    """One step of the ledger."""

    path: str
    stage: str
    kind: str  # projection | attention | ffn | output | elementwise
    shape: tuple[int, ...]
    formula: str  # the multiply-adds in symbols ("—" for elementwise steps)
    terms: tuple[int, ...]  # the same in numbers: rows, inner, columns
    macs: int


@dataclass
class ShapeTracer(Tracer):
    """Keeps each step's path, shape and the shapes of its inputs; no values."""

    shapes: list[tuple[str, tuple[int, ...], tuple[tuple[int, ...], ...]]] = field(
        default_factory=list
    )

    def rec(
        self,
        name: str,
        value: np.ndarray,
        formula: str,
        *inputs: Any,
        cols: Labels | str = None,
        rows: Labels | str = None,
    ) -> np.ndarray:
        self.shapes.append((self.path(name), value.shape, tuple(np.shape(x) for x in inputs)))
        return value


def ledger(cfg: Config) -> list[Cost]:
    """Every step the model computes, in order, with its multiply-adds."""
    tr = ShapeTracer()
    model.run_full(cfg, tr)
    out = []
    for path, shape, inputs in tr.shapes:
        stage = path.rsplit(".", 1)[-1]
        # A product has two operands; RoPE's rotated q and k are made from one (q_raw,
        # k_raw): an elementwise rotation of each column pair, no product.
        if stage in MATMULS and len(shape) == 2 and len(inputs) >= 2:
            kind, formula = MATMULS[stage]
            terms = (shape[0], inputs[0][-1], shape[1])  # rows · inner · columns
            out.append(Cost(path, stage, kind, shape, formula, terms, math.prod(terms)))
        else:
            out.append(Cost(path, stage, "elementwise", shape, "—", (), 0))
    return out


@dataclass(frozen=True)
class Totals:
    by_stage: dict[str, int]
    by_kind: dict[str, int]
    total: int


def totals(costs: Sequence[Cost]) -> Totals:
    by_stage: dict[str, int] = {}
    by_kind = dict.fromkeys(KINDS, 0)
    for c in costs:
        if c.macs:
            by_stage[c.stage] = by_stage.get(c.stage, 0) + c.macs
            by_kind[c.kind] += c.macs
    return Totals(by_stage, by_kind, sum(by_kind.values()))


def measure(cfg: Config, repeat: int) -> float:
    """Seconds of the untraced forward pass: the fastest of `repeat` runs."""
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        model.run_full(cfg)
        best = min(best, time.perf_counter() - start)
    return best


# ---------------------------------------------------------------------------
# --vary L=8,16,32 | D=64,128
# ---------------------------------------------------------------------------


def parse_vary(text: str) -> tuple[str, list[int]]:
    """`L=8,16,32` -> ("L", [8, 16, 32])."""
    name, sep, values = text.partition("=")
    name = name.strip().upper()
    expected = "L=N,N,... (sequence length) or D=N,N,... (d_model), whole numbers >= 1"
    if not sep or name not in VARY:
        raise InputError("malformed --vary", expected=expected, found=repr(text))
    try:
        numbers = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise InputError("malformed --vary", expected=expected, found=repr(text)) from None
    if not numbers or min(numbers) < 1:
        raise InputError("malformed --vary", expected=expected, found=repr(text))
    return name, numbers


def _cycled(items: Sequence[Any], n: int) -> list[Any]:
    return [items[i % len(items)] for i in range(n)]


def resized(
    doc: Document,
    base: Config,
    name: str,
    value: int,
    sets: Sequence[tuple[str, Any]],
    variant: str | None,
    max_elements: int,
    dtype: str | None,
) -> Config:
    """The config with L tokens (the given ones repeated) or with d_model D.

    D: every width follows from d_model by the defaults (d_k = d_v = D / n_heads,
    d_ff = 4 D) and every weight and embedding is drawn, as the file's have the old width.
    """
    d = overridden(doc, sets, variant)
    if name == "L":
        for key, seq in (("source", base.source), ("target", base.target)):
            if key == "target" and base.model.decoder_layers:
                seq = model.target_of(base)
            if seq is None:
                continue
            rows: Sequence[Any] = (
                seq.tokens if seq.tokens is not None else np.asarray(seq.matrix).tolist()
            )
            d.data[key] = _cycled(rows, value)
    else:
        if any(s is not None and s.matrix is not None for s in (base.source, base.target)):
            raise InputError(
                "--vary D needs token sequences; this file gives a numeric matrix",
                file=doc.file,
                path="source"
                if base.source is not None and base.source.matrix is not None
                else "target",
                expected="tokens (a numeric matrix has the old width)",
            )
        m = d.data["model"]
        m["d_model"] = value
        for key in ("d_k", "d_v", "d_ff"):
            m.pop(key, None)
        for key in ("embeddings", "weights"):
            d.data.pop(key, None)
    cfg = build(d, (), None, max_elements, dtype)
    assert isinstance(cfg, Config)
    return cfg


@dataclass(frozen=True)
class VaryRow:
    value: int
    by_kind: dict[str, int]
    total: int
    predicted: float  # seconds, from the multiply-adds, normalised to the last row's measurement
    measured: float  # seconds, untraced engine, fastest of `repeat`


def vary(
    doc: Document,
    base: Config,
    name: str,
    values: Sequence[int],
    sets: Sequence[tuple[str, Any]] = (),
    variant: str | None = None,
    max_elements: int = 2**28,
    dtype: str | None = None,
    repeat: int = 3,
) -> list[VaryRow]:
    """One row per value: multiply-adds per kind, predicted beside measured time."""
    rows = []
    for value in values:
        cfg = resized(doc, base, name, value, sets, variant, max_elements, dtype)
        t = totals(ledger(cfg))
        rows.append((value, t, measure(cfg, repeat)))
    _, ref_totals, ref_time = max(rows, key=lambda r: r[1].total)  # the longest, least noisy
    per_mac = ref_time / ref_totals.total if ref_totals.total else 0.0
    return [VaryRow(v, t.by_kind, t.total, t.total * per_mac, s) for v, t, s in rows]


def exponents(rows: Sequence[VaryRow]) -> dict[str, float]:
    """How each kind grows: log(last / first) / log(value ratio), e.g. 2.0 for O(L²)."""
    first, last = rows[0], rows[-1]
    if len(rows) < 2 or first.value == last.value:
        return {}
    span = math.log(last.value / first.value)
    return {
        kind: math.log(last.by_kind[kind] / first.by_kind[kind]) / span
        for kind in KINDS
        if first.by_kind[kind] and last.by_kind[kind]
    }
