"""The calculator operations (SPEC section 2, single-operation files): one attention,
one normalisation, one positional encoding, each traced step by step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trace_tf import ops
from trace_tf.config import ALL_SCORE_WEIGHTS, OpConfig, ScoreWeights
from trace_tf.model import attend
from trace_tf.text import exact
from trace_tf.trace import Tracer

# The axes each normalisation reduces over, and what they mean (SPEC section 2).
NORM_AXES = {
    "layer": (-1, "each row (over the features of one token)"),
    "rms": (-1, "each row (over the features of one token)"),
    "batch": (0, "each column (over the batch, as in training mode)"),
    "instance": (-1, "each (sample, channel) over its n positions"),
}


def norm_axes_text(kind: str, shape: tuple[int, ...]) -> str:
    """Which axis of x a normalisation reduces over, and the shape its statistics keep."""
    dims = " × ".join(str(n) for n in shape)
    stats = "rms" if kind == "rms" else "mean and var"
    if kind == "instance":
        B, C, n = shape
        return (
            f"x is B × C × n = {dims}; {stats} over axis 2 (the {n} positions of each "
            f"sample and channel), kept as {B} × {C} × 1"
        )
    L, d = shape
    if kind == "batch":
        return (
            f"x is batch × features = {dims}; {stats} over axis 0 (the {L} samples of "
            f"each feature column), kept as a 1 × {d} row"
        )
    return (
        f"x is rows × features = {dims}; {stats} over axis 1 (the {d} features of "
        f"each row), kept as a {L} × 1 column"
    )


def op_arrays(kind: str, p: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The given arrays of a single operation, by the key they have in the file."""
    keys = {
        "attention": ("Q", "K", "V", "mask", *ALL_SCORE_WEIGHTS),
        "norm": ("x", "gamma", "beta"),
    }
    return {k: p[k] for k in keys.get(kind, ()) if isinstance(p.get(k), np.ndarray)}


def attention_labels(p: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The labels of an attention's queries (q0, q1, ...) and keys (k0, ...)."""
    return tuple(f"q{i}" for i in range(len(p["Q"]))), tuple(f"k{j}" for j in range(len(p["K"])))


def attention_op(p: dict[str, Any], tr: Tracer) -> np.ndarray:
    """softmax((score(Q, K) / scale + M) / T) V on given matrices (with attention.softcap c,
    M added to c · tanh(score / scale / c))."""
    Q, K, V = (p[k] for k in ("Q", "K", "V"))
    mask = p["mask"]
    rows, keys = attention_labels(p)
    sw = ScoreWeights(**{k: p[k] for k in ALL_SCORE_WEIGHTS if p.get(k) is not None})
    with tr.scope("attn", rows=rows, keys=keys):
        tr.name_all(op_arrays("attention", p))
        return attend(
            Q,
            K,
            V,
            mask if isinstance(mask, np.ndarray) else None,
            float(p["scale"]),
            str(p["scale_text"]),
            float(p["temperature"]),
            tr,
            score=str(p["score"]),
            sw=sw,
            softcap=p.get("softcap"),
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
        tr.name_all(op_arrays("norm", p))
        if kind == "rms":
            r = tr.rec("rms", ops.rms(x, eps), f"√(mean(x²) + ε) of {where}, ε = {exact(eps)}", x)
            return tr.rec("out", ops.rms_scale(x, r, gamma, beta, eps), "x / rms · γ + β", x, r)
        mean, var = ops.moments(x, axis)
        mean = tr.rec("mean", mean, f"mean of {where}", x)
        var = tr.rec("var", var, f"biased variance of {where} (÷ n)", x)
        centered = tr.rec("centered", x - mean, "x − mean", x, mean)
        out = ops.standardize(x, mean, var, gamma, beta, eps)
        return tr.rec(
            "out", out, f"(x − mean) / √(var + ε) · γ + β,  ε = {exact(eps)}", centered, var
        )


def pe_op(p: dict[str, Any], tr: Tracer) -> np.ndarray:
    """The sinusoidal encoding matrix, or RoPE's rotation angles."""
    length, d, base = int(p["length"]), int(p["d_model"]), float(p["base"])
    if p["kind"] == "rope":
        scaling, r = p.get("rope_scaling"), int(p.get("rope_dims") or d)
        angles = ops.rope_angles(np.arange(length), r, base, scaling)
        over = "d" if r == d else "r"
        frequency = f"{exact(base)}^(−2i/{over})" + (f", {scaling.type}-scaled" if scaling else "")
        pairs = f"(2i, 2i+1) or (i, i+{over}/2)"
        partial = f"; r = rope_dims {r}: columns {r}..{d - 1} not turned" if r < d else ""
        with tr.scope(None, rows=tuple(f"pos {i}" for i in range(length))):
            return tr.rec(
                "pe",
                angles,
                f"θ[pos, i] = pos · {frequency}: pair i, columns {pairs}, rotates by θ{partial}",
            )
    with tr.scope(None, rows=tuple(f"pos {i}" for i in range(length))):
        return tr.rec(
            "pe",
            ops.sinusoidal_pe(length, d, base),
            f"PE[pos,2i] = sin(pos/{exact(base)}^(2i/d)), PE[pos,2i+1] = cos(pos/{exact(base)}^(2i/d))",
        )


OPERATIONS = {"attention": attention_op, "norm": norm_op, "pe": pe_op}


def run_op(op: OpConfig, tr: Tracer) -> np.ndarray:
    return OPERATIONS[op.kind](dict(op.params), tr)
