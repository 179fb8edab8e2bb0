"""The Transformer of Vaswani et al. (2017), composed from ops in the paper's order.

Every function is plain math on numpy arrays; each intermediate passes through
`tr.rec(...)`, which records it (or, with NULL_TRACER, does nothing) and returns
the array to go on with: the same numbers, perhaps the tracer's stored copy. One
attention serves self- and cross-attention, called under two scopes; one
add-and-norm serves every sublayer.

Shapes: L_q query positions, L_k key positions, d = d_model, H heads of d_k / d_v.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from trace_tf import ops
from trace_tf.config import (
    ROPE_PAIRS,
    TIED_OUTPUT,
    AttentionWeights,
    Config,
    FFNWeights,
    HeadWeights,
    LayerWeights,
    ModelConfig,
    MoEWeights,
    NormWeights,
    ScoreWeights,
    Sequence_,
)
from trace_tf.errors import InputError
from trace_tf.text import exact, spaced
from trace_tf.trace import NULL_TRACER, Tracer

Array = np.ndarray


# ---------------------------------------------------------------------------
# Formulas as shown to the user: one place, so the trace and the docs agree
# ---------------------------------------------------------------------------


def _plus(bias: Array | None, name: str) -> str:
    return f" + {name}" if bias is not None else ""


def _operands(x: Array, W: Array, b: Array | None) -> tuple[Array, ...]:
    """The inputs of `x W + b` as a step names them: the bias too, when there is one."""
    return (x, W) if b is None else (x, W, b)


# The `act` step's formula, by the activation applied to H (ModelConfig.act).
ACTIVATION_FORMULAS = {
    "relu": "ReLU(H)",
    "gelu": "GELU(H) (exact, erf)",
    "gelu_tanh": "GELU(H) (tanh approx.)",
    "silu": "SiLU(H) = H σ(H)",
}


def named(text: str) -> tuple[str, str]:
    """A constant as a formula names it, and its value said after the formula, so that
    `S / sqrt(d_k)` is not read as equal to it: "sqrt(d_k) ≈ 1.73205" ->
    ("sqrt(d_k)", ",  sqrt(d_k) ≈ 1.73205"); a plain number, "30" -> ("30", "")."""
    name, *value = re.split(" [=≈] ", text, maxsplit=1)
    return name, f",  {text}" if value else ""


def rope_formula(of: str, m: ModelConfig) -> str:
    """`RoPE(Q_raw, pos), pairs (2i, 2i+1)`: the rotation of `of`, naming its column pairs
    (and its frequency scaling, if any: `, llama3-scaled frequencies`); with rope_dims r,
    the r columns it turns, over which its pairs and frequencies are counted; with a RoPE
    by layer (model.pe_base or rope_scaling a list; `m` a layer's), the layer's base."""
    scaled = f", base {exact(m.pe_base)}" if m.mixed_rope else ""
    scaled += f", {m.rope_scaling.type}-scaled frequencies" if m.rope_scaling else ""
    pairs = ROPE_PAIRS[m.rope_pairs]
    if not m.rope_dims:
        return f"RoPE({of}, pos), pairs {pairs}{scaled}"
    r = m.rope_dims  # partial rotary: the columns r.. pass through
    kept = f", columns {r}..{m.d_k - 1} kept" if r < m.d_k else ""
    return (
        f"RoPE({of}, pos) of columns 0..{r - 1} (r = rope_dims {r}), pairs "
        f"{pairs.replace('d_k', 'r')}, θ_i = base^(−2i/r){scaled}{kept}"
    )


def rope_scaling_text(s: ops.RopeScaling, d: int, base: float) -> str:
    """What a RoPE scaling does to the frequencies θ_i = base^(−2i/d) of pairs of d
    columns, with every parameter: for the run's header and `explain`."""
    f = exact(s.factor)
    if s.type == "linear":
        return f"linear (position interpolation): θ_i ÷ factor {f}"
    if s.type == "llama3":
        L, low, high = s.original_max_len, s.low_freq_factor, s.high_freq_factor
        return (
            f"llama3: factor {f}, low_freq_factor {exact(low)}, high_freq_factor "
            f"{exact(high)}, original_max_len {L}: by wavelength λ_i = 2π/θ_i, θ_i kept for "
            f"λ_i < {exact(L / high)} (original_max_len / high_freq_factor), ÷ {f} for λ_i > "
            f"{exact(L / low)} (original_max_len / low_freq_factor), between (1 − k) θ_i / {f} "
            f"+ k θ_i, k = ({L}/λ_i − {exact(low)}) / ({exact(high)} − {exact(low)})"
        )
    low_pair, high_pair = ops.yarn_band(d, base, s)
    return (
        f"yarn: factor {f}, original_max_len {s.original_max_len}, beta_fast "
        f"{exact(s.beta_fast)}, beta_slow {exact(s.beta_slow)}"
        + (", truncate" if s.truncate else ", not truncated")
        + f": θ_i ÷ {f} · r + θ_i · (1 − r), r = clip((i − {exact(low_pair)}) / "
        f"({exact(high_pair)} − {exact(low_pair)}), 0, 1); cos and sin × attention factor "
        f"{exact(s.attention_factor)}"
    )


def norm_formula(m: ModelConfig, of: str) -> str:
    if m.norm == "rms":
        return f"{of} / √(mean({of}²) + ε) · γ + β,  ε = {exact(m.norm_eps)}"
    return f"({of} − mean) / √(var + ε) · γ + β,  ε = {exact(m.norm_eps)}, biased var"


# ---------------------------------------------------------------------------
# 3.5 Embeddings and positional encoding
# ---------------------------------------------------------------------------


def embed(cfg: Config, seq: Sequence_, tr: Tracer = NULL_TRACER, start: int = 0) -> Array:
    """Token embeddings (x embed_scale) + positional encoding + token types. tokens -> [L, d]

    Only sinusoidal and learned positions are added here; relative (a bias on the
    scores) and rope (a rotation of q and k) act in self-attention, none nowhere.
    With model.token_types, each position's row of the token-type table is added too
    (BERT's segment embedding). The tokens sit at positions start..start+L-1 (start > 0
    for the new tokens of a KV-cached decoding step)."""
    m = cfg.model
    if seq.matrix is not None:
        e = tr.rec("embed", seq.matrix, "E = the given matrix")
    else:
        assert seq.tokens is not None
        e = tr.rec(
            "embed", np.stack([cfg.embeddings[t] for t in seq.tokens]), "E = embedding[token]"
        )
    x = e * m.embed_scale if m.embed_scale != 1.0 else e
    name, where = named(m.embed_scale_text)  # `E · 2` or `E · sqrt(d_model)`
    scale = f" · {name}" if m.embed_scale != 1.0 else ""
    where = where if scale else ""
    if m.embed_norm:  # what layer 0 reads is Norm(X), the next step
        where += ";  normalised next (embed_norm)"
    L = len(seq)
    pe: Array | None = None
    if m.positional == "sinusoidal":
        pe = tr.rec(
            "pe",
            ops.sinusoidal_pe(L, m.d_model, m.pe_base, start, m.dtype),
            f"PE[pos,2i] = sin(pos/{exact(m.pe_base)}^(2i/d)), PE[pos,2i+1] = cos(…)",
        )
    elif m.positional == "learned":
        assert cfg.positional is not None
        pe = tr.rec(
            "pe",
            cfg.positional[start : start + L],
            "PE = positional[pos] (learned)",
            cfg.positional,
        )
    types: Array | None = None
    assert (seq.types is not None) == bool(m.token_types), "types go with model.token_types"
    if seq.types is not None:
        assert cfg.token_types is not None
        types = tr.rec(
            "token_type",
            cfg.token_types[list(seq.types)],
            f"T = token_types[type],  types {spaced(seq.types)}",
            cfg.token_types,
        )
    terms, added = [e], ""
    for term, name in ((pe, "PE"), (types, "T")):
        if term is not None:
            x, added = x + term, f"{added} + {name}"
            terms.append(term)
    # E itself when unscaled and nothing is added: no copy
    return tr.rec("input", x, f"X = E{scale}{added}{where}", *terms)


# ---------------------------------------------------------------------------
# 3.2.1 Scaled dot-product attention, 3.2.2 multi-head attention
# ---------------------------------------------------------------------------


@dataclass
class HeadCache:
    """One head's keys and values kept between decoding iterations (a KV cache).

    Self-attention (`grows`) appends the rows of each new position, so the keys of
    positions 0..t-1 are never recomputed; cross-attention fills it once from the
    encoder output and then only reads it. Arrays are replaced, never written in
    place, so a recorded K or V keeps the rows it had when it was recorded."""

    grows: bool
    k: Array | None = None  # [t, d_k], after RoPE when rope
    v: Array | None = None  # [t, d_v]
    scopes: tuple[str, ...] = ()  # per row: the tracer scope it was computed in

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[0]

    def extend(self, k: Array, v: Array, scope: str) -> tuple[Array, Array]:
        """Keep the new rows' keys and values, computed in the tracer scope `scope`:
        [cached; new] (self-attention) or the encoder's, once (cross-attention).
        -> the whole K and V"""
        new = (scope,) * len(k)
        if self.grows and self.k is not None and self.v is not None:
            k, v = np.concatenate([self.k, k]), np.concatenate([self.v, v])
            new = self.scopes + new
        self.k, self.v, self.scopes = k, v, new
        return k, v


@dataclass
class KVCache:
    """The decoder's KV cache: per layer, a HeadCache per self- and cross-attention K/V head,
    and the tokens whose keys are cached (positions 0..length-1)."""

    self_attn: list[list[HeadCache]]
    cross_attn: list[list[HeadCache]]
    tokens: tuple[str, ...] = ()

    @classmethod
    def empty(cls, cfg: Config) -> KVCache:
        kv_heads = range(cfg.model.n_kv_heads)  # one cache per K/V head, shared by its group
        return cls(
            self_attn=[[HeadCache(True) for _ in kv_heads] for _ in cfg.decoder],
            cross_attn=[
                [HeadCache(False) for _ in kv_heads] if lw.cross_attn else [] for lw in cfg.decoder
            ],
        )

    @property
    def length(self) -> int:
        return len(self.tokens)

    def fork(self) -> KVCache:
        """A copy that grows on its own (a beam); the cross-attention cache is shared."""
        return KVCache(
            self_attn=[
                [HeadCache(True, c.k, c.v, c.scopes) for c in layer] for layer in self.self_attn
            ],
            cross_attn=self.cross_attn,
            tokens=self.tokens,
        )


def project(x: Array, W: Array, b: Array | None) -> Array:
    """x W + b. [L, d] -> [L, d_head]"""
    return ops.linear(x, W, b)


# What a QK-norm step's formula says after the norm's: the axis and the weights' sharing
QK_NORM_NOTE = ";  QK-norm: each row's d_k entries, γ and β shared by every head of the block"


@dataclass(eq=False, slots=True)
class QKNormed:
    """A head's queries, or a K/V head's keys, normalised by QK-norm (model.qk_norm head),
    computed but not yet recorded: recorded as `name`, q_norm / k_norm when RoPE turns them
    next, else q / k, what the scores read; its statistics under it."""

    name: str
    value: Array  # [L, d_k]: the new rows only, for a KV-cached K
    formula: str
    stats: tuple[tuple[str, Array, str], ...]
    nw: NormWeights

    def record(self, tr: Tracer, raw: Array, shared: str = "") -> Array:
        """Record the statistics and the normalised rows of `raw` (its Q_raw or K_raw, as
        recorded), the formula followed by `shared`; -> the array as recorded."""
        record_statistics(tr, self.name, raw, self.stats)
        self.value = tr.rec(
            self.name, self.value, self.formula + shared, raw, self.nw.gamma, self.nw.beta
        )
        return self.value


def qk_normed(raw: Array, nw: NormWeights, m: ModelConfig, rotary: bool, of: str) -> QKNormed:
    """QK-norm of `raw`, `of` Q or K (Qwen3's q_norm, k_norm): model.norm over each row's d_k
    entries, before RoPE (then named q_norm / k_norm; else it is q / k). [L, d_k] -> [L, d_k]"""
    stats = norm_statistics(raw, m)
    name, lhs = (f"{of.lower()}_norm", f"{of}_norm") if rotary else (of.lower(), of)
    formula = f"{lhs} = " + norm_step_formula(m, f"{of}_raw", QK_NORM_NOTE)
    value = normed(raw, [v for _, v, _ in stats], nw, m)
    return QKNormed(name, value, formula, stats, nw)


# What a whole-projection QK-norm step's formula says after the norm's (qk_norm projection)
QK_PROJECTION_NOTE = (
    ";  QK-norm over the whole projection: each row's {n} entries, every head's, before the "
    "split into heads"
)


@dataclass(frozen=True, eq=False)
class WholeNormed:
    """A block's Q_raw or K_raw normalised over the whole projection (model.qk_norm
    projection: OLMo 2's q_norm(q_proj(x))), as recorded; each head reads its d_k columns."""

    value: Array  # [L, n·d_k]: a KV-cached K's new rows only
    of: str  # Q or K

    def columns(self, j: int, d_k: int) -> tuple[Array, str]:
        """Head j's columns (K/V head j's, of K), a contiguous copy, and how a formula
        names them: `Q_norm[:, 4..7]`."""
        a = j * d_k
        cols = np.ascontiguousarray(self.value[:, a : a + d_k])
        return cols, f"{self.of}_norm[:, {a}..{a + d_k - 1}]"


def whole_normed(
    x: Array,
    heads: Sequence[HeadWeights],
    nw: NormWeights,
    m: ModelConfig,
    of: str,
    tr: Tracer = NULL_TRACER,
    src: str = "X",
) -> WholeNormed:
    """QK-norm over the whole projection (model.qk_norm projection, OLMo 2): every head's
    X W + b side by side, [X W_0 + b_0 | … ] = X W_q of the fused weight, recorded as the
    block's q_raw / k_raw, then model.norm over all n·d_k entries of each row (γ, β of
    n·d_k), recorded as q_norm / k_norm. `heads`: the query heads (Q), or each K/V head's
    first query head (K); `src` names x (Enc: the encoder output). [L, d] -> [L, n·d_k]"""
    name, W, b = of.lower(), f"W_{of.lower()}", f"b_{of.lower()}"
    weights = [getattr(hw, W) for hw in heads]
    biases = [getattr(hw, b) for hw in heads if getattr(hw, b) is not None]
    n = "n_heads" if of == "Q" else "n_kv_heads"
    plus = f" + [b_{name},0 | … ]" if biases else ""
    raw = tr.rec(
        f"{name}_raw",
        np.concatenate([project(x, getattr(hw, W), getattr(hw, b)) for hw in heads], axis=-1),
        f"{of}_raw = {src} [W_{name},0 | … | W_{name},{len(heads) - 1}]{plus}: every head's "
        f"columns, {n}·d_k = {len(heads) * m.d_k}",
        x,
        *weights,
        *biases,
    )
    note = QK_PROJECTION_NOTE.format(n=raw.shape[1])
    normed = normalize(raw, nw, m, f"{name}_norm", tr, f"{of}_raw", note)
    return WholeNormed(normed, of)


@dataclass(eq=False, slots=True)
class KeysValues:
    """One K/V head's K and V (and K_raw, with RoPE), with the formula and inputs each
    step records. Grouped-query attention computes them once, in the first query head
    of the group, and records the same arrays in each of its query heads."""

    k: Array  # [L_k, d_k], after RoPE when rope
    v: Array  # [L_k, d_v]
    k_formula: str
    v_formula: str
    k_inputs: tuple[Array, ...]
    v_inputs: tuple[Array, ...]
    # rope or QK-norm: the new rows of X W_k (+ b_k), before the rotation and the norm
    k_raw: Array | None = None
    k_raw_formula: str = ""
    scopes: tuple[str, ...] | None = None  # KV-cached: the scope each row was computed in
    k_norm: QKNormed | None = None  # QK-norm of K_raw: k_norm before RoPE, else K itself

    def record(self, tr: Tracer, shared: str = "") -> None:
        """Record K_raw, the norm of QK-norm, K and V in the current scope, each formula
        followed by `shared` (", K/V head 1 (shared by h2, h3)"), and go on with the
        arrays as recorded."""
        k_inputs = self.k_inputs
        if self.k_raw is not None:
            self.k_raw = tr.rec("k_raw", self.k_raw, self.k_raw_formula + shared, *k_inputs)
            k_inputs = (self.k_raw,)
        if self.k_norm is not None and self.k_raw is not None:
            n = self.k_norm
            if n.name == "k_norm":  # RoPE turns it next
                k_inputs = (n.record(tr, self.k_raw, shared),)
            else:  # K is the norm itself (its cached rows before it): its statistics first
                record_statistics(tr, n.name, self.k_raw, n.stats)
                k_inputs = (self.k_raw, n.nw.gamma, n.nw.beta)
        self.k = tr.rec("k", self.k, self.k_formula + shared, *k_inputs, rows="keys")
        self.v = tr.rec("v", self.v, self.v_formula + shared, *self.v_inputs, rows="keys")
        if self.scopes is not None:
            tr.computed_in("k", self.scopes)
            tr.computed_in("v", self.scopes)


def keys_values(
    x_kv: Array,
    hw: HeadWeights,
    m: ModelConfig,
    rotary: bool,
    src: str,
    start: int,
    cache: HeadCache | None = None,
    scope: str = "",
    whole: tuple[WholeNormed, int] | None = None,
) -> KeysValues:
    """K = X W_k + b_k (normalised by QK-norm, then rotated from position `start` with
    RoPE) and V = X W_v + b_v of one K/V head, not yet recorded. [L_k, d] -> [L_k, d_k], [L_k, d_v]

    `whole` (qk_norm projection): the block's normalised K and this K/V head's index, whose
    columns K is (turned by RoPE), in place of its own projection and norm.

    With a `cache`, self-attention computes K and V for the new rows only, at
    positions start.. after the cached ones, keeps them as computed in `scope` and
    returns [cached; new]; cross-attention computes K and V of the encoder output
    once and reuses them."""
    k_formula = f"K = {src} W_k" + _plus(hw.b_k, "b_k")
    v_formula = f"V = {src} W_v" + _plus(hw.b_v, "b_v")
    if cache is not None and not cache.grows and cache.k is not None and cache.v is not None:
        # Cross-attention after the first iteration: the encoder's K and V, cached.
        cached = " (cached)"
        return KeysValues(
            cache.k, cache.v, k_formula + cached, v_formula + cached, (), (), scopes=cache.scopes
        )
    k_raw, k_raw_formula, k_norm, k_of = None, "", None, "K_raw"
    if whole is not None:  # qk_norm projection: its columns of the block's K_norm
        k, k_of = whole[0].columns(whole[1], m.d_k)
        k_inputs: tuple[Array, ...] = (whole[0].value,)
        k_formula = f"K = {k_of}"
    else:
        k = project(x_kv, hw.W_k, hw.b_k)
        k_inputs = _operands(x_kv, hw.W_k, hw.b_k)
    head_norm = hw.k_norm is not None and m.qk_norm == "head"
    if whole is None and (rotary or head_norm):
        k_raw, k_raw_formula = k, k_formula  # the new rows only
    if k_raw is not None and head_norm:
        assert hw.k_norm is not None
        k_norm = qk_normed(k_raw, hw.k_norm, m, rotary, "K")
        k, k_formula, k_of = k_norm.value, k_norm.formula, "K_norm"
    if rotary:
        positions = start + np.arange(len(k))
        k = ops.rope(k, positions, m.pe_base, m.rope_pairs, m.rope_scaling, m.rope_dims)
        k_formula = "K = " + rope_formula(k_of, m)
    v = project(x_kv, hw.W_v, hw.b_v)
    scopes = None
    if cache is not None:
        if start:  # the keys and values of positions 0..start-1 come from the cache
            k_formula = f"K = [cached K, 0..{start - 1}; {k_formula.removeprefix('K = ')}]"
            v_formula = f"V = [cached V, 0..{start - 1}; {v_formula.removeprefix('V = ')}]"
        k, v = cache.extend(k, v, scope)
        scopes = cache.scopes
    v_inputs = _operands(x_kv, hw.W_v, hw.b_v)
    return KeysValues(
        k, v, k_formula, v_formula, k_inputs, v_inputs, k_raw, k_raw_formula, scopes, k_norm
    )


@dataclass(frozen=True)
class Alibi:
    """ALiBi's fixed bias of one self-attention head (Press et al. 2022; model.positional
    alibi): its slope m and how the slope is written, and whether the attention is
    bidirectional (an encoder's: −m·|i − j|) or causal (−m·(i − j))."""

    slope: float
    slope_text: str  # 2^(−8·1/4)
    symmetric: bool


def alibi_slope_text(h: int, m: ModelConfig) -> str:
    """How head h's slope is formed: given (model.alibi_slopes), or by the paper's rule
    (ops.alibi_slopes), 2^(−8·(h+1)/H), or for H not a power of two, 2^(−8·(h+1)/H')
    then 2^(−8·(2k+1)/(2H')), H' = 2^⌊log₂ H⌋."""
    if m.alibi_slopes is not None:
        return f"model.alibi_slopes[{h}]"
    below = ops.alibi_power(m.n_heads)
    if h < below:
        return f"2^(−8·{h + 1}/{below})"
    return f"2^(−8·{2 * (h - below) + 1}/{2 * below})"


def alibi_slopes(m: ModelConfig) -> Array:
    """Each head's ALiBi slope: model.alibi_slopes as given, else the paper's rule. -> [H]"""
    if m.alibi_slopes is not None:
        return np.array(m.alibi_slopes, dtype=np.float64)
    return ops.alibi_slopes(m.n_heads)


def alibi_rule(m: ModelConfig) -> str:
    """Where the slopes come from, for the header: given, or the paper's rule for this H."""
    if m.alibi_slopes is not None:
        return "given (model.alibi_slopes)"
    below = ops.alibi_power(m.n_heads)
    if below == m.n_heads:
        return "= 2^(−8(h+1)/H)"
    return (
        f"= 2^(−8(h+1)/H') then 2^(−8(2k+1)/(2H')), H' = {below} (Hugging Face's, for H "
        "not a power of two)"
    )


def alibi_heads(m: ModelConfig, symmetric: bool) -> tuple[Alibi, ...] | None:
    """Each head's ALiBi bias with positional alibi (a self-attention's), else None."""
    if m.positional != "alibi":
        return None
    return tuple(
        Alibi(float(s), alibi_slope_text(h, m), symmetric) for h, s in enumerate(alibi_slopes(m))
    )


def alibi_formula(a: Alibi, start: int) -> str:
    """B's formula with this head's slope: query row i at position start + i."""
    row = "i" if start == 0 else f"({start} + i)"
    distance = f"|{row} − j|" if a.symmetric else f"({row} − j)"
    return f"B[i,j] = −m·{distance},  m = {a.slope_text} = {exact(a.slope)}"


def attention_head(
    x_q: Array,
    x_kv: Array,
    hw: HeadWeights,
    mask: Array | None,
    m: ModelConfig,
    rotary: bool,
    tr: Tracer = NULL_TRACER,
    cache: HeadCache | None = None,
    *,
    start: int = 0,
    kv: KeysValues | None = None,
    shared: str = "",
    alibi: Alibi | None = None,
    whole: tuple[WholeNormed, WholeNormed | None, int] | None = None,
) -> tuple[Array, KeysValues]:
    """softmax(Q Kᵀ / scale + B + M) V for one head (eq. 1; B, the relative position
    bias of 000 section 6.2 with positional relative, ALiBi's fixed one with positional
    alibi: `alibi`). [L_q, d] x [L_k, d] -> [L_q, d_v]

    With QK-norm (model.qk_norm; `hw.q_norm`, the block's) Q is normalised before RoPE, as
    K is in `keys_values`. The query rows sit at positions start.. (after the cached ones,
    with a KV cache).
    K and V are computed here (`keys_values`, with the K/V head's `cache`), or are `kv`,
    which another query head of the same K/V head computed (grouped-query attention);
    -> the head's output, and its K and V as recorded, for the other query heads.

    `whole` (qk_norm projection): the block's normalised Q and K (K None when cached)
    and this head's index: Q is its columns of Q_norm, turned by RoPE, recorded as q."""
    src = "X" if x_q is x_kv else "Enc"
    q_of = "Q_raw"
    if whole is not None:  # qk_norm projection: its columns of the block's Q_norm
        q_whole = whole[0].value
        q, q_of = whole[0].columns(whole[2], m.d_k)
        if not rotary:
            q = tr.rec("q", q, f"Q = {q_of}", q_whole)
    else:
        q_whole = q = tr.rec(
            "q_raw" if rotary or hw.q_norm is not None else "q",
            project(x_q, hw.W_q, hw.b_q),
            "Q = X W_q" + _plus(hw.b_q, "b_q"),
            *_operands(x_q, hw.W_q, hw.b_q),
        )
        if hw.q_norm is not None:  # QK-norm, before RoPE (Qwen3's q_norm)
            q = q_whole = qk_normed(q, hw.q_norm, m, rotary, "Q").record(tr, q)
            q_of = "Q_norm"
    if rotary:
        q = tr.rec(
            "q",
            ops.rope(
                q, start + np.arange(len(q)), m.pe_base, m.rope_pairs, m.rope_scaling, m.rope_dims
            ),
            "Q = " + rope_formula(q_of, m),
            q_whole,
        )
    if kv is None:
        k_whole = None
        if whole is not None and whole[1] is not None:
            k_whole = (whole[1], m.kv_head(whole[2]))
        kv = keys_values(x_kv, hw, m, rotary, src, start, cache, tr.path(""), k_whole)
    kv.record(tr, shared)
    out = attend(
        q,
        kv.k,
        kv.v,
        mask,
        m.scale,
        m.scale_text,
        m.temperature,
        tr,
        score=m.score,
        sw=hw.score,
        rel_bias=hw.rel_bias,
        alibi=alibi,
        start=start,
        softcap=m.attn_softcap,
        sink=hw.sink,
    )
    return out, kv


# Each score function records its pieces and returns S [L_q, L_k] (003, 004).


def _dot(q: Array, k: Array, sw: ScoreWeights, tr: Tracer) -> Array:
    return tr.rec("scores", ops.dot_scores(q, k), "S = Q Kᵀ", q, k, cols="keys")


def _bilinear(q: Array, k: Array, sw: ScoreWeights, tr: Tracer) -> Array:
    assert sw.W_b is not None
    q_b = tr.rec("q_b", q @ sw.W_b, "Q W_b", q, sw.W_b)
    return tr.rec("scores", ops.bilinear_scores(q_b, k), "S = (Q W_b) Kᵀ", q_b, k, cols="keys")


def _additive(q: Array, k: Array, sw: ScoreWeights, tr: Tracer) -> Array:
    assert sw.W_a_q is not None and sw.W_a_k is not None and sw.v_a is not None
    q_a = tr.rec("q_a", q @ sw.W_a_q, "Q W_a_q", q, sw.W_a_q)
    k_a = tr.rec("k_a", k @ sw.W_a_k, "K W_a_k", k, sw.W_a_k, rows="keys")
    feats = tr.rec(
        "tanh", ops.additive_features(q_a, k_a), "tanh(q_a[i] + k_a[j]), per feature", q_a, k_a
    )
    return tr.rec(
        "scores",
        ops.additive_scores(feats, sw.v_a),
        "S[i,j] = v_aᵀ tanh(q_a[i] + k_a[j])",
        feats,
        sw.v_a,
        cols="keys",
    )


def _gaussian(q: Array, k: Array, sw: ScoreWeights, tr: Tracer) -> Array:
    assert sw.w is not None
    return tr.rec(
        "scores",
        ops.gaussian_scores(q, k, sw.w),
        "S[i,j] = −½ Σ_f ((q_if − k_jf) w_f)²  (Gaussian kernel)",
        q,
        k,
        sw.w,
        cols="keys",
    )


SCORE_FUNCTIONS = {
    "scaled_dot": _dot,
    "dot": _dot,
    "additive": _additive,
    "bilinear": _bilinear,
    "gaussian": _gaussian,
}


def attend(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None,
    scale: float,
    scale_text: str,
    temperature: float = 1.0,
    tr: Tracer = NULL_TRACER,
    *,
    score: str = "scaled_dot",
    sw: ScoreWeights | None = None,
    rel_bias: Array | None = None,
    alibi: Alibi | None = None,
    start: int = 0,
    softcap: float | None = None,
    sink: Array | None = None,
) -> Array:
    """softmax((score(Q, K) / scale + B + M) / T) V. [L_q, d_q] x [L_k, d_k] x [L_k, d_v] -> [L_q, d_v]

    The score function is chosen by name (SCORE_FUNCTIONS); the default is the
    paper's scaled dot product Q Kᵀ / √d_k (eq. 1). B, with a `rel_bias` table, is the
    relative position bias of lecture 000 section 6.2: B[i,j] = rel_bias[max_len − 1 +
    j − i], query row i at position start + i; with `alibi`, ALiBi's B[i,j] = −m·(i − j)
    (bidirectional: −m·|i − j|), recorded as the same steps rel_bias and biased.
    With a `softcap` c (Gemma 2's attn_logit_softcapping), the scaled scores are capped
    first, S_c = c · tanh((S / scale) / c), and B and M added to S_c: a −inf of M stays
    −inf, where capped after it would be −c, and the masked key weighted.
    With a `sink` logit s (GPT-OSS's attention sinks), e^(s/T) joins each row's denominator
    (ops.softmax_with_sink), recorded as softmax, and the weight it took as the step sink.
    """
    scores = SCORE_FUNCTIONS[score](q, k, sw if sw is not None else ScoreWeights(), tr)
    name, where = named(scale_text)
    scaled = tr.rec("scaled", scores / scale, f"S / {name}{where}", scores, cols="keys")
    so_far = "S / scale"  # what B and M are added to
    if softcap is not None:
        scaled = tr.rec(
            "capped",
            ops.softcap(scaled, softcap),
            f"S_c = c · tanh((S / scale) / c),  c = {exact(softcap)} (soft cap)",
            scaled,
            cols="keys",
        )
        so_far = "S_c"
    plus_b = ""
    if rel_bias is not None:
        row = "i" if start == 0 else f"({start} + i)"  # query row i is position start + i
        b = tr.rec(
            "rel_bias",
            ops.relative_bias(rel_bias, len(q), len(k), start),
            f"B[i,j] = b_rel[j − {row}],  b_rel[o] = rel_bias[{ops.offset_zero(rel_bias)} + o]",
            rel_bias,
            cols="keys",
        )
    elif alibi is not None:
        b = tr.rec(
            "rel_bias",
            ops.alibi_bias(alibi.slope, len(q), len(k), start, alibi.symmetric).astype(q.dtype),
            alibi_formula(alibi, start),
            cols="keys",
        )
    if rel_bias is not None or alibi is not None:
        scaled = tr.rec("biased", scaled + b, f"{so_far} + B", scaled, b, cols="keys")
        plus_b = " + B"
    if mask is not None:
        with np.errstate(invalid="ignore"):
            scaled = tr.rec(
                "masked",
                scaled + mask,
                f"{so_far}{plus_b} + M  (M additive: −inf masks)",
                scaled,
                mask,
                cols="keys",
            )
    temp = f" / T, T = {exact(temperature)}" if temperature != 1.0 else ""
    if sink is None:
        weights = tr.rec(
            "softmax",
            ops.softmax(scaled, temperature),
            f"A = softmax(row{temp})",
            scaled,
            cols="keys",
        )
    else:
        weights, taken = ops.softmax_with_sink(scaled, sink, temperature)
        s, t = ("s_h", "") if temperature == 1.0 else ("s_h/T", "/T")
        denominator = f"Σ_k e^(S[i,k]{t}) + e^({s})"
        weights = tr.rec(
            "softmax",
            weights,
            f"A[i,j] = e^(S[i,j]{t}) / ({denominator}),  s_h = {exact(float(sink))} (the "
            f"head's sink)" + (f", T = {exact(temperature)}" if temperature != 1.0 else ""),
            scaled,
            sink,
            cols="keys",
        )
        tr.rec(
            "sink",
            taken,
            f"e^({s}) / ({denominator}) = 1 − Σ_j A[i,j]  (the sink's weight)",
            scaled,
            sink,
            cols=("sink",),
        )
    return tr.rec("context", weights @ v, "A V", weights, v)


def multi_head_attention(
    x_q: Array,
    x_kv: Array,
    aw: AttentionWeights,
    mask: Array | None,
    m: ModelConfig,
    rotary: bool,
    tr: Tracer = NULL_TRACER,
    cache: Sequence[HeadCache] | None = None,
    alibi: Sequence[Alibi] | None = None,
) -> Array:
    """Concat(head_1..head_H) W_o + b_o (section 3.2.2). [L_q, d] x [L_k, d] -> [L_q, d]

    Grouped-query attention (Ainslie et al. 2023): query head h reads K/V head
    h // (H / H_kv), whose K and V its group's first head computes (with the K/V
    head's `cache`) and the others reuse; H_kv = H is the paper's multi-head attention.

    QK-norm over the whole projection (model.qk_norm projection) normalises Q and K of the
    block once, before the heads (`whole_normed`); each head reads its columns."""
    first = cache[0] if cache is not None else None
    start = first.length if first is not None and first.grows else 0  # position of row 0
    whole: tuple[WholeNormed, WholeNormed | None] | None = None
    if m.qk_norm == "projection":
        q_nw, k_nw = aw.heads[0].q_norm, aw.heads[0].k_norm
        assert q_nw is not None and k_nw is not None
        q_whole = whole_normed(x_q, aw.heads, q_nw, m, "Q", tr)
        k_whole = None  # a cross-attention's K, once computed, comes from its cache
        if first is None or first.grows or first.k is None:
            kv_heads = aw.heads[:: m.group]  # each K/V head's first query head
            src = "X" if x_q is x_kv else "Enc"
            k_whole = whole_normed(x_kv, kv_heads, k_nw, m, "K", tr, src)
        whole = (q_whole, k_whole)
    heads = []
    for j in range(m.n_kv_heads):  # K/V head j, read by query heads j·group..
        c = cache[j] if cache is not None else None
        kv, shared = None, _shared(m, j)  # computed by the group's first query head
        for h in range(j * m.group, (j + 1) * m.group):
            with tr.scope(f"h{h}"):
                out, kv = attention_head(
                    x_q,
                    x_kv,
                    aw.heads[h],
                    mask,
                    m,
                    rotary,
                    tr,
                    c,
                    start=start,
                    kv=kv,
                    shared=shared,
                    alibi=alibi[h] if alibi is not None else None,
                    whole=(*whole, h) if whole is not None else None,
                )
            heads.append(out)
    concat = tr.rec("concat", np.concatenate(heads, axis=-1), "[head_0 | … | head_H-1]", *heads)
    return tr.rec(
        "wo",
        ops.linear(concat, aw.W_o, aw.b_o),
        "concat W_o" + _plus(aw.b_o, "b_o"),
        *_operands(concat, aw.W_o, aw.b_o),
    )


def _shared(m: ModelConfig, j: int) -> str:
    """`, K/V head 1 (shared by h2, h3)`: what a K or V formula adds under grouped-query
    attention; nothing under multi-head attention."""
    if not m.grouped:
        return ""
    group = range(j * m.group, (j + 1) * m.group)
    return f", K/V head {j} (shared by {', '.join(f'h{h}' for h in group)})"


# ---------------------------------------------------------------------------
# 3.3 Position-wise feed-forward
# ---------------------------------------------------------------------------


def feed_forward(x: Array, fw: FFNWeights, m: ModelConfig, tr: Tracer = NULL_TRACER) -> Array:
    """act(x W_1 + b_1) W_2 + b_2 (eq. 2); gated (swiglu, geglu, geglu_tanh; Shazeer 2020):
    (act(x W_1 + b_1) ⊙ (x W_3 + b_3)) W_2 + b_2; GPT-OSS's swiglu_oss: clamped_swiglu.
    [L, d] -> [L, d_ff] -> [L, d]"""
    hidden = tr.rec(
        "hidden",
        ops.linear(x, fw.W_1, fw.b_1),
        "H = X W_1" + _plus(fw.b_1, "b_1"),
        *_operands(x, fw.W_1, fw.b_1),
    )
    if m.activation == "swiglu_oss":  # what W_2 projects back to d_model
        down, name = clamped_swiglu(x, hidden, fw, m, tr), "gated"
    else:
        act = tr.rec("act", ops.ACTIVATIONS[m.act](hidden), ACTIVATION_FORMULAS[m.act], hidden)
        down, name = act, "act"
        if fw.W_3 is not None:  # gated: the activation gates an up projection of x
            up = up_projection(x, fw, tr)
            down, name = tr.rec("gated", act * up, "act ⊙ U", act, up), "gated"
    return tr.rec(
        "out",
        ops.linear(down, fw.W_2, fw.b_2),
        f"{name} W_2" + _plus(fw.b_2, "b_2"),
        *_operands(down, fw.W_2, fw.b_2),
    )


def up_projection(x: Array, fw: FFNWeights, tr: Tracer) -> Array:
    """A gated FFN's up projection U = X W_3 + b_3, the features its gate scales."""
    assert fw.W_3 is not None
    return tr.rec(
        "up",
        ops.linear(x, fw.W_3, fw.b_3),
        "U = X W_3" + _plus(fw.b_3, "b_3"),
        *_operands(x, fw.W_3, fw.b_3),
    )


def clamped_swiglu(
    x: Array, hidden: Array, fw: FFNWeights, m: ModelConfig, tr: Tracer = NULL_TRACER
) -> Array:
    """GPT-OSS's clamped SwiGLU (activation swiglu_oss), from the gate H = X W_1 + b_1:
    G = min(H, limit), act = G σ(α G), U' = clamp(X W_3 + b_3, ±limit) + 1, and act ⊙ U',
    which feed_forward projects by W_2 (Hugging Face's GptOssExperts._apply_gate).
    [L, d_ff] -> [L, d_ff]"""
    limit, alpha = exact(m.swiglu_limit), exact(m.swiglu_alpha)
    gate = tr.rec(
        "gate_clamp",
        ops.clamp_gate(hidden, m.swiglu_limit),
        f"G = min(H, {limit}) (swiglu_limit)",
        hidden,
    )
    act = tr.rec(
        "act",
        ops.swish_alpha(gate, m.swiglu_alpha),
        f"G σ({alpha} G) (swiglu_alpha)",
        gate,
    )
    up = up_projection(x, fw, tr)
    up1 = tr.rec(
        "up_clamp",
        ops.clamp_up(up, m.swiglu_limit),
        f"U' = clamp(U, −{limit}, {limit}) + 1 (swiglu_limit)",
        up,
    )
    return tr.rec("gated", act * up1, "act ⊙ U'", act, up1)


def ffn_sublayer(
    x: Array, fw: FFNWeights | MoEWeights, m: ModelConfig, tr: Tracer = NULL_TRACER
) -> Array:
    """The FFN sublayer: one dense FFN, or a mixture of experts (model.experts). [L, d] -> [L, d]"""
    if isinstance(fw, MoEWeights):
        return mixture_of_experts(x, fw, m, tr)
    return feed_forward(x, fw, m, tr)


def expert_labels(E: int) -> tuple[str, ...]:
    """The experts as a step's columns and scopes name them: e0, e1, ... (as heads h0, h1)."""
    return tuple(f"e{e}" for e in range(E))


def routed_formula(m: ModelConfig) -> str:
    """The `routed` step's formula: the top-k rule, its ties and the renormalisation."""
    k = m.experts_top_k
    top = f"e among the k = {k} of largest P[i,·] in row i (ties: the lowest index)"
    if m.experts_normalize:
        return f"W[i,e] = P[i,e] / Σ_(c chosen) P[i,c] for {top}, else 0 (renormalised)"
    return f"W[i,e] = P[i,e] for {top}, else 0 (not renormalised)"


def mixture_of_experts(x: Array, mw: MoEWeights, m: ModelConfig, tr: Tracer = NULL_TRACER) -> Array:
    """A sparse mixture of experts (Mixtral; Shazeer et al. 2017): the router's logits
    X W_r (+ b_r, GPT-OSS's), their softmax over the E experts, each token's k most
    probable experts and their weights (renormalised to sum to 1 with
    experts_normalize); each expert, the FFN
    of model.activation, runs on the rows of the tokens sent to it only, and out[i] =
    Σ_e routed[i,e] · expert e's out for token i, the experts in index order. An expert
    no token chose computes and records nothing. [L, d] -> [L, E] -> [L, d]"""
    labels = expert_labels(len(mw.experts))
    logits = tr.rec(
        "router",
        ops.linear(x, mw.router, mw.router_bias),
        "R = X W_r" + _plus(mw.router_bias, "b_r") + " (a logit per expert)",
        *_operands(x, mw.router, mw.router_bias),
        cols=labels,
    )
    probs = tr.rec(
        "route_prob",
        ops.softmax(logits),
        "P = softmax(R) over the experts",
        logits,
        cols=labels,
    )
    chosen = ops.top_experts(probs, m.experts_top_k)
    weights = tr.rec(
        "routed",
        ops.routing_weights(probs, chosen, m.experts_normalize),
        routed_formula(m),
        probs,
        cols=labels,
    )
    tokens = tr.row_labels()
    out = np.zeros_like(x)
    outs = []
    for e, fw in enumerate(mw.experts):
        rows = np.flatnonzero((chosen == e).any(axis=-1))
        if not len(rows):
            continue
        with tr.scope(f"e{e}", rows=None if tokens is None else [tokens[i] for i in rows]):
            xe = tr.rec(
                "x",
                x[rows],
                f"X_e = rows {spaced(rows.tolist())} of X: the tokens routed to expert {e}",
                x,
            )
            ye = feed_forward(xe, fw, m, tr)
        out[rows] += weights[rows, e, None] * ye
        outs.append(ye)
    formula = (
        "Σ_e routed[i,e] · e<e>.out (the row of token i; each token's k experts, in index order)"
    )
    shared: list[Array] = []
    if mw.shared is not None:  # Qwen2-MoE's, DeepSeek's: every token, added to the routed sum
        with tr.scope("shared"):
            ys = feed_forward(x, mw.shared, m, tr)
            shared = [ys]
            if mw.shared_gate is not None:
                gate = tr.rec(
                    "gate",
                    ops.sigmoid(ops.linear(x, mw.shared_gate)),
                    "g = σ(X w_g) (a weight per token; w_g: ffn.shared_gate)",
                    *_operands(x, mw.shared_gate, None),
                )
                ys, shared = gate * ys, [gate, ys]
        out = out + ys
        formula += " + " + (
            "shared.gate ⊙ shared.out" if mw.shared_gate is not None else "shared.out"
        )
    return tr.rec("out", out, formula, weights, *outs, *shared)


# ---------------------------------------------------------------------------
# 5.4 / 3.1 Residual connection and normalisation around each sublayer
# ---------------------------------------------------------------------------


def normalize(
    x: Array,
    nw: NormWeights,
    m: ModelConfig,
    name: str,
    tr: Tracer = NULL_TRACER,
    of: str = "x",
    note: str = "",
) -> Array:
    """LayerNorm or RMSNorm of each row, its statistics recorded under `name`. [L, d] -> [L, d]

    `of` names x in the formula (`X` for the embeddings), `note` follows it."""
    stats = record_statistics(tr, name, x, norm_statistics(x, m))
    return tr.rec(
        name, normed(x, stats, nw, m), norm_step_formula(m, of, note), x, nw.gamma, nw.beta
    )


def norm_statistics(x: Array, m: ModelConfig) -> tuple[tuple[str, Array, str], ...]:
    """What model.norm divides each row of x by: its rms, or its mean and biased variance,
    each with the name and formula it is recorded under (not recorded here). -> [L, 1] each"""
    if m.norm == "rms":
        return (("rms", ops.rms(x, m.norm_eps), f"√(mean(x²) + ε), ε = {exact(m.norm_eps)}"),)
    mean, var = ops.row_mean_var(x)
    return (("mean", mean, "mean of each row"), ("var", var, "biased variance of each row (÷ d)"))


def record_statistics(
    tr: Tracer, name: str, x: Array, stats: Sequence[tuple[str, Array, str]]
) -> list[Array]:
    """Record a norm's statistics (norm_statistics) under `name`: the arrays as recorded."""
    with tr.scope(name):
        return [tr.rec(stat, value, formula, x) for stat, value, formula in stats]


def normed(x: Array, stats: Sequence[Array], nw: NormWeights, m: ModelConfig) -> Array:
    """x normalised by its statistics (rms, or mean and var: norm_statistics), · γ + β."""
    if m.norm == "rms":
        return ops.rms_scale(x, stats[0], nw.gamma, nw.beta, m.norm_eps)
    return ops.standardize(x, stats[0], stats[1], nw.gamma, nw.beta, m.norm_eps)


def norm_step_formula(m: ModelConfig, of: str, note: str = "") -> str:
    """`RMSNorm(x) = x / √(mean(x²) + ε) · γ + β,  ε = 1e-05` and the note."""
    kind = "RMSNorm" if m.norm == "rms" else "LayerNorm"
    return f"{kind}({of}) = " + norm_formula(m, of) + note


# What the residual step adds to x, by model.norm_position (post-norm's sum is followed
# by its norm; explain writes the same), and the note its formula ends with
RESIDUAL_ADDS = {
    "post": "sublayer(x)",
    "pre": "sublayer(Norm(x))",
    "sandwich": "Norm_post(sublayer(Norm(x)))",
    "output": "Norm(sublayer(x))",
}
RESIDUAL_NOTES = {
    "sandwich": "  (sandwich: norm, then post_norm)",
    "output": "  (the norm on the sublayer's output)",
}


def residual_formula(position: str) -> str:
    """The residual step's formula under model.norm_position `position`."""
    return f"x + {RESIDUAL_ADDS[position]}{RESIDUAL_NOTES.get(position, '')}"


def add_and_norm(
    x: Array,
    sublayer: Callable[[Array], Array],
    nw: NormWeights,
    m: ModelConfig,
    tr: Tracer = NULL_TRACER,
    post: NormWeights | None = None,
) -> Array:
    """Where the sublayer's norm sits (model.norm_position). Post-norm: Norm(x + F(x)) (the
    paper). Pre-norm: x + F(Norm(x)). Sandwich (Gemma 2): x + Norm_post(F(Norm(x))), `post`
    the sublayer's post_norm. Output (OLMo 2's reordered norm): x + Norm(F(x)). Every
    placement but post ends with the residual, the sublayer's output. [L, d] -> [L, d]"""
    if m.norm_position == "post":
        y = sublayer(x)
        residual = tr.rec("residual", x + y, residual_formula("post"), x, y)
        return normalize(residual, nw, m, "norm", tr)
    y = sublayer(normalize(x, nw, m, "norm", tr) if m.norm_position != "output" else x)
    if m.norm_position != "pre":  # the norm of the sublayer's output, y
        out, onto = (post, "post_norm") if m.norm_position == "sandwich" else (nw, "norm")
        assert out is not None, "config.py gives a post_norm with sandwich"
        y = normalize(y, out, m, onto, tr, "y", ";  y = the sublayer's output")
    return tr.rec("residual", x + y, residual_formula(m.norm_position), x, y)


# ---------------------------------------------------------------------------
# 3.1 Encoder and decoder stacks
# ---------------------------------------------------------------------------


def _self_attention(
    x: Array,
    aw: AttentionWeights,
    mask: Array | None,
    m: ModelConfig,
    tr: Tracer,
    cache: Sequence[HeadCache] | None = None,
    *,
    causal: bool,
) -> Array:
    """Self-attention with add & norm; `causal` (the decoder's) chooses ALiBi's form."""
    return add_and_norm(
        x, _self_attend(aw, mask, m, tr, cache, causal), aw.norm, m, tr, aw.post_norm
    )


def _self_attend(
    aw: AttentionWeights,
    mask: Array | None,
    m: ModelConfig,
    tr: Tracer,
    cache: Sequence[HeadCache] | None,
    causal: bool,
) -> Callable[[Array], Array]:
    """The self-attention sublayer, h -> MultiHead(h, h, h), with RoPE or ALiBi as the model
    has them; `causal` (the decoder's) chooses ALiBi's form."""
    rotary = m.positional == "rope"
    alibi = alibi_heads(m, symmetric=not causal)
    return lambda h: multi_head_attention(h, h, aw, mask, m, rotary, tr, cache, alibi)


PARALLEL_FORMULAS = {
    "separate": "x + self_attn(Norm₁(x)) + ffn(Norm₂(x))  (parallel: self_attn.norm, ffn.norm)",
    "shared": "x + self_attn(Norm(x)) + ffn(Norm(x))  (parallel, one norm: self_attn.norm)",
}


def parallel_layer(
    x: Array,
    lw: LayerWeights,
    mask: Array | None,
    m: ModelConfig,
    tr: Tracer,
    cache: Sequence[HeadCache] | None = None,
    *,
    causal: bool,
) -> Array:
    """x + Attn(Norm₁(x)) + FFN(Norm₂(x)) (GPT-NeoX's use_parallel_residual), or with one
    norm both read, x + Attn(Norm(x)) + FFN(Norm(x)) (GPT-J, Phi, Falcon): both sublayers
    read the layer's input, and their sum is recorded once, as ffn.residual, the step a
    sequential layer ends with too. [L, d] -> [L, d]"""
    with tr.scope("self_attn"):
        h = normalize(x, lw.self_attn.norm, m, "norm", tr)
        attn = _self_attend(lw.self_attn, mask, m, tr, cache, causal)(h)
    with tr.scope("ffn"):
        if m.parallel == "separate":
            h = normalize(x, lw.ffn.norm, m, "norm", tr)
        out = ffn_sublayer(h, lw.ffn, m, tr)
        return tr.rec("residual", x + attn + out, PARALLEL_FORMULAS[m.parallel], x, attn, out)


def encoder_layer(
    x: Array, lw: LayerWeights, mask: Array | None, m: ModelConfig, tr: Tracer = NULL_TRACER
) -> Array:
    """Self-attention, then feed-forward, each with add & norm (model.parallel: side by
    side, parallel_layer). [L, d] -> [L, d]"""
    if m.parallel != "none":
        return parallel_layer(x, lw, mask, m, tr, causal=False)
    with tr.scope("self_attn"):
        x = _self_attention(x, lw.self_attn, mask, m, tr, causal=False)
    with tr.scope("ffn"):
        return add_and_norm(
            x, lambda h: ffn_sublayer(h, lw.ffn, m, tr), lw.ffn.norm, m, tr, lw.ffn.post_norm
        )


def decoder_layer(
    x: Array,
    enc: Array | None,
    lw: LayerWeights,
    mask: Array,
    cross_mask: Array | None,
    m: ModelConfig,
    src_labels: tuple[str, ...] | None,
    tr: Tracer = NULL_TRACER,
    cache: tuple[Sequence[HeadCache], Sequence[HeadCache]] | None = None,
) -> Array:
    """Masked self-attention, cross-attention over the encoder output, feed-forward. [L, d] -> [L, d]

    `cache`: this layer's (self-attention, cross-attention) head caches, when decoding
    incrementally (`x` then holds only the new rows)."""
    self_cache, cross_cache = cache if cache is not None else (None, None)
    if m.parallel != "none":  # (a decoder-only model's: config.py refuses cross-attention)
        return parallel_layer(x, lw, mask, m, tr, self_cache, causal=True)
    with tr.scope("self_attn"):
        x = _self_attention(x, lw.self_attn, mask, m, tr, self_cache, causal=True)
    if lw.cross_attn is not None and enc is not None:
        aw = lw.cross_attn
        with tr.scope("cross_attn", keys=src_labels):
            # Queries from the decoder, keys and values from the encoder output (3.2.3).
            x = add_and_norm(
                x,
                lambda h: multi_head_attention(h, enc, aw, cross_mask, m, False, tr, cross_cache),
                aw.norm,
                m,
                tr,
                aw.post_norm,
            )
    with tr.scope("ffn"):
        return add_and_norm(
            x, lambda h: ffn_sublayer(h, lw.ffn, m, tr), lw.ffn.norm, m, tr, lw.ffn.post_norm
        )


def padding(cfg: Config, seq: Sequence_) -> np.ndarray | None:
    """Which positions hold the pad token, or None when none do."""
    pad = cfg.tokens.pad
    if pad is None or seq.tokens is None or pad not in seq.tokens:
        return None
    return np.array([t == pad for t in seq.tokens])


def _final(x: Array, nw: NormWeights | None, m: ModelConfig, tr: Tracer) -> Array:
    return x if nw is None else normalize(x, nw, m, "final_norm", tr)


def _embed_norm(x: Array, nw: NormWeights | None, m: ModelConfig, tr: Tracer) -> Array:
    """Norm(X), X = E · scale + PE, before the first layer (BERT's embedding LayerNorm;
    model.embed_norm): layer 0 then reads it, not `input`. [L, d] -> [L, d]"""
    if nw is None:
        return x
    return normalize(x, nw, m, "embed_norm", tr, "X", ";  what layer 0 reads")


def encoder(cfg: Config, tr: Tracer = NULL_TRACER) -> Array:
    """The encoder stack on `source`. -> [L_src, d]"""
    m, seq = cfg.model, cfg.source
    assert seq is not None
    labels = seq.labels
    with tr.scope("encoder", rows=labels, keys=labels):
        x = _embed_norm(embed(cfg, seq, tr), cfg.encoder_embed_norm, m, tr)
        pads = padding(cfg, seq)
        mask = None
        if pads is not None:
            mask = tr.rec(
                "mask",
                ops.key_padding_mask(len(seq), pads, m.dtype),
                "M[i,j] = −inf where key j is a pad",
                cols="keys",
            )
        for l, lw in enumerate(cfg.encoder):
            with tr.scope(l):
                x = encoder_layer(x, lw, mask, m, tr)
        x = _final(x, cfg.encoder_final_norm, m, tr)
        return tr.rec("output", x, "encoder output", x)


def self_attention_mask(
    L: int, start: int, window: int, pads: np.ndarray | None, dtype: str
) -> tuple[Array, str]:
    """The decoder self-attention's additive mask over start + L keys (causal, the sliding
    `window` W's, the pad keys') and its formula. -> [L, start + L], formula"""
    mask = ops.causal_mask(L, start, dtype, window)
    pos = "i" if start == 0 else f"{start} + i"
    formula = f"M[i,j] = −inf for j > {pos}"
    if window:
        formula += f" or j ≤ {pos} − {window}"
    formula += " (causal" + (f", window {window}" if window else "")
    formula += ")" if start == 0 else f"; row i is position {start} + i)"
    if pads is not None:
        mask = mask + ops.key_padding_mask(L, pads, dtype)
        formula += " or key j a pad"
    return mask, formula


def decoder(
    cfg: Config,
    target: Sequence_,
    enc: Array | None,
    tr: Tracer = NULL_TRACER,
    cache: KVCache | None = None,
) -> Array:
    """The decoder stack on `target` (teacher forcing), attending to `enc`. -> [L_tgt, d]

    With a KV `cache` holding t tokens, `target` is only the new tokens: they sit at
    positions t.., their keys and values are appended to the cache, and each new
    row attends over all t + L_tgt positions (causally). -> [L_tgt, d]"""
    m = cfg.model
    labels = target.labels
    start = cache.length if cache is not None else 0
    keys = target
    if cache is not None:
        assert target.tokens is not None, "a KV cache needs tokens, not a numeric target"
        keys = Sequence_(tokens=cache.tokens + target.tokens)
    src_labels = cfg.source.labels if cfg.source is not None else None
    with tr.scope("decoder", rows=labels, keys=keys.labels):
        # with a KV cache, the new rows only: a norm of each row on its own
        x = _embed_norm(embed(cfg, target, tr, start), cfg.decoder_embed_norm, m, tr)
        L = len(target)
        # The decoder's self-attention is always causal (3.2.3), also for one token;
        # with a cache, the single newest row sees every key, so its row is all zeros.
        # A sliding window (model.window W) hides the keys j <= i − W too, cached ones
        # included; layers of different windows (a list) each record their own mask.
        pads = padding(cfg, keys)
        mask, formula = self_attention_mask(L, start, m.window, pads, m.dtype)
        if m.mixed_windows:
            formula += ";  the full-attention layers' (a sliding layer records its own)"
        mask = tr.rec("mask", mask, formula, cols="keys")
        cross_mask = None
        src_pads = padding(cfg, cfg.source) if cfg.source is not None and enc is not None else None
        if src_pads is not None:
            with tr.scope(None, keys=src_labels):
                cross_mask = tr.rec(
                    "cross_mask",
                    ops.key_padding_mask(L, src_pads, m.dtype),
                    "M[i,j] = −inf where source key j is a pad",
                    cols="keys",
                )
        for l, lw in enumerate(cfg.decoder):
            layer_cache = (cache.self_attn[l], cache.cross_attn[l]) if cache is not None else None
            with tr.scope(l):
                layer_mask, W = mask, m.window_of(l)
                if m.mixed_windows and W:  # a sliding layer among full ones, or other windows
                    with tr.scope("self_attn"):
                        layer_mask = tr.rec(
                            "mask", *self_attention_mask(L, start, W, pads, m.dtype), cols="keys"
                        )
                x = decoder_layer(  # (its own RoPE, with a list of bases or scalings)
                    x, enc, lw, layer_mask, cross_mask, m.layer_rope(l), src_labels, tr, layer_cache
                )
        if cache is not None:
            assert keys.tokens is not None
            cache.tokens = keys.tokens
        x = _final(x, cfg.decoder_final_norm, m, tr)
        return tr.rec("output", x, "decoder output", x)


def output_weights(cfg: Config) -> tuple[Array, Array | None]:
    """The output projection; tied weights reuse the (unscaled) embedding table (3.4)."""
    if cfg.model.tie_embeddings:
        return cfg.embedding_matrix.T, cfg.output_b
    assert cfg.output_W is not None
    return cfg.output_W, cfg.output_b


def head(cfg: Config, x: Array, rows: Sequence_ | None, tr: Tracer = NULL_TRACER) -> Array:
    """Logits = x W + b and their row softmax over the vocabulary. [L, d] -> [L, V]"""
    return output_layer(cfg, x, rows, tr)[1]


def output_layer(
    cfg: Config, x: Array, rows: Sequence_ | None, tr: Tracer = NULL_TRACER
) -> tuple[Array, Array]:
    """The logits x W + b and their row softmax, both. [L, d] -> [L, V], [L, V]

    With model.logit_softcap c or model.logit_scale s, x W + b is logits_raw and the logits
    c · tanh(logits_raw / c), s · logits_raw, or with both c · tanh(s · logits_raw / c)."""
    W, b = output_weights(cfg)
    tied = ""
    if cfg.model.tie_embeddings:
        tied = " (W = embeddingsᵀ, tied)"
        tr.name(W, TIED_OUTPUT)
    cap, scale = cfg.model.logit_softcap, cfg.model.logit_scale
    product = "logits" if cap is None and scale is None else "logits_raw"
    with tr.scope(None, rows=rows.labels if rows is not None else None):
        logits = tr.rec(
            product,
            ops.linear(x, W, b),
            product + " = out W" + _plus(b, "b") + tied,
            *_operands(x, W, b),
            cols=cfg.vocab,
        )
        if product == "logits_raw":  # what probs and generate read
            logits = tr.rec("logits", *scaled_logits(logits, cap, scale), logits, cols=cfg.vocab)
        probs = tr.rec("probs", ops.softmax(logits), "P = softmax(logits)", logits, cols=cfg.vocab)
        return logits, probs


def scaled_logits(raw: Array, cap: float | None, scale: float | None) -> tuple[Array, str]:
    """The logits of logits_raw and their formula: Cohere's logit_scale s multiplies them,
    Gemma 2's final_logit_softcapping c caps them, and with both the scaled ones are capped
    (the scale belongs to the output layer; the cap bounds what the softmax reads)."""
    s = 1.0 if scale is None else scale
    scaled = raw * raw.dtype.type(s) if scale is not None else raw
    said = f"s = {exact(s)} (logit scale)"
    if cap is None:
        return scaled, f"logits = s · logits_raw,  {said}"
    capped = ops.softcap(scaled, cap)
    c = f"c = {exact(cap)} (soft cap)"
    if scale is None:
        return capped, f"logits = c · tanh(logits_raw / c),  {c}"
    return capped, f"logits = c · tanh(s · logits_raw / c),  {said}, {c}"


# ---------------------------------------------------------------------------
# Whole runs
# ---------------------------------------------------------------------------


def target_of(cfg: Config) -> Sequence_:
    """The decoder input: `target`, or [tokens.bos] when the file gives none."""
    if cfg.target is not None:
        return cfg.target
    if cfg.tokens.bos is None:
        raise InputError(
            "no target and no tokens.bos to start the decoder from",
            file=cfg.file,
            path="target",
            expected="a target sequence or tokens.bos",
            found="neither",
        )
    return Sequence_(tokens=(cfg.tokens.bos,), types=(0,) if cfg.model.token_types else None)


def decoder_types(cfg: Config, n: int) -> tuple[int, ...] | None:
    """The token types of the first n decoder positions under `generate`: the start's
    (target_types, or 0 for [tokens.bos]), and each generated token the type of the
    last position before it, so that generation continues the segment it was given."""
    start = target_of(cfg).types
    if start is None:
        return None
    return (start + (start[-1],) * n)[:n]


def run_encode(cfg: Config, tr: Tracer = NULL_TRACER) -> Array:
    """The encoder on `source`; an encoder-only model with a vocabulary also gets logits."""
    if cfg.model.encoder_layers == 0:
        raise InputError(
            "encode needs an encoder, and this model is decoder-only (encoder_layers: 0); use decode",
            file=cfg.file,
            path="model.encoder_layers",
            expected="encoder_layers >= 1",
            found="encoder_layers: 0",
        )
    enc = encoder(cfg, tr)
    if cfg.model.decoder_layers == 0 and cfg.vocab:
        return head(cfg, enc, cfg.source, tr)
    return enc


def require_decoder(cfg: Config, command: str) -> None:
    """Refuse a model without a decoder, or without a vocabulary for its logits."""
    if cfg.model.decoder_layers == 0:
        raise InputError(
            f"{command} needs a decoder, and this model is encoder-only (decoder_layers: 0); "
            "use encode",
            file=cfg.file,
            path="model.decoder_layers",
            expected="decoder_layers >= 1",
            found="decoder_layers: 0",
        )
    if not cfg.vocab:
        raise InputError(  # (any command that runs the decoder: decode, step, cost, ...)
            "a decoder needs a vocab: its logits are one score per vocabulary token",
            file=cfg.file,
            path="vocab",
            expected="a non-empty vocab list",
            found="no tokens",
        )


def run_decode(cfg: Config, tr: Tracer = NULL_TRACER, target: Sequence_ | None = None) -> Array:
    """Encoder (if any), decoder on the target, logits and probabilities. -> [L_tgt, V]"""
    require_decoder(cfg, "decode")
    tgt = target if target is not None else target_of(cfg)
    enc = encoder(cfg, tr) if cfg.model.encoder_layers else None
    dec = decoder(cfg, tgt, enc, tr)
    return head(cfg, dec, tgt, tr)


def run_full(cfg: Config, tr: Tracer = NULL_TRACER) -> Array:
    """Everything the model computes: decode when it has a decoder, else encode."""
    return run_decode(cfg, tr) if cfg.model.decoder_layers else run_encode(cfg, tr)
