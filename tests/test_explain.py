"""`trace-tf explain`: one entry written out with its own numbers. Every kind of step is
explained, the written-out arithmetic must give the recorded value, and the numbers
substituted must be the right ones (checked against values built here by hand)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES, config_from
from random_configs import random_config
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import Config, OpConfig, load
from trace_tf.explain import Explanation, explain, find_step, parse_cell
from trace_tf.runner import run
from trace_tf.trace import Trace

runner = CliRunner()


def explained(cfg: Config | OpConfig, path: str, cell: tuple[int, ...]) -> Explanation:
    trace = run(cfg)
    return explain(cfg, trace, trace[path], cell)


def _model(score: str = "scaled_dot", **shape: Any) -> dict[str, Any]:
    data = random_config(np.random.default_rng(21), **shape)
    data["model"]["score"] = score
    return data


def _tempered(data: dict[str, Any], T: float) -> dict[str, Any]:
    """`data` with the softmax temperature T in every attention."""
    return {**data, "model": {**data["model"], "temperature": T}}


# Configs covering every kind of step: score functions, norms, activations, positions,
# masks (with a fully masked row), tied output, embed scale, and the calculators.
MODEL_CASES: dict[str, dict[str, Any]] = {
    "pre_rms_gelu_learned_tied": _model(
        d_model=6, n_heads=2, decoder_layers=1, norm_position="pre", norm="rms",
        activation="gelu", positional="learned", tie_embeddings=True,
        embed_scale="sqrt_d_model", pad=True, src_len=4, tgt_len=3,
    ),
    "gelu_tanh_rope_odd_dk": {
        **_model(d_model=6, n_heads=2, d_k=3, d_v=2, activation="gelu_tanh"),
        "model": {"d_model": 6, "n_heads": 2, "d_k": 3, "d_v": 2, "activation": "gelu_tanh",
                  "positional": "rope", "final_norm": True, "temperature": 0.5},
    },
    "rope_halves_cross": _model(
        d_model=8, n_heads=2, decoder_layers=1, positional="rope", rope_pairs="halves",
        pad=True, src_len=4, tgt_len=3,
    ),
    "rope_halves_odd_dk": {
        **_model(d_model=6, n_heads=2, d_k=5, d_v=2),
        "model": {"d_model": 6, "n_heads": 2, "d_k": 5, "d_v": 2, "positional": "rope",
                  "rope_pairs": "halves", "pe_base": 10},
    },
    "additive_cross": _model("additive", d_model=4, n_heads=2, decoder_layers=1),
    "bilinear": _model("bilinear", d_model=4, n_heads=1),
    "gaussian_dot": _model("gaussian", d_model=4, n_heads=2, decoder_layers=1, encoder_layers=0),
    "dot_wide": _model("dot", d_model=16, n_heads=2, d_ff=20),
    "swiglu_pre_rms": _model(
        d_model=4, n_heads=2, d_ff=3, decoder_layers=1, norm_position="pre", norm="rms",
        activation="swiglu",
    ),
    "geglu_no_biases": _model(d_model=4, n_heads=1, d_ff=5, activation="geglu", biases=False),
    "silu_decoder_only": _model(
        d_model=4, n_heads=2, encoder_layers=0, decoder_layers=1, activation="silu"
    ),
    # grouped-query attention: K/V heads shared (fused, and per K/V head in kv_heads)
    "gqa_fused_cross_rope": _model(
        d_model=8, n_heads=4, n_kv_heads=2, decoder_layers=1, positional="rope", fused=True,
        pad=True, src_len=4, tgt_len=3,
    ),
    "mqa_kv_heads_additive": _model(
        "additive", d_model=6, n_heads=3, n_kv_heads=1, encoder_layers=0, decoder_layers=1,
    ),
    "relative_fused_pads": _model(
        d_model=4, n_heads=2, decoder_layers=1, positional="relative", fused=True,
        pad=True, src_len=4, tgt_len=3,
    ),
    # model.embed_norm: LayerNorm (BERT's shape) and RMSNorm in both stacks
    "embed_norm_bert": _model(
        d_model=6, n_heads=2, positional="learned", activation="gelu", embed_norm=True
    ),
    "embed_norm_rms_cross": _model(
        d_model=4, n_heads=2, decoder_layers=1, norm_position="pre", norm="rms",
        embed_norm=True, pad=True, src_len=3, tgt_len=3,
    ),
    # model.token_types (BERT's segment embeddings): both stacks, learned positions and pads;
    # decoder-only with no positions (X = E + T)
    "token_types_cross": _model(
        d_model=4, n_heads=2, decoder_layers=1, positional="learned", embed_norm=True,
        pad=True, src_len=4, tgt_len=3, token_types=3,
    ),
    "token_types_no_positions": _model(
        d_model=4, n_heads=1, encoder_layers=0, decoder_layers=1, positional="none",
        token_types=2,
    ),
    # GeGLU with the tanh GELU gate, in Gemma's shape (multi-query, RoPE halves, tied)
    "geglu_tanh_gemma": _model(
        d_model=6, n_heads=2, n_kv_heads=1, d_k=4, d_v=4, encoder_layers=0, decoder_layers=1,
        norm_position="pre", norm="rms", positional="rope", rope_pairs="halves",
        activation="geglu_tanh", tie_embeddings=True, embed_scale="sqrt_d_model", biases=False,
    ),
    # QK-norm: Qwen3's shape (grouped-query, RMSNorm before RoPE by halves); LayerNorm
    # without RoPE, where q and k are the norms themselves, cross-attention too
    "qk_norm_qwen3": _model(
        d_model=8, n_heads=4, n_kv_heads=2, encoder_layers=0, decoder_layers=1,
        norm_position="pre", norm="rms", positional="rope", rope_pairs="halves",
        activation="swiglu", biases=False, qk_norm="head",
    ),
    "qk_norm_layer_cross": _model(
        d_model=6, n_heads=2, decoder_layers=1, pad=True, src_len=4, tgt_len=3, qk_norm="head",
    ),
    # OLMo 2's shape: the norm on each sublayer's output, QK-norm over the whole projection
    # (grouped-query, before RoPE); sandwich norms (Gemma 2's) with the whole-projection norm
    # in cross-attention, LayerNorm, biases, no RoPE (q and k the norm's columns)
    "output_norm_projection_olmo2": _model(
        d_model=8, n_heads=4, n_kv_heads=2, encoder_layers=0, decoder_layers=1,
        norm_position="output", norm="rms", positional="rope", rope_pairs="halves",
        activation="swiglu", biases=False, qk_norm="projection",
    ),
    "sandwich_projection_cross": _model(
        d_model=6, n_heads=3, decoder_layers=1, pad=True, src_len=4, tgt_len=3,
        norm_position="sandwich", qk_norm="projection",
    ),
    # Gemma 2's soft caps and alternating windows (a sliding layer's own mask), with ALiBi's
    # bias added to the capped scores
    "softcap_windows_gemma2": _model(
        d_model=6, n_heads=2, n_kv_heads=1, encoder_layers=0, decoder_layers=2,
        norm_position="pre", norm="rms", positional="rope", rope_pairs="halves",
        tgt_len=4, window=[2, None], attn_softcap=1.5, logit_softcap=2.0,
    ),
    "softcap_alibi_pads": _model(
        d_model=6, n_heads=3, decoder_layers=1, positional="alibi", pad=True, src_len=4,
        tgt_len=3, attn_softcap=0.8,
    ),
    # GPT-OSS's attention sinks (the sink's term in each softmax entry, the sink step):
    # grouped-query with fused sinks, a window and pads; per-head sinks in an
    # encoder-decoder with a bilinear score and a temperature (s_h divided by T)
    "sinks_gpt_oss": _model(
        d_model=8, n_heads=4, n_kv_heads=2, encoder_layers=0, decoder_layers=2, fused=True,
        norm_position="pre", norm="rms", positional="rope", rope_pairs="halves", pad=True,
        tgt_len=4, window=[2, None], attn_sinks=True,
    ),
    "sinks_bilinear_temperature": _tempered(
        _model("bilinear", d_model=4, n_heads=2, decoder_layers=1, pad=True, src_len=4,
               tgt_len=3, attn_sinks=True),
        1.7,
    ),
    # a mixture of experts: Mixtral's shape (2 of 4, renormalised), and 2 of 3 kept as
    # they are in an encoder-decoder with biases
    "experts_mixtral": _model(
        d_model=6, n_heads=2, encoder_layers=0, decoder_layers=1, norm_position="pre",
        norm="rms", positional="rope", rope_pairs="halves", activation="swiglu", biases=False,
        tgt_len=5, experts=4, experts_top_k=2,
    ),
    "experts_unnormalized_cross": _model(
        d_model=4, n_heads=2, d_ff=3, decoder_layers=1, src_len=4, tgt_len=3, experts=3,
        experts_top_k=2, experts_normalize=False,
    ),
    # GPT-OSS's FFN: a router bias and the clamped SwiGLU, a limit that clamps both ways
    "experts_gpt_oss": _model(
        d_model=6, n_heads=2, encoder_layers=0, decoder_layers=1, norm_position="pre",
        norm="rms", positional="rope", rope_pairs="halves", activation="swiglu_oss",
        swiglu_limit=0.5, tgt_len=5, experts=4, experts_top_k=2, router_bias=True,
    ),
    # experts by layer (a dense layer after a mixture) with Qwen2-MoE's gated shared
    # expert of its own width; DeepSeek's plain one in an encoder-decoder
    "experts_by_layer_shared_gated": _model(
        d_model=6, n_heads=2, d_ff=3, encoder_layers=0, decoder_layers=2, norm_position="pre",
        norm="rms", positional="rope", rope_pairs="halves", activation="swiglu", tgt_len=5,
        experts=[3, None], experts_top_k=2, shared_expert="gated", shared_expert_d_ff=5,
    ),
    "experts_shared_plain_cross": _model(
        d_model=4, n_heads=2, d_ff=3, decoder_layers=1, src_len=4, tgt_len=3, experts=3,
        experts_top_k=1, shared_expert="plain",
    ),
}  # fmt: skip

FILE_CASES = [
    ("hello", None),
    ("hello", "document"),
    ("hello", "document_scale30"),
    (str(FIXTURES / "000_rope_relative_position.yaml"), "apart"),
    (str(FIXTURES / "000_relative_bias.yaml"), None),
    (str(FIXTURES / "004_causal_padding_mask.yaml"), None),
    (str(FIXTURES / "000_softmax_temperature.yaml"), "tau_0_1"),
    (str(FIXTURES / "003_additive_attention.yaml"), None),
    (str(FIXTURES / "003_gaussian_kernel.yaml"), "x1_2_w2"),
    (str(FIXTURES / "004_layer_batch_norm.yaml"), None),
    (str(FIXTURES / "004_layer_batch_norm.yaml"), "batch"),
    (str(FIXTURES / "004_positional_encoding.yaml"), None),
]

OP_CASES: dict[str, dict[str, Any]] = {
    "rms": {"norm": {"kind": "rms", "x": [[1, -2, 3], [0.5, 0, 2]], "gamma": [1, 2, 3], "beta": [0, 1, 0]}},
    "instance": {"norm": {"kind": "instance", "x": [[[1, 2, 3], [4, 5, 7]], [[0, 1, 0], [2, 2, 3]]], "gamma": [2, 1], "beta": [0, -1]}},
    "rope_angles": {"pe": {"length": 4, "d_model": 6, "kind": "rope"}},
    "masked_bilinear": {"attention": {"score": "bilinear", "Q": [[1, 2]], "K": [[1, 0, 1], [0, 1, 1]], "V": [[1], [2]], "W_b": [[1, 0, 2], [0, 1, -1]], "mask": [[0, "-inf"]]}},
    "gaussian_widths": {"attention": {"score": "gaussian", "Q": [[1, 2], [0, 1]], "K": [[1, 0], [2, 2], [0, 0]], "V": [[1], [2], [3]], "w": [1, 0.5]}},
    "fully_masked_row": {"attention": {"Q": [[1.0], [2.0]], "K": [[1.0], [3.0]], "V": [[1.0], [2.0]], "mask": [["-inf", "-inf"], [0, 0]]}},
    "softcap_masked": {"attention": {"Q": [[1, 0]], "K": [[3, 0], [1, 0], [0, 1]], "V": [[1], [2], [3]], "scale": 1, "softcap": 2, "mask": [[0, 0, "-inf"]]}},
}  # fmt: skip


def _cells(shape: tuple[int, ...], rng: np.random.Generator) -> Iterator[tuple[int, ...]]:
    size = int(np.prod(shape))
    if size <= 48:
        yield from np.ndindex(*shape)
        return
    yield tuple(0 for _ in shape)
    yield tuple(n - 1 for n in shape)
    for _ in range(20):
        yield tuple(int(rng.integers(n)) for n in shape)


def _all_configs() -> Iterator[tuple[str, Config | OpConfig]]:
    for name, data in MODEL_CASES.items():
        yield name, config_from(data)
    for path, variant in FILE_CASES:
        yield f"{path}:{variant}", load(path, [], variant)
    for name, data in OP_CASES.items():
        fixed = json.loads(json.dumps(data).replace('"-inf"', "-Infinity"))
        yield name, config_from(fixed)


CONFIGS = dict(_all_configs())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_step_is_explained_and_its_arithmetic_gives_the_recorded_value(name: str) -> None:
    cfg = CONFIGS[name]
    trace: Trace = run(cfg)
    rng = np.random.default_rng(0)
    for step in trace:
        for cell in _cells(step.shape, rng):
            e = explain(cfg, trace, step, cell)
            assert e.agrees, (step.path, cell, e.value, e.result, e.lines())
            assert e.lines()[0].startswith(f"{step.path}[")


def test_under_float32_the_arithmetic_agrees_within_float32_rounding() -> None:
    # The recorded entries are float32, the arithmetic redone in float64: they differ in
    # about the 8th digit, which was called a disagreement (a 1e-9 relative tolerance).
    cfg = load(None, dtype="float32")
    trace: Trace = run(cfg)
    rng = np.random.default_rng(0)
    differs = 0
    for step in trace:
        assert step.value.dtype == np.float32
        for cell in _cells(step.shape, rng):
            e = explain(cfg, trace, step, cell)
            assert e.agrees, (step.path, cell, e.value, e.result)
            differs += e.value != e.result
    assert differs > 0  # (float32 rounding is there to be tolerated)
    # and a difference beyond float32 rounding is still one
    step = next(s for s in trace if s.path == "decoder.0.ffn.out")
    e = explain(cfg, trace, step, (0, 1))
    assert not dataclasses.replace(e, value=e.result * (1 + 1e-4)).agrees


def test_the_documents_105_21() -> None:
    """001 section 4.3.1: Q1 K1ᵀ entry [0,1] with the document's input (the variant
    `document`): q0 = [1,3,3,5] W_Q1, k1 = [2.84,3.99,4,6] W_K1, by hand here."""
    W_Q1 = [[0, 0, 0], [1, 1, 0], [0, 0, 1], [1, 0, 0]]
    W_K1 = [[1, 0, 1], [0, 1, 0], [1, 0, 1], [0, 1, 0]]
    x0, x1 = [1, 3, 3, 5], [2.84, 3.99, 4, 6]
    q0 = [sum(x0[r] * W_Q1[r][c] for r in range(4)) for c in range(3)]
    k1 = [sum(x1[r] * W_K1[r][c] for r in range(4)) for c in range(3)]
    assert q0 == [8, 3, 3]
    e = explained(load(None, [], "document"), "encoder.0.self_attn.h0.scores", (0, 1))
    assert e.operands["q0"] == q0
    np.testing.assert_allclose(e.operands["k1"], k1, atol=1e-12)
    assert e.lines() == [
        "encoder.0.self_attn.h0.scores[0,1] = q0 · k1 = 8×6.84 + 3×9.99 + 3×6.84 = 105.21"
    ]
    assert e.result == pytest.approx(8 * 6.84 + 3 * 9.99 + 3 * 6.84, abs=1e-12)
    assert e.value == pytest.approx(105.21, abs=1e-9)


def test_projection_with_bias_substitutes_the_row_the_column_and_the_bias() -> None:
    data = random_config(np.random.default_rng(3), d_model=4, n_heads=2, biases=True)
    cfg = config_from(data)
    head = data["weights"]["encoder"][0]["self_attn"]["heads"][1]
    trace = run(cfg)
    e = explain(cfg, trace, trace["encoder.0.self_attn.h1.k"], (2, 1))
    x2 = trace.value("encoder.input")[2]
    assert e.operands["x2"] == x2.tolist()
    assert e.operands["W_k[:,1]"] == [row[1] for row in head["W_k"]]
    assert e.operands["b_k[1]"] == [head["b_k"][1]]
    want = sum(a * b for a, b in zip(x2, [row[1] for row in head["W_k"]], strict=True))
    assert e.result == pytest.approx(want + head["b_k"][1], abs=1e-12)
    assert "x2 · W_k[:,1] + b_k[1]" in e.lines()[0]


def test_softmax_writes_out_the_exponentials() -> None:
    cfg = load(str(FIXTURES / "002_database_query.yaml"))
    e = explained(cfg, "attn.softmax", (0, 2))
    assert e.operands["scaled0"] == [1, 1, 0, 1] and e.operands["m"] == [1]
    text = "\n".join(e.lines())
    assert "e^(0 − 1) / (e^(1 − 1) + e^(1 − 1) + e^(0 − 1) + e^(1 − 1))" in text
    assert e.result == pytest.approx(1 / (3 * math.e + 1), abs=1e-15)
    cold = explained(
        load(str(FIXTURES / "002_database_query.yaml"), [], "cold"), "attn.softmax", (0, 0)
    )
    assert cold.operands["T"] == [0.01] and any(
        "z = (scaled − m) / T = [0, 0, -100, 0]" in w
        for w in cold.where  # m = 1
    )
    assert cold.result == pytest.approx(1 / (3 + math.exp(-100)), abs=1e-15)


def test_layer_norm_statistics_are_the_rows_own() -> None:
    cfg = load(None, [], "document_scale30")
    trace = run(cfg)
    z = trace.value("encoder.0.self_attn.residual")[1]
    mean, var = sum(z) / 4, sum((v - sum(z) / 4) ** 2 for v in z) / 4
    e = explain(cfg, trace, trace["encoder.0.self_attn.norm"], (1, 2))
    assert e.operands["x"] == [z[2]]
    assert e.operands["mean"][0] == pytest.approx(mean, abs=1e-12)
    assert e.operands["var"][0] == pytest.approx(var, abs=1e-12)
    assert e.result == pytest.approx((z[2] - mean) / math.sqrt(var + 1e-5), abs=1e-12)
    ev = explain(cfg, trace, trace["encoder.0.self_attn.norm.var"], (1, 0))
    assert ev.operands["x[1,:]"] == z.tolist() and "(4 terms)" not in ev.lines()[-1]


def test_a_pre_norm_residual_says_the_sublayer_read_the_norm() -> None:
    """Pre-norm is x + sublayer(Norm(x)), as the step's formula says; the written line
    said x + sublayer(x), the post-norm convention, and did not name the norm read."""
    data = {
        "model": {"d_model": 2, "positional": "none", "norm_position": "pre", "d_ff": 2},
        "source": [[1, 3], [2, -2]],
    }
    x = np.array(data["source"], dtype=float)
    for block, x_name in (("self_attn", "encoder.input"), ("ffn", "encoder.0.self_attn.residual")):
        trace = run(config_from(data))
        e = explain(config_from(data), trace, trace[f"encoder.0.{block}.residual"], (1, 0))
        assert e.formula == "x + sublayer(Norm(x))"
        assert e.chain[0] == "x[1,0] + sublayer(Norm(x))[1,0]"
        assert e.where == (
            f"x = {x_name} (the sublayer's input)",
            f"sublayer(Norm(x)) = encoder.0.{block}.{'wo' if block == 'self_attn' else 'out'} "
            f"(it reads Norm(x) = encoder.0.{block}.norm)",
        )
        if block == "self_attn":  # x[1,0] is the source's own number
            assert e.operands["x"] == [x[1, 0]]
    post = {**data, "model": {**data["model"], "norm_position": "post"}}
    e = explained(config_from(post), "encoder.0.ffn.residual", (0, 1))
    assert e.chain[0] == "x[0,1] + sublayer(x)[0,1]"
    assert e.where[1] == "sublayer(x) = encoder.0.ffn.out"


def test_concat_names_the_head_and_its_column() -> None:
    e = explained(load(None), "encoder.0.self_attn.concat", (1, 4))
    assert e.lines()[0].endswith("= head 1's context[1,1] = " + e.chain[-1])
    assert "column 4 = head 1 (columns 3..5), its column 1" in e.where


def test_a_fully_masked_softmax_row_says_it_has_no_softmax() -> None:
    """SPEC: a fully masked row comes out as NaN, not silently. The explanation wrote its
    nan with `m = -inf (subtracted for stability; it cancels)`, and −inf − (−inf) is
    nan, not 0: it now says why, beside the result."""
    mask = [[0, -math.inf, 0], [-math.inf, -math.inf, -math.inf]]
    att = {"Q": [[1, 0], [0, 1]], "K": [[1, 0], [0, 1], [1, 1]], "V": [[1], [2], [3]]}
    for T in (1, 0.5):
        cfg = config_from({"attention": {**att, "mask": mask, "temperature": T}})
        e = explained(cfg, "attn.softmax", (1, 2))
        assert math.isnan(e.result) and math.isnan(e.value) and e.agrees
        assert e.chain[-1] == "nan  (a fully masked row has no softmax)"
        assert e.where[1] == (
            "m = the row's largest masked = -inf "
            "(subtracted for stability; every entry is −inf: −inf − (−inf) is nan)"
        )
        # row 0 keeps keys 0 and 2, both scored q0 · k = 1: half each, at any T
        kept = explained(cfg, "attn.softmax", (0, 2))
        assert kept.result == 0.5 and kept.chain[-1] == "0.5"
        assert kept.where[1].endswith("(subtracted for stability; it cancels)")


def test_masks_say_why() -> None:
    cfg = load(str(FIXTURES / "004_causal_padding_mask.yaml"))
    assert "key 1 comes after query 0 (causal)" in explained(cfg, "decoder.mask", (0, 1)).chain[0]
    pad = explained(cfg, "decoder.mask", (3, 3)).chain[0]
    assert pad.startswith("-inf") and "pad token '<pad>'" in pad and "causal" not in pad
    both = explained(cfg, "decoder.mask", (2, 4)).chain[0]
    assert "causal" in both and "pad token" in both
    assert (
        explained(cfg, "decoder.mask", (4, 2)).chain[0].startswith("0  (query 4 may look at key 2")
    )


def test_a_cross_mask_longer_than_the_target_names_its_queries_as_they_are() -> None:
    # 4 source keys, 2 target queries, no KV cache: query i is at position i, and the
    # cross mask has no causal part (it said 'query 0 (position 2)', from 4 − 2)
    cfg = config_from(
        {
            "model": {"seed": 7, "d_model": 4, "n_heads": 2, "decoder_layers": 1, "d_ff": 6},
            "vocab": ["a", "b", "c", "P", "S", "E"],
            "tokens": {"bos": "S", "eos": "E", "pad": "P"},
            "source": ["a", "P", "b", "c"],
            "target": ["S", "a"],
        }
    )
    seen = explained(cfg, "decoder.cross_mask", (0, 3))
    assert seen.value == 0 and "(query 0 may look at key 3 (not a pad))" in seen.chain[0]
    pad = explained(cfg, "decoder.cross_mask", (1, 1)).chain[0]
    assert pad.startswith("-inf") and "key 1 is the pad token 'P'" in pad
    assert "position" not in seen.chain[0] + pad


def test_positions_embeddings_and_input() -> None:
    cfg = load(None)
    pe = explained(cfg, "encoder.pe", (1, 3))
    assert pe.chain[:2] == ("cos(1 / 10000^(2/4))", "cos(0.01)")
    assert pe.result == pytest.approx(math.cos(0.01), abs=1e-15)
    assert explained(cfg, "encoder.embed", (1, 2)).lines() == [
        "encoder.embed[1,2] = embedding['world'][2] = 4"
    ]
    scaled = load(None, ["model.embed_scale=2"])
    e = explained(scaled, "encoder.input", (1, 0))
    assert e.operands == {"E": [2.0], "embed_scale": [2.0], "PE": [math.sin(1)]}
    assert e.result == pytest.approx(4 + math.sin(1), abs=1e-15)


def test_rope_writes_the_angle() -> None:
    cfg = load(str(FIXTURES / "000_rope_relative_position.yaml"))
    e = explained(cfg, "encoder.0.self_attn.h0.q", (1, 2))
    assert e.operands["θ"] == [1 * 10000 ** (-2 / 4)]
    assert e.operands["q_raw[1,2]"] == [2.0] and e.operands["q_raw[1,3]"] == [-1.0]
    assert e.result == pytest.approx(2 * math.cos(0.01) + math.sin(0.01), abs=1e-15)


def test_additive_and_gaussian_scores_are_written_as_in_003() -> None:
    e = explained(load(str(FIXTURES / "003_additive_attention.yaml")), "attn.scores", (0, 0))
    assert e.chain[:2] == ("v_a · tanh(q_a0 + k_a0)", "1×tanh(1 + 2) + 2×tanh(0 + (-1))")
    assert e.result == pytest.approx(math.tanh(3) - 2 * math.tanh(1), abs=1e-15)
    g = explained(load(str(FIXTURES / "003_gaussian_kernel.yaml")), "attn.scores", (0, 0))
    assert g.chain[:2] == ("−½ Σ_f ((q0f − k0f) w_f)²", "−½ × (((1.5 − 0)×1)²)")
    assert g.result == -1.125


def test_a_calculators_query_and_key_rows_are_named_alike() -> None:
    """Q is a given array, not a step: its row was written without the scores' label,
    'q1 = row 1 of Q' beside 'k1 = row 1 ('k1') of K'."""
    cfg = load(str(FIXTURES / "003_gaussian_kernel.yaml"))
    assert explained(cfg, "attn.scores", (0, 1)).where[:2] == (
        "q0 = row 0 ('q0') of Q = [1.5]",
        "k1 = row 1 ('k1') of K = [1]",
    )


def test_norm_calculator_reduces_along_the_stated_axis() -> None:
    batch = load(str(FIXTURES / "004_layer_batch_norm.yaml"), [], "batch")
    e = explained(batch, "norm.mean", (0, 1))
    assert e.operands == {"x[:,1]": [0.7432, 1.3647, -1.1707]}
    inst = config_from(OP_CASES["instance"])
    e = explained(inst, "norm.var", (1, 0, 0))
    assert e.operands["x[1,0,:]"] == [0, 1, 0] and e.result == pytest.approx(2 / 9, abs=1e-15)
    out = explained(inst, "norm.out", (1, 1, 2))
    assert out.operands["γ"] == [1.0] and out.operands["β"] == [-1.0]


def test_long_sums_are_elided_with_the_total() -> None:
    cfg = config_from(MODEL_CASES["dot_wide"])
    e = explained(cfg, "encoder.0.ffn.hidden", (0, 3))
    text = "\n".join(e.lines())
    assert "…" in text and "(16 terms)" in text
    assert len(e.operands["x0"]) == 16


def test_output_and_tied_logits() -> None:
    e = explained(load(None), "encoder.output", (0, 1))
    assert e.chain[0] == "encoder.0.ffn.norm[0,1]"
    tied = config_from(MODEL_CASES["pre_rms_gelu_learned_tied"])
    e = explained(tied, "logits", (0, 2))
    assert "x0 · Eᵀ[:,2] + b[2]" in e.chain[0]


def test_find_step_and_parse_cell() -> None:
    trace = run(load(None))
    assert find_step(trace, "probs").path == "probs"
    step = trace["encoder.0.self_attn.h0.scores"]
    assert parse_cell("1, 0", step) == (1, 0) and parse_cell(None, step) == (0, 0)


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "160"})
    return result.exit_code, result.stdout, result.stderr


def test_explain_command_table_and_json() -> None:
    code, out, err = invoke(
        "explain", "encoder.0.self_attn.h0.scores", "--cell", "0,1", "--variant", "document"
    )
    assert code == 0, err
    assert "q0 · k1 = 8×6.84 + 3×9.99 + 3×6.84 = 105.21" in out
    assert "the arithmetic above agrees" in out
    code, out, err = invoke(
        "explain", "attn.context", str(FIXTURES / "002_database_query.yaml"), "--format", "json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["step"] == "attn.context" and data["cell"] == [0, 0] and data["agrees"] is True
    assert data["operands"]["V[:,0]"] == [18, 20, 22, 19]


def test_a_misspelt_path_is_suggested_only_when_a_letter_or_two_apart() -> None:
    # check and explain share one rule: get_close_matches' 0.5 named h0.v for h0.nope
    # (every path of one head shares most of its letters), a step the user did not mean
    code, _, err = invoke("explain", "encoder.0.self_attn.h0.nope")
    assert code == 2 and "no step 'encoder.0.self_attn.h0.nope'" in err
    assert "did you mean" not in err
    code, _, err = invoke("explain", "encoder.0.self_attn.h0.sofmax")
    assert code == 2 and "did you mean 'encoder.0.self_attn.h0.softmax'" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("scores",), "'scores' selects 6 steps"),
        (("encoder.0.self_attn.h0.scors",), "did you mean 'encoder.0.self_attn.h0.scores'"),
        # a generate iteration's step: it suggested decode's, which holds other numbers
        (
            ("t1.decoder.0.self_attn.h0.scores",),
            "is explained by `trace-tf generate [CONFIG] [its options] --explain STEP",
        ),
        (("probs", "--cell", "0"), "--cell needs 2 indices"),
        (("probs", "--cell", "0,10"), "--cell 0,10 is outside probs"),
        (("probs", "--cell", "a,b"), "--cell must be whole numbers"),
        # int() alone took these as 0,1 and 0,3: not what was typed, or not ASCII digits
        (("probs", "--cell", "0,+1"), "--cell must be whole numbers"),
        (("probs", "--cell", "0,\u0663"), "--cell must be whole numbers"),
        (("probs", "--cell", "0_0,1"), "--cell must be whole numbers"),
        (("probs", "--cell", "-1,0"), "--cell -1,0 is outside probs"),
    ],
)
def test_explain_bad_input_exits_2(args: tuple[str, ...], message: str) -> None:
    code, _, err = invoke("explain", *args)
    assert code == 2 and message in err and "Traceback" not in err


def test_a_long_formula_is_shown_whole_on_a_narrow_terminal() -> None:
    # In the panel's title it was cut at the border: "... · γ + β,  ─╮".
    result = runner.invoke(
        app, ["explain", "encoder.0.ffn.norm", "--cell", "1,2"], env={"COLUMNS": "60"}
    )
    assert result.exit_code == 0, result.stderr
    text = " ".join(line.strip("│ ") for line in result.stdout.splitlines())
    assert "LayerNorm(x) = (x − mean) / √(var + ε) · γ + β, ε = 1e-05, biased var" in " ".join(
        text.split()
    )


# ---------------------------------------------------------------------------
# Non-finite arithmetic: written out as the engine's numpy computes it (IEEE 754)
# ---------------------------------------------------------------------------


def ieee(fn: Any) -> float:
    """The value numpy gives for an expression of float64 scalars, warnings silenced."""
    with np.errstate(all="ignore"):
        return float(fn())


def same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


f64 = np.float64


@pytest.mark.parametrize(
    ("norm", "cell", "want"),
    [
        # eps 0 and a constant row (layer) or column (batch): 0 / √0
        ({"kind": "layer", "x": [[1, 1]], "eps": 0}, (0, 1), lambda: f64(0) / np.sqrt(f64(0))),
        ({"kind": "batch", "x": [[1, 2], [1, 3]], "eps": 0}, (1, 0), lambda: f64(0) / np.sqrt(f64(0))),
        ({"kind": "batch", "x": [[1, 2], [1, 3]], "eps": 0}, (1, 1), lambda: f64(0.5) / np.sqrt(f64(0.25))),
        ({"kind": "rms", "x": [[0, 0]], "eps": 0}, (0, 0), lambda: f64(0) / np.sqrt(f64(0))),
        # squares that underflow to 0 are no zero rms: the rms of [t, −t] is t, x / rms ±1
        # (it was ±inf, the 0 of the underflow taken for the rms)
        ({"kind": "rms", "x": [[1e-200, -1e-200]], "eps": 0}, (0, 0), lambda: f64(1)),
        ({"kind": "rms", "x": [[1e-200, -1e-200]], "eps": 0}, (0, 1), lambda: f64(-1)),
    ],
)  # fmt: skip
def test_a_norm_over_a_zero_root_is_nan_or_inf_as_in_the_engine(
    norm: dict[str, Any], cell: tuple[int, int], want: Any
) -> None:
    """It was a ZeroDivisionError (exit 3): Python's `/` refuses what IEEE 754 defines."""
    e = explained(config_from({"norm": norm}), "norm.out", cell)
    expected = ieee(want)
    assert same_float(e.result, expected) and same_float(e.value, expected)
    assert e.agrees and e.chain[-1] == ("nan" if math.isnan(expected) else f"{expected:g}")


EPS0_MODEL = {
    "model": {"d_model": 2, "norm_eps": 0, "positional": "none"},
    "source": [[1, 1]],
    "weights": {"encoder": [{"self_attn": {"W_o": [[0, 0], [0, 0]]}}]},
}


@pytest.mark.parametrize(("norm", "source"), [("layer", [[1, 1]]), ("rms", [[0, 0]])])
def test_a_model_norm_with_eps_0_on_a_constant_row_is_nan(norm: str, source: Any) -> None:
    data = {**EPS0_MODEL, "model": {**EPS0_MODEL["model"], "norm": norm}, "source": source}
    e = explained(config_from(data), "encoder.0.self_attn.norm", (0, 1))
    # W_o = 0: the residual is the source row, constant, so var = 0 (layer) or rms = 0
    assert math.isnan(e.result) and math.isnan(e.value) and e.agrees
    assert e.chain[-2] in ("(1 − 1) / √(0 + 0) × 1 + 0", "0 / 0 × 1 + 0")


def test_explain_command_on_a_zero_variance_exits_0_with_the_nan(tmp_yaml: Any) -> None:
    path = tmp_yaml("norm: {kind: batch, x: [[1, 2], [1, 3]], eps: 0}\n")
    code, out, err = invoke("explain", "norm.out", path)
    assert code == 0, err
    assert "0 / √(0 + 0) × 1 + 0 = nan" in out and "recorded value nan" in out
    assert "NaN first appears in step norm.out" in err


OVERFLOW_MODEL = {  # cfg/overflow.yaml of the user audit
    "model": {"d_model": 2, "positional": "none"},
    "source": [[1e200, -1e200], [1e200, 1e200]],
    "weights": {"encoder": [{"self_attn": {"heads": [
        {"W_q": [[1e200, 1], [1e200, 1]], "W_k": [[1e200, 1], [-1e200, 1]]},
    ]}}]},
}  # fmt: skip


def test_a_product_that_overflows_is_written_out_as_the_engine_computed_it() -> None:
    """It was `ValueError: -inf + inf in fsum` (exit 3). q[0,0] = 1e200×1e200 + (−1e200)×1e200:
    added one rounded product at a time (IEEE, numpy without fusing) inf + (−inf) = nan;
    with fused multiply-adds (the second product kept exact, −1e400, when added to the
    first's inf) inf. The engine's BLAS decides; the explanation must agree with it."""
    cfg = config_from(OVERFLOW_MODEL)
    e = explained(cfg, "encoder.0.self_attn.h0.q", (0, 0))
    one_by_one = ieee(lambda: f64(1e200) * f64(1e200) + f64(-1e200) * f64(1e200))
    assert math.isnan(one_by_one)
    assert e.agrees and (math.isnan(e.value) or e.value == math.inf)
    assert e.chain[-2] == "1.000e+200×1.000e+200 + (-1.000e+200)×1.000e+200"
    assert len(e.remarks) == 1 and "nan" in e.remarks[0] and "inf" in e.remarks[0]
    # both products +1e400: +inf whichever way; x1 = [1e200, 1e200], column 0 of W_q
    inf = explained(cfg, "encoder.0.self_attn.h0.q", (1, 0))
    assert inf.result == inf.value == ieee(lambda: f64(1e200) * f64(1e200) * 2) == math.inf
    assert inf.remarks == ()
    # finite products whose sum overflows (fsum raised "intermediate overflow")
    big = {**OVERFLOW_MODEL, "source": [[1e308, 1e308]]}
    big["weights"] = {"encoder": [{"self_attn": {"heads": [{"W_q": [[1, 0], [1, 0]]}]}}]}
    e = explained(config_from(big), "encoder.0.self_attn.h0.q", (0, 0))
    assert e.result == e.value == ieee(lambda: f64(1e308) + f64(1e308)) == math.inf


def test_an_overflowing_sum_fused_last_to_first_is_the_one_recorded() -> None:
    """q0 · k0 = 1e200×1e200 + 1e200×(−1e200): nan one rounded product at a time, +inf with
    fused multiply-adds first to last, −inf last to first. OpenBLAS, for a 1 × 2 by 2 × 2
    product, recorded −inf, and the explanation said `recorded value -inf but the
    arithmetic gives nan`, its note naming only +inf: the engine's own number is one way
    of adding them, and the explanation must show it, whichever the BLAS took."""
    Q, K = [[1e200, 1e200]], [[1e200, -1e200], [1, 1]]
    cfg = config_from({"attention": {"Q": Q, "K": K, "V": [[1], [2]], "scale": 1}})
    trace = run(cfg)
    step = trace["attn.scores"]
    engine = ieee(lambda: (np.array(Q) @ np.array(K).T)[0, 0])  # this machine's BLAS
    one_by_one = ieee(lambda: f64(1e200) * f64(1e200) + f64(1e200) * f64(-1e200))
    assert math.isnan(one_by_one)
    for recorded in (engine, math.inf, -math.inf, math.nan):  # each order a BLAS may take
        value = step.value.copy()
        value[0, 0] = recorded
        e = explain(cfg, trace, dataclasses.replace(step, data=value), (0, 0))
        assert e.agrees and same_float(e.result, recorded), (recorded, e.result)
        assert e.chain[-2] == "1.000e+200×1.000e+200 + 1.000e+200×(-1.000e+200)"
        assert e.remarks[0].endswith(
            "as written, nan; with fused multiply-adds (each product added exactly, as BLAS "
            "matrix products do on most machines), inf adding them first to last, -inf last "
            "to first"
        )
    value = step.value.copy()
    value[0, 0] = 5.0  # no way of adding them gives a finite number
    assert not explain(cfg, trace, dataclasses.replace(step, data=value), (0, 0)).agrees


def test_scores_of_infinite_rows_are_nan_and_the_command_exits_0(tmp_yaml: Any) -> None:
    """The audit's `--set model.init_std=1e200`: drawn weights overflow q and k to ±inf."""
    path = tmp_yaml("model: {d_model: 4, n_heads: 2}\nvocab: [a, b, c]\nsource: [a, b, c]\n")
    code, out, err = invoke(
        "explain", "encoder.0.self_attn.h0.scores", path, "--cell", "0,1",
        "--set", "model.init_std=1e200", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    assert "overflow: an infinity first appears" in err
    data = json.loads(out)
    q0, k1 = data["operands"]["q0"], data["operands"]["k1"]
    want = ieee(lambda: np.dot(np.array(q0, dtype=float), np.array(k1, dtype=float)))
    assert not math.isfinite(want) and data["agrees"] is True
    assert data["result"] == data["value"] == ("nan" if math.isnan(want) else str(want))


X_HUGE = np.array([[1e200, -1e200]])


@pytest.mark.parametrize(
    ("data", "path", "cell", "want"),
    [
        pytest.param({"norm": {"kind": "layer", "x": X_HUGE.tolist()}}, "norm.var", (0, 0),
                     lambda: np.var(X_HUGE), id="var-square-overflow"),
        pytest.param({"attention": {"score": "gaussian", "Q": [[1e200]], "K": [[-1e200]], "V": [[1]]}},
                     "attn.scores", (0, 0), lambda: -0.5 * (f64(2e200) * 1) ** 2, id="gaussian-square-overflow"),
        pytest.param({"attention": {"score": "gaussian", "Q": [[1e154, 1e154]], "K": [[0, 0]], "V": [[1]]}},
                     "attn.scores", (0, 0), lambda: -0.5 * (f64(1e154) ** 2 + f64(1e154) ** 2),
                     id="gaussian-fsum-overflow"),
        pytest.param({"attention": {"score": "additive", "Q": [[1]], "K": [[1]], "V": [[1]],
                                    "W_a_q": [[1, 1]], "W_a_k": [[1, 1]], "v_a": [1e308, 1e308]}},
                     "attn.scores", (0, 0), lambda: f64(1e308) * np.tanh(2) + f64(1e308) * np.tanh(2),
                     id="additive-fsum-overflow"),
    ],
)  # fmt: skip
def test_sums_and_squares_that_overflow_in_other_steps_follow_numpy(
    data: dict[str, Any], path: str, cell: tuple[int, ...], want: Any
) -> None:
    """Each raised before: math.fsum's "intermediate overflow", or ** beyond float64."""
    e = explained(config_from(data), path, cell)
    assert not math.isfinite(ieee(want))
    assert same_float(e.result, ieee(want)) and e.agrees, (e.result, ieee(want))


@pytest.mark.parametrize(
    ("data", "path", "want"),
    [
        # numpy's sum of [1e308, 1e308] overflows, and so its mean; the mean is 1e308
        ({"norm": {"kind": "layer", "x": [[1e308, 1e308]]}}, "norm.mean", 1e308),
        # the squares overflow; the rms of [1e200, 1] is 1e200 / √2 (to 1e-400)
        ({"norm": {"kind": "rms", "x": [[1e200, 1]], "eps": 0}}, "norm.rms", 1e200 / math.sqrt(2)),
    ],
)  # fmt: skip
def test_a_mean_or_rms_numpy_overflows_on_is_the_true_one(
    data: dict[str, Any], path: str, want: float
) -> None:
    """Both were inf (numpy's overflow, in the engine and here), the true value finite."""
    e = explained(config_from(data), path, (0, 0))
    assert e.value == pytest.approx(want, rel=1e-15) and e.agrees, (e.value, e.result)


def test_a_nan_in_a_softmax_row_is_its_max_as_in_numpy() -> None:
    """Python's max([1e200, nan]) is 1e200 (the NaN never compares greater); numpy's is NaN,
    and so is the engine's stable softmax of that row."""
    data = {"attention": {"Q": [[1e200]], "K": [[1], [1e200]], "V": [[1], [2]], "scale": 1,
                          "mask": [[0, -math.inf]]}}  # fmt: skip
    cfg = config_from(data)
    # masked = [1e200 + 0, 1e200·1e200 + (−inf)] = [1e200, inf − inf] = [1e200, nan]
    with np.errstate(all="ignore"):
        row = np.array([1e200, 1e200 * 1e200]) + np.array([0, -np.inf])
    masked = explained(cfg, "attn.masked", (0, 1))
    assert math.isnan(masked.result) and masked.agrees
    e = explained(cfg, "attn.softmax", (0, 0))
    assert math.isnan(np.max(row)) and math.isnan(e.operands["m"][0])
    assert math.isnan(e.result) and e.agrees


def test_an_activation_of_nan_is_nan_and_gelu_tanh_of_a_huge_number_follows_numpy() -> None:
    # eps 0 on a constant row: the attention's norm is NaN, and so is the FFN's hidden layer
    act = explained(config_from(EPS0_MODEL), "encoder.0.ffn.act", (0, 3))
    assert math.isnan(ieee(lambda: np.maximum(f64(np.nan), 0.0)))
    assert math.isnan(act.result) and act.agrees  # was max(0.0, nan) = 0.0, not the engine's
    data = {
        "model": {"d_model": 2, "d_ff": 2, "positional": "none", "activation": "gelu_tanh"},
        "source": [[1, 2]],
        "weights": {"encoder": [{"self_attn": {"W_o": [[0, 0], [0, 0]]},
                                 "ffn": {"W_1": [[1e200, -1e200], [0, 0]]}}]},
    }  # fmt: skip
    cfg = config_from(data)
    trace = run(cfg)
    for j in (0, 1):
        h = f64(trace.value("encoder.0.ffn.hidden")[0, j])
        assert abs(h) > 1e199  # h³ is beyond float64: ** raised OverflowError
        want = ieee(lambda h=h: 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3))))
        e = explain(cfg, trace, trace["encoder.0.ffn.act"], (0, j))
        assert same_float(e.result, want) and e.agrees


@pytest.mark.parametrize(
    ("pe", "cell", "want"),
    [
        # a tiny base makes base^(2i/d) subnormal: the angle 1 / base^0.98 is inf, sin(inf) nan
        ({"length": 2, "d_model": 100, "base": 5e-324}, (1, 98),
         lambda: np.sin(1 / np.power(5e-324, 98 / 100))),
        # and RoPE's pos · base^(−2i/d): base^(−0.98) is beyond float64 (** raised)
        ({"length": 2, "d_model": 100, "base": 5e-324, "kind": "rope"}, (1, 49),
         lambda: 1 * np.power(5e-324, -98 / 100)),
    ],
)  # fmt: skip
def test_positions_with_an_angle_beyond_float64_follow_numpy(
    pe: dict[str, Any], cell: tuple[int, int], want: Any
) -> None:
    e = explained(config_from({"pe": pe}), "pe", cell)
    assert not math.isfinite(ieee(want)) and same_float(e.result, ieee(want)) and e.agrees


def test_rope_with_an_angle_beyond_float64_is_nan_as_in_numpy() -> None:
    data = {
        "model": {"d_model": 100, "positional": "rope", "pe_base": 5e-324},
        "source": [[1.0] * 100, [2.0] * 100],
    }
    cfg = config_from(data)
    trace = run(cfg)
    raw = trace.value("encoder.0.self_attn.h0.q_raw")
    for pos in (0, 1):  # θ = 0 · inf = nan at position 0, inf at 1: cos and sin are nan
        with np.errstate(all="ignore"):
            theta = pos * np.power(5e-324, -98 / 100)
            want = raw[pos, 98] * np.cos(theta) - raw[pos, 99] * np.sin(theta)
        e = explain(cfg, trace, trace["encoder.0.self_attn.h0.q"], (pos, 98))
        assert math.isnan(want) and math.isnan(e.result) and e.agrees


def test_the_ieee_helpers_give_numpys_values() -> None:
    """Every place explain's plain-Python arithmetic could raise, against numpy."""
    from trace_tf import explain as ex

    checks = [
        (ex._div(1.0, 0.0), lambda: f64(1) / f64(0)),
        (ex._div(-1.0, 0.0), lambda: f64(-1) / f64(0)),
        (ex._div(1.0, -0.0), lambda: f64(1) / f64(-0.0)),
        (ex._div(0.0, 0.0), lambda: f64(0) / f64(0)),
        (ex._sqrt(-1.0), lambda: np.sqrt(f64(-1))),
        (ex._exp(1000.0), lambda: np.exp(f64(1000))),
        (ex._exp(math.nan), lambda: np.exp(f64(np.nan))),
        (ex._pow(5e-324, -0.98), lambda: np.power(f64(5e-324), -0.98)),
        (ex._pow(-1e200, 3), lambda: np.power(f64(-1e200), 3)),
        (ex._sin(math.inf), lambda: np.sin(f64(np.inf))),
        (ex._cos(-math.inf), lambda: np.cos(f64(-np.inf))),
        (ex._fsum([math.inf, -math.inf]), lambda: np.sum([np.inf, -np.inf])),
        (ex._fsum([1e308, 1e308, -1e308]), lambda: np.sum([1e308, 1e308, -1e308])),
        (ex._fsum([1e308, 1e308, -math.inf]), lambda: np.sum([1e308, 1e308, -np.inf])),
        (ex._max([1.0, math.nan]), lambda: np.max([1.0, np.nan])),
    ]
    for got, want in checks:
        assert same_float(got, ieee(want)), (got, ieee(want))
    # a fused multiply-add keeps the product exact: 1e200 × 1e200 − 1e308 is 1e400 − 1e308
    assert (
        ex._fma(1e200, 1e200, -1e308) == math.inf and ex._fma(1e200, -1e200, math.inf) == math.inf
    )
    assert ex._fma(1e154, 1e154, -1e308) == float(Fraction(1e154) ** 2 - Fraction(1e308))


# ---------------------------------------------------------------------------
# The written arithmetic holds at the precision shown
# ---------------------------------------------------------------------------


def _evaluate(numbers: str) -> float:
    """A written line of arithmetic (`68 / 1.73`, `8×6.85 + 3×(-9.5)`, `(1 − 2)² / √(4 + 1e-05)`,
    `max(0, -1.5)`), evaluated."""
    expr = numbers.replace("×", "*").replace("−", "-").replace("²", "**2").replace("√", "sqrt")
    assert set(expr.replace("sqrt", "").replace("max", "")) <= set("0123456789.e+-*/(), "), numbers
    return float(eval(expr, {"__builtins__": {}, "sqrt": math.sqrt, "max": max}))


@pytest.mark.parametrize("precision", [0, 1, 2, 4, 6])
def test_the_written_numbers_give_the_result_as_written(precision: int) -> None:
    """`--precision 0` wrote `scaled[0,0] = 68 / 2 = 39` (68 / 1.7321 = 39.26, rounded),
    and said the arithmetic agreed. Now a reader who does the written arithmetic gets
    the written result, to its last digit, in every cell of these steps."""
    cfg = load(None)
    trace = run(cfg)
    stages = ("q", "k", "v", "scores", "scaled", "softmax", "context", "wo", "residual", "mean",
              "var", "norm", "hidden", "act", "logits", "probs")  # fmt: skip
    checked = 0
    for step in trace:
        if step.stage not in stages:
            continue
        for cell in np.ndindex(*step.shape):
            e = explain(cfg, trace, step, cell, precision)
            written, result = _evaluate(e.chain[-2]), float(e.chain[-1])
            unit = 10.0**-precision
            assert abs(written - result) <= 0.5 * unit * (1 + 1e-9), (e.lines(), written)
            assert e.agrees and abs(result - e.value) <= 0.5 * unit * (1 + 1e-9)
            checked += 1
    assert checked > 100


def test_precision_0_writes_the_scale_with_the_digits_it_needs() -> None:
    e = explained_at(load(None), "encoder.0.self_attn.h0.scaled", (0, 0), 0)
    assert round(68 / math.sqrt(3)) == 39 and round(68 / 2) == 34 and round(68 / 1.7) == 40
    assert e.chain[-2:] == ("68 / 1.73", "39")  # 68 / 1.73 = 39.31, the fewest digits that hold
    code, out, _ = invoke("explain", "encoder.0.self_attn.h0.scaled", "--precision", "0")
    assert code == 0 and "= 68 / 1.73 = 39" in out and "68 / 2 " not in out
    # the check against the recorded value is at full precision, as before
    assert e.result == pytest.approx(68 / math.sqrt(3), rel=1e-15)


def explained_at(cfg: Config | OpConfig, path: str, cell: tuple[int, ...], p: int) -> Explanation:
    trace = run(cfg)
    return explain(cfg, trace, trace[path], cell, p)


def test_a_scalar_weight_written_in_scientific_notation_is_explained() -> None:
    # The gaussian score's width w is a 0-d array; at --precision 0 it is written in
    # scientific notation, and writing it into np.round's result (a scalar for a 0-d
    # array) raised TypeError: exit 3.
    cfg = load(None, ["model.score=gaussian"])
    e = explained_at(cfg, "decoder.0.self_attn.h0.scores", (0, 0), 0)
    assert e.agrees and e.chain[-1] == "-4.8e-01"
    code, _, err = invoke("explain", "decoder.0.self_attn.h0.scores", "--set",
                          "model.score=gaussian", "--precision", "0")  # fmt: skip
    assert code == 0, err


def test_a_token_with_control_characters_is_shown_escaped(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    # explain wrote a token into its lines raw: an escape character reached the
    # terminal as is, and a newline split `embedding['...']` over two lines (the
    # tables show it escaped, as render.printable writes it). JSON keeps it whole.
    odd = "x\x1b[31m\ny"
    path = tmp_yaml(
        "model: {d_model: 2, n_heads: 1, d_ff: 2, encoder_layers: 1, decoder_layers: 0}\n"
        f"vocab: [{json.dumps(odd)}, b]\nsource: [{json.dumps(odd)}, b]\n"
    )
    result = runner.invoke(app, ["explain", "encoder.embed", path, "--cell", "0,0"])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout
    assert "embedding['x\\x1b[31m\\ny'][0]" in result.stdout
    result = runner.invoke(
        app, ["explain", "encoder.embed", path, "--cell", "0,0", "--format", "json"]
    )
    assert f"embedding['{odd}']" in json.loads(result.stdout)["operands"]


def test_fused_projections_are_named_by_the_column_of_the_given_matrix() -> None:
    """A fused W_q (d_model x H·d_k) gives head h its columns h·d_k.. (SPEC §2): head 1's
    column 1 is column 3 of the W_q in the file, which has no `heads.1.W_q`."""
    W_q = np.arange(1.0, 17.0).reshape(4, 4)
    b_q = np.array([100.0, 200.0, 300.0, 400.0])
    data = {
        "model": {"d_model": 4, "n_heads": 2, "encoder_layers": 1},
        "vocab": ["a", "b"],
        "source": ["a", "b"],
        "weights": {"encoder": [{"self_attn": {"W_q": W_q.tolist(), "b_q": b_q.tolist()}}]},
    }
    cfg = config_from(data)
    x = run(cfg).value("encoder.input")
    e = explained(cfg, "encoder.0.self_attn.h1.q", (1, 1))
    assert e.operands["W_q[:,1]"] == W_q[:, 3].tolist() and e.operands["b_q[1]"] == [400.0]
    assert e.value == pytest.approx(x[1] @ W_q[:, 3] + 400.0, rel=1e-12)
    where = "\n".join(e.where)
    assert (
        "column 3 of weights.encoder.0.self_attn.W_q (head 1's 2..3; given in test.yaml)" in where
    )
    assert "b_q[1] = entry 3 of weights.encoder.0.self_attn.b_q (head 1's 2..3; given in" in where
    assert "heads.1" not in where
    # the per-head form is named as given
    drawn = explained(config_from({**data, "weights": {}}), "encoder.0.self_attn.h1.q", (1, 1))
    assert "column 1 of weights.encoder.0.self_attn.heads.1.W_q" in "\n".join(drawn.where)


def test_the_tied_output_weights_column_is_named_by_its_token() -> None:
    # "column 2 of embeddings (tied, transposed)" left the reader to count the vocabulary
    import yaml

    doc = yaml.safe_load((FIXTURES / "hello.yaml").read_text())
    token = doc["vocab"][2]
    args = ["explain", "logits", "--cell", "0,2", "--set", "model.tie_embeddings=true"]
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    where = json.loads(result.stdout)["where"][1]
    vector = ", ".join(str(x) for x in doc["embeddings"][token])
    assert f"column 2 of embeddings (tied, transposed), the embedding of '{token}' (" in where
    assert where.endswith(f" = [{vector}]")
