"""Model variants through the engine: RoPE (000 section 6.3) and the softmax temperature
(000 section 5.2), against identities and a second implementation written here."""

from __future__ import annotations

import cmath
import math
from typing import Any

import numpy as np
from conftest import config_from
from random_configs import random_config

from trace_tf.runner import run


def _rope_config(source: list[str], biases: bool = True, d_k: int = 6) -> dict[str, Any]:
    data = random_config(
        np.random.default_rng(11), d_model=6, n_heads=2, d_k=d_k, src_len=2, biases=biases
    )
    data["model"]["positional"] = "rope"
    data["model"]["pe_base"] = 100
    data["source"] = source
    return data


def rotate_by_complex_numbers(x: np.ndarray, base: float) -> np.ndarray:
    """000's φ(x, i) = x R_i written as (x_2d + i x_2d+1) · e^{i pos θ_d}, θ_d = base^(−2d/D);
    an odd last column is left alone."""
    out = x.copy()
    D = x.shape[1]
    for pos in range(x.shape[0]):
        for d in range(D // 2):
            z = complex(x[pos, 2 * d], x[pos, 2 * d + 1]) * cmath.exp(
                1j * pos * base ** (-2 * d / D)
            )
            out[pos, 2 * d], out[pos, 2 * d + 1] = z.real, z.imag
    return out


def test_rope_q_and_k_are_q_raw_and_k_raw_rotated() -> None:
    for d_k in (6, 5):
        trace = run(config_from(_rope_config(["t2", "t3", "t4", "t5"], d_k=d_k)))
        for h in range(2):
            for name in ("q", "k"):
                p = f"encoder.0.self_attn.h{h}"
                raw = trace.value(f"{p}.{name}_raw")
                want = rotate_by_complex_numbers(raw, 100.0)
                np.testing.assert_allclose(trace.value(f"{p}.{name}"), want, atol=1e-12)
                # position 0 is not rotated; the norms of the pairs are kept
                np.testing.assert_array_equal(trace.value(f"{p}.{name}")[0], raw[0])
            assert f"encoder.0.self_attn.h{h}.v" in trace
        assert "encoder.pe" not in trace  # rope adds nothing to the input


def test_rope_relative_position_identity_in_the_engine() -> None:
    """The score of the same pair of tokens depends only on their distance (000 6.3):
    a, b at positions (0, 2), (1, 3) and (3, 5) give the same score block."""
    layouts = {
        0: ["t2", "t0", "t3", "t0", "t0", "t0"],
        1: ["t0", "t2", "t0", "t3", "t0", "t0"],
        3: ["t0", "t0", "t0", "t2", "t0", "t3"],
    }
    blocks = []
    for offset, source in layouts.items():
        trace = run(config_from(_rope_config(source)))
        for h in range(2):
            s = trace.value(f"encoder.0.self_attn.h{h}.scores")
            i, j = offset, offset + 2
            blocks.append((h, s[np.ix_([i, j], [i, j])]))
    for h in range(2):
        mine = [b for hh, b in blocks if hh == h]
        for other in mine[1:]:
            np.testing.assert_allclose(other, mine[0], atol=1e-10)
    # at another distance the a-b score changes
    trace = run(config_from(_rope_config(["t2", "t3", "t0", "t0", "t0", "t0"])))
    near = trace.value("encoder.0.self_attn.h0.scores")[0, 1]
    assert abs(near - next(b for h, b in blocks if h == 0)[0, 1]) > 1e-6


def test_rope_only_in_self_attention() -> None:
    data = random_config(np.random.default_rng(12), d_model=4, n_heads=1, decoder_layers=1)
    data["model"]["positional"] = "rope"
    trace = run(config_from(data))
    assert "decoder.0.self_attn.h0.q_raw" in trace and "encoder.0.self_attn.h0.k_raw" in trace
    assert "decoder.0.cross_attn.h0.q_raw" not in trace


def test_softmax_temperature_divides_inside_and_tends_to_the_hardmax() -> None:
    data = random_config(np.random.default_rng(13), d_model=4, n_heads=2, src_len=4)
    gaps = []
    for T in (1.0, 0.1, 0.01, 0.001):
        data["model"]["temperature"] = T
        trace = run(config_from(data))
        scaled = trace.value("encoder.0.self_attn.h0.scaled")
        weights = trace.value("encoder.0.self_attn.h0.softmax")
        # by hand: exp(s/T) / Σ exp(s/T), row by row
        for i, row in enumerate(scaled):
            m = max(row)
            e = [math.exp((s - m) / T) for s in row]
            np.testing.assert_allclose(weights[i], [x / sum(e) for x in e], atol=1e-12)
        hard = np.eye(scaled.shape[1])[np.argmax(scaled, axis=1)]
        gaps.append(float(np.abs(weights - hard).max()))
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] < 1e-12 < gaps[0]
