"""Pure numpy math of the Transformer: no tracing, no I/O, no configuration.

Row-vector convention throughout (SPEC section 1): a sequence is an [L, d] matrix,
one token per row, and a linear layer is `x @ W + b` with W of shape [in, out].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import DTypeLike, NDArray

Array = np.ndarray

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def softmax(x: Array, temperature: float = 1.0) -> Array:
    """Row softmax, numerically stable (subtract the row max). [..., n] -> [..., n]

    The max is subtracted before dividing by the temperature, the same softmax
    (e^((x_j − m)/T) = e^(x_j/T − m/T)): with a tiny T, x / T alone would overflow to
    inf − inf = NaN where the limit, the argmax, is well defined.

    A row that is entirely -inf (fully masked) has no defined softmax and comes
    out as NaN, deliberately: the tracer reports where it first appears.
    """
    with np.errstate(invalid="ignore"):
        e = np.exp(tempered_shift(x, temperature))
        return e / np.sum(e, axis=-1, keepdims=True)


def softmax_with_sink(x: Array, sink: Array, temperature: float = 1.0) -> tuple[Array, Array]:
    """Row softmax with a sink logit s joining each row's denominator, then dropped
    (GPT-OSS's attention sinks): e^(x_j/T) / (Σ_k e^(x_k/T) + e^(s/T)), so a row sums to
    less than 1 and the sink takes the rest. -> the row weights [..., n], the sink's [..., 1]

    The sink is the row's last column, and softmax's shift its max, m = max(max_j x_j, s),
    as Hugging Face's gpt_oss eager_attention_forward: s is divided by T as every entry of
    the row is, and a fully masked row (all −inf) gives zeros, all its weight the sink's."""
    column = np.broadcast_to(np.asarray(sink, dtype=x.dtype), (*x.shape[:-1], 1))
    both = softmax(np.concatenate([x, column], axis=-1), temperature)
    return np.ascontiguousarray(both[..., :-1]), np.ascontiguousarray(both[..., -1:])


def tempered_shift(x: Array, temperature: float = 1.0) -> Array:
    """(x − m) / T, m the row max: what softmax exponentiates. [..., n] -> [..., n]

    Where x − m itself overflows (x = −1e308 below m = 1e308) but x is finite, it is
    x/T − m/T instead: with T = 1e308 that is −2, not the −inf of (−inf)/T, which took
    e^−2 = 0.135 for 0. (A fully masked row stays −inf − (−inf) = NaN.)
    """
    with np.errstate(invalid="ignore", over="ignore"):  # (x − m) / T: 0 or less
        m = np.max(x, axis=-1, keepdims=True)
        shifted = x - m
        if temperature != 1.0:
            lost = np.isneginf(shifted) & np.isfinite(x)
            shifted = shifted / temperature
            if lost.any():
                shifted = np.where(lost, x / temperature - m / temperature, shifted)
    return shifted


def linear(x: Array, W: Array, b: Array | None = None) -> Array:
    """x W + b. [L, in] x [in, out] -> [L, out]"""
    y = x @ W
    return y + b if b is not None else y


def top_experts(probs: Array, k: int) -> NDArray[np.intp]:
    """Each row's k experts of largest router probability, largest first; of equal ones
    the lowest index first (a stable sort), so a tie is decided the same on every run.
    [L, E] -> [L, k]"""
    return np.argsort(-probs, axis=-1, kind="stable")[:, :k]


def routing_weights(probs: Array, chosen: NDArray[np.intp], normalize: bool) -> Array:
    """The weight of each token's chosen experts in its output: their probabilities,
    divided by the sum of the chosen ones when `normalize` (Mixtral's; equal to GPT-OSS's
    softmax over the top-k logits), 0 for the experts not chosen. [L, E], [L, k] -> [L, E]"""
    picked = np.take_along_axis(probs, chosen, axis=-1)
    if normalize:
        picked = picked / np.sum(picked, axis=-1, keepdims=True)
    weights = np.zeros_like(probs)
    np.put_along_axis(weights, chosen, picked, axis=-1)
    return weights


def relu(x: Array) -> Array:
    """max(0, x), elementwise."""
    return np.maximum(x, 0.0)


def gelu(x: Array) -> Array:
    """Exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (Hendrycks & Gimpel 2016)."""
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


# erf, vectorised: the algorithm and coefficients of fdlibm's s_erf.c (Sun
# Microsystems, 1993), which C libraries' erf and so Python's math.erf follow; a
# rational approximation on each of five ranges of |x|, accurate to under one unit
# in the last place. numpy has no erf, and math.erf element by element is slow.
_ERX = 8.45062911510467529297e-01
_EFX = 1.28379167095512586316e-01
_PP = (1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
       -5.77027029648944159157e-03, -2.37630166566501626084e-05)  # fmt: skip
_QQ = (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02, 5.08130628187576562776e-03,
       1.32494738004321644526e-04, -3.96022827877536812320e-06)  # fmt: skip
_PA = (-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
       3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02,
       -2.16637559486879084300e-03)  # fmt: skip
_QA = (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
       1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02)  # fmt: skip
_RA = (-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e01,
       -6.23753324503260060396e01, -1.62396669462573470355e02, -1.84605092906711035994e02,
       -8.12874355063065934246e01, -9.81432934416914548592e00)  # fmt: skip
_SA = (1.0, 1.96512716674392571292e01, 1.37657754143519042600e02, 4.34565877475229228821e02,
       6.45387271733267880336e02, 4.29008140027567833386e02, 1.08635005541779435134e02,
       6.57024977031928170135e00, -6.04244152148580987438e-02)  # fmt: skip
_RB = (-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e01,
       -1.60636384855821916062e02, -6.37566443368389627722e02, -1.02509513161107724954e03,
       -4.83519191608651397019e02)  # fmt: skip
_SB = (1.0, 3.03380607434824582924e01, 3.25792512996573918826e02, 1.53672958608443695994e03,
       3.19985821950859553908e03, 2.55305040643316442583e03, 4.74528541206955367215e02,
       -2.24409524465858183362e01)  # fmt: skip
_ONE_OVER_035 = 2.8571434020996094  # 1/0.35 as fdlibm compares it: high word 0x4006DB6E


def _poly(z: Array, coefficients: tuple[float, ...]) -> Array:
    """c0 + z (c1 + z (c2 + ...)), Horner's rule in the order fdlibm evaluates it."""
    out = np.full_like(z, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        out = c + z * out
    return out


def erf(x: Array) -> Array:
    """The error function, elementwise: math.erf's algorithm, within one unit in the last place."""
    x64 = np.asarray(x, dtype=np.float64)
    flat = x64.ravel()
    a = np.abs(flat)
    out = flat.copy()  # NaN stays NaN
    # |x| < 0.84375: x + x P(x²)/Q(x²) (x + efx x below 2^-28)
    i = np.flatnonzero(a < 0.84375)
    s = flat[i]
    z = s * s
    out[i] = np.where(z < 2.0**-56, s + _EFX * s, s + s * (_poly(z, _PP) / _poly(z, _QQ)))
    # 0.84375 <= |x| < 1.25: erx + P(|x| - 1)/Q(|x| - 1), signed
    i = np.flatnonzero((a >= 0.84375) & (a < 1.25))
    t = a[i] - 1.0
    out[i] = np.copysign(_ERX + _poly(t, _PA) / _poly(t, _QA), flat[i])
    # 1.25 <= |x| < 6: 1 - exp(-x² - 0.5625 + R(1/x²)/S(1/x²)) / |x|, signed
    i = np.flatnonzero((a >= 1.25) & (a < 6.0))
    v = a[i]
    w = 1.0 / (v * v)
    near = v < _ONE_OVER_035
    ratio = np.where(near, _poly(w, _RA) / _poly(w, _SA), _poly(w, _RB) / _poly(w, _SB))
    hi = (v.view(np.uint64) & np.uint64(0xFFFFFFFF00000000)).view(np.float64)  # v, low word 0
    r = np.exp(-hi * hi - 0.5625) * np.exp((hi - v) * (hi + v) + ratio)
    out[i] = np.copysign(1.0 - r / v, flat[i])
    # |x| >= 6 (and infinities): +-1
    i = np.flatnonzero(a >= 6.0)
    out[i] = np.copysign(1.0, flat[i])
    return out.reshape(x64.shape).astype(np.asarray(x).dtype, copy=False)


def gelu_tanh(x: Array) -> Array:
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def sigmoid(x: Array) -> Array:
    """σ(x) = 1 / (1 + e^−x), elementwise, in a form that never overflows: with
    e = e^−|x| (at most 1), 1 / (1 + e) for x >= 0 and e / (1 + e) below 0."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x: Array) -> Array:
    """SiLU (swish): x σ(x), elementwise (Elfwing et al. 2017; the gate of SwiGLU).

    σ is the stable one, so x = −1000 gives −0 with no overflow. As in torch, −inf
    gives −inf · 0 = NaN and +inf gives inf (the tracer names where they appear)."""
    with np.errstate(invalid="ignore"):  # −inf · 0: NaN, said by the tracer
        return x * sigmoid(x)


def swish_alpha(x: Array, alpha: float) -> Array:
    """Swish with gain α: x σ(α x), elementwise (Ramachandran et al. 2017; GPT-OSS's gate,
    α = 1.702, where SiLU is α = 1)."""
    with np.errstate(invalid="ignore"):  # −inf · 0: NaN, as silu's
        return x * sigmoid(alpha * x)


def clamp_gate(h: Array, limit: float) -> Array:
    """GPT-OSS's gate clamped from above only: min(H, limit), elementwise."""
    return np.minimum(h, limit)


def clamp_up(u: Array, limit: float) -> Array:
    """GPT-OSS's up projection clamped to [−limit, limit], plus 1: clamp(U) + 1, elementwise."""
    return np.clip(u, -limit, limit) + 1.0


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}


def row_mean_var(x: Array) -> tuple[Array, Array]:
    """Mean and biased variance (divide by d) of each row, kept as columns. [L, d] -> [L, 1] x2"""
    return moments(x, -1)


def standardize(x: Array, mean: Array, var: Array, gamma: Array, beta: Array, eps: float) -> Array:
    """(x - mean) / sqrt(var + eps) * gamma + beta, with the statistics given.

    Where var + eps is beyond float64 (an infinity, or below its least normal number,
    so 0 or a few bits: 0/0 where the true quotient is finite) but x is finite, those
    groups are computed scaled (see `scaled_moments`): (y − mean_y) / hypot(sd_y, √ε / s),
    and 0 where y is its mean and ε > 0 (x − mean = 0 over √ε, though √ε / s may round to 0).
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        denominator = var + eps
        out = (x - mean) / np.sqrt(denominator)
        redo = _redone(x, beyond_normal(denominator))
        if redo.any():
            out = np.where(redo, standardized_scaled(x, _reduced_axes(x, var), eps), out)
    out *= gamma  # (in place: `out * gamma` would take fresh memory for L x d once more)
    out += beta
    return out


def layer_norm(x: Array, gamma: Array, beta: Array, eps: float) -> Array:
    """(x - mean) / sqrt(var + eps) * gamma + beta over each row (Ba et al. 2016). [L, d] -> [L, d]"""
    mean, var = row_mean_var(x)
    return standardize(x, mean, var, gamma, beta, eps)


def rms(x: Array, eps: float) -> Array:
    """sqrt(mean(x^2) + eps) of each row, kept as a column. [L, d] -> [L, 1]

    A row of finite x whose squares overflow (|x| > 1e154), or whose mean square and ε
    fall below float64's least normal number, is computed scaled by a power of two s
    near its largest |x|: s · hypot(√mean((x/s)²), √ε / s), finite and exact to rounding.
    """
    with np.errstate(over="ignore", under="ignore"):
        square = np.mean(x * x, axis=-1, keepdims=True) + eps
    out = np.sqrt(square)
    redo = _redone(x, beyond_normal(square))
    if redo.any():
        s, _, root_y = scaled_rms(x, eps)
        out = np.where(redo, s * root_y, out)
    return out


def scaled_rms(x: Array, eps: float) -> tuple[Array, Array, Array]:
    """s, y = x / s and hypot(√mean(y²), √ε / s) of each row, s a power of two near its
    largest |x| (see `scaled_moments`): the rms is s times the last, even where that
    overflows or falls below float64's least normal number."""
    s = _power_of_two_scale(x, (x.ndim - 1,))
    y = x / s
    return s, y, np.hypot(np.sqrt(np.mean(y * y, axis=-1, keepdims=True)), math.sqrt(eps) / s)


def rms_scale(x: Array, r: Array, gamma: Array, beta: Array, eps: float) -> Array:
    """x / rms * gamma + beta, with the rms given.

    Where the rms is no normal number (a row so tiny that its rms keeps a few bits:
    [5e-324, 0] has rms 3.5e-324, held as 5e-324, and x / rms was 1 for √2) but x is
    finite, the row is computed scaled, as `rms` is: y / hypot(√mean(y²), √ε / s)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = x / r
        redo = _redone(x, beyond_normal(r))
        if redo.any():
            _, y, root_y = scaled_rms(x, eps)
            out = np.where(redo, y / root_y, out)
    out *= gamma  # (in place, as in standardize: no second L x d array)
    out += beta
    return out


def rms_norm(x: Array, gamma: Array, beta: Array, eps: float) -> Array:
    """x / sqrt(mean(x^2) + eps) * gamma + beta over each row (Zhang & Sennrich 2019)."""
    return rms_scale(x, rms(x, eps), gamma, beta, eps)


def sinusoidal_pe(
    length: int, d: int, base: float = 10000.0, start: int = 0, dtype: DTypeLike = np.float64
) -> Array:
    """PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(pos / base^(2i/d)). -> [L, d]

    Vaswani et al. section 3.5; for an odd d the last column is a sine. The rows
    are positions start..start+L-1 (start > 0: the new tokens of a KV-cached step).
    """
    pos = np.arange(start, start + length, dtype=np.float64)[:, None]
    two_i = np.arange(0, d, 2, dtype=np.float64)  # 2i for each sine column
    angles = pos / np.power(base, two_i / d)  # [L, ceil(d/2)]
    pe = np.empty((length, d), dtype=dtype)  # angles in float64, stored in dtype
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles[:, : d // 2])
    return pe


def causal_mask(n: int, start: int = 0, dtype: DTypeLike = np.float64, window: int = 0) -> Array:
    """Additive mask: 0 where key j <= query position, -inf above (a query sees no later key).

    Query row i sits at position start + i over keys 0..start+n-1 (start > 0: the
    new rows of a KV-cached step; the newest single row sees every key). A sliding
    `window` W >= 1 (Mistral) also hides the keys j <= position − W: the query sees
    the W keys position − W < j <= position, itself included; 0 is unlimited. -> [n, start + n]
    """
    mask = np.triu(np.full((n, start + n), -np.inf, dtype=dtype), k=start + 1)
    if window:
        mask[np.tril(np.ones(mask.shape, dtype=bool), k=start - window)] = -np.inf
    return mask


def key_padding_mask(n_q: int, is_pad: NDArray[np.bool_], dtype: DTypeLike = np.float64) -> Array:
    """Additive mask hiding pad positions as keys (columns); query rows are never masked. -> [n_q, n_k]"""
    row = np.where(is_pad, -np.inf, 0.0).astype(dtype, copy=False)
    return np.broadcast_to(row, (n_q, is_pad.shape[0])).copy()


def rope(
    x: Array,
    positions: NDArray[np.integer],
    base: float = 10000.0,
    pairs: str = "adjacent",
    scaling: RopeScaling | None = None,
    dims: int = 0,
) -> Array:
    """Rotary position embedding (Su et al. 2021). [L, d] -> [L, d]

    Only the first r = `dims` columns turn (partial rotary, GPT-NeoX's rotary_ndims; 0:
    all d), as a rotary embedding of width r: pair i of row `pos`, the columns (a, b) =
    rope_pairs(r, pairs)[i], is rotated by the angle pos · θ_i (θ_i = base^(-2i/r), or as
    `scaling` rescales it: rope_frequencies over r): a cos − b sin into column a, a sin +
    b cos into column b, cos and sin times yarn's attention factor (1 otherwise). The
    columns r.. (and an odd r's last) are left as they are.
    """
    r = dims or x.shape[-1]
    first, second = rope_pairs(r, pairs)
    angles = rope_angles(positions, r, base, scaling)  # [L, r/2]
    cos, sin = np.cos(angles), np.sin(angles)
    if scaling is not None and scaling.attention_factor != 1.0:  # (as Hugging Face: cos · s)
        cos, sin = cos * scaling.attention_factor, sin * scaling.attention_factor
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    a, b = x[:, first], x[:, second]
    out = x.copy()
    out[:, first] = a * cos - b * sin
    out[:, second] = a * sin + b * cos
    return out


def rope_pairs(d: int, pairs: str = "adjacent") -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """The columns RoPE turns together, pair i being (first[i], second[i]), i < d // 2:

    adjacent (2i, 2i+1), RoFormer's and lecture 000's; halves (i, i + d//2), GPT-NeoX's,
    LLaMA's and Hugging Face's `rotate_half`. An odd d's last column is in no pair.
    -> ([d // 2], [d // 2])
    """
    i = np.arange(d // 2)
    if pairs == "halves":
        return i, i + d // 2
    if pairs != "adjacent":
        raise ValueError(f"unknown RoPE pairing {pairs!r}")  # (config.py refuses it first)
    return 2 * i, 2 * i + 1


def moments(x: Array, axis: int | tuple[int, ...]) -> tuple[Array, Array]:
    """Mean and biased variance over `axis`, the reduced axes kept. -> broadcastable to x

    A group of finite x whose sum or squares overflow is computed scaled (see
    `scaled_moments`): its mean is then right, and its variance an infinity only when
    the true variance is beyond float64 (above 1.8e308).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        mean = np.mean(x, axis=axis, keepdims=True)
        var = np.mean((x - mean) ** 2, axis=axis, keepdims=True)
        redo = _redone(x, ~(np.isfinite(mean) & np.isfinite(var)))
        if redo.any():
            s, _, mean_y, var_y = scaled_moments(x, axis)
            mean = np.where(redo, mean_y * s, mean)
            var = np.where(redo, var_y * s * s, var)
    return mean, var


def scaled_moments(x: Array, axis: int | tuple[int, ...]) -> tuple[Array, Array, Array, Array]:
    """s, y = x / s, and y's mean and biased variance over `axis`, s a power of two near
    each group's largest |x|: so |y| <= 2 and nothing overflows, and dividing by s is
    exact (but for values 2^1000 times smaller than the largest, which do not count).
    The true mean is s · mean_y and the variance s² · var_y, even where those overflow."""
    s = _power_of_two_scale(x, axis)
    y = x / s
    mean_y = np.mean(y, axis=axis, keepdims=True)
    var_y = np.mean((y - mean_y) ** 2, axis=axis, keepdims=True)
    return s, y, mean_y, var_y


def standardized_scaled(x: Array, axis: int | tuple[int, ...], eps: float) -> Array:
    """(x − mean) / √(var + ε) over `axis`, computed scaled (`scaled_moments`) for groups
    whose var + ε float64 cannot hold: (y − mean_y) / hypot(sd_y, √ε / s)."""
    s, y, mean_y, var_y = scaled_moments(x, axis)
    scaled = (y - mean_y) / np.hypot(np.sqrt(var_y), math.sqrt(eps) / s)
    # √ε / s rounds to 0 under a large s only where var_y = 0: there it is 0 / √ε = 0
    return np.where(y == mean_y, 0.0, scaled) if eps > 0 else scaled


def _power_of_two_scale(x: Array, axis: int | tuple[int, ...]) -> Array:
    """2^(e−1) for each group's largest |x| = m · 2^e (0.5 <= m < 1); 1 for a group of
    zeros or non-finite values. A power of two the dtype holds (2^127 in float32)."""
    with np.errstate(invalid="ignore"):
        largest = np.max(np.abs(x), axis=axis, keepdims=True)
    ok = np.isfinite(largest) & (largest > 0)
    _, e = np.frexp(np.where(ok, largest, 1.0))
    return np.where(ok, np.ldexp(np.ones_like(largest), e - 1), 1.0).astype(x.dtype)


def _reduced_axes(x: Array, stat: Array) -> tuple[int, ...]:
    """The axes a kept-dims statistic of x was reduced over (its size-1 axes)."""
    return tuple(i for i, n in enumerate(stat.shape) if n == 1 and x.ndim == stat.ndim)


def beyond_normal(a: Array) -> Array:
    """Where a (a variance or mean square, plus ε) is no normal number of its dtype: an
    infinity, or below the least normal (0, or a subnormal of a few bits)."""
    return ~((a >= np.finfo(a.dtype).tiny) & np.isfinite(a))


def _redone(x: Array, failed: Array) -> Array:
    """Of the groups of x whose kept-dims statistic `failed`, those to compute scaled:
    the ones whose x are all finite (read only where some group failed, seldom)."""
    if not failed.any():
        return failed
    return failed & np.all(np.isfinite(x), axis=_reduced_axes(x, failed), keepdims=True)


@dataclass(frozen=True)
class RopeScaling:
    """A rescaling of RoPE's frequencies for contexts longer than the training one, by
    Hugging Face's `rope_type` and its parameters (modeling_rope_utils): linear (position
    interpolation), llama3 (LLaMA 3.1-3.3) or yarn (Peng et al. 2023)."""

    type: str  # linear | llama3 | yarn
    factor: float  # how much longer a context: low frequencies are divided by it
    original_max_len: int = 0  # llama3, yarn: the context length of pre-training
    low_freq_factor: float = 1.0  # llama3: wavelengths above original_max_len / this: ÷ factor
    high_freq_factor: float = 4.0  # llama3: wavelengths below original_max_len / this: kept
    beta_fast: float = 32.0  # yarn: pairs turning more often in original_max_len are kept
    beta_slow: float = 1.0  # yarn: pairs turning less often in original_max_len are ÷ factor
    truncate: bool = True  # yarn: the band's bounds rounded out to whole pairs
    attention_factor: float = 1.0  # yarn: times cos and sin ("mscale"), q·k by its square


def rope_frequencies(d: int, base: float = 10000.0, scaling: RopeScaling | None = None) -> Array:
    """θ_i = base^(-2i/d), the radians pair i turns per position, rescaled by `scaling` if
    given (rope_scaled): what every angle is a multiple of. -> [d // 2]"""
    theta = np.power(base, -np.arange(0, 2 * (d // 2), 2, dtype=np.float64) / d)
    return theta if scaling is None else rope_scaled(theta, d, base, scaling)


def rope_scaled(theta: Array, d: int, base: float, s: RopeScaling) -> Array:
    """The frequencies θ as Hugging Face's rope init functions rescale them (for rope_type
    s.type), formula for formula:

    linear: θ / factor. llama3: by wavelength λ = 2π/θ, kept below original_max_len /
    high_freq_factor, θ / factor above original_max_len / low_freq_factor, and between,
    (1 − k) θ / factor + k θ with k = (original_max_len / λ − low) / (high − low). yarn:
    θ / factor · (1 − e) + θ · e, e = 1 − ramp(i), the ramp rising from 0 to 1 over the
    pairs between those that turn beta_fast and beta_slow times in original_max_len
    positions (yarn_band). -> [d // 2]
    """
    if s.type == "linear":
        return theta / s.factor
    if s.type == "llama3":
        low_wavelength = s.original_max_len / s.low_freq_factor
        high_wavelength = s.original_max_len / s.high_freq_factor
        wavelength, k = llama3_smoothing(theta, s)
        out = np.where(wavelength > low_wavelength, theta / s.factor, theta)
        smoothed = (1 - k) * out / s.factor + k * out
        medium = ~(wavelength < high_wavelength) & ~(wavelength > low_wavelength)
        return np.where(medium, smoothed, out)
    if s.type == "yarn":
        low, high = yarn_band(d, base, s)
        ramp = np.clip((np.arange(len(theta), dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolated = 1 - ramp
        return theta / s.factor * (1 - extrapolated) + theta * extrapolated
    raise ValueError(f"unknown RoPE scaling {s.type!r}")  # (config.py refuses it first)


def llama3_smoothing(theta: Array, s: RopeScaling) -> tuple[Array, Array]:
    """llama3's wavelength λ = 2π/θ and smoothing k = (original_max_len / λ − low) / (high −
    low) of frequencies θ, for rope_scaled and explain alike (so both pick the same band).
    2π / θ and L / λ as torch divides a number by a tensor, 1/θ · 2π and 1/λ · L: the
    rounding of Hugging Face's, which k, near 0 at a band's edge, magnifies."""
    wavelength = (1 / theta) * (2 * math.pi)
    k = ((1 / wavelength) * s.original_max_len - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    return wavelength, k


def yarn_band(d: int, base: float, s: RopeScaling) -> tuple[float, float]:
    """yarn's band of pairs [low, high] over which the frequencies go from kept to ÷ factor:
    the pair that turns r times in original_max_len positions is d ln(L / 2πr) / (2 ln base),
    for r = beta_fast (low) and beta_slow (high); rounded out (truncate) and held in 0..d − 1;
    a band of one pair is widened by 0.001, as Hugging Face does, so its ramp divides by no 0.
    A ratio L / 2πr beyond float64 (a beta near 1e308 or 1e-308) is taken as a difference of
    logarithms, which is finite, where Hugging Face's would be ln 0 or ∞."""

    def pair_of(rotations: float) -> float:
        ratio = s.original_max_len / (rotations * 2 * math.pi)
        if 0 < ratio < math.inf:
            log_ratio = math.log(ratio)  # (Hugging Face's find_correction_dim, as written)
        else:
            log_ratio = math.log(s.original_max_len) - math.log(rotations) - math.log(2 * math.pi)
        return d * log_ratio / (2 * math.log(base))

    low, high = pair_of(s.beta_fast), pair_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    return low, high + 0.001 if low == high else high


def rope_angles(
    positions: NDArray[np.integer],
    d: int,
    base: float = 10000.0,
    scaling: RopeScaling | None = None,
) -> Array:
    """RoPE rotation angles pos · θ_i for each position and column pair (rope_frequencies). -> [L, d // 2]"""
    return positions.astype(np.float64)[:, None] * rope_frequencies(d, base, scaling)


def relative_bias(table: Array, n_q: int, n_k: int, start: int = 0) -> Array:
    """B[i,j] = table[max_len − 1 + j − (start + i)]: the learned bias of offset j − i.

    Relative position bias (lecture 000 section 6.2; Shaw et al. 2018): `table` holds
    one number per offset −(max_len − 1) .. +(max_len − 1), 2·max_len − 1 in all. Query
    row i sits at position start + i (start > 0: the new rows of a KV-cached step), keys
    at 0..n_k − 1. B depends on j − i only (a Toeplitz matrix). -> [n_q, n_k]
    """
    offsets = np.arange(n_k)[None, :] - (start + np.arange(n_q))[:, None]
    return table[offset_zero(table) + offsets]


def alibi_slopes(n_heads: int) -> Array:
    """ALiBi's slope m_h of each head (Press et al. 2022, "Train Short, Test Long").

    H a power of two: m_h = 2^(−8(h+1)/H), a geometric sequence from 2^(−8/H) down to
    2^(−8). Otherwise (the paper's rule, Hugging Face's _get_alibi_slopes): the H' = 2^⌊log₂ H⌋
    slopes of H', then the odd-numbered ones of 2H', 2^(−8(2k+1)/(2H')), k = 0..H − H' − 1.
    -> [H]
    """
    below = alibi_power(n_heads)
    first = 2.0 ** (-8.0 * np.arange(1, below + 1) / below)
    rest = 2.0 ** (-8.0 * np.arange(1, 2 * (n_heads - below), 2) / (2 * below))
    return np.concatenate([first, rest])


def alibi_power(n_heads: int) -> int:
    """H' = 2^⌊log₂ H⌋, the power of two at or below H whose slopes ALiBi takes first
    (H itself when H is a power of two)."""
    return 1 << (n_heads.bit_length() - 1)


def alibi_bias(slope: float, n_q: int, n_k: int, start: int = 0, symmetric: bool = False) -> Array:
    """B[i,j] = −m·((start + i) − j): ALiBi's penalty, linear in the distance from query
    row i (at position start + i) back to key j; `symmetric`, −m·|i − j| (a bidirectional
    encoder's form, as MosaicBERT's). Keys sit at 0..n_k − 1. -> [n_q, n_k]
    """
    distance = (start + np.arange(n_q))[:, None] - np.arange(n_k)[None, :]
    return slope * -(np.abs(distance) if symmetric else distance)  # −0: 0


def offset_zero(table: Array) -> int:
    """max_len − 1: where offset 0 sits in a relative bias table, which holds the
    2·max_len − 1 offsets −(max_len − 1) .. +(max_len − 1) in order."""
    return (table.shape[0] - 1) // 2


# ---------------------------------------------------------------------------
# Attention score functions (003 "注意力评分函数", 004 "相似度计算"): each maps
# queries [L_q, d_q] and keys [L_k, d_k] to scores [L_q, L_k].
# ---------------------------------------------------------------------------


def dot_scores(q: Array, k: Array) -> Array:
    """Q Kᵀ: the dot product of every query with every key. -> [L_q, L_k]"""
    return q @ k.T


def bilinear_scores(q_b: Array, k: Array) -> Array:
    """(Q W_b) Kᵀ, given Q W_b (004: sim(Q, K) = Q W Kᵀ). -> [L_q, L_k]"""
    return q_b @ k.T


def additive_features(q_a: Array, k_a: Array) -> Array:
    """tanh(q_a[i] + k_a[j]) for every query i and key j (Bahdanau). -> [L_q, L_k, d_a]"""
    return np.tanh(q_a[:, None, :] + k_a[None, :, :])


def additive_scores(features: Array, v_a: Array) -> Array:
    """v_aᵀ tanh(q W_a_q + k W_a_k) (003: a(k, q) = vᵀ tanh(W_k k + W_q q)). -> [L_q, L_k]"""
    return features @ v_a


def gaussian_scores(q: Array, k: Array, w: Array) -> Array:
    """−½ Σ_f ((q_f − k_f) w_f)²: the log of a Gaussian kernel (003, Nadaraya-Watson).

    softmax of these is exp(−½((x − x_i) w)²) / Σ_j exp(−½((x − x_j) w)²), the
    kernel-regression weights; `w` is a number or one width per feature. -> [L_q, L_k]
    """
    # one query at a time: [L_k, d], where all at once made [L_q, L_k, d] twice (4 GB
    # for 2000 tokens of d_k 64, three times what the rest of the run needs)
    out = np.empty((len(q), len(k)), dtype=np.result_type(q, k, w))
    for i, row in enumerate(q):
        d = (row - k) * w
        out[i] = -0.5 * np.sum(d * d, axis=-1)
    return out


def softcap(x: Array, cap: float) -> Array:
    """c · tanh(x / c): a soft cap bounding every entry to (−c, c), near x where |x| ≪ c
    (Gemma 2's attn_logit_softcapping and final_logit_softcapping, Grok-1's). -> x's shape"""
    return cap * np.tanh(x / cap)
