"""Partial rotary (model.rope_dims, GPT-NeoX's rotary_ndims) and parallel layers
(model.parallel: GPT-NeoX's use_parallel_residual, GPT-J's shared norm), by hand: small
worked examples written out here, a one-layer numpy implementation, and what the
header, explain, stages, weights and the pe calculator say about them. (Against the
torch reference: tests/test_engine_reference.py, tests/test_generate.py; against
Hugging Face: tests/test_hf_gpt_neox.py.)"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import config_from
from random_configs import random_config
from typer.testing import CliRunner

from trace_tf import ops
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import run

runner = CliRunner()

# One row at position 2, six columns: rope_dims 4 turns columns 0..3 only.
ROW = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])


def test_partial_rotary_adjacent_by_hand() -> None:
    """r = 4 of 6, base 100, adjacent: pairs (0, 1) and (2, 3) turn by 2 · 100^(−0/4) = 2
    and 2 · 100^(−2/4) = 0.2 (over r = 4, not 6); columns 4, 5 pass through."""
    out = ops.rope(ROW, np.array([2]), 100.0, "adjacent", None, 4)
    a, b = 2.0, 0.2
    want = [
        1 * math.cos(a) - 2 * math.sin(a),
        1 * math.sin(a) + 2 * math.cos(a),
        3 * math.cos(b) - 4 * math.sin(b),
        3 * math.sin(b) + 4 * math.cos(b),
        5.0,
        6.0,
    ]
    np.testing.assert_allclose(out[0], want, rtol=0, atol=1e-15)
    # frequencies over head_dim (6) instead of r: pair 1 would turn by 2 · 100^(−2/6)
    wrong = ops.rope(ROW, np.array([2]), 100.0, "adjacent", None, 0)
    assert not np.allclose(wrong[0], want)


def test_partial_rotary_halves_by_hand() -> None:
    """halves within the rotary part (GPT-NeoX's rotate_half of q[..., :r]): pairs (0, 2)
    and (1, 3), the angles as above."""
    out = ops.rope(ROW, np.array([2]), 100.0, "halves", None, 4)
    a, b = 2.0, 0.2
    want = [
        1 * math.cos(a) - 3 * math.sin(a),
        2 * math.cos(b) - 4 * math.sin(b),
        1 * math.sin(a) + 3 * math.cos(a),
        2 * math.sin(b) + 4 * math.cos(b),
        5.0,
        6.0,
    ]
    np.testing.assert_allclose(out[0], want, rtol=0, atol=1e-15)


def test_partial_rotary_linear_scaling_over_r() -> None:
    """linear scaling divides the frequencies of the r columns: pair 1 turns by 0.2 / 2."""
    scaling = ops.RopeScaling("linear", 2.0)
    out = ops.rope(ROW, np.array([2]), 100.0, "adjacent", scaling, 4)
    b = 0.1
    np.testing.assert_allclose(
        out[0, 2:4],
        [3 * math.cos(b) - 4 * math.sin(b), 3 * math.sin(b) + 4 * math.cos(b)],
        atol=1e-15,
    )


def test_rope_dims_d_k_is_full_rope() -> None:
    """rope_dims d_k is every column: bit for bit the run without it."""
    raw = random_config(
        np.random.default_rng(2),
        d_model=8,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=1,
        norm_position="pre",
        positional="rope",
        tgt_len=4,
    )
    a = run(config_from(raw), "decode")
    raw["model"]["rope_dims"] = 4
    b = run(config_from(raw), "decode")
    assert np.array_equal(a.value("logits"), b.value("logits"))


def layer_norm(x: np.ndarray, g: Any, b: Any, eps: float = 1e-5) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * np.asarray(g) + np.asarray(b)


def one_layer_by_numpy(raw: dict[str, Any], parallel: str) -> np.ndarray:
    """A one-head, no-position, decoder-only layer: x + attn(LN1 x) + ffn(LN2 x) (LN2 is
    LN1 when shared), written here without trace-tf. -> the layer's output"""
    w = raw["weights"]["decoder"][0]
    x = np.array([raw["embeddings"][t] for t in raw["target"]])
    a, f = w["self_attn"], w["ffn"]
    h1 = layer_norm(x, a["norm"]["gamma"], a["norm"]["beta"])
    head = a["heads"][0]
    q, k, v = (h1 @ np.array(head[f"W_{p}"]) + np.array(head[f"b_{p}"]) for p in "qkv")
    s = q @ k.T / math.sqrt(q.shape[1])
    s = s + np.triu(np.full(s.shape, -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    attn = (p @ v) @ np.array(a["W_o"]) + np.array(a["b_o"])
    h2 = h1 if parallel == "shared" else layer_norm(x, f["norm"]["gamma"], f["norm"]["beta"])
    hidden = np.maximum(h2 @ np.array(f["W_1"]) + np.array(f["b_1"]), 0)
    ffn = hidden @ np.array(f["W_2"]) + np.array(f["b_2"])
    return np.asarray(x + attn + ffn)


def neox_raw(parallel: str, **extra: Any) -> dict[str, Any]:
    return random_config(
        np.random.default_rng(5),
        d_model=4,
        n_heads=1,
        encoder_layers=0,
        decoder_layers=1,
        norm_position="pre",
        positional="none",
        parallel=parallel,
        final_norm=False,
        tgt_len=3,
        **extra,
    )


@pytest.mark.parametrize("parallel", ["separate", "shared"])
def test_a_parallel_layer_by_numpy(parallel: str) -> None:
    raw = neox_raw(parallel)
    trace = run(config_from(raw), "decode")
    want = one_layer_by_numpy(raw, parallel)
    np.testing.assert_allclose(trace.value("decoder.0.ffn.residual"), want, rtol=1e-13, atol=1e-13)
    assert "decoder.0.self_attn.residual" not in trace
    assert ("decoder.0.ffn.norm" in trace) == (parallel == "separate")
    # the sequential layer (the same weights) is another number
    raw["model"].pop("parallel")
    if parallel == "shared":
        raw["weights"]["decoder"][0]["ffn"]["norm"] = raw["weights"]["decoder"][0]["self_attn"][
            "norm"
        ]
    sequential = run(config_from(raw), "decode").value("decoder.0.ffn.residual")
    assert not np.allclose(sequential, want)


def write(tmp_path: Any, raw: dict[str, Any]) -> str:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return str(path)


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_header_stages_and_explain_say_parallel(tmp_path: Any) -> None:
    file = write(tmp_path, neox_raw("shared"))
    header = json.loads(invoke("decode", file, "--format", "json"))["conventions"]
    assert "parallel: each layer x + self_attn(Norm(x)) + ffn(Norm(x))" in header["model"]
    stages = " ".join(invoke("stages").split())
    assert "x + self_attn(Norm₁(x)) + ffn(Norm₂(x))" in stages
    assert "self_attn.norm only, which the FFN reads too" in stages
    data = json.loads(
        invoke("explain", "decoder.0.ffn.residual", file, "--cell", "1,2", "--format", "json")
    )
    text = json.dumps(data, ensure_ascii=False)
    assert "decoder.0.self_attn.wo" in text and "decoder.0.ffn.out" in text
    assert "decoder.0.self_attn.norm, shared" in text
    # the sum explained is the recorded value, x + attn + ffn of that cell
    trace = run(config_from(neox_raw("shared")), "decode")
    parts = [
        trace.value(p)[1, 2]
        for p in ("decoder.input", "decoder.0.self_attn.wo", "decoder.0.ffn.out")
    ]
    assert math.isclose(sum(parts), trace.value("decoder.0.ffn.residual")[1, 2], abs_tol=1e-14)


def test_weights_of_a_shared_norm_model_have_no_ffn_norm(tmp_path: Any) -> None:
    raw = neox_raw("shared")
    out = json.loads(invoke("weights", write(tmp_path, raw), "--format", "json"))
    keys = [w["path"] for w in out["weights"]]
    assert "weights.decoder.0.self_attn.norm.gamma" in keys
    assert not any(".ffn.norm" in k for k in keys)
    cfg = config_from(neox_raw("separate"))
    assert isinstance(cfg, Config)
    assert "weights.decoder.0.ffn.norm.gamma" in cfg.named_arrays()


def test_explain_says_which_columns_turn(tmp_path: Any) -> None:
    raw = random_config(
        np.random.default_rng(1),
        d_model=12,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=1,
        norm_position="pre",
        positional="rope",
        rope_pairs="halves",
        rope_dims=4,
        tgt_len=3,
    )
    file = write(tmp_path, raw)
    header = json.loads(invoke("decode", file, "--format", "json"))["conventions"]["positions"]
    assert "pair (i, i+r/2) turned by pos · 10000^(−2i/r)" in header
    assert "r = rope_dims 4 columns of each head's 6 turned" in header
    assert "columns 4..5 kept as they are" in header
    kept = json.dumps(
        json.loads(
            invoke("explain", "decoder.0.self_attn.h0.q", file, "--cell", "2,5", "--format", "json")
        ),
        ensure_ascii=False,
    )
    assert "rope_dims 4: columns 4..5 are not rotated" in kept
    turned = json.dumps(
        json.loads(
            invoke("explain", "decoder.0.self_attn.h0.q", file, "--cell", "2,3", "--format", "json")
        ),
        ensure_ascii=False,
    )
    # column 3 is pair 1's second (halves of r = 4: (1, 3)), at 10000^(−2/4)
    assert "pair 1: columns 1, 3, halves" in turned and "10000^(−2/4)" in turned


def test_the_pe_calculator_counts_frequencies_over_rope_dims() -> None:
    out = json.loads(
        invoke(
            "pe",
            "--kind",
            "rope",
            "--length",
            "3",
            "--d-model",
            "8",
            "--rope-dims",
            "4",
            "--base",
            "100",
            "--format",
            "json",
        )
    )
    angles = np.array(out["steps"][0]["value"])
    want = np.array([[p * 100 ** (-2 * i / 4) for i in range(2)] for p in range(3)])
    np.testing.assert_allclose(angles, want, rtol=0, atol=1e-15)
