"""Pure numpy math of the Transformer: no tracing, no I/O, no configuration.

Row-vector convention throughout (SPEC section 1): a sequence is an [L, d] matrix,
one token per row, and a linear layer is `x @ W + b` with W of shape [in, out].
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

Array = np.ndarray

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def softmax(x: Array, temperature: float = 1.0) -> Array:
    """Row softmax, numerically stable (subtract the row max). [..., n] -> [..., n]

    A row that is entirely -inf (fully masked) has no defined softmax and comes
    out as NaN, deliberately: the tracer reports where it first appears.
    """
    z = x / temperature if temperature != 1.0 else x
    with np.errstate(invalid="ignore"):
        shifted = z - np.max(z, axis=-1, keepdims=True)
        e = np.exp(shifted)
        return e / np.sum(e, axis=-1, keepdims=True)


def linear(x: Array, W: Array, b: Array | None = None) -> Array:
    """x W + b. [L, in] x [in, out] -> [L, out]"""
    y = x @ W
    return y + b if b is not None else y


def relu(x: Array) -> Array:
    """max(0, x), elementwise."""
    return np.maximum(x, 0.0)


def gelu(x: Array) -> Array:
    """Exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (Hendrycks & Gimpel 2016)."""
    erf = np.vectorize(math.erf, otypes=[x.dtype])
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x: Array) -> Array:
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}


def row_mean_var(x: Array) -> tuple[Array, Array]:
    """Mean and biased variance (divide by d) of each row, kept as columns. [L, d] -> [L, 1] x2"""
    return moments(x, -1)


def standardize(x: Array, mean: Array, var: Array, gamma: Array, beta: Array, eps: float) -> Array:
    """(x - mean) / sqrt(var + eps) * gamma + beta, with the statistics given."""
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def layer_norm(x: Array, gamma: Array, beta: Array, eps: float) -> Array:
    """(x - mean) / sqrt(var + eps) * gamma + beta over each row (Ba et al. 2016). [L, d] -> [L, d]"""
    mean, var = row_mean_var(x)
    return standardize(x, mean, var, gamma, beta, eps)


def rms(x: Array, eps: float) -> Array:
    """sqrt(mean(x^2) + eps) of each row, kept as a column. [L, d] -> [L, 1]"""
    return np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rms_scale(x: Array, r: Array, gamma: Array, beta: Array) -> Array:
    """x / rms * gamma + beta, with the rms given."""
    return x / r * gamma + beta


def rms_norm(x: Array, gamma: Array, beta: Array, eps: float) -> Array:
    """x / sqrt(mean(x^2) + eps) * gamma + beta over each row (Zhang & Sennrich 2019)."""
    return rms_scale(x, rms(x, eps), gamma, beta)


def sinusoidal_pe(length: int, d: int, base: float = 10000.0, start: int = 0) -> Array:
    """PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(pos / base^(2i/d)). -> [L, d]

    Vaswani et al. section 3.5; for an odd d the last column is a sine. The rows
    are positions start..start+L-1 (start > 0: the new tokens of a KV-cached step).
    """
    pos = np.arange(start, start + length, dtype=np.float64)[:, None]
    two_i = np.arange(0, d, 2, dtype=np.float64)  # 2i for each sine column
    angles = pos / np.power(base, two_i / d)  # [L, ceil(d/2)]
    pe = np.empty((length, d), dtype=np.float64)
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles[:, : d // 2])
    return pe


def causal_mask(n: int, start: int = 0) -> Array:
    """Additive mask: 0 where key j <= query position, -inf above (a query sees no later key).

    Query row i sits at position start + i over keys 0..start+n-1 (start > 0: the
    new rows of a KV-cached step; the newest single row sees every key). -> [n, start + n]
    """
    return np.triu(np.full((n, start + n), -np.inf), k=start + 1)


def key_padding_mask(n_q: int, is_pad: NDArray[np.bool_]) -> Array:
    """Additive mask hiding pad positions as keys (columns); query rows are never masked. -> [n_q, n_k]"""
    row = np.where(is_pad, -np.inf, 0.0)
    return np.broadcast_to(row, (n_q, is_pad.shape[0])).copy()


def rope(x: Array, positions: NDArray[np.integer], base: float = 10000.0) -> Array:
    """Rotary position embedding (Su et al. 2021, RoFormer convention). [L, d] -> [L, d]

    Each pair of columns (2i, 2i+1) of row `pos` is rotated by the angle
    pos * base^(-2i/d); for an odd d the last column is left as it is.
    """
    half = x.shape[-1] // 2
    angles = rope_angles(positions, x.shape[-1], base)  # [L, d/2]
    cos, sin = np.cos(angles), np.sin(angles)
    even, odd = x[:, 0 : 2 * half : 2], x[:, 1 : 2 * half : 2]
    out = x.copy()
    out[:, 0 : 2 * half : 2] = even * cos - odd * sin
    out[:, 1 : 2 * half : 2] = even * sin + odd * cos
    return out


def moments(x: Array, axis: int | tuple[int, ...]) -> tuple[Array, Array]:
    """Mean and biased variance over `axis`, the reduced axes kept. -> broadcastable to x"""
    mean = np.mean(x, axis=axis, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axis, keepdims=True)
    return mean, var


def rope_angles(positions: NDArray[np.integer], d: int, base: float = 10000.0) -> Array:
    """RoPE rotation angles pos * base^(-2i/d) for each position and column pair. -> [L, d // 2]"""
    theta = np.power(base, -np.arange(0, 2 * (d // 2), 2, dtype=np.float64) / d)
    return positions.astype(np.float64)[:, None] * theta


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
    diff = (q[:, None, :] - k[None, :, :]) * w
    return -0.5 * np.sum(diff * diff, axis=-1)
