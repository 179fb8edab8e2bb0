"""The calculator operations (SPEC section 2, single-operation files): one attention,
one normalisation, one positional encoding, each traced step by step."""

from __future__ import annotations

from typing import Any

import numpy as np

from trace_tf import ops
from trace_tf.config import OpConfig
from trace_tf.model import attend
from trace_tf.trace import Tracer

# The axes each normalisation reduces over, and what they mean (SPEC section 2).
NORM_AXES = {
    "layer": (-1, "each row (over the features of one token)"),
    "rms": (-1, "each row (over the features of one token)"),
    "batch": (0, "each column (over the batch, as in training mode)"),
    "instance": (-1, "each (sample, channel) over its n positions"),
}


def attention_op(p: dict[str, Any], tr: Tracer) -> np.ndarray:
    """softmax((Q Kᵀ / scale + M) / T) V on given matrices."""
    Q, K, V = (np.asarray(p[k]) for k in ("Q", "K", "V"))
    mask = p["mask"]
    keys = tuple(f"k{j}" for j in range(K.shape[0]))
    rows = tuple(f"q{i}" for i in range(Q.shape[0]))
    with tr.scope("attn", rows=rows, keys=keys):
        tr.name(Q, "Q")
        tr.name(K, "K")
        tr.name(V, "V")
        return attend(
            Q,
            K,
            V,
            mask if isinstance(mask, np.ndarray) else None,
            float(p["scale"]),
            str(p["scale_text"]),
            float(p["temperature"]),
            tr,
        )


def norm_op(p: dict[str, Any], tr: Tracer) -> np.ndarray:
    """LayerNorm, RMSNorm, BatchNorm or InstanceNorm, statistics shown separately."""
    kind = str(p["kind"])
    x = np.asarray(p["x"])
    eps = float(p["eps"])
    axis, where = NORM_AXES[kind]
    gamma = np.ones(x.shape[1]) if p["gamma"] is None else np.asarray(p["gamma"])
    beta = np.zeros(x.shape[1]) if p["beta"] is None else np.asarray(p["beta"])
    if kind == "instance":
        gamma, beta = gamma.reshape(1, -1, 1), beta.reshape(1, -1, 1)
    with tr.scope("norm"):
        tr.name(x, "x")
        if kind == "rms":
            r = tr.rec("rms", ops.rms(x, eps), f"√(mean(x²) + ε) of {where}, ε = {eps:g}", x)
            return tr.rec("out", ops.rms_scale(x, r, gamma, beta), "x / rms · γ + β", x, r)
        mean, var = ops.moments(x, axis)
        tr.rec("mean", mean, f"mean of {where}", x)
        tr.rec("var", var, f"biased variance of {where} (÷ n)", x)
        centered = tr.rec("centered", x - mean, "x − mean", x, mean)
        out = ops.standardize(x, mean, var, gamma, beta, eps)
        return tr.rec("out", out, f"(x − mean) / √(var + ε) · γ + β,  ε = {eps:g}", centered, var)


def pe_op(p: dict[str, Any], tr: Tracer) -> np.ndarray:
    """The sinusoidal encoding matrix, or RoPE's rotation angles."""
    length, d, base = int(p["length"]), int(p["d_model"]), float(p["base"])
    if p["kind"] == "rope":
        angles = ops.rope_angles(np.arange(length), d, base)
        with tr.scope(None, rows=tuple(f"pos {i}" for i in range(length))):
            return tr.rec(
                "pe", angles, f"θ[pos, i] = pos · {base:g}^(−2i/d): pair (2i, 2i+1) rotates by θ"
            )
    with tr.scope(None, rows=tuple(f"pos {i}" for i in range(length))):
        return tr.rec(
            "pe",
            ops.sinusoidal_pe(length, d, base),
            f"PE[pos,2i] = sin(pos/{base:g}^(2i/d)), PE[pos,2i+1] = cos(pos/{base:g}^(2i/d))",
        )


OPERATIONS = {"attention": attention_op, "norm": norm_op, "pe": pe_op}


def run_op(op: OpConfig, tr: Tracer) -> np.ndarray:
    return OPERATIONS[op.kind](dict(op.params), tr)
