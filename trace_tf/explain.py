"""One entry of one step, written out with the user's own numbers, as the documents do
by hand: `scores[0,1] = q0 · k1 = 8×6.84 + 3×9.99 + 3×6.84 = 105.21`.

Each explainer reads the step's recorded inputs (`Step.inputs` names them: earlier
steps, or weights by their key path) and the conventions of the config (scale,
temperature, eps, base), writes the arithmetic out, and computes the entry again
from exactly the numbers it wrote, in plain Python floats. It is run once with every
number in full, which gives the value compared with the recorded one, and then with
the numbers as `--precision` writes them, one more decimal at a time until they give
the result as written (`explain`). Pure functions: text and renderables, no printing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np
from rich.console import Group, RenderableType
from rich.text import Text

from trace_tf import ops
from trace_tf.calc import NORM_AXES
from trace_tf.config import (
    QK_KEYS,
    TIED_OUTPUT,
    Config,
    OpConfig,
    Sequence_,
    Source,
    decoder_layer_of,
    head_part,
)
from trace_tf.errors import InputError, quoted, suggest_path
from trace_tf.model import RESIDUAL_ADDS, alibi_slope_text, alibi_slopes, decoder_types, target_of
from trace_tf.runner import named_arrays
from trace_tf.stages import Stage, stage_of
from trace_tf.text import exact, printable, whole_number
from trace_tf.trace import Step, Trace

MAX_TERMS = 6  # longer sums show their first 3 and last 2 terms around "…"
ONE_LINE = 90  # an explanation this short is printed on one line


# ---------------------------------------------------------------------------
# What an explanation is
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Explanation:
    """An entry of a step written out: symbols, then numbers, then the result."""

    path: str
    cell: tuple[int, ...]
    stage: str  # the registry key (stages.STAGES)
    formula: str  # the step's formula
    value: float  # the recorded value at the cell
    result: float  # the same entry recomputed here, from its numbers in full
    chain: tuple[str, ...]  # "q0 · k1", "8×6.84 + …": the right-hand sides, in order
    where: tuple[str, ...]  # what each symbol is, with its numbers
    operands: dict[str, list[float]]  # the numbers substituted, by symbol (full precision)
    inputs: tuple[str, ...]
    remarks: tuple[str, ...] = ()  # what the arithmetic depends on, beyond the numbers
    rtol: float = 1e-9  # how near value and result must be: the step's dtype's rounding
    # where each weight named came from (Config.sources)
    sources: dict[str, Source] = field(default_factory=dict)

    @property
    def lhs(self) -> str:
        return f"{self.path}[{','.join(str(i) for i in self.cell)}]"

    @property
    def agrees(self) -> bool:
        return _same(self.value, self.result, self.rtol)

    def lines(self) -> list[str]:
        """`lhs = a = b = c` on one line when it is short, else one `= …` per line."""
        one = " = ".join([self.lhs, *self.chain])
        if len(one) <= ONE_LINE:
            return [one]
        return [f"{self.lhs} = {self.chain[0]}", *(f"  = {c}" for c in self.chain[1:])]

    def json(self) -> dict[str, Any]:
        from trace_tf.render import json_value

        return {
            "step": self.path,
            "cell": list(self.cell),
            "stage": self.stage,
            "formula": self.formula,
            "value": json_value(self.value),
            "result": json_value(self.result),
            "agrees": self.agrees,
            "lines": self.lines(),
            "where": list(self.where),
            "operands": {k: json_value(v) for k, v in self.operands.items()},
            "inputs": list(self.inputs),
            "remarks": list(self.remarks),
            "sources": {k: v.json() for k, v in self.sources.items()},
        }


def _same(a: float, b: float, rtol: float = 1e-9) -> bool:
    """Equal to rounding (1e-9 relative, or `rtol`); NaN only with NaN, an infinity only
    with itself."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= rtol * max(1.0, abs(a))


def _rtol(dtype: Any) -> float:
    """The tolerance for a recorded value of this dtype against the arithmetic redone in
    float64: 1e-9, or 16 units of the last place of a coarser float (float32: 1.9e-6)."""
    return max(1e-9, 16 * float(np.finfo(dtype).eps))


@dataclass
class _Parts:
    """What an explainer returns: the right-hand sides up to the result (which `explain`
    writes), the result computed from the numbers written, and the symbols."""

    chain: list[str]
    result: float
    where: list[str] = field(default_factory=list)
    operands: dict[str, list[float]] = field(default_factory=dict)
    # A sum of products that overflows float64 has no one value: the result, added one
    # product at a time as written, and `fused`, with fused multiply-adds (as BLAS does),
    # adding the products first to last, and last to first (BLAS kernels do either).
    fused: tuple[float, float] | None = None
    note: str = ""  # said after the result: why a mask entry is 0 or −inf
    # The steps and weights the entry was computed from, when not the step's own inputs
    # (a KV-cached row: those of the iteration that computed it).
    inputs: tuple[str, ...] | None = None


# ---------------------------------------------------------------------------
# Numbers as the documents write them
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fmt:
    """How numbers are written: with `precision` decimals, or (None) in full."""

    precision: int | None

    def num(self, x: float) -> str:
        """A number with at most `precision` decimals, trailing zeros dropped (6.84, 8);
        one that would show as 0, or a large one, in scientific notation (1.235e-07).
        Precision None: the shortest text that reads back as the same float64."""
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "-inf" if x < 0 else "inf"
        if self.precision is None:
            text = repr(float(x)).removesuffix(".0")
        else:
            text = f"{x:.{self.precision}f}"
            if x != 0 and (abs(x) <= self.tiny or abs(float(text)) >= 1e8):
                return f"{x:.{max(self.precision - 1, 1)}e}"
            if "." in text:
                text = text.rstrip("0").rstrip(".")
        return "0" if text == "-0" else text

    @property
    def tiny(self) -> float:
        """Up to this magnitude a number is written in scientific notation (5e-5 for 4
        decimals): it would round to 0. Read back from the text, so that a number
        rounded as written is written the same way again."""
        return float(f"5e-{(self.precision or 0) + 1}")

    def shown(self, x: float) -> float:
        """x as written: the number a reader computes with."""
        if self.precision is None or not math.isfinite(x):
            return x
        return float(self.num(x))

    def shown_array(self, a: np.ndarray) -> np.ndarray:
        """Every entry as written (`shown`), in bulk: np.round (whose numbers read back
        from their own text at this precision), and `shown` for the scientific ones."""
        if self.precision is None:
            return a
        x = np.asarray(a, dtype=np.float64)
        with np.errstate(all="ignore"):
            out = np.array(np.round(x, self.precision))  # (np.round of a 0-d array: a scalar)
            sci = np.isfinite(x) & (x != 0) & ((np.abs(x) <= self.tiny) | (np.abs(out) >= 1e8))
        for index in np.argwhere(sci):
            out[tuple(index)] = self.shown(float(x[tuple(index)]))
        return out

    def fac(self, x: float) -> str:
        """A number inside a product or after an operator: negatives in parentheses."""
        text = self.num(x)
        return f"({text})" if text.startswith("-") else text

    def vec(self, v: Sequence[float] | np.ndarray) -> str:
        items = [self.num(float(x)) for x in v]
        if len(items) > MAX_TERMS:
            items = [*items[:3], "…", *items[-2:]]
        return "[" + ", ".join(items) + "]"


def _elide(terms: list[str], joiner: str = " + ") -> str:
    if len(terms) <= MAX_TERMS:
        return joiner.join(terms)
    return joiner.join([*terms[:3], "…", *terms[-2:]]) + f"  ({len(terms)} terms)"


def _sum(f: _Fmt, values: Sequence[float]) -> str:
    """a + b + (−c) …, elided when long."""
    return _elide([f.num(float(v)) if k == 0 else f.fac(float(v)) for k, v in enumerate(values)])


# ---------------------------------------------------------------------------
# Arithmetic as the engine's numpy does it (IEEE 754), where Python's math refuses
# ---------------------------------------------------------------------------


def _div(a: float, b: float) -> float:
    """a / b; by zero as IEEE 754 divides: ±inf, and NaN for 0 / 0 (Python raises)."""
    if b != 0 or math.isnan(b):
        return a / b
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _sqrt(x: float) -> float:
    """√x; NaN for a negative x, as numpy.sqrt gives (math.sqrt raises)."""
    return math.nan if x < 0 else math.sqrt(x)


def _fsum(values: Iterable[float]) -> float:
    """The sum, correctly rounded (math.fsum). Where fsum refuses, term by term in the
    written order as numpy adds: inf − inf is NaN, and a sum beyond float64 is ±inf."""
    terms = list(values)
    try:
        return math.fsum(terms)
    except (OverflowError, ValueError):  # "intermediate overflow", "-inf + inf"
        total = 0.0
        for t in terms:
            total += t
        return total


def _exp(x: float) -> float:
    """e^x; inf beyond float64, as numpy.exp gives (math.exp raises)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _pow(x: float, y: float) -> float:
    """x^y for x > 0 or a whole y; ±inf beyond float64, as numpy.power gives (** raises)."""
    try:
        return float(x**y)
    except OverflowError:
        return -math.inf if x < 0 and y % 2 == 1 else math.inf


def _cos(x: float) -> float:
    """cos x; NaN for x = ±inf, as numpy.cos gives (math.cos raises)."""
    return math.nan if math.isinf(x) else math.cos(x)


def _sin(x: float) -> float:
    """sin x; NaN for x = ±inf, as numpy.sin gives (math.sin raises)."""
    return math.nan if math.isinf(x) else math.sin(x)


def _max(values: Sequence[float]) -> float:
    """The largest value, NaN when any is NaN, as numpy.max (Python's max depends on
    where the NaN stands)."""
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def _fma(x: float, y: float, acc: float) -> float:
    """x × y + acc rounded once (a fused multiply-add): a product beyond float64 is
    still exact when it is added."""
    if not (math.isfinite(x) and math.isfinite(y)):
        return x * y + acc
    if not math.isfinite(acc):
        return acc  # ±inf or NaN plus a finite product
    exact = Fraction(x) * Fraction(y) + Fraction(acc)
    try:
        return float(exact)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


def _fused_sum(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Σ x × y by fused multiply-adds, in the order given."""
    total = 0.0
    for x, y in zip(xs, ys, strict=True):
        total = _fma(x, y, total)
    return total


def _dot(f: _Fmt, a: np.ndarray, b: np.ndarray) -> tuple[str, float, tuple[float, float] | None]:
    """a · b written out term by term; its value from those terms; and, when finite
    numbers overflow on the way, its value with fused multiply-adds (see _Parts.fused)."""
    xs, ys = [float(x) for x in a], [float(y) for y in b]
    terms = [f"{f.fac(x)}×{f.fac(y)}" for x, y in zip(xs, ys, strict=True)]
    total = _fsum(x * y for x, y in zip(xs, ys, strict=True))
    fused = None
    if not math.isfinite(total) and all(map(math.isfinite, [*xs, *ys])):
        fused = (_fused_sum(xs, ys), _fused_sum(xs[::-1], ys[::-1]))
    return _elide(terms), total, fused


def _overflow_remark(f: _Fmt, written: float, fused: tuple[float, float]) -> str:
    forward, backward = fused
    orders = (
        f.num(forward)
        if _same(forward, backward)
        else f"{f.num(forward)} adding them first to last, {f.num(backward)} last to first"
    )
    return (
        "the products overflow float64 (beyond ±1.8e308), so the sum depends on how it is "
        f"done: added one product at a time, as written, {f.num(written)}; with fused "
        "multiply-adds (each product added exactly, as BLAS matrix products do on most "
        f"machines), {orders}"
    )


def _idx(cell: Sequence[int]) -> str:
    return "[" + ",".join(str(i) for i in cell) + "]"


# ---------------------------------------------------------------------------
# The context an explainer reads
# ---------------------------------------------------------------------------


@dataclass
class _Ctx:
    cfg: Config | OpConfig
    trace: Trace
    arrays: dict[str, np.ndarray]
    f: _Fmt  # how the numbers are written; an explainer computes with them as written
    named: dict[str, Source] = field(default_factory=dict)  # the sources `source` said
    _shown: dict[str, np.ndarray] = field(default_factory=dict)

    def get(self, name: str) -> np.ndarray:
        """An input step or weight, its numbers as written (`_Fmt.shown`)."""
        if name not in self._shown:
            if name in self.trace:
                value = self.trace.value(name)
            elif name in self.arrays:
                value = self.arrays[name]
            else:
                raise InputError(f"cannot explain: the input {name!r} of this step is not known")
            self._shown[name] = self.f.shown_array(value)
        return self._shown[name]

    def source(self, name: str) -> str:
        """` (where the weight came from)`, said briefly (Config.sources), and kept for
        the JSON; '' for a step or a calculator's given array."""
        src = self.cfg.sources.get(name) if isinstance(self.cfg, Config) else None
        if src is None:
            return ""
        self.named[name] = src
        return f" ({src.text})"

    def param(self, key: str) -> Any:
        assert isinstance(self.cfg, OpConfig)
        return self.cfg.params[key]

    def row_of(self, name: str, i: int, labels: Sequence[str] | None = None) -> str:
        """`row i ('token') of name`, with the token when it is known, and where the row
        was computed when a KV cache kept it from an earlier iteration."""
        if labels is None:
            step = self.trace.steps.get(name)
            labels = step.rows if step is not None else None
        label = f" ({quoted(labels[i])})" if labels is not None else ""
        at = _computed_at(self.trace, name, i)
        cached = ""
        if at is not None:
            kept = "computed" if _same_iteration(at, name) else "cached: computed"
            cached = f" ({kept} at {at}, row {i})"
        return f"row {i}{label} of {name}{cached}"

    def cached_rows(self, name: str) -> str:
        """`; rows 0..1 cached: …` for a KV-cached K or V, naming where each kept row was
        computed; then `; row 2 its K/V head's, computed at …` for the rows this
        iteration computed in another query head (grouped-query attention); "" when
        every row was computed in `name` itself."""
        scopes = self.trace.computed_in.get(name, ())
        at = {r: _computed_at(self.trace, name, r) for r in range(len(scopes))}
        elsewhere = {r: a for r, a in at.items() if a is not None}
        kept = [r for r, a in elsewhere.items() if not _same_iteration(a, name)]
        now = [r for r, a in elsewhere.items() if _same_iteration(a, name)]
        text = ""
        if kept:
            where = [f"row {r} at {elsewhere[r]}" for r in kept]
            text = f"; rows {kept[0]}..{kept[-1]} cached: " + _elide(where, ", ")
        if now:  # all computed in one step: the group's first query head, this iteration
            rows = f"row {now[0]}" if len(now) == 1 else f"rows {now[0]}..{now[-1]}"
            text += f"; {rows} its K/V head's, computed at {elsewhere[now[0]]}"
        return text


def _computed_at(trace: Trace, name: str, r: int) -> str | None:
    """The step in which row r of a KV-cached K or V step `name` was computed (the same
    stage in an earlier iteration's scope), or None: computed in `name` itself, or not a
    cached step (Trace.computed_in)."""
    scopes = trace.computed_in.get(name)
    if scopes is None:
        return None
    at = scopes[r] + name.rsplit(".", 1)[-1]
    return None if at == name else at


def _same_iteration(at: str, name: str) -> bool:
    """Whether the row `_computed_at` names was computed in the iteration of `name`, not
    kept from an earlier one: a shared K/V head's new row, computed in the first query
    head of its group (grouped-query attention)."""
    iteration = at.split(".", 1)[0]  # t<i>, in generate
    return _ITERATION.match(at) is not None and name.split(".", 1)[0] == iteration


_ITERATION = re.compile(r"t\d+\.(?:b\d+\.)?")  # generate's iteration i (live beam j)
_STACK = re.compile(rf"^(?:{_ITERATION.pattern})?(encoder|decoder)\.")


def _first_position(ctx: _Ctx, path: str) -> int:
    """The position of row 0 of a step: with a KV cache, the new rows of a decoder
    iteration sit after the cached ones, at start.. where start is the number of keys its
    causal mask (`<prefix>decoder.mask`, 1 row per new token) has beyond its rows; else 0."""
    m = _STACK.match(path)
    if m is None or m.group(1) != "decoder":
        return 0
    mask = ctx.trace.steps.get(m.group(0) + "mask")
    return 0 if mask is None else mask.shape[1] - mask.shape[0]


def _symbol(name: str) -> str:
    """A short symbol for an input: x for what a layer reads, else its last part."""
    last = name.rsplit(".", 1)[-1]
    if last in ("input", "norm", "embed_norm", "final_norm", "output", "residual", "x"):
        return "x"
    if name == TIED_OUTPUT:
        return "Eᵀ"
    return {"Q": "q", "K": "k", "V": "v"}.get(last, last)


def _bias_of(ctx: _Ctx, weight: str) -> tuple[str, np.ndarray] | None:
    """The bias that goes with a weight, by the SPEC's naming (W_q -> b_q, W -> b)."""
    if weight == TIED_OUTPUT:
        name = "weights.output.b"
    elif weight.endswith(".ffn.router"):  # a mixture of experts' router: router_bias
        name = f"{weight}_bias"
    else:
        head, _, last = weight.rpartition(".")
        if not last.startswith("W"):
            return None
        name = f"{head}.{'b' + last[1:]}" if head else "b" + last[1:]
    return (name, ctx.get(name)) if name in ctx.arrays else None


# ---------------------------------------------------------------------------
# Explainers, one per kind of step (keys of stages.STAGES)
# ---------------------------------------------------------------------------

Explainer = Callable[[_Ctx, Step, tuple[int, ...]], _Parts]


def _given_as(ctx: _Ctx, name: str, j: int) -> tuple[str, int, str]:
    """Where entry (or column) j of a weight is in the file, with a note that says where
    it came from: a per-head `weights.<block>.heads.<h>.W_q` given fused is head h's
    columns of `weights.<block>.W_q` (SPEC §2), so its column j is column h·d_k + j
    there (a `kv_heads.<h>.W_k`, K/V head h's, likewise); the tied output weight's
    column j is the embedding of the j-th vocabulary token."""
    if name == TIED_OUTPUT and isinstance(ctx.cfg, Config):
        token = ctx.cfg.vocab[j]
        ctx.source(name)  # (named in the JSON: the tie)
        return name, j, f", the embedding of {quoted(token)}{ctx.source(f'embeddings.{token}')}"
    fused = _fused_source(ctx, name)
    if fused is not None:
        source, h = fused
        width = ctx.get(name).shape[-1]
        first = h * width
        given = _part_source(ctx, name, source)
        part = head_part(name)
        head = "K/V head" if part is not None and part[0] == "kv_heads" else "head"
        return source, first + j, f" ({head} {h}'s {first}..{first + width - 1}; {given})"
    return name, j, ctx.source(name)


def _part_source(ctx: _Ctx, name: str, fused: str) -> str:
    """Where the fused weight a per-head `name` was cut from came from, with only the
    entries set inside this head's part of it (Config.sources); the fused weight is
    named in the JSON."""
    ctx.source(fused)
    part = ctx.cfg.sources[name] if isinstance(ctx.cfg, Config) else None
    assert part is not None and part.fused_text is not None
    return part.fused_text


def _fused_source(ctx: _Ctx, name: str) -> tuple[str, int] | None:
    """The fused weight a per-head `weights.<block>.heads.<h>.<key>` was cut from,
    `weights.<block>.<key>`, and h, when the file gave it fused (head h's columns of a
    W_q/W_k/W_v, SPEC §2, or its entries of a b_q/b_k/b_v; row h of a rel_bias); else None."""
    src = ctx.cfg.sources.get(name) if isinstance(ctx.cfg, Config) else None
    if src is None or src.fused is None:
        return None
    part = head_part(name)
    assert part is not None
    return src.fused, int(part[2])


def _linear(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """y[i,j] = x_i · W[:,j] + b[j]."""
    i, j = cell
    x_name, w_name = step.inputs[0], step.inputs[1]
    x, W = ctx.get(x_name), ctx.get(w_name)
    i = _new_row(step, i, x, x_name)  # a KV-cached K or V: x holds its last (new) rows only
    xs, ws = _symbol(x_name), _symbol(w_name)
    text, total, fused = _dot(ctx.f, x[i], W[:, j])
    chain = [f"{xs}{i} · {ws}[:,{j}]"]
    w_key, w_col, w_note = _given_as(ctx, w_name, j)
    where = [
        f"{xs}{i} = {ctx.row_of(x_name, i)} = {ctx.f.vec(x[i])}",
        f"{ws}[:,{j}] = column {w_col} of {w_key}{w_note} = {ctx.f.vec(W[:, j])}",
    ]
    operands = {f"{xs}{i}": x[i].tolist(), f"{ws}[:,{j}]": W[:, j].tolist()}
    bias = _bias_of(ctx, w_name)
    if bias is not None:
        b_name, b = bias
        bs = b_name.rsplit(".", 1)[-1]
        chain[0] += f" + {bs}[{j}]"
        text += f" + {ctx.f.fac(float(b[j]))}"
        total = total + float(b[j])
        fused = None if fused is None else (fused[0] + float(b[j]), fused[1] + float(b[j]))
        b_key, b_at, b_note = _given_as(ctx, b_name, j)
        where.append(
            f"{bs} = {b_name}{b_note}"
            if b_key == b_name
            else f"{bs}[{j}] = entry {b_at} of {b_key}{b_note}"
        )
        operands[f"{bs}[{j}]"] = [float(b[j])]
    return _Parts([*chain, text], total, where, operands, fused)


def _new_row(step: Step, i: int, x: np.ndarray, x_name: str) -> int:
    """Row i of a step computed from `x` is row i − (the step's rows − x's rows) of x: a
    KV-cached K or V computes only its last rows (the rest were kept, see `_kept`)."""
    row = i - (step.shape[0] - x.shape[0])
    if row < 0:
        raise InputError(
            f"cannot explain row {i} of {step.path}: it was not computed from {x_name}, and "
            "where it was computed is not known"
        )
    return row


def _projection(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """q, k: a projection, (rope) the rotation of q_raw / k_raw (q_norm / k_norm with
    QK-norm), or (QK-norm without RoPE) the norm of q_raw / k_raw, read with its γ; with
    qk_norm projection, the head's columns of the block's q_norm / k_norm, perhaps turned."""
    assert isinstance(ctx.cfg, Config)
    if len(step.inputs) == 1:
        layer = decoder_layer_of(step.path)
        m = ctx.cfg.model  # (a decoder layer of a null base has no RoPE)
        rotary = m.layer_turns(layer) if layer is not None else m.positional == "rope"
        rotary = rotary and ".cross_attn." not in f".{step.path}"
        if not rotary:  # (only qk_norm projection records a q or k of one input, unturned)
            return _columns(ctx, step, cell)
        return _rope(ctx, step, cell)
    if step.inputs[1].endswith(".gamma"):
        return _norm(ctx, step, cell)
    return _linear(ctx, step, cell)


def _columns_from(ctx: _Ctx, step: Step, x: np.ndarray) -> int:
    """The first of the columns of `x` a head's q or k was taken from: with qk_norm projection
    x is the block's q_norm / k_norm, every head's side by side (k: K/V head j's, j the query
    head's); else 0, x being the head's own."""
    assert isinstance(ctx.cfg, Config)
    width = step.shape[1]
    if x.shape[1] == width:
        return 0
    found = re.search(r"\.h(\d+)\.", step.path)
    assert found is not None, f"{step.path} is no head's step"
    h = int(found.group(1))
    return (h if step.stage == "q" else ctx.cfg.model.kv_head(h)) * width


def _columns(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """q, k with qk_norm projection and no RoPE: the head's columns of the block's q_norm /
    k_norm, as they are."""
    x_name = step.inputs[0]
    x = ctx.get(x_name)
    i = _new_row(step, cell[0], x, x_name)  # a KV-cached K: its new rows only
    off = _columns_from(ctx, step, x)
    j = off + cell[1]
    v, sym = float(x[i, j]), _symbol(x_name)
    return _Parts(
        [f"{sym}[{i},{j}]"],
        v,
        [
            f"{sym} = {x_name}, over the whole projection (qk_norm projection): this head's "
            f"columns are {off}..{off + step.shape[1] - 1}"
        ],
        {f"{sym}[{i},{j}]": [v]},
    )


def _raw(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """q_raw, k_raw: a head's projection; with qk_norm projection the block's, every head's
    X W side by side, whose column c is head c // d_k's column c mod d_k."""
    weights = [name for name in step.inputs[1:] if ctx.get(name).ndim == 2]
    if len(weights) < 2:
        return _linear(ctx, step, cell)
    i, c = cell
    h, j = divmod(c, ctx.get(weights[0]).shape[1])
    parts = _linear(ctx, replace(step, inputs=(step.inputs[0], weights[h])), (i, j))
    head = "head" if step.stage == "q_raw" else "K/V head"
    parts.where.insert(
        0, f"column {c} is {head} {h}'s column {j} (qk_norm projection: every head's side by side)"
    )
    return parts


def _kept(explainer: Explainer) -> Explainer:
    """K or V of a KV-cached iteration: a new row as `explainer` explains it; a row kept
    in the cache, explained in the step of the iteration that computed it."""

    def explain_row(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
        at = _computed_at(ctx.trace, step.path, cell[0])
        if at is None:
            return explainer(ctx, step, cell)
        if at not in ctx.trace:
            raise InputError(f"cannot explain: the step {at} that computed this row is not known")
        parts = explainer(ctx, ctx.trace[at], cell)
        parts.inputs = ctx.trace[at].inputs if parts.inputs is None else parts.inputs
        parts.chain.insert(0, f"{at}{_idx(cell)}")
        if _same_iteration(at, step.path):  # a shared K/V head's: computed once, just now
            parts.where.insert(0, f"row {cell[0]} is its K/V head's, computed at {at}")
        else:
            parts.where.insert(0, f"row {cell[0]} is cached: computed at {at} and kept since")
        return parts

    return explain_row


def _rope(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """RoPE: pair p of row pos, columns (a, b) (adjacent (2p, 2p+1), halves (p, p + d/2)),
    turned by θ = pos · base^(−2p/d), or pos · the scaled frequency with model.rope_scaling
    (cos and sin times yarn's attention factor); d is rope_dims r when given (partial
    rotary), whose columns r.. pass through; with a RoPE by layer, the step's layer's."""
    assert isinstance(ctx.cfg, Config)
    raw_name = step.inputs[0]
    raw = ctx.get(raw_name)
    off = _columns_from(ctx, step, raw)  # qk_norm projection: the head's columns of the block's
    raw = raw[:, off : off + step.shape[1]]
    i = _new_row(step, cell[0], raw, raw_name)  # a cached K: raw holds its new rows only
    j = cell[1]
    pos = _first_position(ctx, raw_name) + i  # (row i of raw; new rows sit after the cache)
    m, layer = ctx.cfg.model, decoder_layer_of(step.path)
    if m.mixed_rope and layer is not None:  # a RoPE by layer: this layer's base and scaling
        m = m.layer_rope(layer)
    d, dk = m.rotary_dims, raw.shape[1]  # the columns turned, as a RoPE of width d
    r = _symbol(raw_name)
    raw_text = raw_name if not off else f"{raw_name}[:, {off}..{off + dk - 1}] (this head's)"
    if j >= d or (j == d - 1 and d % 2):  # partial rotary's rest, or the odd last column
        v = float(raw[i, j])
        why = (
            f"rope_dims {d}: columns {d}..{dk - 1} are not rotated"
            if j >= d
            else "odd d_k: the last column is not rotated"
        )
        return _Parts([f"{r}[{i},{j}]  ({why})"], v, [f"{r} = {raw_text}"], {f"{r}[{i},{j}]": [v]})
    first, second = ops.rope_pairs(d, m.rope_pairs)
    p = int(np.flatnonzero((first == j) | (second == j))[0])
    ca, cb = int(first[p]), int(second[p])
    pair = f"(position {pos}, pair {p}: columns {ca}, {cb}, {m.rope_pairs})"
    scaling, factor = m.rope_scaling, 1.0
    if scaling is None:
        theta = ctx.f.shown(pos * _pow(m.pe_base, -2 * p / d))  # (written, like cos θ and sin θ)
        angle = (
            f"θ = pos · base^(−2p/{'r' if m.rope_dims else 'd_k'}) = "
            f"{pos} · {exact(m.pe_base)}^(−{2 * p}/{d}) = "
            f"{ctx.f.num(theta)} rad {pair}"
        )
    else:
        frequency = float(ops.rope_frequencies(d, m.pe_base, scaling)[p])
        theta = ctx.f.shown(pos * ctx.f.shown(frequency))
        angle = (
            f"θ = pos · θ_p = {pos} · {ctx.f.num(frequency)} = {ctx.f.num(theta)} rad {pair}; "
            f"θ_p = {exact(m.pe_base)}^(−{2 * p}/{d}) = {ctx.f.num(_pow(m.pe_base, -2 * p / d))} "
            f"then scaled, {_scaled_frequency(ctx, scaling, m.pe_base, p, d)}"
        )
        factor = scaling.attention_factor
    a, b = float(raw[i, ca]), float(raw[i, cb])
    c, s = ctx.f.shown(_cos(theta) * factor), ctx.f.shown(_sin(theta) * factor)
    cos, sin = ("cos θ", "sin θ") if factor == 1 else ("s·cos θ", "s·sin θ")
    lhs = f"{r}[{i},{ca}]", f"{r}[{i},{cb}]"
    if j == ca:
        sym = f"{lhs[0]} {cos} − {lhs[1]} {sin}"
        nums = f"{ctx.f.fac(a)}×{ctx.f.fac(c)} − {ctx.f.fac(b)}×{ctx.f.fac(s)}"
        total = a * c - b * s
    else:
        sym = f"{lhs[0]} {sin} + {lhs[1]} {cos}"
        nums = f"{ctx.f.fac(a)}×{ctx.f.fac(s)} + {ctx.f.fac(b)}×{ctx.f.fac(c)}"
        total = a * s + b * c
    where = [angle, f"{r} = {raw_text}"]
    if m.mixed_rope and layer is not None:
        scaled = f", model.rope_scaling.{layer}: {scaling.type}" if scaling is not None else ""
        where.insert(1, f"base {exact(m.pe_base)}: layer {layer}'s (model.pe_base.{layer}){scaled}")
    if factor != 1:
        where.insert(1, f"s = {exact(factor)}, yarn's attention factor on cos and sin")
    return _Parts([sym, nums], total, where, {lhs[0]: [a], lhs[1]: [b], "θ": [theta]})


def _scaled_frequency(ctx: _Ctx, sc: ops.RopeScaling, base: float, p: int, d: int) -> str:
    """How the RoPE scaling `sc` turned pair p's frequency base^(−2p/d) into the one used."""
    f = exact(sc.factor)
    if sc.type == "linear":
        return f"÷ factor {f} (linear)"
    if sc.type == "llama3":
        wavelengths, ks = ops.llama3_smoothing(ops.rope_frequencies(d, base)[p : p + 1], sc)
        wavelength, k = float(wavelengths[0]), float(ks[0])  # (the engine's band, as it is)
        L, low, high = sc.original_max_len, sc.low_freq_factor, sc.high_freq_factor
        said = f"llama3: wavelength 2π/θ_p = {ctx.f.num(wavelength)}"
        if wavelength < L / high:
            return f"{said} < {exact(L / high)} (original_max_len / high_freq_factor): kept"
        if wavelength > L / low:
            return f"{said} > {exact(L / low)} (original_max_len / low_freq_factor): ÷ {f}"
        return (
            f"{said}, between {exact(L / high)} and {exact(L / low)}: (1 − k) θ_p / {f} + k θ_p, "
            f"k = ({L}/{ctx.f.num(wavelength)} − {exact(low)}) / ({exact(high)} − {exact(low)}) "
            f"= {ctx.f.num(k)}"
        )
    low_pair, high_pair = ops.yarn_band(d, base, sc)
    ramp = min(max((p - low_pair) / (high_pair - low_pair), 0.0), 1.0)
    return (
        f"yarn: θ_p ÷ {f} · r + θ_p · (1 − r), r = clip(({p} − {exact(low_pair)}) / "
        f"({exact(high_pair)} − {exact(low_pair)}), 0, 1) = {ctx.f.num(ramp)}"
    )


def _score_function(ctx: _Ctx) -> str:
    if isinstance(ctx.cfg, Config):
        return ctx.cfg.model.score
    return str(ctx.param("score"))


def _scores(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    i, j = cell
    score = _score_function(ctx)
    f = ctx.f
    if score == "additive":
        tanh_name, v_name = step.inputs
        v_a = ctx.get(v_name)
        qa_name, ka_name = ctx.trace[tanh_name].inputs
        qa, ka = ctx.get(qa_name)[i], ctx.get(ka_name)[j]
        sym_terms = [
            f"{f.fac(float(v))}×tanh({f.num(float(a))} + {f.fac(float(b))})"
            for v, a, b in zip(v_a, qa, ka, strict=True)
        ]
        tanhs = [f.shown(math.tanh(float(a) + float(b))) for a, b in zip(qa, ka, strict=True)]
        val_terms = [f"{f.fac(float(v))}×{f.fac(t)}" for v, t in zip(v_a, tanhs, strict=True)]
        total = _fsum(float(v) * t for v, t in zip(v_a, tanhs, strict=True))
        return _Parts(
            [
                f"v_a · tanh(q_a{i} + k_a{j})",
                _elide(sym_terms),
                _elide(val_terms),
            ],
            total,
            [
                f"v_a = {v_name}{ctx.source(v_name)} = {f.vec(v_a)}",
                f"q_a{i} = {ctx.row_of(qa_name, i, step.rows)} = {f.vec(qa)}",
                f"k_a{j} = {ctx.row_of(ka_name, j, step.cols)} = {f.vec(ka)}",
            ],
            {"v_a": v_a.tolist(), f"q_a{i}": qa.tolist(), f"k_a{j}": ka.tolist()},
        )
    if score == "gaussian":
        q_name, k_name, w_name = step.inputs
        q, k = ctx.get(q_name)[i], ctx.get(k_name)[j]
        w = np.broadcast_to(ctx.get(w_name), q.shape)
        terms = [
            f"(({f.num(float(a))} − {f.fac(float(b))})×{f.fac(float(c))})²"
            for a, b, c in zip(q, k, w, strict=True)
        ]
        diffs = [(float(a) - float(b)) * float(c) for a, b, c in zip(q, k, w, strict=True)]
        squares = [d * d for d in diffs]  # d·d as the engine squares (** raises on overflow)
        chain = [
            f"−½ Σ_f ((q{i}f − k{j}f) w_f)²",
            f"−½ × ({_elide(terms)})",
        ]
        if len(squares) > 1:  # the squares are written too
            squares = [f.shown(sq) for sq in squares]
            chain.append(f"−½ × ({_sum(f, squares)})")
        total = -0.5 * _fsum(squares)
        return _Parts(
            chain,
            total,
            [
                f"q{i} = {ctx.row_of(q_name, i, step.rows)} = {f.vec(q)}",
                f"k{j} = {ctx.row_of(k_name, j, step.cols)} = {f.vec(k)}",
                f"w = {w_name}{ctx.source(w_name)} = {f.vec(np.atleast_1d(ctx.get(w_name)))}",
            ],
            {f"q{i}": q.tolist(), f"k{j}": k.tolist(), "w": w.tolist()},
        )
    q_name, k_name = step.inputs
    q, k = ctx.get(q_name)[i], ctx.get(k_name)[j]
    qs = "(q W_b)" if score == "bilinear" else _symbol(q_name)
    ks = _symbol(k_name)
    text, total, fused = _dot(f, q, k)
    return _Parts(
        [f"{qs}{i} · {ks}{j}", text],
        total,
        [
            f"{qs}{i} = {ctx.row_of(q_name, i, step.rows)} = {f.vec(q)}",
            f"{ks}{j} = {ctx.row_of(k_name, j, step.cols)} = {f.vec(k)}",
        ],
        {f"{qs}{i}": q.tolist(), f"{ks}{j}": k.tolist()},
        fused,
    )


def _tanh(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    i, j, a = cell
    qa_name, ka_name = step.inputs
    x, y = float(ctx.get(qa_name)[i, a]), float(ctx.get(ka_name)[j, a])
    total = math.tanh(x + y)
    return _Parts(
        [
            f"tanh(q_a[{i},{a}] + k_a[{j},{a}])",
            f"tanh({ctx.f.num(x)} + {ctx.f.fac(y)})",
        ],
        total,
        [f"q_a = {qa_name}", f"k_a = {ka_name}"],
        {f"q_a[{i},{a}]": [x], f"k_a[{j},{a}]": [y]},
    )


def _scale_of(ctx: _Ctx) -> tuple[float, str]:
    if isinstance(ctx.cfg, Config):
        return ctx.cfg.model.scale, ctx.cfg.model.scale_text
    return float(ctx.param("scale")), str(ctx.param("scale_text"))


def _scaled(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    scale, text = _scale_of(ctx)
    scale = ctx.f.shown(scale)
    s = float(ctx.get(step.inputs[0])[cell])
    total = s / scale
    return _Parts(
        [
            f"scores{_idx(cell)} / scale",
            f"{ctx.f.num(s)} / {ctx.f.num(scale)}",
        ],
        total,
        [f"scores = {step.inputs[0]}", f"scale = {text}"],
        {"scores": [s], "scale": [scale]},
    )


def _capped(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """c · tanh(s / c): the soft cap of a scaled score (capped) or of a logit (logits, of
    logits_raw), c the model's attn_softcap or logit_softcap (attend's softcap)."""
    f, src = ctx.f, step.inputs[0]
    if not isinstance(ctx.cfg, Config):
        c, key = float(ctx.param("softcap")), "attention.softcap"
    elif step.stage == "logits":
        c, key = float(ctx.cfg.model.logit_softcap or 0), "model.logit_softcap"
    else:
        c, key = float(ctx.cfg.model.attn_softcap or 0), "model.attn_softcap"
    s, c = f.shown(float(ctx.get(src)[cell])), f.shown(c)
    sym = _symbol(src)
    t = math.tanh(s / c)
    return _Parts(
        [
            f"c · tanh({sym}{_idx(cell)} / c)",
            f"{f.num(c)} · tanh({f.num(s)} / {f.num(c)})",
            f"{f.num(c)} · tanh({f.num(s / c)})",
            f"{f.num(c)} · {f.fac(t)}",
        ],
        c * t,
        [f"{sym} = {src}", f"c = {exact(c)} ({key}): the soft cap, bounding to (−c, c)"],
        {sym: [s], "c": [c]},
    )


def _logits(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """out W + b; with model.logit_softcap or logit_scale, of logits_raw (its one input):
    its cap, its multiple, or with both the cap of the multiple."""
    if len(step.inputs) != 1:
        return _linear(ctx, step, cell)
    assert isinstance(ctx.cfg, Config)
    scale = ctx.cfg.model.logit_scale
    if scale is None:
        return _capped(ctx, step, cell)
    f, src = ctx.f, step.inputs[0]
    r, s = f.shown(float(ctx.get(src)[cell])), f.shown(scale)
    given = [f"{_symbol(src)} = {src}", f"s = {exact(scale)} (model.logit_scale)"]
    if ctx.cfg.model.logit_softcap is None:
        return _Parts(
            [f"s · {_symbol(src)}{_idx(cell)}", f"{f.num(s)} × {f.num(r)}"],
            s * r,
            given,
            {_symbol(src): [r], "s": [s]},
        )
    c = f.shown(ctx.cfg.model.logit_softcap)
    t = math.tanh(s * r / c)
    return _Parts(
        [
            f"c · tanh(s · {_symbol(src)}{_idx(cell)} / c)",
            f"{f.num(c)} · tanh({f.num(s)} × {f.num(r)} / {f.num(c)})",
            f"{f.num(c)} · tanh({f.num(s * r / c)})",
            f"{f.num(c)} · {f.fac(t)}",
        ],
        c * t,
        [*given, f"c = {exact(c)} (model.logit_softcap): the soft cap, bounding to (−c, c)"],
        {_symbol(src): [r], "s": [s], "c": [c]},
    )


def _rel_bias(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """B[i,j] = b_rel[j − i]: the table's entry for the offset, at max_len − 1 + offset.
    In self-attention the queries are the last L_q of the L_k positions (all of them, but
    for a KV-cached step's new rows), so row i is position L_k − L_q + i."""
    i, j = cell
    n_q, n_k = step.value.shape
    pos = n_k - n_q + i
    if not step.inputs:  # positional alibi: no table, a fixed slope per head
        return _alibi(ctx, step, j, pos, n_k - n_q)
    name = step.inputs[0]
    table = ctx.get(name)
    offset = j - pos
    centre = ops.offset_zero(table)  # max_len − 1
    index = centre + offset
    v = float(table[index])
    row = f"({n_k - n_q} + {i})" if n_k > n_q else f"{i}"  # as the formula: j − (start + i)
    h = name.partition(".heads.")[2].partition(".")[0]
    fused = _fused_source(ctx, name)
    given = (
        f"{name}{ctx.source(name)}"
        if fused is None
        else f"row {h} of {fused[0]} (fused; {_part_source(ctx, name, fused[0])}), i.e. {name}"
    )
    plus = f"{centre} + {offset}" if offset >= 0 else f"{centre} − {-offset}"
    return _Parts(
        [f"b_rel[h{h}][{j} − {row}]", f"b_rel[{offset}]", f"rel_bias[{index}]"],
        v,
        [
            f"offset j − i = {offset} (key {j} seen from query position {pos}); "
            f"index max_len − 1 + offset = {plus} = {index}",
            f"rel_bias = {given} = {ctx.f.vec(table)}",
        ],
        {"rel_bias": [v]},
    )


def _alibi(ctx: _Ctx, step: Step, j: int, pos: int, start: int) -> _Parts:
    """ALiBi's B[i,j] = −m·(pos − j) (the encoder's −m·|pos − j|): head h's slope m
    (model.alibi_slopes, given or the paper's) times the distance from query position pos
    back to key j."""
    assert isinstance(ctx.cfg, Config)
    m = ctx.cfg.model
    h = int(step.path.rpartition(".h")[2].partition(".")[0])
    H = m.n_heads
    symmetric = "encoder" in step.path.split(".")
    slope = ctx.f.shown(float(alibi_slopes(m)[h]))
    if m.alibi_slopes is not None:
        rule = "given"
    else:
        rule = "2^(−8(h+1)/H)" if ops.alibi_power(H) == H else "H not a power of two"
    distance = abs(pos - j) if symmetric else pos - j
    row = f"({start} + i)" if start else "i"  # a KV-cached step's row i is position start + i
    apart = f"|{row} − j|" if symmetric else f"{row} − j"
    return _Parts(
        [f"−m·{apart if symmetric else f'({apart})'}", f"−{ctx.f.num(slope)} · {distance}"],
        -slope * distance + 0.0,
        [
            f"m = {alibi_slope_text(h, m)} = {exact(slope)}: head {h}'s slope of {H} "
            f"(ALiBi, {rule})",
            f"distance {apart} = {distance} (key {j} seen from "
            f"query position {pos}; {'bidirectional encoder' if symmetric else 'causal'})",
        ],
        {"m": [slope], "distance": [float(distance)]},
    )


def _plus(ctx: _Ctx, step: Step, cell: tuple[int, ...], term: str) -> _Parts:
    """The step's first input plus its second, `term`, at the cell: scaled + B (biased);
    scaled + M, or biased + M where a relative position bias came between (masked)."""
    s_name, t_name = step.inputs
    s, t = float(ctx.get(s_name)[cell]), float(ctx.get(t_name)[cell])
    sym = _symbol(s_name)  # scaled, or biased (S / scale + B)
    return _Parts(
        [
            f"{sym}{_idx(cell)} + {term}{_idx(cell)}",
            f"{ctx.f.num(s)} + {ctx.f.fac(t)}",
        ],
        s + t,
        [f"{sym} = {s_name}", f"{term} = {t_name}"],
        {sym: [s], term: [t]},
    )


def _biased(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """scaled + B; under alibi, B's slope and distance said too (its step has no table)."""
    parts = _plus(ctx, step, cell, "B")
    b = ctx.trace.steps.get(step.inputs[1])
    if b is not None and not b.inputs:
        parts.where += _rel_bias(ctx, b, cell).where
    return parts


def _masked(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    return _plus(ctx, step, cell, "M")


def _temperature(ctx: _Ctx, step: Step) -> float:
    if step.stage in ("probs", "route_prob"):  # (model.temperature is the attention's)
        return 1.0
    if isinstance(ctx.cfg, Config):
        return ctx.cfg.model.temperature
    return float(ctx.param("temperature"))


def _softmax(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """e^((s_j − m)/T) / Σ_k e^((s_k − m)/T), m = the row's max (the stable softmax, as
    ops.softmax computes it: the max subtracted before T divides); with a second input,
    the head's sink logit (model.attn_sinks), + e^((s_h − m)/T) in the denominator."""
    sink = step.inputs[1] if len(step.inputs) > 1 else None
    return _softmax_row(ctx, step.inputs[0], cell, _temperature(ctx, step), sink)


def _sink(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """The weight row i gave the head's sink (model.attn_sinks): the sink's column of the
    softmax of the row with s_h appended, e^((s_h − m)/T) / (Σ_k e^((s_k − m)/T) + e^((s_h − m)/T))."""
    return _softmax_row(ctx, step.inputs[0], cell, _temperature(ctx, step), step.inputs[1], True)


def _softmax_row(
    ctx: _Ctx,
    src: str,
    cell: tuple[int, ...],
    T: float,
    sink: str | None = None,
    of_sink: bool = False,
) -> _Parts:
    """Entry (i, j) of the softmax of row i of `src` at temperature T; with a `sink`
    (the weight holding a head's sink logit s_h), s_h joins the row's denominator, and
    `of_sink` asks for the sink's own weight (entry (i, 0) of the step sink)."""
    i, j = cell
    f = ctx.f
    row = [float(x) for x in ctx.get(src)[i]]
    s = _symbol(src)
    shown = [f.shown(x) for x in row]  # (written, as are the exponentials and their sum)
    where = [f"{s} = {ctx.row_of(src, i)} = {f.vec(row)}"]
    operands: dict[str, list[float]] = {f"{s}{i}": row}
    if sink is not None:
        s_h = f.shown(float(ctx.get(sink)))
        where.append(f"s_h = {sink}{ctx.source(sink)} = {f.num(s_h)}: the head's sink logit")
        operands["s_h"] = [s_h]
        shown.append(s_h)  # the row's last entry, as ops.softmax_with_sink appends it
    m = _max(shown)
    masked = all(x == -math.inf for x in shown)  # SPEC: NaN, and the run warns of it
    why = "every entry is −inf: −inf − (−inf) is nan" if masked else "it cancels"
    largest = f"the row's largest {s}" if sink is None else f"max(the row's largest {s}, s_h)"
    where.append(f"m = {largest} = {f.num(m)} (subtracted for stability; {why})")
    if T == 1:
        z = [x - m for x in shown]  # a fully masked row: −inf − (−inf) = nan
        terms = [f"e^({f.num(x)} − {f.fac(m)})" for x in shown]
        entry, each, last = f"e^({s}[{i},{j}] − m)", f"e^({s}[{i},k] − m)", "e^(s_h − m)"
    else:
        z = [f.shown(float(v)) for v in ops.tempered_shift(np.array(shown), T)]
        terms = [f"e^({f.num(x)})" for x in z]
        entry, each = f"e^(({s}[{i},{j}] − m)/T)", f"e^(({s}[{i},k] − m)/T)"
        last = "e^((s_h − m)/T)"
        where.append(f"T = {exact(T)}: z = ({s} − m) / T = {f.vec(z)}")
    exps = [_exp(x) for x in z]
    total_sum = _fsum(exps)
    k = len(exps) - 1 if of_sink else j
    if sink is None:
        formula = f"{entry} / Σ_k {each}"
        denominator = _elide(terms)
    else:
        formula = f"{last if of_sink else entry} / (Σ_k {each} + {last})"
        denominator = f"{_elide(terms[:-1])} + {terms[-1]}"
        if T != 1:
            where[-1] += " (s_h divided by T as the row is)"
    result = _div(f.shown(exps[k]), f.shown(total_sum))
    operands.update({"m": [m], "T": [T]})
    return _Parts(
        [formula, f"{terms[k]} / ({denominator})", f"{f.num(exps[k])} / {f.num(total_sum)}"],
        result,
        where,
        operands,
        note="a fully masked row has no softmax" if masked else "",
    )


# generate --sample's stages, `t<i>.sample.<stage>` (SPEC section 4's order): each reads
# the stage before it by path, in its own iteration, and the options the run used.


def _sampling(ctx: _Ctx, step: Step, option: str) -> tuple[str, Any]:
    """The iteration's scope (`t3.`) and the value of a sampling option of the run."""
    if option not in ctx.trace.sampling:
        raise InputError(
            f"cannot explain {step.path}: the sampling options of its run are not known"
        )
    return step.path[: -len(f"sample.{step.stage}")], ctx.trace.sampling[option]


def _tempered(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """softmax(logits / T) of the iteration's last row of logits: the next token's."""
    scope, T = _sampling(ctx, step, "temperature")
    logits = f"{scope}logits"
    return _softmax_row(ctx, logits, (ctx.trace[logits].shape[0] - 1, cell[1]), float(T))


def _kept_share(
    ctx: _Ctx,
    step: Step,
    cell: tuple[int, ...],
    src: str,
    kept: np.ndarray,
    rule: str,
    why_not: str,
) -> _Parts:
    """A kept token's tempered probability (the step `src`) over the kept total
    (renormalised); else 0, `why_not`."""
    f, j = ctx.f, cell[1]
    p = ctx.get(src)[0]
    vocab = step.cols or tuple(str(k) for k in range(len(p)))
    idx = [int(k) for k in np.flatnonzero(kept)]
    listed = _elide([f"{quoted(vocab[k])} {f.num(float(p[k]))}" for k in idx], ", ")
    where = [f"tempered = {src}", f"{rule}: {listed}"]
    if not kept[j]:
        return _Parts([], 0.0, where, note=why_not.format(quoted(vocab[j])))
    values = [float(p[k]) for k in idx]
    total = _fsum(values)
    return _Parts(
        [
            f"tempered[0,{j}] / Σ_kept tempered[0,k]",
            f"{f.num(float(p[j]))} / ({_sum(f, values)})",
            f"{f.num(float(p[j]))} / {f.num(total)}",
        ],
        _div(float(p[j]), f.shown(total)),
        where,
        {"tempered0": [float(x) for x in p], "kept": [float(k) for k in idx]},
    )


def _top_k(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """Top-k keeps the k most probable tokens of the tempered distribution."""
    from trace_tf.generate import top_k_kept

    scope, k = _sampling(ctx, step, "top_k")
    tempered = f"{scope}sample.tempered"
    kept = top_k_kept(ctx.trace.value(tempered)[0], int(k))
    rule = f"kept, the {k} most probable (ties to the earlier vocabulary entry)"
    why_not = "{} is not among the " + f"{k} most probable"
    return _kept_share(ctx, step, cell, tempered, kept, rule, why_not)


def _top_p(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """Top-p's prefix is found on the tempered distribution, then what top-k kept is
    kept of it (generate.sampling_steps)."""
    from trace_tf.generate import top_k_kept, top_p_filter

    scope, top_p = _sampling(ctx, step, "top_p")
    tempered = f"{scope}sample.tempered"
    p = ctx.trace.value(tempered)[0]  # (the run's numbers, not as written)
    kept = top_p_filter(p, float(top_p)) > 0
    rule = (
        f"kept, the smallest prefix, by probability, whose total reaches p = {exact(float(top_p))}"
    )
    why_not = "{} is outside that prefix"
    k = ctx.trace.sampling.get("top_k")
    if k is not None:
        in_top_k = top_k_kept(p, int(k))
        if not in_top_k[cell[1]]:  # (top-k dropped it, whether or not the prefix holds it)
            why_not = "{} is not among the " + f"{k} most probable (top-k)"
        kept &= in_top_k
        rule += f", of the {k} top-k kept"
    return _kept_share(ctx, step, cell, tempered, kept, rule, why_not)


def _context(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    i, j = cell
    a_name, v_name = step.inputs
    A, V = ctx.get(a_name), ctx.get(v_name)
    text, total, fused = _dot(ctx.f, A[i], V[:, j])
    return _Parts(
        [f"A{i} · V[:,{j}]", text],
        total,
        [
            f"A{i} = {ctx.row_of(a_name, i)} = {ctx.f.vec(A[i])}",
            f"V[:,{j}] = column {j} of {v_name}{ctx.cached_rows(v_name)} = {ctx.f.vec(V[:, j])}",
        ],
        {f"A{i}": A[i].tolist(), f"V[:,{j}]": V[:, j].tolist()},
        fused,
    )


def _concat(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    i, j = cell
    start = 0
    for h, name in enumerate(step.inputs):
        width = ctx.get(name).shape[1]
        if j < start + width:
            c = j - start
            v = float(ctx.get(name)[i, c])
            return _Parts(
                [f"head {h}'s context[{i},{c}]"],
                v,
                [
                    f"column {j} = head {h} (columns {start}..{start + width - 1}), its column {c}",
                    f"head {h}'s context = {name}",
                ],
                {f"context[{i},{c}]": [v]},
            )
        start += width
    raise AssertionError("column beyond the heads")  # the cell was checked against the shape


def _residual(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """x + sublayer(x) (post-norm), or x + sublayer(Norm(x)) (pre-norm: the sublayer
    reads the norm recorded beside the residual); a parallel layer's x + attn + ffn."""
    assert isinstance(ctx.cfg, Config)
    if len(step.inputs) == 3:
        return _parallel_residual(ctx, step, cell)
    x_name, y_name = step.inputs
    x, y = float(ctx.get(x_name)[cell]), float(ctx.get(y_name)[cell])
    total = x + y
    position = ctx.cfg.model.norm_position
    added = RESIDUAL_ADDS[position]
    reads = {
        "post": "",
        "pre": " (it reads Norm(x) = {}.norm)",
        "sandwich": " (the sublayer reads Norm(x) = {}.norm)",
        "output": " (the norm of the sublayer's output)",
    }[position]
    reads = reads.format(step.path.removesuffix(".residual"))
    return _Parts(
        [f"x{_idx(cell)} + {added}{_idx(cell)}", f"{ctx.f.num(x)} + {ctx.f.fac(y)}"],
        total,
        [f"x = {x_name} (the sublayer's input)", f"{added} = {y_name}{reads}"],
        {"x": [x], "sublayer": [y]},
    )


def _parallel_residual(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """x + self_attn(Norm₁(x)) + ffn(Norm₂(x)) (model.parallel separate), or with the one
    norm self_attn.norm both read (shared): the layer's input and both sublayers' outputs."""
    assert isinstance(ctx.cfg, Config)
    x_name, a_name, f_name = step.inputs
    x, a, y = (float(ctx.get(name)[cell]) for name in step.inputs)
    layer = step.path.removesuffix(".ffn.residual")
    shared = ctx.cfg.model.parallel == "shared"
    n1, n2 = ("Norm(x)", "Norm(x)") if shared else ("Norm₁(x)", "Norm₂(x)")
    ffn_reads = f"{layer}.self_attn.norm, shared" if shared else f"{layer}.ffn.norm"
    return _Parts(
        [
            f"x{_idx(cell)} + self_attn({n1}){_idx(cell)} + ffn({n2}){_idx(cell)}",
            f"{ctx.f.num(x)} + {ctx.f.fac(a)} + {ctx.f.fac(y)}",
        ],
        x + a + y,
        [
            f"x = {x_name} (the layer's input, which both sublayers read normalised: parallel)",
            f"self_attn({n1}) = {a_name} (it reads {n1} = {layer}.self_attn.norm)",
            f"ffn({n2}) = {f_name} (it reads {n2} = {ffn_reads})",
        ],
        {"x": [x], "self_attn": [a], "ffn": [y]},
    )


def _norm(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """A model's LayerNorm / RMSNorm entry, from the statistics recorded under it."""
    assert isinstance(ctx.cfg, Config)
    i, j = cell
    f = ctx.f
    x_name, g_name, b_name = step.inputs
    i = _new_row(step, i, ctx.get(x_name), x_name)  # a KV-cached K: K_raw holds its new rows
    x, g, b = float(ctx.get(x_name)[i, j]), float(ctx.get(g_name)[j]), float(ctx.get(b_name)[j])
    eps = ctx.cfg.model.norm_eps
    where = [f"x = {x_name}", f"γ = {g_name}{ctx.source(g_name)}, β = {b_name}{ctx.source(b_name)}"]
    if g_name.rsplit(".", 2)[-2] in QK_KEYS and ctx.cfg.model.qk_norm == "projection":
        n = ctx.get(x_name).shape[1]  # the whole projection's row: every head's columns
        where[0] += f" (QK-norm over the whole projection: row {i}'s {n} entries, every head's)"
    elif g_name.rsplit(".", 2)[-2] in QK_KEYS:  # QK-norm: one head's row, the block's γ and β
        where[0] += (
            f" (QK-norm: row {i}'s {ctx.get(x_name).shape[1]} entries, this head's alone; "
            "γ and β of d_k shared by every head of the block)"
        )
    if ctx.cfg.model.norm == "rms":
        r = float(ctx.get(f"{step.path}.rms")[i, 0])
        total, note = _div(x, r) * g + b, ""
        row = ctx.get(x_name)[i, :]
        if _beyond(r, step) and np.isfinite(row).all() and np.any(row != 0):
            unit, note = _rms_scaled(row, j, eps, step)
            total = unit * g + b
        where.insert(1, f"rms{i} = {step.path}.rms[{i},0] (√(mean(x²) + ε), ε = {exact(eps)})")
        return _Parts(
            [
                f"x[{i},{j}] / rms{i} × γ[{j}] + β[{j}]",
                f"{f.num(x)} / {f.num(r)} × {f.fac(g)} + {f.fac(b)}",
            ],
            total,
            where,
            {"x": [x], "rms": [r], "γ": [g], "β": [b]},
            note=note,
        )
    mean = float(ctx.get(f"{step.path}.mean")[i, 0])
    var = float(ctx.get(f"{step.path}.var")[i, 0])
    total, note = _div(x - mean, _sqrt(var + eps)) * g + b, ""
    scaled = _norm_scaled(ctx.get(x_name)[i, :], j, var + eps, eps, step)
    if scaled is not None:
        unit, note = scaled
        total = unit * g + b
    where.insert(
        1, f"mean{i}, var{i} = {step.path}.mean, .var row {i} (biased var, ε = {exact(eps)})"
    )
    return _Parts(
        [
            f"(x[{i},{j}] − mean{i}) / √(var{i} + ε) × γ[{j}] + β[{j}]",
            f"({f.num(x)} − {f.fac(mean)}) / √({f.num(var)} + {exact(eps)}) × {f.fac(g)} + {f.fac(b)}",
        ],
        total,
        where,
        {"x": [x], "mean": [mean], "var": [var], "γ": [g], "β": [b]},
        note=note,
    )


def _reduced(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> tuple[np.ndarray, str, str]:
    """The values a mean / var / rms entry reduces over, and how to name them."""
    x_name = step.inputs[0]
    x = ctx.get(x_name)
    if isinstance(ctx.cfg, OpConfig):
        axis = NORM_AXES[str(ctx.param("kind"))][0] % x.ndim
    else:
        axis = x.ndim - 1
    index: list[Any] = list(cell)
    index[axis] = slice(None)
    sel = ",".join(":" if k == axis else str(c) for k, c in enumerate(cell))
    return x[tuple(index)], f"x[{sel}]", x_name


def _beyond(denominator: float, step: Step) -> bool:
    """A var + ε or mean square + ε that the step's dtype (float64, or float32 under
    --dtype float32) cannot hold (ops.beyond_normal): the engine computes it scaled."""
    return bool(ops.beyond_normal(np.asarray(denominator, dtype=step.value.dtype)))


def _norm_scaled(
    group: np.ndarray, k: int, denominator: float, eps: float, step: Step
) -> tuple[float, str] | None:
    """(x_k − mean) / √(var + ε) of a group of finite x, not all one value, whose
    var + ε (`denominator`) the step's dtype cannot hold, computed as the engine does,
    scaled by a power of two s, and the note saying so; None for any other group."""
    if not (_beyond(denominator, step) and np.isfinite(group).all() and np.any(group != group[0])):
        return None
    x = group.astype(np.float64)
    s, y, mean_y, var_y = ops.scaled_moments(x, 0)
    sv = float(s[0])
    value = float(ops.standardized_scaled(x, 0, eps)[k])
    note = (
        f"var + ε is beyond {step.value.dtype}; with x and mean divided by s = 2^{math.frexp(sv)[1] - 1}, "
        f"which changes no quotient: ({exact(float(y[k]))} − {exact(float(mean_y[0]))}) "
        f"/ √({exact(float(var_y[0]))} + ε/s²)"
    )
    return value, note


def _rms_scaled(row: np.ndarray, k: int, eps: float, step: Step) -> tuple[float, str]:
    """x_k / rms of a row of finite x whose rms the step's dtype holds in a few bits only
    (below its least normal number), computed as the engine does (ops.rms_scale), scaled
    by a power of two s, and the note saying so."""
    s, y, root = ops.scaled_rms(row.astype(np.float64)[None, :], eps)
    sv = float(s[0, 0])
    note = (
        f"rms is below {step.value.dtype}'s normal numbers; with x divided by "
        f"s = 2^{math.frexp(sv)[1] - 1}: {exact(float(y[0, k]))} / "
        f"√(Σ (x/s)² / {len(row)} + ε/s²)"
    )
    return float(y[0, k] / root[0, 0]), note


def _eps(ctx: _Ctx) -> float:
    if isinstance(ctx.cfg, Config):
        return ctx.cfg.model.norm_eps
    return float(ctx.param("eps"))


def _mean(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    xs, sel, x_name = _reduced(ctx, step, cell)
    n = len(xs)
    total = _fsum(float(v) for v in xs) / n
    if math.isinf(total) and np.isfinite(xs).all():  # the sum overflows, not the mean
        total = float(ops.moments(xs.astype(np.float64), 0)[0][0])
    return _Parts(
        [
            f"Σ {sel} / {n}",
            f"({_sum(ctx.f, xs.tolist())}) / {n}",
        ],
        total,
        [f"{sel} = {ctx.f.vec(xs)} of {x_name}"],
        {sel: xs.tolist()},
    )


def _var(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    xs, sel, x_name = _reduced(ctx, step, cell)
    n = len(xs)
    mean = ctx.f.shown(_fsum(float(v) for v in xs) / n)  # (written below)
    terms = [f"({ctx.f.num(float(v))} − {ctx.f.fac(mean)})²" for v in xs]
    total = _fsum((float(v) - mean) * (float(v) - mean) for v in xs) / n
    return _Parts(
        [f"Σ ({sel} − mean)² / {n}", f"({_elide(terms)}) / {n}"],
        total,
        [f"{sel} = {ctx.f.vec(xs)} of {x_name}", f"mean = {ctx.f.num(mean)} (biased: ÷ {n})"],
        {sel: xs.tolist(), "mean": [mean]},
    )


def _rms(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    xs, sel, x_name = _reduced(ctx, step, cell)
    n, eps = len(xs), _eps(ctx)
    terms = [f"{ctx.f.fac(float(v))}²" for v in xs]
    square = _fsum(float(v) * float(v) for v in xs) / n + eps
    total, note = _sqrt(square), ""
    if _beyond(square, step) and np.isfinite(xs).all() and np.any(xs != 0):
        sv = float(ops.scaled_moments(xs.astype(np.float64), 0)[0][0])
        ys = [float(v) / sv for v in xs]
        total = sv * math.hypot(math.sqrt(_fsum(y * y for y in ys) / n), math.sqrt(eps) / sv)
        note = (
            f"mean(x²) + ε is beyond {step.value.dtype}; with x divided by s = 2^{math.frexp(sv)[1] - 1}: "
            f"s · √(Σ (x/s)² / {n} + ε/s²)"
        )
    return _Parts(
        [f"√(Σ {sel}² / {n} + ε)", f"√(({_elide(terms)}) / {n} + {exact(eps)})"],
        total,
        [f"{sel} = {ctx.f.vec(xs)} of {x_name}"],
        {sel: xs.tolist(), "ε": [eps]},
        note=note,
    )


def _stat_index(ctx: _Ctx, cell: tuple[int, ...], stat: np.ndarray) -> tuple[int, ...]:
    """The entry of a kept-dims statistic that belongs to a cell of x."""
    return tuple(0 if n == 1 else c for c, n in zip(cell, stat.shape, strict=True))


def _centered(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    x_name, m_name = step.inputs
    m_all = ctx.get(m_name)
    mi = _stat_index(ctx, cell, m_all)
    x, m = float(ctx.get(x_name)[cell]), float(m_all[mi])
    total = x - m
    return _Parts(
        [
            f"x{_idx(cell)} − mean{_idx(mi)}",
            f"{ctx.f.num(x)} − {ctx.f.fac(m)}",
        ],
        total,
        [f"x = {x_name}", f"mean = {m_name}"],
        {"x": [x], "mean": [m]},
    )


def _norm_out(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """The calculator's norm output, γ and β taken per feature (per channel: instance)."""
    f = ctx.f
    a_name, s_name = step.inputs
    stat_all = ctx.get(s_name)
    si = _stat_index(ctx, cell, stat_all)
    a, s = float(ctx.get(a_name)[cell]), float(stat_all[si])
    c = cell[1]
    gamma, beta = ctx.param("gamma"), ctx.param("beta")
    g = 1.0 if gamma is None else f.shown(float(gamma[c]))
    b = 0.0 if beta is None else f.shown(float(beta[c]))
    where = [
        f"γ[{c}] = {f.num(g)}, β[{c}] = {f.num(b)}"
        + (" (defaults)" if gamma is None and beta is None else "")
    ]
    if ctx.param("kind") == "rms":
        total, note = _div(a, s) * g + b, ""
        row = np.asarray(ctx.param("x"))[cell[0], :]
        if _beyond(s, step) and np.isfinite(row).all() and np.any(row != 0):
            unit, note = _rms_scaled(row, cell[1], _eps(ctx), step)
            total = unit * g + b
        return _Parts(
            [
                f"x{_idx(cell)} / rms{_idx(si)} × γ[{c}] + β[{c}]",
                f"{f.num(a)} / {f.num(s)} × {f.fac(g)} + {f.fac(b)}",
            ],
            total,
            [f"x = {a_name}", f"rms = {s_name}", *where],
            {"x": [a], "rms": [s], "γ": [g], "β": [b]},
            note=note,
        )
    eps = _eps(ctx)
    total, note = _div(a, _sqrt(s + eps)) * g + b, ""
    x = np.asarray(ctx.param("x"))
    axis = NORM_AXES[str(ctx.param("kind"))][0] % x.ndim
    group = x[tuple(slice(None) if k == axis else c for k, c in enumerate(cell))]
    scaled = _norm_scaled(group, cell[axis], s + eps, eps, step)
    if scaled is not None:
        unit, note = scaled
        total = unit * g + b
    return _Parts(
        [
            f"centered{_idx(cell)} / √(var{_idx(si)} + ε) × γ[{c}] + β[{c}]",
            f"{f.num(a)} / √({f.num(s)} + {exact(eps)}) × {f.fac(g)} + {f.fac(b)}",
        ],
        total,
        [f"centered = {a_name}", f"var = {s_name}", *where],
        {"centered": [a], "var": [s], "γ": [g], "β": [b]},
        note=note,
    )


def _act(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    assert isinstance(ctx.cfg, Config)
    f = ctx.f
    h = float(ctx.get(step.inputs[0])[cell])
    kind = ctx.cfg.model.act  # a gated FFN's: its gate's
    hn = f.num(h)
    if kind == "swish_alpha":  # swiglu_oss: of the clamped gate G, with gain α
        alpha = ctx.cfg.model.swiglu_alpha
        g, a = f"G{_idx(cell)}", exact(alpha)
        e = _exp(-alpha * h)
        chain = [
            f"{g} σ(α {g})",
            f"{g} / (1 + e^(−α {g}))",
            f"{hn} / (1 + e^(−{a} × {f.fac(h)}))",
            f"{hn} / (1 + {f.num(e)})",
        ]
        where = [f"G = {step.inputs[0]}", f"α = model.swiglu_alpha = {a}"]
        return _Parts(chain, _div(h, 1.0 + e), where, {"G": [h]})
    if kind == "silu":
        e = _exp(-h)
        total = _div(h, 1.0 + e)
        chain = [
            f"H{_idx(cell)} σ(H{_idx(cell)})",
            f"H{_idx(cell)} / (1 + e^(−H{_idx(cell)}))",
            f"{hn} / (1 + e^({f.num(-h)}))",
            f"{hn} / (1 + {f.num(e)})",
        ]
    elif kind == "relu":
        total = h if h > 0 or math.isnan(h) else 0.0  # numpy.maximum keeps a NaN
        chain = [f"max(0, H{_idx(cell)})", f"max(0, {hn})"]
    elif kind == "gelu":
        r2 = f.shown(math.sqrt(2.0))
        total = 0.5 * h * (1.0 + math.erf(h / r2))
        chain = [
            f"½ H{_idx(cell)} (1 + erf(H{_idx(cell)} / √2))",
            f"0.5 × {f.fac(h)} × (1 + erf({hn} / {f.num(r2)}))",
        ]
    else:
        c = f.shown(math.sqrt(2.0 / math.pi))
        total = 0.5 * h * (1.0 + math.tanh(c * (h + 0.044715 * _pow(h, 3))))
        chain = [
            "½ H (1 + tanh(√(2/π) (H + 0.044715 H³)))",
            f"0.5 × {f.fac(h)} × (1 + tanh({f.num(c)} × ({hn} + 0.044715 × {f.fac(h)}³)))",
        ]
    return _Parts(chain, total, [f"H = {step.inputs[0]}"], {"H": [h]})


def _gated(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """A gated FFN's act ⊙ U (swiglu_oss: act ⊙ U'): one product of the gate's entry
    and the up projection's."""
    a_name, u_name = step.inputs
    a, u = float(ctx.get(a_name)[cell]), float(ctx.get(u_name)[cell])
    us = "U'" if u_name.endswith(".up_clamp") else "U"
    return _Parts(
        [f"act{_idx(cell)} × {us}{_idx(cell)}", f"{ctx.f.num(a)} × {ctx.f.fac(u)}"],
        a * u,
        [f"act = {a_name}", f"{us} = {u_name}"],
        {f"act{_idx(cell)}": [a], f"{us}{_idx(cell)}": [u]},
    )


def _gate_clamp(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """GPT-OSS's gate clamped from above: min(H, limit) (a NaN stays NaN, as numpy's)."""
    assert isinstance(ctx.cfg, Config)
    limit = ctx.cfg.model.swiglu_limit
    h = float(ctx.get(step.inputs[0])[cell])
    total = h if h <= limit or math.isnan(h) else limit
    return _Parts(
        [f"min(H{_idx(cell)}, limit)", f"min({ctx.f.num(h)}, {exact(limit)})"],
        total,
        [f"H = {step.inputs[0]}", f"limit = model.swiglu_limit = {exact(limit)}"],
        {"H": [h]},
    )


def _up_clamp(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """GPT-OSS's up projection clamped to ±limit, plus 1 (a NaN stays NaN, as numpy's)."""
    assert isinstance(ctx.cfg, Config)
    limit = ctx.cfg.model.swiglu_limit
    u = float(ctx.get(step.inputs[0])[cell])
    clamped = u if math.isnan(u) else min(max(u, -limit), limit)
    lim = exact(limit)
    return _Parts(
        [
            f"clamp(U{_idx(cell)}, −limit, limit) + 1",
            f"clamp({ctx.f.num(u)}, −{lim}, {lim}) + 1",
            f"{ctx.f.num(clamped)} + 1",
        ],
        clamped + 1.0,
        [f"U = {step.inputs[0]}", f"limit = model.swiglu_limit = {lim}"],
        {"U": [u]},
    )


# A mixture of experts (model.experts): the steps under <stack>.<l>.ffn, each expert's
# under ffn.e<e>. The choice is the engine's, ops.top_experts of the recorded
# route_prob: each row's k largest, ties to the lowest index.


def _ffn_scope(path: str) -> str:
    """`decoder.0.ffn.` of any step under that FFN (an expert's `decoder.0.ffn.e1.out`)."""
    return path[: path.rindex(".ffn.") + len(".ffn.")]


def _chosen(ctx: _Ctx, path: str) -> np.ndarray:
    """Each token's chosen experts in the FFN of the step at `path`, largest first. [L, k]"""
    assert isinstance(ctx.cfg, Config)
    probs = ctx.trace.value(_ffn_scope(path) + "route_prob")
    return ops.top_experts(probs, ctx.cfg.model.experts_top_k)


def _expert_rows(ctx: _Ctx, path: str, e: int) -> np.ndarray:
    """The tokens expert e computed, in order: the rows of its steps (e<e>.x)."""
    return np.flatnonzero((_chosen(ctx, path) == e).any(axis=-1))


def _labels(experts: Iterable[int]) -> str:
    return ", ".join(f"e{int(e)}" for e in experts)


def _routed(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """A token's weight of an expert: 0 unless the expert is among its k largest P, else
    P (renormalised: P over the sum of the k chosen ones)."""
    assert isinstance(ctx.cfg, Config)
    m, f = ctx.cfg.model, ctx.f
    i, e = cell
    p_name = step.inputs[0]
    P = ctx.get(p_name)
    chosen = [int(c) for c in _chosen(ctx, step.path)[i]]
    where = [
        f"P{i} = {ctx.row_of(p_name, i)} = {f.vec(P[i])}",
        f"the k = {m.experts_top_k} experts of largest P[{i},·]: {_labels(chosen)} (model."
        "experts_top_k; of equal ones the lowest index)",
    ]
    operands = {f"P{i}": [float(x) for x in P[i]]}
    if e not in chosen:
        return _Parts([], 0.0, where, operands, note=f"e{e} is not chosen for row {i}")
    p = float(P[i, e])
    if not m.experts_normalize:
        where.append("not renormalised (model.experts_normalize false): the weight is P")
        return _Parts([f"P[{i},{e}]", f.num(p)], p, where, operands)
    picked = [float(P[i, c]) for c in chosen]
    total = 0.0
    for x in picked:  # (as numpy sums the k chosen, largest first)
        total += x
    where.append("renormalised (model.experts_normalize): divided by the chosen ones' sum")
    return _Parts(
        [
            f"P[{i},{e}] / ({' + '.join(f'P[{i},{c}]' for c in chosen)})",
            f"{f.num(p)} / ({_sum(f, picked)})",
            f"{f.num(p)} / {f.num(total)}",
        ],
        _div(p, total),
        where,
        operands,
    )


def _expert_input(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """Row r of an expert's X_e: the row of X of the r-th token routed to it."""
    r, j = cell
    e = int(step.path.rsplit(".", 2)[-2][1:])
    x_name = step.inputs[0]
    i = int(_expert_rows(ctx, step.path, e)[r])
    chosen = [int(c) for c in _chosen(ctx, step.path)[i]]
    v = float(ctx.get(x_name)[i, j])
    return _Parts(
        [f"X[{i},{j}]", ctx.f.num(v)],
        v,
        [
            f"X = {x_name}; row {r} of X_e is {ctx.row_of(x_name, i)}, the {_nth(r)} token "
            f"whose chosen experts ({_labels(chosen)}, routed) include e{e}"
        ],
        {f"X[{i},{j}]": [v]},
    )


def _nth(r: int) -> str:
    """0 -> 1st, 1 -> 2nd, ... (row r counted from 1)."""
    n = r + 1
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _ffn_out(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """A dense FFN's (or an expert's) out, a product; a mixture of experts' ffn.out, the
    sum of its chosen experts' outs, weighted."""
    assert isinstance(ctx.cfg, Config)
    if not step.path.endswith(".ffn.out") or not ctx.cfg.model.experts_at(step.path):
        return _linear(ctx, step, cell)
    f = ctx.f
    i, j = cell
    w_name = step.inputs[0]
    W = ctx.get(w_name)
    scope = _ffn_scope(step.path)
    experts = sorted(int(c) for c in _chosen(ctx, step.path)[i])  # (summed in index order)
    ws, ys, where, symbols, read = [], [], [], [], [w_name]
    for e in experts:
        r = int(np.flatnonzero(_expert_rows(ctx, step.path, e) == i)[0])
        y_name = f"{scope}e{e}.out"
        ws.append(float(W[i, e]))
        ys.append(float(ctx.get(y_name)[r, j]))
        symbols.append(f"W[{i},{e}] · Y{e}[{r},{j}]")
        token = f" ({quoted(step.rows[i])})" if step.rows is not None else ""
        where.append(f"Y{e} = {y_name}, whose row {r} is token {i}{token}'s")
        read.append(y_name)
    total = 0.0
    for w, y in zip(ws, ys, strict=True):  # (as the engine adds: one expert at a time)
        total += w * y
    text = " + ".join(
        f"{f.fac(w) if k else f.num(w)}×{f.fac(y)}"
        for k, (w, y) in enumerate(zip(ws, ys, strict=True))
    )
    operands = {f"W[{i},·]": ws, f"Y[·][{j}]": ys}
    s_name = scope + "shared.out"  # a shared expert's (model.shared_expert), every token's
    if s_name in step.inputs:
        s = float(ctx.get(s_name)[i, j])
        g_name = scope + "shared.gate"
        where.append(f"S = {s_name}, the shared expert's out")
        operands[f"S[{i},{j}]"] = [s]
        if g_name in step.inputs:  # gated: g ⊙ S, added to the routed sum
            g = float(ctx.get(g_name)[i, 0])
            symbols.append(f"g[{i}] · S[{i},{j}]")
            text += f" + {f.fac(g)}×{f.fac(s)}"
            total += g * s
            where.append(f"g = {g_name}, σ(X w_g) of token {i}")
            operands[f"g[{i}]"] = [g]
        else:
            symbols.append(f"S[{i},{j}]")
            text += f" + {f.fac(s)}"
            total += s
    return _Parts(
        [" + ".join(symbols), text],
        total,
        [
            f"W = {w_name}: row {i}'s chosen experts {_labels(experts)} = "
            + f.vec([W[i, e] for e in experts]),
            *where,
        ],
        operands,
        inputs=tuple(read) + tuple(n for n in step.inputs if n.startswith(scope + "shared")),
    )


def _shared_gate(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """A gated shared expert's weight of a token: σ of the product X_i · w_g."""
    f = ctx.f
    z = _linear(ctx, step, cell)
    e = _exp(-z.result)
    return _Parts(
        [
            f"σ({z.chain[0]})",
            f"1 / (1 + e^(−({z.chain[-1]})))",
            f"1 / (1 + e^({f.num(-z.result)}))",
            f"1 / (1 + {f.num(e)})",
        ],
        _div(1.0, 1.0 + e),
        z.where,
        z.operands,
    )


def _embed(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    assert isinstance(ctx.cfg, Config)
    i, j = cell
    stack = step.path.rsplit(".", 2)[-2]
    seq = ctx.cfg.source if stack == "encoder" else ctx.cfg.target or target_of(ctx.cfg)
    if seq is not None and seq.matrix is not None:
        v = float(seq.matrix[i, j])
        name = "source" if stack == "encoder" else "target"
        return _Parts(
            [f"{name}[{i},{j}]  (the given matrix)"],
            v,
            [f"{name} is given as numbers{ctx.source(name)}: they are the embeddings"],
            {name: [v]},
        )
    token = step.rows[i] if step.rows is not None else "?"
    v = float(ctx.cfg.embeddings[token][j])
    entry = f"embedding[{quoted(token)}]"
    return _Parts(
        [f"{entry}[{j}]"],
        v,
        [
            f"row {i} is the token {quoted(token)}; {entry}{ctx.source(f'embeddings.{token}')}"
            f" = {ctx.f.vec(ctx.cfg.embeddings[token])}"
        ],
        {f"embedding['{token}']": ctx.cfg.embeddings[token].tolist()},  # (JSON: as it is)
    )


def _sinusoid(ctx: _Ctx, i: int, j: int, d: int, base: float) -> _Parts:
    p = j // 2
    angle = ctx.f.shown(i / _pow(base, 2 * p / d))  # (written)
    fn, total = ("sin", _sin(angle)) if j % 2 == 0 else ("cos", _cos(angle))
    return _Parts(
        [f"{fn}({i} / {exact(base)}^({2 * p}/{d}))", f"{fn}({ctx.f.num(angle)})"],
        total,
        [f"position {i}, column {j}: pair {p} ({'even: sine' if j % 2 == 0 else 'odd: cosine'})"],
        {"angle": [angle]},
    )


def _pe(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    assert isinstance(ctx.cfg, Config)
    i, j = cell
    pos = _first_position(ctx, step.path) + i  # a KV-cached iteration's new rows: start..
    m = ctx.cfg.model
    at = [f"row {i} is position {pos} (after {pos - i} cached)"] if pos != i else []
    if m.positional == "learned":
        v = float(ctx.get(step.inputs[0])[pos, j])
        return _Parts(
            [f"positional[{pos},{j}]  (learned)"],
            v,
            [*at, f"positional = {step.inputs[0]}{ctx.source(step.inputs[0])}"],
            {"positional": [v]},
        )
    parts = _sinusoid(ctx, pos, j, step.value.shape[1], m.pe_base)
    parts.where[:0] = at
    return parts


def _type_of(ctx: _Ctx, path: str, i: int) -> tuple[int, int, str]:
    """Row i of a stack's step: its position, its token type, and where that type is from."""
    assert isinstance(ctx.cfg, Config)
    pos = _first_position(ctx, path) + i  # a KV-cached iteration's new rows: start..
    stack = _STACK.match(path)
    if stack is not None and stack.group(1) == "encoder":
        source = ctx.cfg.source
        assert source is not None and source.types is not None
        return pos, source.types[i], _given_types(source, "source_types")
    types = decoder_types(ctx.cfg, pos + 1)
    assert types is not None
    if pos >= len(target_of(ctx.cfg)):  # generated: the type of the position before it
        return pos, types[pos], f"a generated token: the type of position {pos - 1}"
    if ctx.cfg.target is None:
        return pos, types[pos], "the start [tokens.bos]: type 0"
    return pos, types[pos], _given_types(ctx.cfg.target, "target_types")


def _given_types(seq: Sequence_, key: str) -> str:
    """Where a sequence's token types came from: the config's key, or its default."""
    return key if seq.types_given else f"every type 0: the config gives no {key}"


def _token_type(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """A row of the token-type table, picked by the position's type."""
    i, j = cell
    pos, t, given = _type_of(ctx, step.path, i)
    table = step.inputs[0]
    v = float(ctx.get(table)[t, j])
    at = f"row {i} is position {pos} (after {pos - i} cached) and" if pos != i else f"row {i}"
    return _Parts(
        [f"token_types[{t},{j}]"],
        v,
        [f"{at} has type {t} ({given})", f"token_types = {table}{ctx.source(table)}"],
        {"token_types": [v]},
    )


def _pe_table(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    i, j = cell
    d, base = int(ctx.param("d_model")), float(ctx.param("base"))
    if ctx.param("kind") == "rope":
        width, d = d, int(ctx.param("rope_dims") or d)  # partial rotary: a RoPE of d columns
        where = [
            f"position {i} turns pair {j} by this angle (radians): columns {2 * j}, "
            f"{2 * j + 1}, or {j}, {j + d // 2} with model.rope_pairs halves"
        ]
        if d < width:
            where.append(
                f"rope_dims {d}: frequencies over {d} columns, {d}..{width - 1} not turned"
            )
        scaling = ctx.param("rope_scaling")
        if scaling is None:
            total = i * _pow(base, -2 * j / d)
            return _Parts(
                [f"{i} · {exact(base)}^(−{2 * j}/{d})"], total, where, {"pos": [float(i)]}
            )
        frequency = ctx.f.shown(float(ops.rope_frequencies(d, base, scaling)[j]))
        where.append(
            f"θ_{j} = {exact(base)}^(−{2 * j}/{d}) = {ctx.f.num(_pow(base, -2 * j / d))}, then "
            f"scaled, {_scaled_frequency(ctx, scaling, base, j, d)}"
        )
        return _Parts(
            [f"{i} · θ_{j}", f"{i} × {ctx.f.num(frequency)}"],
            i * frequency,
            where,
            {"pos": [float(i)], f"θ_{j}": [frequency]},
        )
    return _sinusoid(ctx, i, j, d, base)


def _input(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    assert isinstance(ctx.cfg, Config)
    m = ctx.cfg.model
    e = float(ctx.get(step.inputs[0])[cell])
    total, sym, nums = e, f"E{_idx(cell)}", ctx.f.num(e)
    operands = {"E": [e]}
    if m.embed_scale != 1.0:
        total = e * ctx.f.shown(m.embed_scale)
        sym += " × embed_scale"
        nums += f" × {ctx.f.num(m.embed_scale)}"
        operands["embed_scale"] = [m.embed_scale]
    where = [f"E = {step.inputs[0]}"]
    for added in step.inputs[1:]:  # the positions' PE, then the token types' T
        name = {"pe": "PE", "token_type": "T"}[added.rsplit(".", 1)[-1]]
        v = float(ctx.get(added)[cell])
        total = total + v
        sym += f" + {name}{_idx(cell)}"
        nums += f" + {ctx.f.fac(v)}"
        operands[name] = [v]
        where.append(f"{name} = {added}")
        if name == "T":  # which row of the table, and why
            _, t, given = _type_of(ctx, step.path, cell[0])
            where[-1] += f": token_types[{t}], row {cell[0]}'s type ({given})"
    return _Parts([sym, nums], total, where, operands)


def _mask(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """Why a mask entry is 0 or −inf: the rule, applied again."""
    assert isinstance(ctx.cfg, Config)
    i, j = cell
    layer = re.search(r"decoder\.(\d+)\.self_attn\.mask$", step.path)  # a sliding layer's own
    causal = layer is not None or step.path.endswith("decoder.mask")
    pos = _first_position(ctx, step.path) + i  # a KV-cached iteration's rows: start..
    query = f"query {i}" if pos == i else f"query {i} (position {pos})"
    key = step.cols[j] if step.cols is not None else None
    pad = key if key is not None and key == ctx.cfg.tokens.pad else None  # ("" is a token)
    reasons = []
    m = ctx.cfg.model
    W = (m.window_of(int(layer.group(1))) if layer else m.window) if causal else 0
    if causal and j > pos:
        reasons.append(f"key {j} comes after {query} (causal)")
    if W and j <= pos - W:
        reasons.append(
            f"key {j} is {pos - j} positions before {query}, not within its window of {W} "
            f"(j ≤ {pos} − {W})"
        )
    if pad is not None:
        reasons.append(f"key {j} is the pad token {quoted(pad)}")
    total = -math.inf if reasons else 0.0
    p = "i" if pos == i else str(pos)
    seen = f" (j ≤ {p}, not a pad)" if causal else " (not a pad)"
    if W:
        seen = f" ({p} − {W} < j ≤ {p}, not a pad)"
    why = " and ".join(reasons) or f"{query} may look at key {j}{seen}"
    if layer is not None:
        why += f"; layer {layer.group(1)}'s mask (model.window.{layer.group(1)}: {W})"
    elif m.mixed_windows:
        full = [str(l) for l, w in enumerate(m.layer_windows) if not w]
        why += f"; the mask of the full-attention layers ({', '.join(full) or 'none'})"
    return _Parts([], total, note=why)


def _output(ctx: _Ctx, step: Step, cell: tuple[int, ...]) -> _Parts:
    """The stack's output is the last step it recorded (the same array)."""
    prev = next(s for s in ctx.trace if s.value is step.value and s.path != step.path)
    v = float(prev.value[cell])
    return _Parts(
        [f"{prev.path}{_idx(cell)}"],
        v,
        [f"the stack's output is {prev.path}, passed on unchanged"],
        {prev.path: [v]},
    )


EXPLAINERS: dict[str, Explainer] = {
    "embed": _embed,
    "pe": _pe,
    "token_type": _token_type,
    "input": _input,
    "mask": _mask,
    "cross_mask": _mask,
    "q_raw": _raw,
    "k_raw": _raw,
    "q_norm": _norm,
    "k_norm": _norm,
    "q": _projection,
    "k": _kept(_projection),
    "v": _kept(_linear),
    "q_a": _linear,
    "k_a": _linear,
    "tanh": _tanh,
    "q_b": _linear,
    "scores": _scores,
    "scaled": _scaled,
    "capped": _capped,
    "rel_bias": _rel_bias,
    "biased": _biased,
    "masked": _masked,
    "softmax": _softmax,
    "sink": _sink,
    "context": _context,
    "concat": _concat,
    "wo": _linear,
    "residual": _residual,
    "norm": _norm,
    "post_norm": _norm,
    "mean": _mean,
    "var": _var,
    "rms": _rms,
    "centered": _centered,
    "norm_out": _norm_out,
    "router": _linear,
    "gate": _shared_gate,
    "route_prob": _softmax,
    "routed": _routed,
    "x": _expert_input,
    "hidden": _linear,
    "act": _act,
    "up": _linear,
    "gated": _gated,
    "gate_clamp": _gate_clamp,
    "up_clamp": _up_clamp,
    "out": _ffn_out,
    "embed_norm": _norm,
    "final_norm": _norm,
    "output": _output,
    "logits_raw": _linear,
    "logits": _logits,
    "probs": _softmax,
    "pe_table": _pe_table,
}

# generate --sample's stages, `t<i>.sample.<name>`: not model steps (not in the registry).
SAMPLING_EXPLAINERS: dict[str, Explainer] = {
    "tempered": _tempered,
    "top_k": _top_k,
    "top_p": _top_p,
}


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------


def find_step(trace: Trace, name: str) -> Step:
    """A step by its path, or by a stage name or pattern that selects exactly one."""
    if name in trace:
        return trace[name]
    matches = trace.select(name)
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(s.path for s in matches[:8]) + (", …" if len(matches) > 8 else "")
        raise InputError(
            f"{quoted(name)} selects {len(matches)} steps; name one",
            expected="a full step path",
            found=shown,
        )
    generated = any(_ITERATION.match(p) for p in trace.steps)  # a run of generate
    if _ITERATION.match(name) and not generated:
        # an iteration of generate (t3.decoder...) asked of a run of encode or decode
        raise InputError(
            f"no step {quoted(name)} in this run: explain runs the model as decode does; "
            "a step of generate's iteration (t<i>.…) is explained by `trace-tf generate "
            "[CONFIG] [its options] --explain STEP --cell I,J`",
            expected="a step path of encode or decode, or a stage that selects one step",
            found=quoted(name),
        )
    operation = not any(p.startswith(("encoder.", "decoder.")) for p in trace.steps)
    raise InputError(
        f"no step {quoted(name)} in this run" + suggest_path(name, list(trace.steps)),
        expected=(
            "a step path (see `trace-tf generate --trace`) or a stage or pattern that selects one"
            if generated
            # a single operation's few steps (norm.mean, ...): encode and decode refuse its file
            else "one of its steps: " + ", ".join(trace.steps)
            if operation
            else "a step path (see `trace-tf encode` or `decode`) or a stage that selects one step"
        ),
        found=quoted(name),
    )


def parse_cell(text: str | None, step: Step) -> tuple[int, ...]:
    """`I,J` (as many indices as the step has dimensions); the first cell when omitted."""
    shape = step.shape
    if text is None:
        return tuple(0 for _ in shape)
    parts = text.replace(" ", "").split(",")
    # (signed only to be told that a negative index is outside)
    if not all(whole_number(part, signed=True) for part in parts):
        raise InputError(
            "--cell must be whole numbers separated by commas",
            expected="e.g. --cell 0,1",
            found=quoted(text),
        )
    cell = tuple(int(part) for part in parts)
    dims = " × ".join(str(n) for n in shape)
    if len(cell) != len(shape):
        raise InputError(
            f"--cell needs {len(shape)} indices for {step.path} (shape {dims})",
            expected=f"{len(shape)} comma-separated indices",
            found=quoted(text),
        )
    if any(not 0 <= c < n for c, n in zip(cell, shape, strict=True)):
        raise InputError(
            f"--cell {text} is outside {step.path}",
            expected=f"indices from 0 within the shape {dims}",
            found=quoted(text),
        )
    return cell


def _tidy(line: str) -> str:
    """`v_a = v_a = [1, 2]` -> `v_a = [1, 2]`: a symbol that is its own name."""
    parts = line.split(" = ")
    kept = [p for k, p in enumerate(parts) if k == 0 or p != parts[k - 1]]
    return "" if len(kept) == 1 and len(parts) > 1 else " = ".join(kept)


def explain(
    cfg: Config | OpConfig, trace: Trace, step: Step, cell: tuple[int, ...], precision: int = 4
) -> Explanation:
    """The entry `cell` of `step`, written out with its numbers and recomputed from them."""
    stage: Stage | None = stage_of(step.path)
    key, explainer = (stage.key, EXPLAINERS.get(stage.key)) if stage is not None else ("", None)
    if stage is None and re.match(rf"{_ITERATION.pattern}sample\.", step.path):
        key, explainer = step.stage, SAMPLING_EXPLAINERS.get(step.stage)
    if explainer is None:
        raise LookupError(  # a bug (tests/test_stages.py: every stage has one), not bad input
            f"explain: no explainer for step {step.path} (stage {key or '?'}) in EXPLAINERS"
        )
    arrays = named_arrays(cfg)
    named: dict[str, Source] = {}  # (each writing names the same weights)

    def written(f: _Fmt) -> _Parts:
        return explainer(_Ctx(cfg, trace, arrays, f, named), step, cell)

    in_full = written(_Fmt(None))  # every number in full: the result, and the operands
    f = _Fmt(precision)
    value, result, remarks = float(step.value[cell]), in_full.result, []
    order: int | None = None  # the engine fused them, in this order (see _Parts.fused)
    rtol = _rtol(step.value.dtype)
    if in_full.fused is not None and not all(_same(v, result) for v in in_full.fused):
        remarks.append(_overflow_remark(f, result, in_full.fused))
        if not _same(result, value, rtol):
            order = next((k for k, v in enumerate(in_full.fused) if _same(v, value, rtol)), None)
            result = result if order is None else in_full.fused[order]
    # The result is written at `precision`; the numbers it comes from with as many more
    # decimals as it takes for them to give that result (68 / 1.73 = 39, not 68 / 2 = 39).
    for digits in [*range(precision, 18), None]:
        parts = written(_Fmt(digits))
        got = parts.result if order is None or parts.fused is None else parts.fused[order]
        if f.num(got) == f.num(result):
            break
    chain = [*parts.chain, f.num(result) + (f"  ({parts.note})" if parts.note else "")]
    chain = [c for k, c in enumerate(chain) if k == 0 or c != chain[k - 1]]
    return Explanation(
        path=step.path,
        cell=cell,
        stage=key,
        formula=step.formula,
        value=value,
        result=result,
        chain=tuple(chain),
        where=tuple(_tidy(w) for w in parts.where if _tidy(w)),
        operands=in_full.operands,
        inputs=step.inputs if in_full.inputs is None else in_full.inputs,
        remarks=tuple(remarks),
        rtol=rtol,
        sources=named,
    )


def explain_named(
    cfg: Config | OpConfig, trace: Trace, name: str, cell: str | None, precision: int = 4
) -> Explanation:
    """The entry --cell `cell` (I,J; the first when None) of the step `name` of `trace`
    (a path, or a stage or pattern that selects one step), written out."""
    step = find_step(trace, name)
    return explain(cfg, trace, step, parse_cell(cell, step), precision)


def explanation_view(e: Explanation, precision: int = 4) -> RenderableType:
    """The explanation as the documents write it, with where each number comes from.
    A token in it is quoted as Python writes it, as in messages; control characters
    escaped."""
    f = _Fmt(precision)
    body: list[RenderableType] = [Text(e.formula, style="italic")]  # (wraps, unlike a title)
    body.extend(Text(printable(line), style="bold") for line in e.lines())
    if e.where:
        body.append(Text("where", style="dim"))
        body.extend(Text(f"  {printable(w)}") for w in e.where)
    body.extend(Text(f"note: {printable(r)}", style="yellow") for r in e.remarks)
    if e.agrees:
        check = Text(f"recorded value {f.num(e.value)}: the arithmetic above agrees", style="green")
    else:
        check = Text(
            f"recorded value {f.num(e.value)} but the arithmetic gives {f.num(e.result)}",
            style="bold red",
        )
    body.append(check)
    from trace_tf.render import titled_panel

    return titled_panel(Group(*body), Text(e.lhs, style="bold cyan"))
