"""`generate`: decoding against an independent step-by-step reference (tests/reference_torch.py
on the growing prefix), the KV cache against full recomputation, sampling and beam search
against hand computations and brute force, the JSON shape, and every exit-2 error."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import config_from, shape_id
from random_configs import LLAMA, random_config
from reference_torch import reference_forward
from rich.cells import cell_len
from typer.testing import CliRunner

from trace_tf import generate as gen
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.trace import Tracer

runner = CliRunner()
BOS, EOS = "t0", "t1"  # random_configs' tokens


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def model_of(raw: dict[str, Any]) -> Config:
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    return cfg


def generation_config(seed: int, max_len: int = 16, **shape: Any) -> dict[str, Any]:
    """A random config with a decoder (every array given), with room for `max_len`
    learned positions (or relative offsets)."""
    shape.setdefault("decoder_layers", 1)
    shape.setdefault("tgt_len", 1)
    if shape.get("positional") == "relative":
        shape.setdefault("max_len", max_len)
    rng = np.random.default_rng(seed)
    raw = random_config(rng, **shape)
    if shape.get("positional") == "learned":
        raw["model"]["max_len"] = max_len
        raw["weights"]["positional"] = (
            0.5 * rng.standard_normal((max_len, len(raw["embeddings"]["t0"])))
        ).tolist()
    return raw


SHAPES = [
    dict(d_model=4, n_heads=2),
    dict(d_model=6, n_heads=2, norm_position="pre", norm="rms", decoder_layers=2),
    dict(
        d_model=4,
        n_heads=1,
        encoder_layers=0,
        decoder_layers=2,
        activation="gelu",
        positional="learned",
    ),
    dict(d_model=8, n_heads=4, pad=True, src_len=5, tgt_len=3),
    dict(d_model=6, n_heads=2, positional="none", tie_embeddings=True, embed_scale="sqrt_d_model"),
    dict(d_model=5, n_heads=2, d_k=3, d_v=4, biases=False, fused=True, final_norm=True),
    # grouped-query attention: 2 K/V heads for 4 query heads, self- and cross-attention
    dict(d_model=8, n_heads=4, n_kv_heads=2, pad=True, src_len=5, tgt_len=3),
    # model.embed_norm: the new rows' embeddings normalised on their own under the cache
    dict(d_model=6, n_heads=2, positional="learned", embed_norm=True, pad=True, src_len=4),
    dict(
        d_model=4,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="pre",
        norm="rms",
        embed_norm=True,
    ),
    # a gated FFN (SwiGLU), pre-norm RMSNorm, decoder-only: the layout of LLaMA
    dict(
        d_model=4,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="pre",
        norm="rms",
        activation="swiglu",
    ),
]
ROPE = [
    dict(d_model=6, n_heads=2, positional="rope"),
    dict(
        d_model=4,
        n_heads=1,
        encoder_layers=0,
        decoder_layers=2,
        positional="rope",
        norm_position="pre",
    ),
    # halves: pairs (i, i + d_k/2), Hugging Face's rotate_half; LLaMA's pre-norm RMSNorm
    dict(
        d_model=8,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        positional="rope",
        rope_pairs="halves",
        norm_position="pre",
        norm="rms",
    ),
    dict(d_model=6, n_heads=2, positional="rope", rope_pairs="halves", pad=True, src_len=4),
    # multi-query attention (one K/V head for 4 query heads), LLaMA's layout otherwise
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=1,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
    ),
]


# Relative position bias (000 section 6.2): the new rows sit at positions start.., the
# keys at 0..start+L−1, so B of a cached step is the last rows of the uncached B.
RELATIVE = [
    dict(d_model=6, n_heads=2, positional="relative", pad=True, src_len=4),
    dict(
        d_model=4,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        positional="relative",
        norm_position="pre",
        fused=True,
    ),
]

# ALiBi (model.positional alibi): likewise the new rows at start.., B = −m·(i − j) of
# their positions; an encoder-decoder of 3 heads and BLOOM's decoder-only pre-norm shape
ALIBI = [
    dict(d_model=6, n_heads=3, positional="alibi", pad=True, src_len=4),
    dict(
        d_model=8,
        n_heads=4,
        encoder_layers=0,
        decoder_layers=2,
        positional="alibi",
        norm_position="pre",
        embed_norm=True,
        activation="gelu_tanh",
        tie_embeddings=True,
    ),
]

# Sliding-window attention (model.window, Mistral): a cached row at position start + i
# attends over the cached keys start + i − W < j <= start + i only.
WINDOW = [
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        window=3,
    ),
    dict(d_model=6, n_heads=2, encoder_layers=0, decoder_layers=1, tgt_len=4, window=2),
]

# QK-norm (model.qk_norm head): the cached K is normalised (and turned, with RoPE) when it
# is computed; Qwen3's shape (LLaMA's, GQA, no biases) and an encoder-decoder without RoPE
# whose cross-attention normalises the encoder's K once, with LayerNorm
QK_NORM = [
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        biases=False,
        qk_norm="head",
    ),
    dict(d_model=6, n_heads=2, pad=True, src_len=4, qk_norm="head"),
]

# The norm on each sublayer's output (model.norm_position output) and QK-norm over the whole
# projection (model.qk_norm projection): OLMo 2's shape, the cached K normalised over all its
# K/V heads' columns, then turned, when its row is computed; and Gemma 2's sandwich norms in
# an encoder-decoder whose cross-attention normalises the encoder's whole K once
OLMO2 = [
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **{**LLAMA, "norm_position": "output"},
        biases=False,
        qk_norm="projection",
    ),
    dict(d_model=6, n_heads=3, pad=True, src_len=4, norm_position="sandwich", qk_norm="projection"),
]

# Token types (model.token_types): each generated token takes the type of the position
# before it (the last target type), with learned positions and the embedding norm, and
# decoder-only.
TYPES = [
    dict(d_model=6, n_heads=2, positional="learned", embed_norm=True, tgt_len=3, token_types=3),
    dict(d_model=4, n_heads=2, encoder_layers=0, decoder_layers=2, tgt_len=3, token_types=2),
]

# Partial rotary (model.rope_dims) and parallel layers (model.parallel): a cached row's
# first rope_dims columns turned at its own position, the rest as projected; the layer's
# input read by both sublayers. GPT-NeoX's shape (a norm each) and GPT-J's (one, shared).
NEOX = [
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
        tgt_len=2,
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
    ),
]


# Gemma 2's soft caps (model.attn_softcap, model.logit_softcap: greedy reads the capped
# logits) and its alternating windows (model.window a list: layer 0 slides over 2 keys,
# cached ones included, layer 1 attends to every key); and the caps in an encoder-decoder
GEMMA2 = [
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **{**LLAMA, "activation": "geglu_tanh"},
        tgt_len=3,
        window=[2, None],
        attn_softcap=1.5,
        logit_softcap=2.0,
    ),
    dict(d_model=6, n_heads=2, pad=True, src_len=4, attn_softcap=0.8, logit_softcap=1.5),
    # Gemma 3's RoPE by layer: layer 0's base 10000 unscaled, layer 1's 10 scaled ÷ 8
    # (model.pe_base, model.rope_scaling as lists): each cached key turned by its layer's
    dict(
        d_model=8,
        n_heads=2,
        n_kv_heads=1,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        qk_norm="head",
        tgt_len=3,
        window=[2, None],
        pe_base=[10000.0, 10.0],
        rope_scaling=[None, {"type": "linear", "factor": 8.0}],
    ),
]

# GPT-OSS's attention sinks (model.attn_sinks): each self-attention head's sink logit in
# every softmax row, cached rows or not; grouped-query, alternating windows as GPT-OSS's
SINKS = [
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        tgt_len=3,
        window=[2, None],
        fused=True,
        attn_sinks=True,
    ),
]
# a mixture of experts (model.experts): Mixtral's shape, each new token routed on its own
# through the cache; an encoder-decoder one, 2 of 3 experts, not renormalised; and
# GPT-OSS's: sinks, a window, a router bias and the clamped SwiGLU (a limit that clamps)
MOE = [
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        tgt_len=3,
        experts=4,
        experts_top_k=2,
    ),
    dict(
        d_model=6,
        n_heads=2,
        pad=True,
        src_len=4,
        experts=3,
        experts_top_k=2,
        experts_normalize=False,
    ),
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **(LLAMA | dict(activation="swiglu_oss")),
        tgt_len=3,
        window=[2, None],
        attn_sinks=True,
        swiglu_limit=0.6,
        experts=4,
        experts_top_k=2,
        router_bias=True,
    ),
]

# Cohere 2's shape (Command R7B): one shared LayerNorm for both parallel sublayers, RoPE
# by adjacent pairs in the sliding layer only, the full layer with none (model.pe_base
# null: its cached keys unturned), tied embeddings, the logits scaled (model.logit_scale)
COHERE = [
    dict(
        d_model=8,
        n_heads=2,
        n_kv_heads=1,
        encoder_layers=0,
        decoder_layers=2,
        norm_position="pre",
        positional="rope",
        activation="swiglu",
        parallel="shared",
        biases=False,
        tie_embeddings=True,
        tgt_len=3,
        window=[2, None],
        pe_base=[10000.0, None],
        logit_scale=0.5,
    ),
]

# every generate configuration, as the reference and the cache checks take them
EVERY_SHAPE = SHAPES + ROPE + RELATIVE + ALIBI + WINDOW + TYPES + QK_NORM + NEOX + OLMO2 + GEMMA2
EVERY_SHAPE += SINKS + MOE + COHERE


# ---------------------------------------------------------------------------
# Greedy against the independent reference, iteration by iteration
# ---------------------------------------------------------------------------


def reference_greedy(raw: dict[str, Any], max_tokens: int) -> tuple[list[str], list[np.ndarray]]:
    """Greedy decoding by hand: the torch reference on the whole prefix at each iteration,
    argmax of its last row of probabilities."""
    prefix = list(raw["target"])
    types = raw.get("target_types")
    produced, dists = [], []
    for _ in range(max_tokens):
        step = {**raw, "target": prefix}
        if types is not None:  # a generated token: the type of the position before it
            step["target_types"] = types + [types[-1]] * (len(prefix) - len(types))
        probs = reference_forward(step)["probs"][-1]
        token = raw["vocab"][int(np.argmax(probs))]
        produced.append(token)
        dists.append(probs)
        prefix.append(token)
        if token == EOS:
            break
    return produced, dists


@pytest.mark.parametrize(
    "shape",
    EVERY_SHAPE,
    ids=shape_id,
)
def test_greedy_matches_the_reference_step_by_step(shape: dict[str, Any]) -> None:
    raw = generation_config(5, **shape)
    expected, dists = reference_greedy(raw, max_tokens=6)
    for cache in (True, False):
        result = gen.run(model_of(raw), gen.settings(greedy=True, max_tokens=6, cache=cache))
        assert list(result.generated) == expected
        assert result.stopped == ("eos" if expected[-1] == EOS else "max_tokens")
        for k, (it, probs) in enumerate(zip(result.iterations, dists, strict=True)):
            assert it.index == k and it.prefix == (*raw["target"], *expected[:k])
            np.testing.assert_allclose(it.probs, probs, rtol=0, atol=1e-10)
            assert it.next == expected[k]


def test_the_packaged_example_ends_at_eos_or_the_limit() -> None:
    code, out, err = invoke("generate", "--greedy", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    generated = data["generated"]
    assert generated[-1] == "EOS" or len(generated) == 20
    assert "EOS" not in generated[:-1]
    assert data["tokens"]["target"] == ["SOS"] and data["iterations"][0]["prefix"] == ["SOS"]
    # Each iteration's distribution is what `decode` gives for that prefix (teacher forcing).
    for it in data["iterations"][:3]:
        target = "[" + ", ".join(it["prefix"]) + "]"
        code, out, _ = invoke("decode", "--set", f"target={target}", "--format", "json")
        last_row = json.loads(out)["steps"][-1]["value"][-1]
        assert np.allclose(list(it["probs"].values()), last_row, rtol=0, atol=1e-12)


def test_uncached_iterations_are_decode_bit_for_bit() -> None:
    # README: without the cache an iteration is the decoder of `decode` on the prefix
    code, out, err = invoke("generate", "--no-cache", "--max-tokens", "4", "--format", "json")
    assert code == 0, err
    for it in json.loads(out)["iterations"]:
        target = "[" + ", ".join(it["prefix"]) + "]"
        code, out, _ = invoke("decode", "--set", f"target={target}", "--format", "json")
        assert list(it["probs"].values()) == json.loads(out)["steps"][-1]["value"][-1]


def test_the_packaged_example_table_shows_prefix_distribution_and_choice() -> None:
    code, out, err = invoke("generate", "--max-tokens", "2")
    assert code == 0, err
    assert "iteration 0" in out and "iteration 1" in out and "prefix SOS" in out
    assert "◀ chosen" in out and "greedy: the most probable" in out and "█" in out
    assert "stopped because it reached --max-tokens" in out


# ---------------------------------------------------------------------------
# The KV cache: the same numbers as recomputing the whole prefix
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    EVERY_SHAPE,
    ids=shape_id,
)
def test_cached_and_uncached_probabilities_agree_to_1e_12(shape: dict[str, Any]) -> None:
    cfg = model_of(generation_config(9, **shape))
    for strategy in (dict(greedy=True), dict(sample=True, seed=4), dict(beam=3)):
        a = gen.run(cfg, gen.settings(max_tokens=8, cache=True, **strategy))  # type: ignore[arg-type]
        b = gen.run(cfg, gen.settings(max_tokens=8, cache=False, **strategy))  # type: ignore[arg-type]
        assert a.generated == b.generated and len(a.iterations) == len(b.iterations)
        for x, y in zip(a.iterations, b.iterations, strict=True):
            assert x.prefix == y.prefix and x.next == y.next
            assert np.abs(x.model_probs - y.model_probs).max() <= 1e-12
            for bx, by in zip(x.beams, y.beams, strict=True):
                assert np.abs(bx.probs - by.probs).max() <= 1e-12


@pytest.mark.parametrize(
    "shape",
    [SHAPES[0], ROPE[0], ROPE[3], RELATIVE[0], ALIBI[0], QK_NORM[1], OLMO2[1]],
    ids=shape_id,
)
def test_the_cached_trace_shows_K_and_V_growing_row_by_row(shape: dict[str, Any]) -> None:
    raw = generation_config(2, **shape)
    raw["weights"]["output"]["b"][1] = -1000.0  # EOS never: four iterations
    cfg = model_of(raw)
    s_cached = gen.settings(greedy=True, max_tokens=4)
    s_full = gen.settings(greedy=True, max_tokens=4, cache=False)
    cached, full = Tracer(), Tracer()
    gen.run(cfg, s_cached, cached)
    gen.run(cfg, s_full, full)
    c, f = cached.trace, full.trace
    for i in range(4):
        base = f"t{i}.decoder.0.self_attn.h0"
        for name in ("k", "v"):
            k_cached, k_full = c.value(f"{base}.{name}"), f.value(f"{base}.{name}")
            assert k_cached.shape[0] == i + 1  # one row per position fed so far
            assert np.abs(k_cached - k_full).max() <= 1e-12
        assert c.value(f"{base}.q").shape[0] == 1 and f.value(f"{base}.q").shape[0] == i + 1
        if shape.get("positional") == "relative":  # the new row is position i
            table = raw["weights"]["decoder"][0]["self_attn"]["heads"][0]["rel_bias"]
            max_len = raw["model"]["max_len"]
            by_hand = [table[max_len - 1 + j - i] for j in range(i + 1)]  # b_rel[j − i]
            assert c.value(f"{base}.rel_bias").tolist() == [by_hand]
            assert f.value(f"{base}.rel_bias")[-1].tolist() == by_hand
        # The newest row sees every cached key: its causal mask row is all zeros.
        assert np.array_equal(c.value(f"t{i}.decoder.mask"), np.zeros((1, i + 1)))
        cross = f"t{i}.decoder.0.cross_attn.h0.k"
        assert np.array_equal(c.value(cross), c.value("t0.decoder.0.cross_attn.h0.k"))
        assert (i == 0) != c[cross].formula.endswith("(cached)")
    # The row labels of K are the tokens of the cached positions.
    assert c["t3.decoder.0.self_attn.h0.k"].rows == ("t0", *gen.run(cfg, s_cached).generated[:3])
    # The encoder ran once, outside the iterations.
    assert "encoder.output" in c and not any(p.startswith("t1.encoder") for p in c.steps)


@pytest.mark.parametrize("shape", WINDOW, ids=shape_id)
def test_the_window_hides_cached_keys_as_recomputing_does(shape: dict[str, Any]) -> None:
    raw = generation_config(6, **shape)
    raw["weights"]["output"]["b"][1] = -1000.0  # EOS never: every iteration runs
    W, n = shape["window"], len(raw["target"])
    cached, full = Tracer(), Tracer()
    s = dict(greedy=True, max_tokens=6)
    a = gen.run(model_of(raw), gen.settings(**s), cached)  # type: ignore[arg-type]
    b = gen.run(model_of(raw), gen.settings(cache=False, **s), full)  # type: ignore[arg-type]
    expected, dists = reference_greedy(raw, max_tokens=6)
    assert list(a.generated) == list(b.generated) == expected
    for i, (x, y, probs) in enumerate(zip(a.iterations, b.iterations, dists, strict=True)):
        assert np.abs(x.model_probs - y.model_probs).max() <= 1e-12
        np.testing.assert_allclose(x.model_probs, probs, rtol=0, atol=1e-10)
        # the cached row of iteration i > 0 is position n − 1 + i over keys 0..n − 1 + i:
        # it sees the last W of them, the older ones −inf
        pos = n - 1 + i
        row = [-np.inf if j <= pos - W else 0.0 for j in range(pos + 1)]
        if i:
            assert cached.trace.value(f"t{i}.decoder.mask").tolist() == [row]
        assert full.trace.value(f"t{i}.decoder.mask")[-1].tolist() == row
    # and the window matters here: without it the distributions differ
    del raw["model"]["window"]
    c = gen.run(model_of(raw), gen.settings(**s))  # type: ignore[arg-type]
    assert (
        max(
            np.abs(x.model_probs - z.model_probs).max()
            for x, z in zip(a.iterations, c.iterations, strict=True)
        )
        > 1e-6
    )


def test_traced_and_untraced_generation_agree() -> None:
    cfg = model_of(generation_config(3, **SHAPES[1]))
    s = gen.settings(beam=2, max_tokens=5)
    a, b = gen.run(cfg, s, Tracer()), gen.run(cfg, s)
    assert a.generated == b.generated
    for x, y in zip(a.iterations, b.iterations, strict=True):
        assert np.array_equal(x.model_probs, y.model_probs)


def _record_numbers(g: gen.Generation) -> int:
    """The numbers a generation's iterations hold: each distinct array over the vocabulary
    (greedy's chosen distribution is the model's), and each prefix's and beam's tokens."""
    total = 0
    for it in g.iterations:
        arrays = [
            it.probs,
            it.model_probs,
            *(p for _, p in it.stages),
            *(b.probs for b in it.beams),
        ]
        total += sum(a.size for a in {id(a): a for a in arrays}.values())
        total += len(it.prefix) + sum(len(b.tokens) for b in it.beams)
    return total


@pytest.mark.parametrize(
    "options",
    [dict(), dict(sample=True, top_k=50, top_p=0.9), dict(beam=3)],
    ids=["greedy", "sample", "beam"],
)
def test_the_size_estimate_bounds_the_records_and_is_close_to_them(options: Any) -> None:
    """generate.records, the numbers the iterations' records may hold (which --max-tokens
    1000000 made terabytes), against what a run holds: never below it, and, where the
    distributions over a large vocabulary dominate, within 1.5× (counting each of them five
    times per beam and one more, as first written, would have refused runs that fit)."""
    vocab = [f"w{i}" for i in range(1500)]
    raw = {"model": {"d_model": 4, "encoder_layers": 0, "decoder_layers": 1}, "vocab": vocab,
           "tokens": {"bos": "w0"}}  # fmt: skip
    cfg = model_of(raw)  # (no eos: every run makes --max-tokens iterations)
    s = gen.settings(max_tokens=12, **options)
    g = gen.run(cfg, s)
    assert len(g.iterations) == 12
    held, bound = _record_numbers(g), gen.records(cfg, s)
    assert held <= bound <= 1.5 * held, (held, bound)


# ---------------------------------------------------------------------------
# Sampling: temperature, top-k, top-p and the draw, checked by hand
# ---------------------------------------------------------------------------

FIXED_P = {"BOS": 0.05, "a": 0.4, "b": 0.25, "c": 0.15, "d": 0.1, "EOS": 0.05}


def fixed_config(p: dict[str, float], bias: dict[str, float] | None = None) -> dict[str, Any]:
    """A decoder-only model whose next-token distribution is `p` whatever the prefix:
    output W = 0 and output b = log p (exp(-1000) underflows to exactly 0)."""
    vocab = list(p)
    b = [math.log(x) if x > 0 else -1000.0 for x in p.values()]
    return {
        "model": {"d_model": 2, "encoder_layers": 0, "decoder_layers": 1},
        "vocab": vocab,
        "tokens": {"bos": vocab[0], "eos": "EOS"},
        "weights": {"output": {"W": [[0.0] * len(vocab)] * 2, "b": b}},
    }


def probs_of(raw: dict[str, Any], **options: Any) -> dict[str, float]:
    result = gen.run(model_of(raw), gen.settings(sample=True, max_tokens=1, **options))
    return dict(zip(raw["vocab"], result.iterations[0].probs.tolist(), strict=True))


def test_temperature_by_hand() -> None:
    # softmax(log p / T) = p^(1/T) / sum p^(1/T); T = 2: square roots.
    got = probs_of(fixed_config(FIXED_P), temperature=2.0)
    total = sum(math.sqrt(x) for x in FIXED_P.values())
    for token, x in FIXED_P.items():
        assert math.isclose(got[token], math.sqrt(x) / total, rel_tol=1e-12)


def test_top_k_and_top_p_keep_exactly_the_documented_sets() -> None:
    raw = fixed_config(FIXED_P)
    got = probs_of(raw, top_k=3)  # a, b, c of 0.4 + 0.25 + 0.15 = 0.8
    assert {t for t, x in got.items() if x > 0} == {"a", "b", "c"}
    assert math.isclose(got["a"], 0.5) and math.isclose(got["b"], 0.3125)
    assert math.isclose(got["c"], 0.1875)
    got = probs_of(raw, top_p=0.6)  # 0.4 < 0.6, 0.4 + 0.25 = 0.65 >= 0.6: b crosses and is kept
    assert {t for t, x in got.items() if x > 0} == {"a", "b"}
    assert math.isclose(got["a"], 0.4 / 0.65) and math.isclose(got["b"], 0.25 / 0.65)
    got = probs_of(raw, top_p=0.4)  # a alone reaches 0.4
    assert got["a"] == 1.0 and sum(got.values()) == 1.0
    # top-p measures what top-k left as it is, renormalising once, last (SPEC section 4):
    # 0.4, 0.65 < 0.7, 0.8 >= 0.7, so c crosses and is kept. (Renormalised first, as
    # Hugging Face chains them, 0.5 + 0.3125 = 0.8125 would reach 0.7 without c.)
    got = probs_of(raw, top_k=3, top_p=0.7)
    assert {t for t, x in got.items() if x > 0} == {"a", "b", "c"}
    assert math.isclose(got["a"], 0.5) and math.isclose(got["c"], 0.1875)
    got = probs_of(raw, top_k=3, top_p=0.6)  # 0.4 < 0.6, 0.65 >= 0.6: as top-p alone
    assert {t for t, x in got.items() if x > 0} == {"a", "b"}
    assert math.isclose(got["a"], 0.4 / 0.65) and math.isclose(got["b"], 0.25 / 0.65)
    got = probs_of(raw, top_k=2, top_p=0.9)  # top-k kept 0.65 < 0.9: top-p keeps both
    assert math.isclose(got["a"], 0.4 / 0.65) and math.isclose(got["b"], 0.25 / 0.65)
    assert probs_of(raw, top_p=1.0) == pytest.approx(FIXED_P, rel=1e-12)


# The audit's g06 (/tmp/numaudit/cfg/g06_topp1.yaml): logits through the output bias,
# one token of probability 3.7e-19, where the running total from the largest down
# reaches 1.0 in float64 before the last tokens.
TINY_TAIL_LOGITS = [-2.5838310270420326, -7.741978238913314, -24.218330148597808,
                    -11.945084417055867, 4.756529388744398, 15.570779556716277,
                    18.13580171323687, 0.9675174368870821]  # fmt: skip


def test_top_p_1_keeps_every_token_of_nonzero_probability() -> None:
    vocab = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "E"]
    raw = {
        "model": {"d_model": 2, "n_heads": 1, "encoder_layers": 0, "decoder_layers": 1, "seed": 1},
        "vocab": vocab,
        "tokens": {"bos": "t0", "eos": "E"},
        "weights": {"output": {"W": [[0.0] * 8] * 2, "b": TINY_TAIL_LOGITS}},
    }
    got = probs_of(raw, top_p=1.0)
    # softmax(b) by hand: e^(b_i - max) / sum_j e^(b_j - max)
    top = max(TINY_TAIL_LOGITS)
    e = [math.exp(b - top) for b in TINY_TAIL_LOGITS]
    want = [x / math.fsum(e) for x in e]
    assert want[2] == pytest.approx(3.7467e-19, rel=1e-4)
    for token, x in zip(vocab, want, strict=True):
        assert got[token] == pytest.approx(x, rel=1e-12), token  # t2 included, not 0
    # By hand: 0.5, 0.5 - 2^-54 and 2^-54 total exactly 1, but 0.5 + (0.5 - 2^-54)
    # rounds to 1.0 in float64: every prefix "reaches" 1 after two tokens.
    p = np.array([2.0**-54, 0.5, 0.5 - 2.0**-54])
    assert float(np.cumsum([0.5, 0.5 - 2.0**-54])[-1]) == 1.0
    assert gen.top_p_filter(p, 1.0).tolist() == p.tolist()
    assert gen.top_p_filter(p, 0.75).tolist() == [0, 0.5, 0.5 - 2.0**-54]


def nucleus_check(p: np.ndarray, top_p: float, top_k: int | None, kept: set[int]) -> bool:
    """Whether `kept` is SPEC section 4's set as the README states it, in exact rational
    arithmetic on the float probabilities `p`: sorted by probability (ties in vocabulary
    order), the top-k kept as they are, then the smallest prefix whose total reaches
    top_p: what it leaves out is at most (1 - top_p) of p's total (1 up to rounding),
    give or take 4 units in the last place of that total when top_p < 1; the crossing
    token in; all of top-k's when their total stays below. Tokens of probability 0
    aside."""
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))[: top_k or len(p)]
    exact = [Fraction(float(x)) for x in p]
    total = sum(exact)
    slack = Fraction(4) * Fraction(float(np.finfo(p.dtype).eps)) * total if top_p < 1 else 0
    bound = (1 - Fraction(top_p)) * total + slack
    prefixes = list(itertools.accumulate((exact[i] for i in order), initial=Fraction(0)))
    n = next((m for m in range(1, len(order) + 1) if total - prefixes[m] <= bound), len(order))
    return kept == {i for i in order[:n] if p[i] > 0}


def test_top_p_keeps_the_smallest_prefix_reaching_p_in_exact_arithmetic() -> None:
    """Random distributions, some with probabilities down to 1e-300, and p = 1, p just
    below 1, random p and p at a prefix's own float total, with and without top-k: the
    kept set is the exact rule's (p = 1: every token of non-zero probability)."""
    rng = np.random.default_rng(2024)
    for trial in range(4000):
        V = int(rng.integers(2, 13))
        logits = rng.standard_normal(V) * [0.5, 3, 12, 30, 400][trial % 5]
        tempered = gen.sampling_steps(logits, gen.settings(sample=True))[0][1]
        choice = trial % 4
        if choice == 0:
            top_p = 1.0
        elif choice == 1:
            top_p = 1 - 10.0 ** -int(rng.integers(1, 17))
        elif choice == 2:
            top_p = float(rng.uniform(0.01, 1))
        else:  # a prefix's own float total: a tie, which that prefix reaches
            top_p = min(1.0, float(np.cumsum(np.sort(tempered)[::-1])[rng.integers(V)]))
        top_k = int(rng.integers(1, V + 1)) if rng.random() < 0.3 else None
        s = gen.settings(sample=True, top_p=top_p, top_k=top_k)
        final = gen.sampling_steps(logits, s)[-1][1]
        kept = {int(i) for i in np.flatnonzero(final)}
        assert nucleus_check(tempered, top_p, top_k, kept), (trial, top_p, top_k)
        assert math.isclose(final.sum(), 1.0, rel_tol=1e-12)


@pytest.mark.parametrize(
    ("probs", "top_p", "kept"),
    [
        ([0.5, 0.4, 0.1], 0.9, 2),  # 0.5 + 0.4 reaches 0.9, as by hand
        ([0.6, 0.3, 0.1], 0.9, 2),
        ([0.7, 0.2, 0.1], 0.9, 2),
        ([0.4, 0.3, 0.2, 0.1], 0.7, 2),
        ([0.4, 0.3, 0.2, 0.1], 0.9, 3),
        ([0.5, 0.4, 0.1], 0.90001, 3),  # beyond rounding: the crossing token
        ([0.5, 0.4, 0.1], 0.89999, 2),
        ([0.5, 0.4, 0.1 - 1e-17, 1e-17], 1.0, 4),  # p = 1: every token of non-zero p
    ],
)
def test_top_p_at_a_decimal_tie_keeps_the_prefix_that_reaches_it(
    probs: list[float], top_p: float, kept: int
) -> None:
    # The review found 0.5, 0.4, 0.1 with top-p 0.9 kept all three: softmax gives
    # 0.10000000000000003 for the last, a hair above the float 1 - 0.9.
    for dtype in (np.float64, np.float32):
        logits = np.log(np.array(probs)).astype(dtype)
        s = gen.settings(sample=True, top_p=top_p)
        final = gen.sampling_steps(logits, s)[-1][1]
        assert int(np.count_nonzero(final)) == kept, dtype


def test_ties_go_to_the_earlier_vocabulary_entry() -> None:
    raw = fixed_config({"BOS": 0.1, "x": 0.3, "y": 0.3, "z": 0.2, "EOS": 0.1})
    got = probs_of(raw, top_k=1)
    assert got["x"] == 1.0 and got["y"] == 0.0
    assert gen.run(model_of(raw), gen.settings(greedy=True, max_tokens=1)).generated == ("x",)


def test_sampling_draws_by_the_documented_inverse_cdf() -> None:
    # Independently: one default_rng(seed) for the run, u = rng.random() per iteration,
    # the first token in vocabulary order whose running total exceeds u.
    p = {"BOS": 0.1, "a": 0.3, "b": 0.2, "c": 0.25, "d": 0.15, "EOS": 0.0}
    raw = fixed_config(p)
    for seed in (0, 1, 2024):
        rng = np.random.default_rng(seed)
        expected = []
        for _ in range(12):
            u, running = rng.random(), 0.0
            for token, x in p.items():
                running += x
                if running > u:
                    expected.append(token)
                    break
        result = gen.run(model_of(raw), gen.settings(sample=True, seed=seed, max_tokens=12))
        assert list(result.generated) == expected
        assert [it.u for it in result.iterations] == list(np.random.default_rng(seed).random(12))


@pytest.mark.parametrize("cache", [True, False])
def test_sampling_is_reproducible_with_a_seed(cache: bool) -> None:
    cfg = model_of(generation_config(4, **SHAPES[0]))
    s = gen.settings(sample=True, seed=7, temperature=1.5, top_p=0.95, max_tokens=12, cache=cache)
    first, again = gen.run(cfg, s), gen.run(cfg, s)
    assert first.generated == again.generated
    other = [
        gen.run(cfg, gen.settings(sample=True, seed=n, max_tokens=12)).generated for n in range(5)
    ]
    assert len(set(other)) > 1  # the seed matters
    code, out, _ = invoke("generate", "--sample", "--seed", "3", "--format", "json")
    code2, out2, _ = invoke("generate", "--sample", "--seed", "3", "--format", "json")
    assert code == code2 == 0 and json.loads(out)["generated"] == json.loads(out2)["generated"]


@pytest.mark.parametrize("shape", SHAPES[:4], ids=shape_id)
def test_top_k_1_and_beam_width_1_equal_greedy(shape: dict[str, Any]) -> None:
    cfg = model_of(generation_config(6, **shape))
    greedy = gen.run(cfg, gen.settings(greedy=True, max_tokens=8))
    top1 = gen.run(cfg, gen.settings(sample=True, top_k=1, seed=11, max_tokens=8))
    beam1 = gen.run(cfg, gen.settings(beam=1, max_tokens=8))
    assert top1.generated == greedy.generated == beam1.generated
    assert [it.prefix for it in beam1.iterations] == [it.prefix for it in greedy.iterations]


# ---------------------------------------------------------------------------
# Beam search: by hand, and against brute force over every sequence
# ---------------------------------------------------------------------------


def test_beam_by_hand_with_and_without_length_penalty() -> None:
    # p(EOS) 0.4, p(a) 0.35, p(b) 0.25 after any prefix; width 2.
    # t0: EOS (log 0.4) finishes, a (log 0.35) lives; the beam narrows to 1.
    # t1: a EOS (log 0.14) beats a a (log 0.1225): it finishes; the beam is empty.
    raw = fixed_config({"BOS": 0.0, "a": 0.35, "b": 0.25, "EOS": 0.4})
    cfg = model_of(raw)
    plain = gen.run(cfg, gen.settings(beam=2, max_tokens=5))
    assert plain.stopped == "beams_finished" and len(plain.iterations) == 2
    assert [(h.tokens, round(math.exp(h.logprob), 12)) for h in plain.finished] == [
        (("EOS",), 0.4),
        (("a", "EOS"), 0.14),
    ]
    c0 = plain.iterations[0].candidates
    assert [(c.token, c.finished) for c in c0] == [("EOS", True), ("a", False)]
    assert plain.generated == ("EOS",)  # log 0.4 > log 0.14
    assert gen.run(cfg, gen.settings(greedy=True)).generated == ("EOS",)
    # GNMT: score = logP / ((5 + n) / 6)^alpha. alpha = 5: log 0.14 / (7/6)^5 = -0.9096 beats
    # log 0.4 = -0.9163, so the longer hypothesis wins; alpha = 4 (-0.9774) it does not.
    for alpha, winner in ((5.0, ("a", "EOS")), (4.0, ("EOS",))):
        result = gen.run(cfg, gen.settings(beam=2, length_penalty=alpha, max_tokens=5))
        assert result.generated == winner
        scores = {h.tokens: h.score for h in result.finished}
        assert math.isclose(scores[("a", "EOS")], math.log(0.14) / (7 / 6) ** alpha, rel_tol=1e-12)
        assert math.isclose(scores[("EOS",)], math.log(0.4), rel_tol=1e-12)


def _brute_force_config() -> dict[str, Any]:
    raw = random_config(
        np.random.default_rng(7),
        d_model=4,
        n_heads=1,
        encoder_layers=0,
        decoder_layers=1,
        tgt_len=1,
    )
    raw["weights"]["output"]["b"][1] += 1.0  # make EOS likely enough to finish
    return raw


def _reference_logp(raw: dict[str, Any], max_tokens: int) -> dict[tuple[str, ...], np.ndarray]:
    """log p(. | prefix) from the torch reference, for every prefix that does not hold EOS."""
    vocab = raw["vocab"]
    out: dict[tuple[str, ...], np.ndarray] = {}
    for n in range(max_tokens):
        for tail in itertools.product([t for t in vocab if t != EOS], repeat=n):
            probs = reference_forward({**raw, "target": [BOS, *tail]})["probs"][-1]
            out[tail] = np.log(probs)
    return out


def test_beam_search_finds_the_brute_force_best_where_greedy_does_not() -> None:
    raw, max_tokens = _brute_force_config(), 3
    logp = _reference_logp(raw, max_tokens)
    vocab = raw["vocab"]
    # Every sequence that ends in EOS within 3 tokens, with its log-probability.
    complete = {}
    for tail, lp in logp.items():
        complete[(*tail, EOS)] = (
            sum(logp[tail[:k]][vocab.index(t)] for k, t in enumerate(tail)) + lp[vocab.index(EOS)]
        )
    best = max(complete, key=lambda s: complete[s])
    cfg = model_of(raw)
    greedy = gen.run(cfg, gen.settings(greedy=True, max_tokens=max_tokens)).generated
    wide = gen.run(cfg, gen.settings(beam=200, max_tokens=max_tokens))  # exhaustive
    assert wide.generated == best and greedy != best
    assert {h.tokens for h in wide.finished} == set(complete)
    for h in wide.finished:
        assert math.isclose(h.logprob, complete[h.tokens], rel_tol=0, abs_tol=1e-10)
    # Width 2 already finds it here, following the documented rules step by step:
    assert gen.run(cfg, gen.settings(beam=2, max_tokens=max_tokens)).generated == best
    assert _by_the_rules(logp, vocab, width=2, max_tokens=max_tokens) == best


def _by_the_rules(
    logp: dict[tuple[str, ...], np.ndarray], vocab: list[str], width: int, max_tokens: int
) -> tuple[str, ...]:
    """Beam search as the README states it, in plain Python: rank every extension by
    cumulative logP (ties: earlier beam, earlier vocabulary entry), keep width - finished,
    set aside those ending in EOS; the best logP wins among the finished ones and the
    live ones cut at max_tokens."""
    live: list[tuple[tuple[str, ...], float]] = [((), 0.0)]
    finished: list[tuple[tuple[str, ...], float]] = []
    for _ in range(max_tokens):
        ext = [
            (total + float(logp[tail][i]), j, i, tail)
            for j, (tail, total) in enumerate(live)
            for i in range(len(vocab))
        ]
        ext.sort(key=lambda e: (-e[0], e[1], e[2]))
        live = []
        for total, _, i, tail in ext[: width - len(finished)]:
            (finished if vocab[i] == EOS else live).append(((*tail, vocab[i]), total))
        if not live:
            break
    return max(finished + live, key=lambda h: h[1])[0]


def test_beam_search_at_the_limit_weighs_the_cut_beams_against_the_finished() -> None:
    """Stopped by max_tokens, a live beam more probable than every finished hypothesis
    is the result: every width returns the brute-force best of what a search of that
    length can end with (a sequence ending in EOS, or one cut at the limit)."""
    raw = _brute_force_config()
    vocab, cfg = raw["vocab"], model_of(raw)
    for max_tokens in (1, 2):
        logp = _reference_logp(raw, max_tokens)

        def total(seq: tuple[str, ...], logp: dict[tuple[str, ...], np.ndarray] = logp) -> float:
            return sum(float(logp[seq[:k]][vocab.index(t)]) for k, t in enumerate(seq))

        ends = {(*tail, EOS): total((*tail, EOS)) for tail in logp}
        cut = itertools.product([t for t in vocab if t != EOS], repeat=max_tokens)
        ends.update({seq: total(seq) for seq in cut})
        best = max(ends, key=lambda seq: ends[seq])
        exhaustive = gen.run(cfg, gen.settings(beam=200, max_tokens=max_tokens))
        assert exhaustive.generated == best, max_tokens
        assert exhaustive.result is not None
        assert math.isclose(exhaustive.result.logprob, ends[best], abs_tol=1e-10)
        assert {h.tokens for h in exhaustive.unfinished} == {seq for seq in ends if EOS not in seq}
        for width in (2, 3):
            by_rules = _by_the_rules(logp, vocab, width=width, max_tokens=max_tokens)
            s = gen.settings(beam=width, max_tokens=max_tokens)
            assert gen.run(cfg, s).generated == by_rules
    # Here the most probable single token is not EOS, yet EOS is among the 200 kept:
    # before, the first EOS-ended hypothesis won over the better cut one.
    one = gen.run(cfg, gen.settings(beam=200, max_tokens=1))
    assert one.finished and EOS not in one.generated
    assert one.result is not None and one.result.score > max(h.score for h in one.finished)


# ---------------------------------------------------------------------------
# JSON (SPEC section 5) and the trace under t<i>. paths
# ---------------------------------------------------------------------------


def test_json_shape_greedy_with_trace() -> None:
    code, out, err = invoke("generate", "--max-tokens", "3", "--trace", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert {"trace_tf", "title", "tokens", "steps", "generated", "iterations"} <= set(data)
    vocab = ["hello", "mundo", "world", "how", "?", "EOS", "SOS", "a", "hola", "c"]
    prefix = ["SOS"]
    for k, it in enumerate(data["iterations"]):
        assert set(it) == {"index", "prefix", "probs", "next"}
        assert it["index"] == k and it["prefix"] == prefix
        assert list(it["probs"]) == vocab and math.isclose(sum(it["probs"].values()), 1.0)
        assert it["next"] == max(vocab, key=lambda t: it["probs"][t])
        prefix = [*prefix, it["next"]]
    assert data["generated"] == prefix[1:]
    paths = [s["path"] for s in data["steps"]]
    assert paths[0] == "encoder.embed"
    for p in paths:
        head = p.split(".")[0]
        assert head == "encoder" or (head[0] == "t" and int(head[1:]) < len(data["iterations"]))
    assert {"t0.probs", "t2.probs", "t2.decoder.0.self_attn.h1.k"} <= set(paths)
    k = next(s for s in data["steps"] if s["path"] == "t2.decoder.0.self_attn.h1.k")
    assert k["shape"] == [3, 3]


def test_json_shape_sample_and_beam() -> None:
    code, out, _ = invoke(
        "generate", "--sample", "--top-k", "3", "--max-tokens", "2", "--format", "json"
    )
    data = json.loads(out)
    assert code == 0 and data["strategy"]["name"] == "sample" and data["strategy"]["top_k"] == 3
    for it in data["iterations"]:
        assert sum(x > 0 for x in it["probs"].values()) <= 3
        assert set(it["model_probs"]) == set(it["probs"]) and 0 <= it["u"] < 1
    code, out, _ = invoke("generate", "--beam", "3", "--max-tokens", "3", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["strategy"] == {
        "name": "beam",
        "max_tokens": 3,
        "cache": True,
        "width": 3,
        "length_penalty": 0.0,
    }
    first = data["iterations"][0]
    assert [b["prefix"] for b in first["beams"]] == [["SOS"]] and first["beams"][0]["logprob"] == 0
    assert len(first["candidates"]) == 3
    best = first["candidates"][0]
    assert first["next"] == best["token"] and first["prefix"] == ["SOS"]
    assert math.isclose(best["logprob"], math.log(first["probs"][best["token"]]), rel_tol=1e-12)
    assert data["result"]["tokens"] == data["generated"]
    assert len(data["iterations"][1]["beams"]) == 3


def test_stage_selection_works_on_iteration_paths() -> None:
    code, out, _ = invoke(
        "generate", "--max-tokens", "2", "--trace", "--stage", "cross", "--format", "json"
    )
    paths = [s["path"] for s in json.loads(out)["steps"]]
    assert code == 0 and paths and all(".cross_attn." in p for p in paths)
    assert any(p.startswith("t1.") for p in paths)
    code, out, _ = invoke(
        "generate",
        "--beam",
        "2",
        "--max-tokens",
        "2",
        "--trace",
        "--stage",
        "cross",
        "--head",
        "1",
        "--format",
        "json",
    )
    paths = [s["path"] for s in json.loads(out)["steps"]]
    assert code == 0 and "t1.b1.decoder.0.cross_attn.h1.softmax" in paths
    assert all(".h1." in p for p in paths)
    code, out, _ = invoke(
        "generate", "--max-tokens", "3", "--trace", "--stage", "k", "--layer", "0"
    )
    assert code == 0 and "K = [cached K, 0..1; X W_k]" in out


def test_decoder_only_generates_from_the_target_prompt() -> None:
    raw = generation_config(1, d_model=4, n_heads=1, encoder_layers=0, decoder_layers=1, tgt_len=3)
    result = gen.run(model_of(raw), gen.settings(greedy=True, max_tokens=3))
    assert result.start == tuple(raw["target"]) and result.iterations[0].prefix == result.start


# ---------------------------------------------------------------------------
# Errors: exit 2, one clear line
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--sample", "--temperature", "0"], "--temperature must be positive"),
        (["--sample", "--temperature", "-1"], "--temperature must be positive"),
        # "found inf" under "must be positive" told the user nothing: inf is positive
        (
            ["--sample", "--temperature", "inf"],
            "--temperature must be a finite number; expected a finite number > 0, found inf",
        ),
        (
            ["--sample", "--temperature", "nan"],
            "--temperature must be a finite number; expected a finite number > 0, found nan",
        ),
        (
            ["--beam", "2", "--length-penalty", "nan"],
            "--length-penalty must be a finite number; expected a finite number, found nan",
        ),
        (
            ["--sample", "--top-p", "nan"],
            "--top-p must lie in (0, 1]; expected 0 < p <= 1, found nan",
        ),
        (["--sample", "--top-p", "0"], "--top-p must lie in (0, 1]"),
        (["--sample", "--top-p", "1.5"], "--top-p must lie in (0, 1]"),
        (["--sample", "--top-k", "0"], "--top-k must be at least 1"),
        (["--sample", "--seed", "-1"], "--seed must be at least 0"),  # was exit 3
        # 1 + 10 + 100 + ... live beams: --beam 100000 ran for many minutes before
        (["--beam", "20000"], "may need more than 100,000 decoder passes"),
        # every iteration's prefix is kept: their records grow as the square of the
        # tokens, and --max-tokens 1000000 ran for ever (found by tests/fuzz_configs.py);
        # 2000 iterations' records are 2000 · 2 · (2001 + 5 · 10 + 128), over 10^6
        (["--max-tokens", "2000", "--max-elements", "1000000"], "2000 iteration(s) would hold"),
        (["--beam", "2", "--length-penalty", "1e308"], "--length-penalty 1e308 overflows"),
        (["--beam", "2", "--length-penalty", "-1e308"], "--length-penalty -1e308 overflows"),
        (["--beam", "0"], "--beam width must be at least 1"),
        (["--greedy", "--sample"], "conflicting strategies --greedy and --sample"),
        (["--sample", "--beam", "2"], "conflicting strategies --sample and --beam"),
        # another strategy's option is unused, but a bad value is still refused
        (["--greedy", "--top-p", "5"], "--top-p must lie in (0, 1]"),
        (["--beam", "2", "--seed", "-1"], "--seed must be at least 0"),
        (["--stage", "k"], "add --trace"),
        (["--trace", "--stage", "softmx"], "did you mean 'softmax'"),
        # (the model alone is about 33,000 with its arrays' and steps' objects)
        (["--trace", "--max-elements", "100000"], "over the limit of 100,000"),
    ],
)
def test_bad_options_exit_2(args: list[str], message: str) -> None:
    code, _, err = invoke("generate", *args)
    assert code == 2 and message in err and "Traceback" not in err


def test_an_unused_option_is_said_even_when_the_run_then_fails() -> None:
    code, _, err = invoke("generate", "--seed", "1", "--set", "model.embed_scale=1e300")
    assert code == 2
    assert err.index("warning: --seed applies to --sample only") < err.index("error:")


@pytest.mark.parametrize(
    ("args", "unused"),
    [
        (["--temperature", "2"], "--temperature applies to --sample only: unused by --greedy"),
        (["--greedy", "--seed", "7"], "--seed applies to --sample only: unused by --greedy"),
        (["--beam", "2", "--top-k", "1"], "--top-k applies to --sample only: unused by --beam"),
        (["--sample", "--length-penalty", "1"], "--length-penalty applies to --beam only"),
    ],
)
def test_another_strategys_option_is_said_and_unused(args: list[str], unused: str) -> None:
    """SPEC's usage line lists every option beside every strategy: another strategy's
    option is accepted, as Hugging Face's generate does, with a warning; it changes
    nothing (--top-k 1 would make beam search greedy, --temperature 2 its ranking)."""
    strategy = [a for a in args if a in ("--greedy", "--sample", "--beam")] or ["--greedy"]
    width = ["2"] if strategy == ["--beam"] else []
    code, out, err = invoke("generate", "--format", "json", *args)
    assert code == 0 and f"trace-tf: warning: {unused}" in err
    data = json.loads(out)
    assert any(unused in w for w in data["warnings"])
    code, plain, _ = invoke("generate", "--format", "json", *strategy, *width)
    assert code == 0
    assert data["generated"] == json.loads(plain)["generated"]


@pytest.mark.parametrize(
    ("args", "by"),
    [
        (["--explain", "t0.probs"], "--explain"),
        (["--format", "json"], "--format json"),
    ],
)
def test_show_where_no_table_shows_a_distribution_is_said_and_unused(
    args: list[str], by: str
) -> None:
    """--show sets the rows of the table's distributions: with --explain (one entry) or
    JSON (each whole distribution) it was silently unused; it is said, as another
    strategy's option is, and the output is the same as without it."""
    unused = f"--show applies to the table of each distribution: unused by {by}"
    code, out, err = invoke("generate", *args, "--show", "3")
    assert code == 0, err
    assert f"trace-tf: warning: {unused}" in err
    code, plain, plain_err = invoke("generate", *args)
    assert code == 0 and "--show" not in plain_err
    if by == "--explain":
        assert out == plain
    else:
        data, without = json.loads(out), json.loads(plain)
        assert unused in data.pop("warnings") and without.pop("warnings") == []
        assert data == without
    code, _, err = invoke("generate", "--show", "3")  # the table's: used
    assert code == 0 and "--show" not in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1}\nvocab: [a, E]\ntokens: {eos: E}\n",
            "tokens.bos",
        ),
        (
            "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1}\nvocab: [a]\ntokens: {bos: a, eos: E}\n",
            "not in the vocabulary",
        ),
        (
            "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1}\nvocab: []\n",
            "a decoder needs a vocab",
        ),
        (
            "model: {d_model: 2}\nvocab: [a, E]\ntokens: {bos: a, eos: E}\nsource: [a]\n",
            "encoder-only",
        ),
        (
            "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1}\nvocab: [a, E]\ntokens: {bos: a, eos: E}\ntarget: [[1, 2]]\n",
            "numeric matrix",
        ),
        (
            "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1, positional: learned, max_len: 4}\n"
            "vocab: [a, E]\ntokens: {bos: a, eos: E}\n",
            "beyond the 4 learned positions",
        ),
        (
            "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1, positional: relative, max_len: 4}\n"
            "vocab: [a, E]\ntokens: {bos: a, eos: E}\n",
            "beyond the 4 positions the relative bias reaches",
        ),
    ],
)
def test_configs_generate_cannot_serve_exit_2(tmp_yaml, text: str, message: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_yaml(text)
    code, _, err = invoke("generate", path)
    assert code == 2 and message in err and path in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args, advice",
    [
        (["--beam", "100000", "--max-tokens", "2"], "fewer --max-tokens, a narrower --beam or a"),
        (["--trace", "--max-elements", "100000"], "fewer --max-tokens, a --stage to keep or a"),
    ],
)
def test_over_the_limit_advises_only_what_the_command_line_can_change(
    args: list[str], advice: str
) -> None:
    # without --trace, --stage is itself an error; it was advised all the same
    code, _, err = invoke("generate", *args)
    assert code == 2 and f"expected {advice} higher --max-elements" in err


def test_a_vanishing_temperature_samples_the_argmax() -> None:
    # softmax(logits / T) tends to the argmax as T -> 0; logits / 1e-320 alone would
    # overflow to inf - inf = NaN (it did, and was refused).
    args = ["--max-tokens", "4", "--format", "json"]
    code, out, err = invoke("generate", "--sample", "--temperature", "1e-320", *args)
    assert code == 0, err
    sampled = json.loads(out)
    code, out, _ = invoke("generate", "--greedy", *args)
    greedy = json.loads(out)
    assert sampled["generated"] == greedy["generated"]
    for s, g in zip(sampled["iterations"], greedy["iterations"], strict=True):
        top = max(g["probs"], key=g["probs"].get)
        assert s["probs"] == {t: float(t == top) for t in g["probs"]}  # one-hot, exactly


def test_a_target_is_the_prompt_and_needs_no_bos(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    # SPEC 5: the prefix starts as `target` when the file gives one, else [tokens.bos]
    text = (
        "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1}\nvocab: [a, b, E]\n"
        "tokens: {eos: E}\ntarget: [b, a]\n"
    )
    code, out, err = invoke("generate", tmp_yaml(text), "--format", "json", "--max-tokens", "3")
    assert code == 0, err
    data = json.loads(out)
    assert data["iterations"][0]["prefix"] == ["b", "a"]
    # the same run as with a bos that the target makes unused
    with_bos = tmp_yaml(text.replace("{eos: E}", "{bos: b, eos: E}"))
    code, out_bos, _ = invoke("generate", with_bos, "--format", "json", "--max-tokens", "3")
    assert code == 0 and json.loads(out_bos)["iterations"] == data["iterations"]


def test_a_nan_distribution_is_an_error_not_a_token(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    # The only key is a pad: the decoder's softmax row is fully masked.
    path = tmp_yaml(
        "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1}\nvocab: [a, E, P]\n"
        "tokens: {bos: a, eos: E, pad: P}\ntarget: [P]\n"
    )
    code, _, err = invoke("generate", path)
    assert code == 2 and "not finite" in err and "NaN first appears in step t0.decoder.0" in err


def test_beam_passes_count_the_live_beams_each_iteration_can_have() -> None:
    s = gen.settings(beam=5, max_tokens=4)
    assert gen.beam_passes(s, n_vocab=3) == 1 + 3 + 5 + 5
    assert gen.beam_passes(gen.settings(beam=200, max_tokens=3), n_vocab=6) == 1 + 6 + 36
    wide = gen.settings(beam=10**6, max_tokens=10**6)
    assert gen.beam_passes(wide, n_vocab=10, limit=1000) == 1 + 10 + 100 + 1000  # stops there


def test_helpers_by_hand() -> None:
    p = np.array([0.1, 0.4, 0.2, 0.3])
    assert gen.ranking(p).tolist() == [1, 3, 2, 0]
    # The filters keep probabilities as they are; sampling_steps renormalises.
    assert gen.top_k_filter(p, 2).tolist() == [0, 0.4, 0, 0.3]
    assert gen.top_p_filter(p, 0.7).tolist() == [0, 0.4, 0, 0.3]
    assert gen.top_p_filter(p, 0.71).tolist() == [0, 0.4, 0.2, 0.3]
    # 0.5 + 0.25 = 0.75 exactly reaches 0.75; of the tied 0.25s the earlier one is in
    assert gen.top_p_filter(np.array([0.25, 0.5, 0.25]), 0.75).tolist() == [0.25, 0.5, 0]
    assert [gen.draw(p, u) for u in (0.0, 0.0999, 0.1, 0.49, 0.5, 0.7, 0.9999999)] == [
        0,
        0,
        1,
        1,
        2,
        3,
        3,
    ]
    assert gen.draw(np.array([0.5, 0.5, 0.0]), 1 - 2**-53) == 1  # never a zero-probability token
    assert gen.length_penalty(3, 0.0) == 1.0 and math.isclose(gen.length_penalty(7, 1.0), 2.0)


TABLE_RUNS = [
    ([], ["greedy: the most probable"]),
    (["--sample"], ["T = 1", "sampled: u ="]),
    (["--sample", "--temperature", "0.5"], ["T = 0.5"]),
    (["--sample", "--top-k", "3"], ["T = 1", "top-k 3"]),
    (["--sample", "--top-p", "0.9"], ["T = 1", "top-p 0.9"]),
    (["--sample", "--top-k", "3", "--top-p", "0.9"], ["top-k 3", "top-p 0.9"]),
    (["--beam", "2"], ["live beam", "best extension"]),
]


@pytest.mark.parametrize("options, shown", TABLE_RUNS, ids=lambda x: " ".join(x) or "greedy")
def test_every_strategy_renders_as_tables_and_agrees_with_json(
    options: list[str], shown: list[str]
) -> None:
    # Each strategy and filter combination, as tables (the default output), shows its
    # columns, and only those, and the tokens of the JSON of the same run.
    import re

    args = ["generate", *options, "--max-tokens", "3"]
    if "--sample" in options:
        args += ["--seed", "5"]
    code, out, err = invoke(*args)
    assert code == 0, err
    for text in shown:
        assert text in out, text
    for text, option in (("top-k ", "--top-k"), ("top-p ", "--top-p")):
        assert (text in out) == (option in options), text
    code, data, err = invoke(*args, "--format", "json")
    assert code == 0, err
    generated = json.loads(data)["generated"]
    assert re.search(r"│ generated +" + r" ".join(map(re.escape, generated)) + r" +│", out)
    if "--beam" not in options:  # one chosen token per iteration, in order
        assert re.findall(r"│ next (\S+) ", out) == generated


def test_a_long_token_is_shortened_in_the_distribution_so_its_p_shows(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    # 0fca77e shortened long tokens as matrix labels only: in the next-token table a
    # 300-letter token pushed its probability off the screen ("0…").
    long = "start" + "x" * 290 + "end"
    path = tmp_yaml(
        f"model: {{d_model: 2, encoder_layers: 0, decoder_layers: 1}}\nvocab: [a, {long}, E]\n"
        "tokens: {bos: a, eos: E}\n"
    )
    args = ("generate", path, "--max-tokens", "1")
    code, out, err = invoke(*args, "--format", "json")
    assert code == 0, err
    p = json.loads(out)["iterations"][0]["probs"][long]
    for strategy in ("--greedy", "--beam"):
        extra = ("2",) if strategy == "--beam" else ()
        result = runner.invoke(app, [*args, strategy, *extra], env={"COLUMNS": "120"})
        assert result.exit_code == 0, result.output
        rows = [x for x in result.stdout.splitlines() if "start" in x and "…" in x]
        assert rows and f"{p:.4f}" in rows[0], (strategy, rows)


@pytest.mark.parametrize("strategy", [("--greedy",), ("--beam", "2")])
def test_long_tokens_in_prefixes_and_hypotheses_do_not_widen_the_output(
    tmp_yaml: Any, strategy: tuple[str, ...]
) -> None:
    # Every token here is 298 letters: the beams' prefix column and the hypotheses'
    # token column took the longest token as their least width, so a 120-column
    # terminal got lines about 320 cells wide; the distribution already shortened them.
    words = [f"{w}" + "x" * 290 + "end" for w in ("start", "other", "final")]
    path = tmp_yaml(
        f"model: {{d_model: 2, encoder_layers: 0, decoder_layers: 1}}\nvocab: {words}\n"
        f"tokens: {{bos: {words[0]}, eos: {words[2]}}}\n"
    )
    result = runner.invoke(
        app, ["generate", path, "--max-tokens", "2", *strategy], env={"COLUMNS": "120"}
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(cell_len, lines)) <= 120, max(lines, key=cell_len)
    assert any("startxxx" in x and "…" in x for x in lines)  # shown, shortened


def test_without_eos_every_strategy_runs_to_max_tokens(tmp_yaml: Any) -> None:
    # generate refused a file without tokens.eos, though --max-tokens ends the loop: a
    # language model without an end token could not be decoded at all.
    raw = _brute_force_config()
    raw["tokens"]["eos"] = None  # t1 is now an ordinary token
    vocab, cfg, max_tokens = raw["vocab"], model_of(raw), 2
    logp = {
        tail: np.log(reference_forward({**raw, "target": [BOS, *tail]})["probs"][-1])
        for n in range(max_tokens)
        for tail in itertools.product(vocab, repeat=n)
    }
    totals = {
        seq: sum(float(logp[seq[:k]][vocab.index(t)]) for k, t in enumerate(seq))
        for seq in itertools.product(vocab, repeat=max_tokens)
    }
    exhaustive = gen.run(cfg, gen.settings(beam=200, max_tokens=max_tokens))
    assert exhaustive.generated == max(totals, key=lambda s: totals[s])
    assert exhaustive.stopped == "max_tokens" and not exhaustive.finished
    assert {h.tokens for h in exhaustive.unfinished} == set(totals)
    greedy = gen.run(cfg, gen.settings(greedy=True, max_tokens=max_tokens))
    first = vocab[int(np.argmax(logp[()]))]
    assert greedy.generated == (first, vocab[int(np.argmax(logp[(first,)]))])
    assert greedy.stopped == "max_tokens"
    sampled = gen.run(cfg, gen.settings(sample=True, max_tokens=5, seed=3))
    assert len(sampled.generated) == 5 and sampled.stopped == "max_tokens"
    code, out, err = invoke("generate", tmp_yaml(yaml.safe_dump(raw)), "--max-tokens", "2")
    assert code == 0, err
    assert "after 2 produced token(s): the file sets no tokens.eos" in " ".join(out.split())


@pytest.mark.parametrize("strategy", [["--greedy"], ["--sample"], ["--beam", "2"]])
def test_a_long_prefix_is_shown_by_its_ends_so_the_output_grows_linearly(
    strategy: list[str],
) -> None:
    # Each iteration printed its whole prefix: 2000 tokens wrote 15 MB, growing as the
    # square of --max-tokens. Past 21 tokens, the first 4 and the last 16 are shown
    # around how many were left out; --full shows them all; the result is whole.
    def lines(n: int, *extra: str) -> list[str]:
        result = runner.invoke(
            app, ["generate", *strategy, "--max-tokens", str(n), *extra], env={"COLUMNS": "100"}
        )
        assert result.exit_code == 0, result.stderr
        return result.stdout.splitlines()

    short, long = lines(40), lines(80)
    growth = (len(long) - len(short)) / (len(short) - len(lines(20)))
    assert growth < 2.3, growth  # (quadratic: about 3)
    prefixes = [x for x in long if "prefix" in x or ("│ " in x and "SOS " in x)]
    # SOS + 79 tokens at the last iteration; sampling may end at eos sooner
    hidden = " … 60 more … " if strategy[0] != "--sample" else " more … "
    assert any("SOS how" in x and hidden in x for x in prefixes)
    assert not any(" more … " in x for x in lines(20))  # 21 tokens at most: whole
    whole = "\n".join(lines(80, "--full"))
    assert " more … " not in whole and whole.count("SOS") > 80
    summary = long[long.index(next(x for x in long if "─ generated" in x)) :]
    assert " more … " not in "\n".join(summary)  # the result in full


def test_the_header_shows_eos_and_pad_as_quoted_text_not_raw(tmp_yaml: Any) -> None:
    # The stop row (4cbbe2e) wrote tokens.eos raw: an escape character went to the
    # terminal as is (colouring what followed) and a newline broke the header's line;
    # a token of 300 letters filled three lines of it. pad's row already quoted it.
    odd = "E\x1b[31m\nX"
    long = "start" + "x" * 290 + "end"
    path = tmp_yaml(
        "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1}\n"
        f"vocab: [a, {json.dumps(odd)}, {long}]\n"
        f"tokens: {{bos: a, eos: {json.dumps(odd)}, pad: {long}}}\ntarget: [a]\n"
    )
    code, out, err = invoke("generate", path, "--max-tokens", "1")
    assert code == 0, err
    assert "\x1b" not in out
    stop = next(x for x in out.splitlines() if "│ stop" in x)
    assert "at tokens.eos ('E\\x1b[31m\\nX') or after 1 produced token(s)" in stop
    masks = " ".join(x for x in out.splitlines() if "pad token" in x or "masked as" in x)
    assert "x" * 100 not in masks and "(298 characters)" in masks


def test_the_header_names_an_empty_pad_token_that_masks() -> None:
    # The masks row tested the pad token's truth, not its presence: tokens.pad "" masked
    # its key (-inf in the masked scores) while the header said "masks none".
    from trace_tf.runner import conventions, run

    cfg = config_from(
        {
            "model": {"d_model": 2, "n_heads": 1, "encoder_layers": 1, "decoder_layers": 0},
            "vocab": ["", "a"],
            "tokens": {"pad": ""},
            "source": ["a", ""],
        }
    )
    [masked] = [s for s in run(cfg) if s.path.endswith("self_attn.h0.masked")]
    assert np.isneginf(masked.value[:, 1]).all()
    assert dict(conventions(cfg))["masks"].endswith(": pad token '' masked as a key")


def test_the_header_counts_one_learned_position_in_the_singular() -> None:
    from trace_tf.runner import conventions

    model = {"d_model": 2, "n_heads": 1, "positional": "learned", "max_len": 1}
    cfg = config_from({"model": model, "vocab": ["a"], "source": ["a"]})
    assert "weights.positional (1 row), added" in dict(conventions(cfg))["positions"]


@pytest.mark.parametrize("width, precision", [(40, 4), (40, 10), (60, 17), (120, 4)])
def test_a_sampling_table_keeps_every_rank_token_and_number_whole(
    width: int, precision: int
) -> None:
    # Four columns of numbers on a narrow terminal: rich cut each number ("0.79…") and
    # dropped the rank and token columns altogether; the table is printed wider instead.
    args = ["generate", "--sample", "--seed", "3", "--temperature", "0.7", "--top-k", "5"]
    args += ["--top-p", "0.9", "--max-tokens", "1"]
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    it = data["iterations"][0]
    result = runner.invoke(app, [*args, "--precision", str(precision)], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    lines = [x.strip("│ ") for x in result.stdout.splitlines()]
    head = lines.index(next(x for x in lines if x.startswith("#")))
    header = ["#", "token", "model p", "T = 0.7", "top-k 5", "top-p 0.9"]
    assert lines[head].split() == " ".join(header).split(" ")
    model, final = it["model_probs"], it["probs"]
    # sorted by the last column, then the earlier ones, then vocabulary order
    order = sorted(model, key=lambda t: (-final[t], -model[t]))
    for rank, token in enumerate(order, start=1):
        cells = lines[head + rank].split()
        assert cells[:2] == [str(rank), token]
        first, last = cells[2], cells[5]
        # each column in one notation, Python's own formatting of the JSON value
        for shown, column in ((first, model), (last, final)):
            assert shown in (f"{column[token]:.{precision}f}", f"{column[token]:.{precision}e}")


@pytest.mark.parametrize("width", [40, 64, 80])
def test_the_rest_s_total_stays_one_line_however_narrow(width: int) -> None:
    # Its label, "(their total)", sits in the bars' column, which gives way down to the
    # mark's two cells: it wrapped, and each line was cut again ("(…" over "t…").
    args = ["generate", "--sample", "--seed", "1", "--max-tokens", "1", "--show", "3"]
    out = runner.invoke(app, [*args, "--precision", "17"], env={"COLUMNS": str(width)})
    assert out.exit_code == 0, out.output
    lines = [x.strip("│ ") for x in out.stdout.splitlines()]
    rest = next(k for k, x in enumerate(lines) if x.startswith("… ") and " more " in x)
    assert lines[rest + 1].startswith("next "), lines[rest : rest + 2]


@pytest.mark.parametrize("width, precision", [(40, 4), (40, 17), (80, 17), (120, 4)])
def test_the_chosen_token_keeps_its_mark_however_narrow(width: int, precision: int) -> None:
    # The bars give way on a narrow terminal, and the mark of the chosen token, drawn in
    # their column, went with them: no row said which token was drawn.
    args = ["generate", "--sample", "--seed", "3", "--temperature", "0.7", "--top-k", "5"]
    args += ["--top-p", "0.9", "--max-tokens", "2"]
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    out = runner.invoke(app, [*args, "--precision", str(precision)], env={"COLUMNS": str(width)})
    assert out.exit_code == 0, out.output
    lines = [x.strip("│ ") for x in out.stdout.splitlines()]
    heads = [k for k, x in enumerate(lines) if x.startswith("# ")]
    assert len(heads) == len(data["iterations"]) == 2
    for head, it in zip(heads, data["iterations"], strict=True):
        rows = lines[head + 1 : head + 11]
        marked = [x.split()[1] for x in rows if "◀" in x]
        assert marked == [it["next"]]


def test_a_log_probability_near_zero_is_never_shown_as_zero() -> None:
    """log p of a token of p = 1 - 8e-11 is -7.7e-11: '-0.0000' at 4 decimals hid it."""
    bias = ["--set", "weights.output.b=[0,0,0,0,0,30,0,0,0,0]"]  # EOS far the likeliest
    code, out, _ = invoke("generate", "--beam", "2", "--max-tokens", "1", *bias, "--format", "json")
    logprob = json.loads(out)["result"]["logprob"]
    assert code == 0 and -1e-10 < logprob < -1e-11
    code, out, _ = invoke("generate", "--beam", "2", "--max-tokens", "1", *bias)
    assert code == 0 and "-0.0000" not in out
    shown = f"{logprob:.4e}"
    assert f"(log p {shown}, cumulative {shown})" in out and f"finished, score {shown}" in out


STATUS = r"(→ beam \d+|dropped|finished, score -?\d\.\d+(e-?\d+)?)"


@pytest.mark.parametrize("width", [40, 60, 80])
@pytest.mark.parametrize(
    "extra", [(), ("--set", "weights.output.b=[0,0,0,0,0,3,0,0,0,0]")]
)  # (the second: EOS likely, beams finish)
def test_each_beam_status_stays_on_its_row_however_narrow(
    width: int, extra: tuple[str, ...]
) -> None:
    # At 40 columns the status column wrapped: "→ beam" over "0", and the row of the
    # extensions not shown as "10" over "more," over "dropped".
    import re

    args = ["generate", "--beam", "2", "--max-tokens", "3", *extra]
    out = runner.invoke(app, args, env={"COLUMNS": str(width)})
    assert out.exit_code == 0, out.output
    lines = [x.strip("│ ") for x in out.stdout.splitlines()]
    heads = [k for k, x in enumerate(lines) if x.startswith("# ")]
    assert heads
    statuses = 0
    for head in heads:
        for row in itertools.takewhile(lambda x: not x.startswith("best "), lines[head + 1 :]):
            if row.startswith("… "):
                assert re.fullmatch(r"… \d+ more, dropped", row), row
            else:
                assert re.fullmatch(rf"\d+ +\d+ +\S+ +(-?\d\.\d+ +){{3}}\S* *{STATUS}", row), row
                statuses += "→ beam" in row or "finished" in row
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    assert statuses == sum(len(it["candidates"]) for it in data["iterations"])


def test_a_token_with_a_space_is_quoted_in_a_sequence_but_not_in_a_table(tmp_path: Any) -> None:
    # "start SOS New York (none)" read as four tokens, or as no tokens after SOS New York:
    # on a line of tokens, one with a space inside and the token "(none)" are quoted
    path = tmp_path / "ny.yaml"
    path.write_text(
        "model: {d_model: 4, n_heads: 1, encoder_layers: 1, decoder_layers: 1}\n"
        "vocab: [SOS, EOS, New York, '(none)', is]\n"
        "tokens: {bos: SOS, eos: EOS}\nsource: [New York, is]\n"
    )
    prefix = ["--set", "target=[SOS, New York, '(none)']", "--max-tokens", "1"]
    env = {"COLUMNS": "100"}
    out = CliRunner().invoke(app, ["generate", str(path), "--greedy", *prefix], env=env)
    assert out.exit_code == 0, out.output
    assert "prefix SOS 'New York' '(none)'" in out.stdout
    assert "start     SOS 'New York' '(none)'" in out.stdout
    # in the distribution table each token has its own cell: shown as it is
    rows = [line for line in out.stdout.splitlines() if "New York" in line]
    assert any("'New York'" not in line for line in rows)
    beam = CliRunner().invoke(app, ["generate", str(path), "--beam", "2", *prefix], env=env)
    assert beam.exit_code == 0, beam.output
    assert "SOS 'New York' '(none)'" in beam.stdout  # the live beam's prefix


def test_beam_extensions_write_their_p_column_in_one_notation() -> None:
    # README: a column of probabilities is written in one notation, scientific when fixed
    # would hide a number. The beam table wrote each p on its own: hello's 9.58e-05 as
    # 0.0001 a row above a's 4.6844e-10, as if it had one significant digit.
    args = ["generate", "--beam", "2", "--set", "model.init_std=4", "--max-tokens", "1"]
    result = runner.invoke(app, args, env={"COLUMNS": "150"})
    assert result.exit_code == 0, result.output
    lines = [x.strip("│ ") for x in result.stdout.splitlines()]
    start = next(k for k, x in enumerate(lines) if x.startswith("#  beam  + token")) + 1
    rows = [x.split() for x in lines[start : start + 10]]
    assert [r[0] for r in rows] == [str(k) for k in range(1, 11)], rows
    cells = {r[2]: r[3] for r in rows}  # token -> p as written
    # the same distribution, from decode with SOS as the target and softmax by hand
    decoded = runner.invoke(app, ["decode", "--set", "model.init_std=4", "--format", "json"])
    steps = {s["path"]: s for s in json.loads(decoded.stdout)["steps"]}
    logits = np.array(steps["logits"]["value"][0])
    p = np.exp(logits - logits.max())
    p /= p.sum()
    vocab = ["hello", "mundo", "world", "how", "?", "EOS", "SOS", "a", "hola", "c"]
    assert p.min() < 5e-5 < p.max()  # fixed notation at 4 decimals would hide some
    for token, q in zip(vocab, p, strict=True):
        written = cells[token]
        assert "e" in written, (token, written)  # every cell in the column's notation
        assert float(written) == pytest.approx(q, rel=1e-4), (token, written, q)


def test_generate_help_says_the_prefix_starts_as_the_target() -> None:
    # The help said "From tokens.bos (or the target)": bos first. The prefix starts as the
    # target when the file gives one (README, SPEC section 5), bos only without one.
    text = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "200"}).stdout
    assert "From the target (tokens.bos when the file gives none)" in " ".join(text.split())
    for extra, start in (["--set", "target=[how]"], ["how"]), (["--set", "target=null"], ["SOS"]):
        args = ["generate", *extra, "--max-tokens", "1", "--format", "json"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["iterations"][0]["prefix"] == start
