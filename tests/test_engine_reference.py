"""The engine against an independent PyTorch implementation (tests/reference_torch.py),
on random configs of several shapes, and traced against untraced."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import config_from, shape_id
from random_configs import LLAMA, random_config, to_per_head
from reference_torch import reference_forward

from trace_tf import model
from trace_tf.config import Config
from trace_tf.runner import run

SHAPES = [
    dict(d_model=4, n_heads=2),  # encoder-only, post-norm
    dict(d_model=6, n_heads=3, norm_position="pre"),
    dict(d_model=8, n_heads=2, decoder_layers=2, encoder_layers=2),
    dict(d_model=8, n_heads=2, decoder_layers=1, norm_position="pre", norm="rms"),
    dict(d_model=5, n_heads=2, d_k=3, d_v=4, d_ff=7, decoder_layers=1, biases=False),
    dict(d_model=4, n_heads=1, encoder_layers=0, decoder_layers=2, activation="gelu"),
    dict(d_model=6, n_heads=2, decoder_layers=1, activation="gelu_tanh", positional="learned"),
    # gated FFNs (Shazeer 2020): SwiGLU pre-norm RMSNorm (as LLaMA), GeGLU post-norm;
    # and SiLU as a plain activation
    dict(
        d_model=6, n_heads=2, decoder_layers=1, norm_position="pre", norm="rms", activation="swiglu"
    ),
    dict(d_model=4, n_heads=2, d_ff=5, decoder_layers=1, activation="geglu"),
    dict(
        d_model=4, n_heads=1, encoder_layers=0, decoder_layers=2, activation="swiglu", biases=False
    ),
    dict(d_model=5, n_heads=1, d_ff=3, activation="silu"),
    dict(
        d_model=6,
        n_heads=2,
        decoder_layers=1,
        positional="none",
        tie_embeddings=True,
        embed_scale="sqrt_d_model",
    ),
    dict(d_model=8, n_heads=4, decoder_layers=1, pad=True, src_len=5, tgt_len=4),
    dict(d_model=8, n_heads=2, encoder_layers=0, decoder_layers=1, pad=True, tgt_len=5, scale=2.5),
    dict(d_model=6, n_heads=2, decoder_layers=1, fused=True, final_norm=True),
    dict(d_model=7, n_heads=1, decoder_layers=1, norm_position="pre", final_norm=False),
    # relative position bias (000 section 6.2): post- and pre-norm, encoder-only and
    # encoder-decoder, decoder-only, with padding masks, per-head and fused tables
    dict(d_model=4, n_heads=2, positional="relative", pad=True, src_len=5),
    dict(d_model=6, n_heads=3, positional="relative", norm_position="pre"),
    dict(
        d_model=8,
        n_heads=2,
        decoder_layers=2,
        encoder_layers=2,
        positional="relative",
        pad=True,
        src_len=4,
        tgt_len=5,
    ),
    dict(
        d_model=6,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=1,
        positional="relative",
        norm_position="pre",
        norm="rms",
        fused=True,
        pad=True,
        tgt_len=4,
    ),
    dict(d_model=6, n_heads=2, decoder_layers=1, positional="relative", fused=True, max_len=9),
    # RoPE (000 section 6.3), its two pairings: adjacent (2i, 2i+1) and halves (i, i + d_k/2,
    # Hugging Face's rotate_half); decoder-only pre-norm RMSNorm (LLaMA's shape), encoder-decoder
    # with padding (rotated in self-attention only), odd d_k (its last column unturned)
    dict(d_model=6, n_heads=2, decoder_layers=1, positional="rope", pad=True, src_len=4),
    dict(
        d_model=8,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        positional="rope",
        rope_pairs="halves",
        norm_position="pre",
        norm="rms",
        biases=False,
        tgt_len=5,
    ),
    dict(
        d_model=8,
        n_heads=2,
        encoder_layers=2,
        decoder_layers=1,
        positional="rope",
        rope_pairs="halves",
        pad=True,
        src_len=5,
        tgt_len=4,
    ),
    dict(d_model=6, n_heads=2, d_k=5, d_v=3, decoder_layers=1, positional="rope", fused=True),
    dict(
        d_model=6,
        n_heads=2,
        d_k=5,
        d_v=3,
        decoder_layers=1,
        positional="rope",
        rope_pairs="halves",
        fused=True,
    ),
    # grouped-query attention (Ainslie et al. 2023; Hugging Face's repeat_kv): multi-query
    # (one K/V head), decoder-only pre-norm RMSNorm, RoPE by halves, SwiGLU (LLaMA's shape);
    # encoder-decoder with cross-attention, 2 K/V heads of 4, fused, padded; per-head
    # kv_heads with relative biases (test_dtype runs each shape in float32 too)
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=1,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        biases=False,
        tgt_len=5,
    ),
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=2,
        decoder_layers=2,
        fused=True,
        pad=True,
        src_len=5,
        tgt_len=4,
    ),
    dict(d_model=6, n_heads=3, n_kv_heads=1, d_k=4, d_v=3, decoder_layers=1, positional="relative"),
    # the embeddings normalised before layer 0 (model.embed_norm): BERT's shape (encoder-only,
    # post-norm LayerNorm, learned positions, GELU) and a decoder-only pre-norm RMSNorm; and
    # encoder-decoder with padding
    dict(d_model=8, n_heads=2, positional="learned", activation="gelu", embed_norm=True),
    dict(
        d_model=6,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="pre",
        norm="rms",
        embed_norm=True,
    ),
    dict(d_model=4, n_heads=2, decoder_layers=1, pad=True, src_len=4, tgt_len=3, embed_norm=True),
    # token types (model.token_types, BERT's segment embeddings): BERT's shape in both
    # stacks, with padding; and a decoder-only one with no positions (X = E + T)
    dict(
        d_model=6,
        n_heads=2,
        decoder_layers=1,
        positional="learned",
        embed_norm=True,
        pad=True,
        src_len=5,
        tgt_len=4,
        token_types=3,
    ),
    dict(
        d_model=4, n_heads=1, encoder_layers=0, decoder_layers=1, positional="none", token_types=2
    ),
    # wide enough ([L, d] arrays of 10 KiB) that the tracer copies steps into its blocks
    dict(d_model=32, n_heads=4, decoder_layers=2, pad=True, src_len=40, tgt_len=36),
    # sliding-window attention (model.window, Mistral), narrower than the target: LLaMA's
    # shape with RoPE by halves and grouped K/V heads; and a post-norm one with padding
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="pre",
        norm="rms",
        positional="rope",
        rope_pairs="halves",
        biases=False,
        tgt_len=7,
        window=3,
    ),
    dict(d_model=6, n_heads=2, encoder_layers=0, decoder_layers=1, pad=True, tgt_len=6, window=3),
    # GeGLU with the tanh GELU gate (geglu_tanh) in Gemma's shape: decoder-only pre-norm
    # RMSNorm, RoPE by halves, multi-query, d_k apart from d_model, scaled tied embeddings
    dict(
        d_model=6,
        n_heads=2,
        n_kv_heads=1,
        d_k=4,
        d_v=4,
        d_ff=7,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="pre",
        norm="rms",
        positional="rope",
        rope_pairs="halves",
        activation="geglu_tanh",
        tie_embeddings=True,
        embed_scale="sqrt_d_model",
        biases=False,
        tgt_len=5,
    ),
    # RoPE scaling (model.rope_scaling): llama3 (LLaMA 3.1-3.3) with its pairs of d_k 8,
    # base 100, in all three bands (wavelengths 6.3, 20, 63, 199 against 8 / 1.25 and
    # 8 / 0.25) on LLaMA's shape; linear (position interpolation) in an encoder-decoder
    dict(
        d_model=16,
        n_heads=2,
        n_kv_heads=1,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        tgt_len=12,
        pe_base=100.0,
        rope_scaling={
            "type": "llama3",
            "factor": 4,
            "low_freq_factor": 0.25,
            "high_freq_factor": 1.25,
            "original_max_len": 8,
        },
    ),
    dict(
        d_model=8,
        n_heads=2,
        decoder_layers=1,
        positional="rope",
        pad=True,
        src_len=6,
        tgt_len=5,
        rope_scaling={"type": "linear", "factor": 2.5},
    ),
    # ALiBi (model.positional alibi): symmetric in a padded encoder, causal in the decoder,
    # 3 heads (not a power of two); and BLOOM's shape: decoder-only, pre-norm, 4 heads,
    # the embedding norm, tanh GELU, tied embeddings, in a sliding window
    dict(d_model=6, n_heads=3, decoder_layers=1, positional="alibi", pad=True, src_len=5),
    dict(
        d_model=8,
        n_heads=4,
        encoder_layers=0,
        decoder_layers=2,
        positional="alibi",
        norm_position="pre",
        embed_norm=True,
        final_norm=True,
        activation="gelu_tanh",
        tie_embeddings=True,
        tgt_len=6,
        window=4,
    ),
    # QK-norm (model.qk_norm head): Qwen3's shape (LLaMA's, grouped-query, no biases), q and
    # k normalised over d_k before RoPE; LayerNorm's in an encoder-decoder without RoPE,
    # cross-attention included, padded; and RMSNorm, post-norm, fused weights, odd d_k
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        biases=False,
        tgt_len=5,
        qk_norm="head",
    ),
    dict(d_model=6, n_heads=2, decoder_layers=1, pad=True, src_len=5, qk_norm="head"),
    dict(
        d_model=8,
        n_heads=2,
        d_k=3,
        decoder_layers=1,
        norm="rms",
        fused=True,
        positional="rope",
        qk_norm="head",
    ),
    # partial rotary (model.rope_dims, GPT-NeoX's rotary_ndims) and parallel layers
    # (model.parallel): GPT-NeoX's shape, decoder-only, pre-norm LayerNorm, exact GELU, RoPE
    # by halves on 2 of d_k 4, a norm each; GPT-J's, one shared norm, tanh GELU, adjacent
    # pairs on 4 of 6 with llama3-scaled frequencies over those 4; a parallel encoder with
    # padding, RMSNorm, rope_dims d_k (all of it); and a sequential one turning 2 of an odd 5
    dict(
        d_model=8,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="pre",
        positional="rope",
        rope_pairs="halves",
        rope_dims=2,
        activation="gelu",
        parallel="separate",
        tgt_len=5,
    ),
    dict(
        d_model=12,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="pre",
        positional="rope",
        rope_dims=4,
        activation="gelu_tanh",
        parallel="shared",
        tgt_len=12,
        pe_base=100.0,
        rope_scaling={
            "type": "llama3",
            "factor": 4,
            "low_freq_factor": 0.25,
            "high_freq_factor": 1.25,
            "original_max_len": 8,
        },
    ),
    dict(
        d_model=8,
        n_heads=2,
        norm_position="pre",
        norm="rms",
        positional="rope",
        rope_dims=4,
        parallel="shared",
        pad=True,
        src_len=5,
    ),
    dict(d_model=6, n_heads=2, d_k=5, decoder_layers=1, positional="rope", rope_dims=2, fused=True),
    # the three together (StableLM 2's combination, its QK-norm's γ shared by the heads):
    # QK-norm before a partial rotary, 4 of d_k 6 by halves, in parallel layers, grouped-query
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        d_k=6,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="pre",
        positional="rope",
        rope_pairs="halves",
        rope_dims=4,
        qk_norm="head",
        parallel="separate",
        tgt_len=5,
    ),
    # model.norm_position output (OLMo 2's reordered norm: x + Norm(F(x))) and sandwich
    # (Gemma 2's x + Norm_post(F(Norm(x)))), model.qk_norm projection (OLMo 2's QK-norm over
    # all heads' columns before the split). OLMo 2's shape: grouped-query, RMSNorm, RoPE by
    # halves, SwiGLU, no biases; Gemma 2's (multi-query, GeGLU tanh, tied, scaled
    # embeddings); an encoder-decoder with sandwich LayerNorms and the whole-projection norm
    # in cross-attention too, padded; the output norm on an encoder with fused biased
    # weights, adjacent RoPE pairs and odd d_k; sandwich with per-head QK-norm
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **{**LLAMA, "norm_position": "output"},
        biases=False,
        tgt_len=5,
        qk_norm="projection",
    ),
    dict(
        d_model=6,
        n_heads=2,
        n_kv_heads=1,
        d_k=4,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="sandwich",
        norm="rms",
        positional="rope",
        rope_pairs="halves",
        activation="geglu_tanh",
        tie_embeddings=True,
        embed_scale="sqrt_d_model",
        biases=False,
    ),
    dict(
        d_model=6,
        n_heads=3,
        decoder_layers=2,
        encoder_layers=1,
        norm_position="sandwich",
        qk_norm="projection",
        pad=True,
        src_len=5,
        tgt_len=4,
    ),
    dict(
        d_model=8,
        n_heads=2,
        d_k=3,
        norm_position="output",
        positional="rope",
        fused=True,
        qk_norm="projection",
    ),
    dict(
        d_model=8,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=1,
        norm_position="sandwich",
        norm="rms",
        positional="rope",
        qk_norm="head",
    ),
    # Gemma 2's soft caps and alternating windows: decoder-only pre-norm RMSNorm, RoPE by
    # halves, grouped-query GeGLU (tanh), the scores capped at 1.5 and the logits at 2 (small
    # enough to bend these scores), layers 0 and 2 sliding over 2 keys, 1 full; and the caps
    # in an encoder-decoder (cross-attention capped too) with ALiBi's bias added after the
    # cap, padded, and windows [3, 3] (one for every layer) in a decoder-only one
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=3,
        norm_position="pre",
        norm="rms",
        positional="rope",
        rope_pairs="halves",
        activation="geglu_tanh",
        biases=False,
        tie_embeddings=True,
        embed_scale="sqrt_d_model",
        tgt_len=6,
        window=[2, None, 2],
        attn_softcap=1.5,
        logit_softcap=2.0,
    ),
    dict(
        d_model=6,
        n_heads=3,
        decoder_layers=1,
        positional="alibi",
        pad=True,
        src_len=5,
        tgt_len=4,
        attn_softcap=0.8,
        logit_softcap=1.5,
    ),
    dict(
        d_model=6,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        pad=True,
        tgt_len=7,
        window=[3, 3],
        attn_softcap=2.0,
    ),
    # Gemma 3's RoPE by layer (model.pe_base, model.rope_scaling as lists): its sliding
    # layers' base apart from its full layer's, the full one's frequencies linear-scaled
    # (÷ 8), in its shape: sandwich RMSNorms, per-head QK-norm, multi-query, halves
    dict(
        d_model=8,
        n_heads=2,
        n_kv_heads=1,
        encoder_layers=0,
        decoder_layers=3,
        norm_position="sandwich",
        norm="rms",
        positional="rope",
        rope_pairs="halves",
        qk_norm="head",
        activation="geglu_tanh",
        tgt_len=6,
        window=[2, 2, None],
        pe_base=[10000.0, 10000.0, 10.0],
        rope_scaling=[None, None, {"type": "linear", "factor": 8.0}],
    ),
    # Cohere's shape (Command R): one shared LayerNorm for both parallel sublayers, RoPE by
    # adjacent pairs, SwiGLU, tied embeddings, grouped-query; its logit_scale, here beside a
    # logit soft cap (the scaled logits capped); and Cohere 2's (Command R7B): sliding
    # layers turned by RoPE, the full layer with none (model.pe_base null), the logits
    # scaled alone
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="pre",
        positional="rope",
        activation="swiglu",
        parallel="shared",
        biases=False,
        tie_embeddings=True,
        tgt_len=5,
        logit_scale=0.25,
        logit_softcap=1.5,
    ),
    dict(
        d_model=8,
        n_heads=2,
        n_kv_heads=1,
        encoder_layers=0,
        decoder_layers=3,
        norm_position="pre",
        positional="rope",
        activation="swiglu",
        parallel="shared",
        biases=False,
        tie_embeddings=True,
        tgt_len=6,
        window=[2, 2, None],
        pe_base=[10000.0, 10000.0, None],
        logit_scale=0.5,
    ),
    # GPT-OSS's attention sinks: decoder-only, LLaMA's conventions, grouped-query, fused
    # sinks, alternating windows and pads (a row may see little but its sink); and per-head
    # sinks in an encoder-decoder with relative bias (the encoder's and the decoder's
    # self-attention have sinks, cross-attention none)
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        fused=True,
        pad=True,
        tgt_len=6,
        window=[2, None],
        attn_sinks=True,
    ),
    dict(
        d_model=6,
        n_heads=2,
        decoder_layers=1,
        positional="relative",
        pad=True,
        src_len=5,
        tgt_len=4,
        attn_sinks=True,
    ),
    # a mixture of experts (model.experts): Mixtral's shape (LLaMA's, grouped-query, 4
    # experts, top 2, renormalised); Qwen-MoE's norm_topk_prob false (not renormalised) in a
    # padded encoder-decoder with biases, post-norm ReLU, 3 of 5 experts; and one expert per
    # token (top 1 of 3) in GPT-NeoX's parallel layers, tanh GeGLU
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        biases=False,
        tgt_len=6,
        experts=4,
        experts_top_k=2,
    ),
    dict(
        d_model=6,
        n_heads=2,
        d_ff=5,
        decoder_layers=1,
        pad=True,
        src_len=5,
        tgt_len=4,
        experts=5,
        experts_top_k=3,
        experts_normalize=False,
    ),
    dict(
        d_model=6,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="pre",
        parallel="separate",
        activation="geglu_tanh",
        positional="rope",
        tgt_len=5,
        experts=3,
        experts_top_k=1,
    ),
    # experts by layer (a list, Qwen-MoE's mlp_only_layers): a dense layer between
    # mixtures of 4 and 3 experts, top 2 not renormalised
    dict(
        d_model=6,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=3,
        **LLAMA,
        tgt_len=5,
        experts=[4, None, 3],
        experts_top_k=2,
        experts_normalize=False,
    ),
    # shared experts: Qwen2-MoE's gated one (σ(X w_g)), wider than the experts, in
    # LLaMA's shape, and DeepSeek's plain one in a padded encoder-decoder, top 1 of 3
    dict(
        d_model=6,
        n_heads=2,
        d_ff=4,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        tgt_len=5,
        experts=4,
        experts_top_k=2,
        experts_normalize=False,
        shared_expert="gated",
        shared_expert_d_ff=7,
    ),
    dict(
        d_model=6,
        n_heads=2,
        d_ff=5,
        decoder_layers=1,
        pad=True,
        src_len=5,
        tgt_len=4,
        experts=3,
        experts_top_k=1,
        shared_expert="plain",
    ),
    # GPT-OSS's shape: LLaMA's with q/k/v/o biases, sinks, alternating windows, a router
    # bias and the clamped SwiGLU, its limit small enough to clamp both the gate and U
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **(LLAMA | dict(activation="swiglu_oss")),
        tgt_len=6,
        window=[3, None],
        attn_sinks=True,
        swiglu_limit=0.6,
        experts=4,
        experts_top_k=2,
        router_bias=True,
    ),
]


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_step_matches_the_torch_reference(shape: dict[str, object]) -> None:
    raw = random_config(np.random.default_rng(7), **shape)  # type: ignore[arg-type]
    expected = reference_forward(raw)
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    assert cfg.drawn == (), "random_config gives every array"
    trace = run(cfg, "full")
    compared = 0
    for path, value in expected.items():
        assert path in trace, f"engine did not record {path}"
        np.testing.assert_allclose(trace.value(path), value, rtol=1e-10, atol=1e-10, err_msg=path)
        compared += 1
    assert compared > 20
    assert "probs" in trace or cfg.model.decoder_layers == 0


@pytest.mark.parametrize("shape", SHAPES[:6], ids=shape_id)
def test_traced_equals_untraced(shape: dict[str, object]) -> None:
    cfg = config_from(random_config(np.random.default_rng(3), **shape))  # type: ignore[arg-type]
    assert isinstance(cfg, Config)
    traced = run(cfg, "full")
    untraced = model.run_full(cfg)
    last = "probs" if "probs" in traced else "encoder.output"
    assert np.array_equal(traced.value(last), untraced)


def test_fused_and_per_head_forms_give_identical_traces() -> None:
    raw = random_config(
        np.random.default_rng(11), d_model=6, n_heads=3, decoder_layers=1, fused=True
    )
    a = run(config_from(raw), "full")
    b = run(config_from(to_per_head(raw)), "full")
    assert list(a.steps) == list(b.steps)
    for path in a.steps:
        assert np.array_equal(a.value(path), b.value(path)), path
