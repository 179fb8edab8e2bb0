"""The engine against Hugging Face's Gemma 2 (transformers' Gemma2ForCausalLM, float64,
eval).

Gemma 2 is Gemma 1 (tests/test_hf_gemma.py: γ = 1 + weight, a tanh-GELU gate, embeddings
scaled by √hidden_size, a tied output) with four conventions more, each silent when
mapped as Gemma 1's:
- sandwich norms, `x + Norm_post(F(Norm(x)))` (`norm_position: sandwich`): its
  post_attention_layernorm is the attention's `post_norm` (Gemma 1's is the FFN's
  `norm`), pre_feedforward_layernorm the FFN's `norm`, post_feedforward_layernorm its
  `post_norm`, each γ = 1 + weight;
- sliding-window layers alternating with full ones (`layer_types`, `sliding_window`):
  `model.window` as a list, one per layer, null for a full one;
- the scores scaled by query_pre_attn_scalar^-1/2, not head_dim^-1/2:
  `model.scale: √query_pre_attn_scalar`;
- tanh soft caps on the scaled scores (`attn_logit_softcapping`, before the mask) and
  on the logits (`final_logit_softcapping`): `model.attn_softcap`, `model.logit_softcap`.

Small random Gemma 2s, every parameter drawn anew (norm weights away from 0), each with
a window smaller than the prompt and caps small enough to bite, are converted here by
Gemma 1's test mapping and the four above (written here independently of the README's
recipe, which is run as printed). HF computes Gemma 1's four things in float32 here too
(RMSNorm, rotary angles, softmax, the embedding scale): `float64_gemma2` does them in
float64, as `float64_gemma` does for Gemma 1; so patched, every hidden state, each head's
attention weights and the logits must match trace-tf to 1e-12.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import shape_id
from hf_common import (
    assert_greedy_matches,
    assert_matches,
    assert_recipe_runs,
    decode_json,
    draw_parameters,
    float64_hf,
    hf_outputs,
    largest_error,
    prompt_for,
    rotary_config,
    run_readme,
    traced,
    vocab_of,
)
from test_hf_gemma import _embed_float64, _rms_norm_float64
from test_hf_gemma import to_config as gemma_to_config
from transformers import Gemma2Config, Gemma2ForCausalLM
from transformers.models.gemma2 import modeling_gemma2

PROMPT = 7  # tokens: longer than every window below

# Gemma2Config's options, each model's own; its defaults are Gemma 2 2B's sizes (vocab
# 256000, hidden 2304, head_dim 256, 26 layers, window 4096, query_pre_attn_scalar 256),
# every one set small here
SHAPES: list[dict[str, Any]] = [
    dict(  # one sliding layer, both caps, query_pre_attn_scalar ≠ head_dim
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        hidden_size=8,
        intermediate_size=12,
        head_dim=4,
        query_pre_attn_scalar=9,
        sliding_window=2,
        attn_logit_softcapping=1.5,
        final_logit_softcapping=2.0,
    ),
    dict(  # Gemma 2's alternation (sliding, full), multi-query, both caps
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        hidden_size=12,
        intermediate_size=16,
        head_dim=6,
        query_pre_attn_scalar=10,
        sliding_window=3,
        attn_logit_softcapping=1.0,
        final_logit_softcapping=2.5,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
    ),
    dict(  # another order, grouped-query, no caps, biases, an untied output
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=8,
        intermediate_size=20,
        head_dim=4,
        query_pre_attn_scalar=4,
        sliding_window=2,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        attention_bias=True,
        tie_word_embeddings=False,
        rms_norm_eps=0.1,
    ),
]


def gemma2(shape: dict[str, Any], seed: int) -> Gemma2ForCausalLM:
    """A Gemma2ForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`."""
    config = rotary_config(Gemma2Config, shape)
    assert config.hidden_activation == "gelu_pytorch_tanh"
    assert config.sliding_window < PROMPT and "sliding_attention" in config.layer_types
    return draw_parameters(Gemma2ForCausalLM(config), seed, norm_weight=0.0)  # 1 + weight near 1


def to_config(model: Gemma2ForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """Gemma 1's mapping with sandwich norms, per-layer windows, the scale and the caps."""
    raw = gemma_to_config(model, prompt)
    c = model.config
    p = {k: v.numpy() for k, v in model.state_dict().items()}

    def gamma(key: str) -> dict[str, Any]:
        return {"gamma": (1.0 + p[key]).tolist()}  # Gemma2RMSNorm: x / rms(x) · (1 + weight)

    for l, layer in enumerate(raw["weights"]["decoder"]):
        m = f"model.layers.{l}"
        layer["self_attn"]["post_norm"] = gamma(f"{m}.post_attention_layernorm.weight")
        layer["ffn"]["norm"] = gamma(f"{m}.pre_feedforward_layernorm.weight")
        layer["ffn"]["post_norm"] = gamma(f"{m}.post_feedforward_layernorm.weight")
    raw["model"] |= {
        "norm_position": "sandwich",
        "window": [c.sliding_window if t == "sliding_attention" else None for t in c.layer_types],
        "scale": c.query_pre_attn_scalar**0.5,
        "attn_softcap": c.attn_logit_softcapping,
        "logit_softcap": c.final_logit_softcapping,
    }
    return raw


@contextmanager
def float64_gemma2() -> Iterator[None]:
    """HF's Gemma 2 with Gemma 1's four float32 computations done in float64."""
    with float64_hf(modeling_gemma2, "Gemma2", _rms_norm_float64) as mp:
        mp.setattr(modeling_gemma2.Gemma2TextScaledWordEmbedding, "forward", _embed_float64)
        yield


def expected_of(model: Gemma2ForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    with float64_gemma2():
        return hf_outputs(model, prompt)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_gemma2(shape: dict[str, Any], seed: int) -> None:
    model = gemma2(shape, seed)
    prompt = prompt_for(model, seed, PROMPT)
    expected = expected_of(model, prompt)
    c = model.config
    assert len(expected) == 2 + c.num_hidden_layers * (1 + c.num_attention_heads) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_the_window_bites_and_the_caps_bound(shape: dict[str, Any]) -> None:
    """What the comparison covers is there in HF's own numbers: a sliding layer's weights
    are 0 on the keys j ≤ i − sliding_window, and nowhere else above the diagonal, a
    full layer's on none of them; a capped model's logits lie within ±final cap."""
    model = gemma2(shape, 2)
    prompt = prompt_for(model, 2, PROMPT)
    expected = expected_of(model, prompt)
    c = model.config
    i, j = np.indices((PROMPT, PROMPT))
    for l, kind in enumerate(c.layer_types):
        hidden = j <= i - c.sliding_window if kind == "sliding_attention" else np.zeros_like(i > 0)
        weights = expected[f"decoder.{l}.self_attn.h0.softmax"]
        assert (weights[hidden | (j > i)] == 0).all() and (weights[~hidden & (j <= i)] > 0).all()
    if c.final_logit_softcapping is not None:
        assert np.abs(expected["logits"]).max() < c.final_logit_softcapping


@pytest.mark.parametrize("shape", SHAPES[1:], ids=shape_id)
def test_as_shipped_gemma2_differs_by_float32_roundings_only(shape: dict[str, Any]) -> None:
    """Unpatched, HF's float32 norm, angles, softmax and embedding scale put it about
    1e-7 away (relative to 1 + |value|): more than float64 roundings, less than any
    mapping error gives."""
    model = gemma2(shape, 4)
    prompt = prompt_for(model, 4, PROMPT)
    value = traced(to_config(model, prompt)).value
    error = largest_error(hf_outputs(model, prompt), value)
    assert 1e-10 < error < 1e-5


def pre_norm(raw: dict[str, Any]) -> None:
    """Gemma 1's placement: no norm on a sublayer's output."""
    raw["model"]["norm_position"] = "pre"
    for layer in raw["weights"]["decoder"]:
        del layer["self_attn"]["post_norm"], layer["ffn"]["post_norm"]


def no_caps(raw: dict[str, Any]) -> None:
    del raw["model"]["attn_softcap"], raw["model"]["logit_softcap"]


def no_attn_cap(raw: dict[str, Any]) -> None:
    del raw["model"]["attn_softcap"]


def no_logit_cap(raw: dict[str, Any]) -> None:
    del raw["model"]["logit_softcap"]


def every_layer_sliding(raw: dict[str, Any]) -> None:
    raw["model"]["window"] = max(w for w in raw["model"]["window"] if w is not None)


def scale_sqrt_head_dim(raw: dict[str, Any]) -> None:
    """trace-tf's default, √d_k, not √query_pre_attn_scalar."""
    del raw["model"]["scale"]


def gemma1_norms(raw: dict[str, Any]) -> None:
    """post_attention_layernorm as the FFN's norm, as in Gemma 1's mapping."""
    for layer in raw["weights"]["decoder"]:
        a, f = layer["self_attn"], layer["ffn"]
        a["post_norm"], f["norm"] = f["norm"], a["post_norm"]


@pytest.mark.parametrize(
    "mutate",
    [
        pre_norm,
        no_caps,
        no_attn_cap,
        no_logit_cap,
        every_layer_sliding,
        scale_sqrt_head_dim,
        gemma1_norms,
    ],
)
def test_the_comparison_catches_a_wrong_mapping(mutate: Callable[[dict[str, Any]], None]) -> None:
    """Each of Gemma 2's conventions left out or mapped as Gemma 1's makes the comparison
    above fail, by far more than float32 roundings do (test_as_shipped_*)."""
    model = gemma2(SHAPES[1], 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = to_config(model, prompt)
    mutate(raw)
    expected = expected_of(model, prompt)
    value = traced(raw).value
    with pytest.raises(AssertionError):
        assert_matches(expected, value)
    assert largest_error(expected, value) > 1e-5


# ------------------------------------------------------------ generate --greedy


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_gemma2_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    """Prompts of 4 and 8 new tokens: the window bites as the sequence grows, HF's
    sliding cache layers dropping the keys that trace-tf's cache masks."""
    assert_greedy_matches(gemma2(shape, 5), to_config, tmp_path, float64_gemma2)


# ---------------------------------------------------- README recipe: Gemma 2 → trace-tf


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    gemma = run_readme("From Hugging Face Gemma")
    scope = assert_recipe_runs("From Hugging Face Gemma 2", "gemma2", float64_gemma2, after=gemma)
    model = scope["model"]
    assert model.config.sliding_window < len(scope["prompt"])  # the window bites
    assert (model.model.layers[0].post_attention_layernorm.weight != 0).all()


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_converts_any_gemma2(
    shape: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe's `gemma2_arrays` and `gemma2_config` on other models (norm weights away
    from 0, other windows and layer orders, caps on and off, biases, an untied output)."""
    monkeypatch.chdir(tmp_path)
    scope = run_readme("From Hugging Face Gemma 2", scope=run_readme("From Hugging Face Gemma"))
    model = gemma2(shape, 7)
    prompt, vocab = prompt_for(model, 7, PROMPT), vocab_of(model)
    np.savez("m.npz", **scope["gemma2_arrays"](model, vocab))
    config = scope["gemma2_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert_matches(expected_of(model, prompt), decode_json("m.yaml"))


def test_the_readme_recipe_refuses_bidirectional_attention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """use_bidirectional_attention (EmbeddingGemma's) is not a causal decoder: refused."""
    monkeypatch.chdir(tmp_path)
    scope = run_readme("From Hugging Face Gemma 2", scope=run_readme("From Hugging Face Gemma"))
    model = gemma2(SHAPES[0], 0)
    model.config.use_bidirectional_attention = True
    vocab = vocab_of(model)
    with pytest.raises(ValueError, match="bidirectional"):
        scope["gemma2_config"](model, vocab, vocab[:3], "m.npz")


def test_a_gemma2_config_alternates_sliding_and_full_layers_by_default() -> None:
    """README: without layer_types, Gemma2Config makes the even layers sliding (layer 0
    first) and the odd ones full, with Gemma 2's window of 4096 and scalar of 256."""
    config = Gemma2Config(num_hidden_layers=3, hidden_size=8, num_attention_heads=2, head_dim=4)
    assert config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert (config.sliding_window, config.query_pre_attn_scalar) == (4096, 256)
