"""What each stage costs: multiply-adds per step, and how they grow with L or D.

Lecture 000, section 5.4: the projections cost O(L D^2) and attention O(L^2 D),
so attention dominates once the sequence is longer than the model is wide. The
ledger is read off the engine itself: a tracer that keeps only shapes runs the
model; each step is looked up by its stage in the registry (stages.py), COSTS says
how that stage is computed, and a product's multiply-adds, rows x inner x columns,
are read off the shapes of the operands it was recorded with. Nothing about the
model's structure (which layers, heads and sublayers run, where RoPE applies) is
written twice here.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trace_tf import model
from trace_tf.config import Config, Document, build, check_size, overridden
from trace_tf.errors import InputError, quoted
from trace_tf.stages import stage_of
from trace_tf.text import whole_number
from trace_tf.trace import Labels, Tracer

Shape = tuple[int, ...]
Terms = tuple[int, int, int]  # rows, inner, columns


# How a product's operands are laid out, as recorded (`tr.rec(name, value, formula,
# *inputs)`): each reads rows · inner · columns off the operands' shapes, or gives
# None when the inputs are not of that layout (so a changed engine is caught, not
# silently miscounted). `shape` is the product's own.


def x_w(shape: Shape, inputs: Sequence[Shape]) -> Terms | None:
    """X W (+ b): X is m × n, W is n × p, the product m × p; a bias, when there is
    one, is p numbers (its adds are not multiply-adds)."""
    if len(inputs) in (2, 3) and len(inputs[0]) == len(inputs[1]) == 2:
        (m, n), (n_w, p) = inputs[:2]
        if n == n_w and shape == (m, p) and tuple(inputs[2:]) in ((), ((p,),)):
            return m, n, p
    return None


def x_heads(shape: Shape, inputs: Sequence[Shape]) -> Terms | None:
    """X [W_0 | … | W_n−1] (+ [b_0 | … ]): X is m × n, two or more heads' W each n × p_h,
    side by side m × Σ p_h (model.qk_norm projection's q_raw, k_raw); one head's is x_w."""
    weights = [s for s in inputs[1:] if len(s) == 2]
    biases = [s for s in inputs[1:] if len(s) == 1]
    if len(inputs) < 3 or len(inputs[0]) != 2 or len(weights) < 2:
        return None
    (m, n), p = inputs[0], sum(w[1] for w in weights)
    if (
        all(w[0] == n for w in weights)
        and shape == (m, p)
        and biases in ([], [(w[1],) for w in weights])
    ):
        return m, n, p
    return None


def q_kt(shape: Shape, inputs: Sequence[Shape]) -> Terms | None:
    """Q Kᵀ: Q is m × n, K is p × n, the scores m × p (dot, scaled_dot; bilinear's Q W_b)."""
    if len(inputs) == 2 and len(inputs[1]) == 2:
        return x_w(shape, [inputs[0], inputs[1][::-1]])  # Kᵀ is n × p
    return None


def pairs_v(shape: Shape, inputs: Sequence[Shape]) -> Terms | None:
    """tanh(…) v_a: the features are m × p × n (one row per query-key pair), v_a is n."""
    if len(inputs) == 2 and len(inputs[0]) == 3 and len(inputs[1]) == 1:
        (m, p, n), (n_v,) = inputs
        if n == n_v and shape == (m, p):
            return m, n, p
    return None


def pairs_w(shape: Shape, inputs: Sequence[Shape]) -> Terms | None:
    """Σ_f ((q_f − k_f) w_f)²: Q is m × n, K is p × n, w a number or n widths; one
    multiply-add per feature of each query-key pair, like Q Kᵀ."""
    if len(inputs) == 3 and inputs[2] in ((), (1,), inputs[0][-1:]):
        return q_kt(shape, inputs[:2])
    return None


def routed_sum(shape: Shape, inputs: Sequence[Shape]) -> Terms | None:
    """Σ_e W[i,e] · Y_e[r] (a mixture of experts' ffn.out): W is L × E, each chosen
    expert's out n_e × d, and every token's row is k of the Σ n_e = L·k rows, each
    scaled and added: L·k·d multiply-adds."""
    if len(inputs) < 2 or len(inputs[0]) != 2 or len(shape) != 2:
        return None
    (L, E), outs = inputs[0], inputs[1:]
    rows = sum(y[0] for y in outs if len(y) == 2 and y[1] == shape[1])
    each = all(0 < y[0] <= L for y in outs)  # (an expert computes some of the L tokens)
    if (
        each
        and len(outs) <= E
        and shape[0] == L
        and rows == sum(y[0] for y in outs)
        and rows % L == 0
    ):
        return L, rows // L, shape[1]
    return None


def gated_shared_sum(shape: Shape, inputs: Sequence[Shape]) -> Terms | None:
    """routed_sum, then + g ⊙ S (model.shared_expert gated): g is L × 1, the shared
    expert's out S is L × d, one multiply-add more per entry: L·(k+1)·d."""
    if len(inputs) > 3 and inputs[-2] == (shape[0], 1) and inputs[-1] == shape:
        terms = routed_sum(shape, inputs[:-2])
        return None if terms is None else (terms[0], terms[1] + 1, terms[2])
    return None


def plain_shared_sum(shape: Shape, inputs: Sequence[Shape]) -> Terms | None:
    """routed_sum, then + S (model.shared_expert plain): additions, no multiply-adds."""
    if len(inputs) > 2 and inputs[-1] == shape:
        return routed_sum(shape, inputs[:-1])
    return None


# a mixture's ffn.out by the shared expert's inputs it records after the experts' outs
SUMS = {0: routed_sum, 1: plain_shared_sum, 2: gated_shared_sum}


@dataclass(frozen=True)
class Product:
    """A step made by a matrix product: its kind, its multiply-adds in symbols (rows ·
    inner · columns) and how its operands are laid out."""

    kind: str
    formula: str
    layout: Callable[[Shape, Sequence[Shape]], Terms | None]

    def fit(self, shape: Shape, inputs: Sequence[Shape]) -> Terms | None:
        return self.layout(shape, inputs)


@dataclass(frozen=True)
class Free:
    """A step with no multiply-adds: elementwise (scaling, masks, softmax, residuals,
    norms, activations), a lookup or a copy. `of`: made from that one array of the
    step's own shape (RoPE's rotation of q_raw or k_raw: `does` rotates), and only so."""

    of: str | None = None
    does: str = "rotates"

    @property
    def formula(self) -> str:
        return "—" if self.of is None else f"— ({self.does} {self.of}, elementwise)"

    def fit(self, shape: Shape, inputs: Sequence[Shape]) -> tuple[()] | None:
        if self.of is None or (len(inputs) == 1 and inputs[0] == shape):
            return ()
        return None


@dataclass(frozen=True)
class Normed:
    """A step with no multiply-adds that normalises `of` by QK-norm (model.qk_norm): made
    from that array, of the step's own shape, and its γ and β, one number per column."""

    of: str

    @property
    def formula(self) -> str:
        return f"— (normalises {self.of}, elementwise)"

    def fit(self, shape: Shape, inputs: Sequence[Shape]) -> tuple[()] | None:
        if len(inputs) == 3 and inputs[0] == shape and inputs[1] == inputs[2] == shape[-1:]:
            return ()
        return None


@dataclass(frozen=True)
class Columns:
    """A step with no multiply-adds made from one head's columns of a wider array `of`
    (model.qk_norm projection: a head's q or k, of the block's q_norm or k_norm), copied or
    turned by RoPE: the same rows, a whole fraction of its columns."""

    of: str

    @property
    def formula(self) -> str:
        return f"— (a head's columns of {self.of}, elementwise)"

    def fit(self, shape: Shape, inputs: Sequence[Shape]) -> tuple[()] | None:
        if len(inputs) == 1 and len(inputs[0]) == len(shape) == 2:
            (rows, cols), (r, c) = inputs[0], shape
            if rows == r and cols > c and cols % c == 0:
                return ()
        return None


FREE = Free()
SHARED = "— (a shared K/V head's: computed in its group's first head)"

# Every stage a model records (the keys of stages.STAGES), each with the ways it is
# computed: exactly one must fit each recorded step, or `ledger` stops. A stage the
# engine records that is missing here stops it too; tests/test_cost.py checks that
# runs over every option record every stage and way listed, and nothing else.
COSTS: dict[str, tuple[Product | Free | Normed | Columns, ...]] = {
    "embed": (FREE,),  # a lookup
    "pe": (FREE,),
    "token_type": (FREE,),  # a lookup in the token-type table
    "input": (FREE,),
    "mask": (FREE,),
    "cross_mask": (FREE,),
    "q_raw": (
        Product("projection", "L_q·d_model·d_k", x_w),
        Product("projection", "L_q·d_model·(H·d_k)", x_heads),  # qk_norm projection: the block's
    ),
    "k_raw": (
        Product("projection", "L_k·d_model·d_k", x_w),
        Product("projection", "L_k·d_model·(H_kv·d_k)", x_heads),
    ),
    "q_norm": (Normed("q_raw"),),  # QK-norm before RoPE
    "k_norm": (Normed("k_raw"),),
    # a projection; RoPE's rotation (of q_raw, or of q_norm with QK-norm); QK-norm without RoPE
    "q": (
        Product("projection", "L_q·d_model·d_k", x_w),
        Free("q_raw (q_norm with QK-norm)"),
        Normed("q_raw"),
        Columns("the block's q_norm"),  # qk_norm projection
    ),
    "k": (
        Product("projection", "L_k·d_model·d_k", x_w),
        Free("k_raw (k_norm with QK-norm)"),
        Normed("k_raw"),
        Columns("the block's k_norm"),
    ),
    "v": (Product("projection", "L_k·d_model·d_v", x_w),),
    "q_a": (Product("projection", "L_q·d_k·d_a", x_w),),
    "k_a": (Product("projection", "L_k·d_k·d_a", x_w),),
    "tanh": (FREE,),
    "q_b": (Product("projection", "L_q·d_k·d_k", x_w),),
    "scores": (
        Product("attention", "L_q·d_k·L_k", q_kt),  # dot, scaled_dot, bilinear
        Product("attention", "L_q·d_a·L_k", pairs_v),  # additive
        Product("attention", "L_q·d_k·L_k", pairs_w),  # gaussian
    ),
    "scaled": (FREE,),
    "capped": (FREE,),  # c · tanh(s / c), elementwise
    "rel_bias": (FREE,),  # a lookup in the table of offsets; alibi: m times a distance
    "biased": (FREE,),
    "masked": (FREE,),
    "softmax": (FREE,),
    "sink": (FREE,),  # the sink's e^((s_h − m)/T) per row: elementwise, as softmax's
    "context": (Product("attention", "L_q·L_k·d_v", x_w),),
    "concat": (FREE,),
    "wo": (Product("projection", "L·(H·d_v)·d_model", x_w),),
    "residual": (FREE,),
    "norm": (FREE,),
    "post_norm": (FREE,),  # sandwich
    "mean": (FREE,),
    "var": (FREE,),
    "rms": (FREE,),
    "hidden": (Product("ffn", "L·d_model·d_ff", x_w),),
    "act": (FREE,),
    "up": (Product("ffn", "L·d_model·d_ff", x_w),),  # a gated FFN's second product
    "gated": (FREE,),  # act ⊙ U, elementwise
    "gate_clamp": (FREE,),  # swiglu_oss: min(H, limit), elementwise
    "up_clamp": (FREE,),  # swiglu_oss: clamp(U, ±limit) + 1, elementwise
    "router": (Product("ffn", "L·d_model·E", x_w),),  # a mixture of experts' router
    "route_prob": (FREE,),
    "routed": (FREE,),  # the top-k choice and its weights
    "x": (FREE,),  # the rows routed to an expert: a copy
    # a dense FFN's (and an expert's, on its L_e rows), or a mixture's weighted sum
    "out": (
        Product("ffn", "L·d_ff·d_model", x_w),
        Product("ffn", "L·k·d_model", routed_sum),  # each token's k outs, weighted
        Product("ffn", "L·k·d_model", plain_shared_sum),  # and the shared expert's, added
        Product("ffn", "L·(k+1)·d_model", gated_shared_sum),  # and g ⊙ S
    ),
    "gate": (Product("ffn", "L·d_model·1", x_w),),  # a shared expert's σ(X w_g): the product
    "embed_norm": (FREE,),
    "final_norm": (FREE,),
    "output": (FREE,),
    "logits_raw": (Product("output", "L·d_model·V", x_w),),
    # the product; or with model.logit_softcap or logit_scale, c · tanh(logits_raw / c),
    # s · logits_raw or both
    "logits": (Product("output", "L·d_model·V", x_w), Free("logits_raw", "caps or scales")),
    "probs": (FREE,),
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
    formula: str  # the multiply-adds in symbols ("—", perhaps with why, for none)
    terms: tuple[int, ...]  # the same in numbers: rows, inner, columns
    macs: int


@dataclass
class ShapeTracer(Tracer):
    """Keeps each step's path, shape and the shapes of its inputs; no values. And
    whether the step's array was recorded before (`again`): grouped-query attention
    records a K/V head's K and V, computed once, in each query head of its group."""

    shapes: list[tuple[str, tuple[int, ...], tuple[tuple[int, ...], ...], bool]] = field(
        default_factory=list
    )
    _seen: dict[int, weakref.ref[np.ndarray]] = field(default_factory=dict)

    def rec(
        self,
        name: str,
        value: np.ndarray,
        formula: str,
        *inputs: Any,
        cols: Labels | str = None,
        rows: Labels | str = None,
    ) -> np.ndarray:
        seen = self._seen.get(id(value))
        again = seen is not None and seen() is value  # (an id alone may be a dead array's)
        self._seen[id(value)] = weakref.ref(value)
        shapes = tuple(np.shape(x) for x in inputs)
        self.shapes.append((self.path(name), value.shape, shapes, again))
        return value


def ledger(cfg: Config) -> list[Cost]:
    """Every step the model computes, in order, with its multiply-adds; a product
    recorded again (a shared K or V) counts once, where it was computed."""
    tr = ShapeTracer()
    with np.errstate(all="ignore"):  # the numbers are not shown: their overflow is no news
        model.run_full(cfg, tr)
    m = cfg.model
    shared = {"none": 0, "plain": 1, "gated": 2}[m.shared_expert]
    return [
        cost_of(path, shape, inputs, again, m.experts_at(path) > 0, shared)
        for path, shape, inputs, again in tr.shapes
    ]


def classify(
    path: str,
    shape: Shape,
    inputs: Sequence[Shape],
    experts: bool | None = None,
    shared: int = 0,
) -> tuple[Product | Free | Normed | Columns, tuple[int, ...]]:
    """How a recorded step is computed (its entry in COSTS) and its terms; an error
    (a bug, not bad input) when no way, or more than one, fits. `experts`: whether the
    step's FFN (its layer's) is a mixture, whose ffn.out alone is a weighted sum (its shapes can be
    those of a product too: one expert for all L = E tokens); `shared`: the shared
    expert's inputs that ffn.out records after the experts' (SUMS: 0 none, 1 plain, 2
    gated)."""
    entry = stage_of(path)
    ways = COSTS.get(entry.key, ()) if entry is not None else ()
    if experts is not None and entry is not None and entry.key == "out":
        summed = experts and path.endswith(".ffn.out")
        ways = tuple(
            w
            for w in ways
            if isinstance(w, Product)
            and (w.layout is SUMS[shared] if summed else w.layout not in SUMS.values())
        )
    fits = [(way, terms) for way in ways if (terms := way.fit(shape, inputs)) is not None]
    if len(fits) != 1:
        raise LookupError(
            f"cost: step {path} (stage {entry.key if entry else '?'}, shape {shape}, inputs "
            f"{list(inputs)}) fits {len(fits)} of the {len(ways)} ways cost.COSTS lists for it"
        )
    return fits[0]


def cost_of(
    path: str,
    shape: Shape,
    inputs: Sequence[Shape],
    again: bool = False,
    experts: bool | None = None,
    shared: int = 0,
) -> Cost:
    """The step's cost; `again`: its array was recorded before (a K/V head's K or V in
    another query head of its group), and a product is not made twice; `experts`: as
    `classify`, and `shared`."""
    way, terms = classify(path, shape, inputs, experts, shared)
    stage = path.rsplit(".", 1)[-1]
    if again and (isinstance(way, Product) or way.of is not None):  # (a rotation, norm neither)
        return Cost(path, stage, "elementwise", shape, SHARED, (), 0)
    kind = way.kind if isinstance(way, Product) else "elementwise"
    return Cost(path, stage, kind, shape, way.formula, terms, math.prod(terms) if terms else 0)


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
    with np.errstate(all="ignore"):  # (outside the timed runs)
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
        raise InputError("malformed --vary", expected=expected, found=quoted(text))
    # a whole number between each two commas, none empty (`8,,16` would drop one unseen)
    items = [v.strip() for v in values.split(",")]
    if not all(map(whole_number, items)) or min(map(int, items)) < 1:
        raise InputError("malformed --vary", expected=expected, found=quoted(text))
    numbers = [int(v) for v in items]
    if len(set(numbers)) < len(numbers):  # a second row of one value measures nothing new
        raise InputError("malformed --vary", expected=f"{expected}, each once", found=quoted(text))
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
    # (keys below embeddings read against every token, the weights_file's included)
    d = overridden(doc, sets, variant, tokens=frozenset(t for t in base.embeddings if "." in t))
    if name == "L":
        with _naming_the_value(name, value, base):  # before the list is made
            check_size(d, base.model, len(base.vocab), [value], max_elements)
        for key, seq in (("source", base.source), ("target", base.target)):
            if key == "target" and base.model.decoder_layers:
                seq = model.target_of(base)
            if seq is None:
                continue
            rows: Sequence[Any] = (
                seq.tokens if seq.tokens is not None else np.asarray(seq.matrix).tolist()
            )
            d.data[key] = _cycled(rows, value)
            if seq.types is not None:  # each token's type goes with it
                d.data[f"{key}_types"] = _cycled(seq.types, value)
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
        for key in ("d_k", "d_v", "d_ff", "d_a"):  # each follows d_model by its default
            m.pop(key, None)
        if d.data.get("vocab") is None:  # the vocabulary the embeddings gave stays
            d.data["vocab"] = list(base.vocab)
        for key in ("embeddings", "weights", "weights_file"):
            d.data.pop(key, None)
    with _naming_the_value(name, value, base):
        cfg = build(d, (), None, max_elements, dtype)
    assert isinstance(cfg, Config)
    return cfg


@contextmanager
def _naming_the_value(name: str, value: int, base: Config) -> Iterator[None]:
    """The file was fine: an error building it resized says which --vary value did it."""
    try:
        yield
    except InputError as exc:
        exc.message = f"with --vary {name}={value}: {exc.message}"
        if name == "D" and exc.path == "model.n_heads":  # d_k follows D / n_heads: the
            # message's "or an explicit model.d_k" cannot help, --vary D drops it
            exc.expected = f"--vary D values divisible by model.n_heads ({base.model.n_heads})"
        raise


@dataclass(frozen=True)
class VaryRow:
    value: int
    by_kind: dict[str, int]
    total: int
    predicted: float  # seconds, from the multiply-adds, scaled to the measurement of the row of most multiply-adds
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
    ref = ref_totals.total
    # time x (macs / its macs): the ratio is 1.0 for that row, so it predicts its own time
    # exactly (macs x time / its macs could miss it by a unit in the last place)
    return [
        VaryRow(v, t.by_kind, t.total, ref_time * (t.total / ref) if ref else 0.0, s)
        for v, t, s in rows
    ]


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
