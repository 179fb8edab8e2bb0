"""RoPE's two pairings through the whole model: `model.rope_pairs: halves` (GPT-NeoX,
LLaMA, Hugging Face's rotate_half: columns (i, i + d_k/2)) is `adjacent` (RoFormer:
(2i, 2i+1)) with the columns of W_q and W_k permuted, and keeps the relative-position
identity of lecture 000 section 6.3. (Against an independent torch rotate_half:
tests/test_engine_reference.py; by hand and as complex numbers: tests/test_ops.py.)"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from conftest import FIXTURES, config_from
from random_configs import random_config

from trace_tf.config import Config, load
from trace_tf.runner import run

D_K = 4
# column i of halves is column 2i of adjacent, column i + d_k/2 is column 2i + 1
INTERLEAVE = np.ravel(np.stack([np.arange(D_K // 2), np.arange(D_K // 2, D_K)], axis=1))


def _permuted(raw: dict[str, Any]) -> dict[str, Any]:
    """A copy whose self-attention heads take W_q, W_k, b_q, b_k with their columns in
    the order INTERLEAVE: each halves pair (i, i + d_k/2) becomes the adjacent (2i, 2i+1)."""
    out = copy.deepcopy(raw)
    for stack in ("encoder", "decoder"):
        for layer in out["weights"].get(stack, []):
            for head in layer["self_attn"]["heads"]:
                for key in ("W_q", "W_k", "b_q", "b_k"):
                    head[key] = np.asarray(head[key])[..., INTERLEAVE].tolist()
    return out


def _config(raw: dict[str, Any]) -> Config:
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    return cfg


def test_halves_is_adjacent_with_the_columns_of_W_q_and_W_k_permuted() -> None:
    raw = random_config(
        np.random.default_rng(3), d_model=8, n_heads=2, encoder_layers=1, decoder_layers=2,
        positional="rope", rope_pairs="halves", src_len=4, tgt_len=5,
    )  # fmt: skip
    adjacent = _permuted(raw)
    del adjacent["model"]["rope_pairs"]  # the default
    a, h = run(_config(adjacent), "full"), run(_config(raw), "full")
    assert list(a.steps) == list(h.steps)
    rotated = 0
    for path in h.steps:
        want = h.value(path)
        if path.split(".")[-1] in ("q", "k", "q_raw", "k_raw") and ".self_attn." in path:
            want = want[:, INTERLEAVE]  # the same numbers, in the other pairing's columns
            rotated += 1
        np.testing.assert_allclose(a.value(path), want, rtol=1e-12, atol=1e-13, err_msg=path)
    assert rotated == 3 * 2 * 4  # 3 self-attentions, 2 heads, q_raw q k_raw k
    # and the two pairings on the same weights are two different models
    same_weights = copy.deepcopy(raw)
    same_weights["model"]["rope_pairs"] = "adjacent"
    other = run(_config(same_weights), "full")
    assert np.abs(other.value("probs") - h.value("probs")).max() > 1e-3


def test_halves_scores_depend_only_on_the_distance() -> None:
    """000 section 6.3 with halves: a, b at positions 0, 1 and at 2, 3 give the same a-b
    scores; at 0, 2 another one (the fixture's variants, paired the other way)."""
    path, halves = str(FIXTURES / "000_rope_relative_position.yaml"), ["model.rope_pairs=halves"]
    scores = "encoder.0.self_attn.h0.scores"
    base = run(load(path, halves), "encode").value(scores)
    shifted = run(load(path, halves, "shifted"), "encode").value(scores)
    apart = run(load(path, halves, "apart"), "encode").value(scores)
    np.testing.assert_allclose(shifted[2:4, 2:4], base, rtol=1e-13, atol=1e-13)
    assert abs(apart[0, 2] - base[0, 1]) > 0.1
    adjacent = run(load(path), "encode").value(scores)
    assert abs(adjacent[0, 1] - base[0, 1]) > 0.1  # the pairing changes the numbers
