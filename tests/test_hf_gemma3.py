"""The engine against Hugging Face's Gemma 3 text model (transformers' Gemma3ForCausalLM,
float64, eval).

Gemma 3's text model is Gemma 2 (tests/test_hf_gemma2.py: sandwich norms, per-layer
windows, query_pre_attn_scalar, the logits' optional soft cap) with QK-norm: each
head's query and key through a Gemma3RMSNorm(head_dim) (`q_norm`, `k_norm`, one γ per
layer shared by the heads, γ = 1 + weight) before RoPE, `model.qk_norm: head`. Its
sliding layers and its full ones each have a RoPE (`rope_parameters` by layer type, from
a checkpoint's `rope_local_base_freq` 10000, unscaled, and `rope_theta` 1000000 with its
`rope_scaling`, linear ×8 in the 4B, 12B and 27B): `model.pe_base` and
`model.rope_scaling` as lists, each decoder layer's. Its config keeps Gemma 2's
`attn_logit_softcapping` (None by default), but in transformers 5.23 Gemma3Attention
never passes it to the attention: the scores are not capped whatever it says
(`attn_softcap` stays off), only the logits (`final_logit_softcapping`).

HF computes Gemma 2's four things in float32 here too: `float64_gemma3` does them in
float64 (its rotary embedding takes the layer type: `rotary_float64` on that type's
parameters), and every hidden state, each head's attention weights and the logits must
match trace-tf to 1e-12.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
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
    rotary_float64,
    run_readme,
    traced,
    vocab_of,
)
from test_hf_gemma import _embed_float64, _rms_norm_float64
from test_hf_gemma2 import to_config as gemma2_to_config
from test_hf_llama import rope_scaling
from transformers import Gemma3ForCausalLM, Gemma3TextConfig
from transformers.models.gemma3 import modeling_gemma3

PROMPT = 7  # tokens: longer than every window below

# Gemma3TextConfig's options, each model's own; its defaults are Gemma 3 1B's sizes
# (vocab 262208, hidden 2304, head_dim 256, 26 layers, window 4096), every one set small
SHAPES: list[dict[str, Any]] = [
    dict(  # a sliding layer and a full one, multi-query, no caps (Gemma 3's default)
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        hidden_size=8,
        intermediate_size=12,
        head_dim=4,
        query_pre_attn_scalar=6,
        sliding_window=2,
        layer_types=["sliding_attention", "full_attention"],
    ),
    dict(  # Gemma 3's order (sliding before full), grouped-query, both caps (one ignored)
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=12,
        intermediate_size=16,
        head_dim=6,
        query_pre_attn_scalar=10,
        sliding_window=3,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        attn_logit_softcapping=1.0,
        final_logit_softcapping=2.5,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
        attention_bias=True,
        tie_word_embeddings=False,
    ),
    dict(  # Gemma 3 4B's RoPE, as its config.json says it: sliding layers' base 10000,
        # unscaled; the full layers' 1000000, linear ×8; grouped-query, sliding first
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=8,
        intermediate_size=12,
        head_dim=6,
        query_pre_attn_scalar=6,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_local_base_freq=10_000.0,
        rope_theta=1_000_000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        final_logit_softcapping=2.5,
    ),
    dict(  # Gemma 3 1B's: the same two bases, no scaling; multi-query
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        hidden_size=8,
        intermediate_size=12,
        head_dim=4,
        query_pre_attn_scalar=4,
        sliding_window=2,
        layer_types=["sliding_attention", "full_attention"],
        rope_local_base_freq=10_000.0,
        rope_theta=1_000_000.0,
    ),
]
# A checkpoint's own RoPE keys (config.json), which Gemma3TextConfig turns into
# rope_parameters by layer type
CHECKPOINT_ROPE = ("rope_local_base_freq", "rope_theta", "rope_scaling")


def gemma3(shape: dict[str, Any], seed: int) -> Gemma3ForCausalLM:
    """A Gemma3ForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`;
    its sliding and full layers' RoPE the same, or with rope_local_base_freq a
    checkpoint's (CHECKPOINT_ROPE), by HF's own reading of those keys."""
    shape, own = dict(shape), {}
    if "rope_local_base_freq" in shape:
        own = {key: shape.pop(key) for key in CHECKPOINT_ROPE if key in shape}
    config = rotary_config(Gemma3TextConfig, shape, by_layer_type=True)
    if own:
        config.rope_parameters = Gemma3TextConfig(**own).rope_parameters
    assert config.hidden_activation == "gelu_pytorch_tanh"
    assert config.sliding_window < PROMPT and "sliding_attention" in config.layer_types
    return draw_parameters(Gemma3ForCausalLM(config), seed, norm_weight=0.0)  # 1 + weight near 1


def to_config(model: Gemma3ForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """Gemma 2's mapping with QK-norm: each layer's q_norm and k_norm, γ = 1 + weight; and
    each layer's RoPE, its layer type's base and scaling (LLaMA's mapping of it)."""
    raw = gemma2_to_config(model, prompt)
    rope = [model.config.rope_parameters[t] for t in model.config.layer_types]
    raw["model"] |= {
        "pe_base": [float(r["rope_theta"]) for r in rope],
        "rope_scaling": [rope_scaling(r) for r in rope],
    }
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    for l, layer in enumerate(raw["weights"]["decoder"]):
        for norm in ("q_norm", "k_norm"):
            weight = p[f"model.layers.{l}.self_attn.{norm}.weight"]
            layer["self_attn"][norm] = {"gamma": (1.0 + weight).tolist()}
    raw["model"] |= {"qk_norm": "head", "attn_softcap": None}  # Gemma3Attention never caps
    return raw


def _rotary_float64(self: Any, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str) -> Any:
    """Gemma3RotaryEmbedding.forward in float64: rotary_float64 on `layer_type`'s RoPE."""
    return rotary_float64(self, x, position_ids, layer_type)


@contextmanager
def float64_gemma3() -> Iterator[None]:
    """HF's Gemma 3 with Gemma's four float32 computations done in float64."""
    with float64_hf(modeling_gemma3, "Gemma3", _rms_norm_float64) as mp:
        mp.setattr(modeling_gemma3.Gemma3RotaryEmbedding, "forward", _rotary_float64)
        mp.setattr(modeling_gemma3.Gemma3TextScaledWordEmbedding, "forward", _embed_float64)
        yield


def expected_of(model: Gemma3ForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    with float64_gemma3():
        return hf_outputs(model, prompt)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_gemma3(shape: dict[str, Any], seed: int) -> None:
    model = gemma3(shape, seed)
    prompt = prompt_for(model, seed, PROMPT)
    expected = expected_of(model, prompt)
    c = model.config
    assert len(expected) == 2 + c.num_hidden_layers * (1 + c.num_attention_heads) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


def test_gemma3_ignores_its_config_s_attention_cap() -> None:
    """attn_logit_softcapping set or None, HF's Gemma 3 computes the same numbers (its
    QK-norm bounds the scores instead): the mapping leaves `attn_softcap` off."""
    capped, uncapped = gemma3(SHAPES[1], 6), gemma3(SHAPES[1] | {"attn_logit_softcapping": None}, 6)
    prompt = prompt_for(capped, 6, PROMPT)
    expected, plain = expected_of(capped, prompt), expected_of(uncapped, prompt)
    assert capped.config.attn_logit_softcapping == 1.0
    for path, want in expected.items():
        np.testing.assert_array_equal(plain[path], want, err_msg=path)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_as_shipped_gemma3_differs_by_float32_roundings_only(shape: dict[str, Any]) -> None:
    model = gemma3(shape, 4)
    prompt = prompt_for(model, 4, PROMPT)
    value = traced(to_config(model, prompt)).value
    error = largest_error(hf_outputs(model, prompt), value)
    assert 1e-10 < error < 1e-5


def no_qk_norm(raw: dict[str, Any]) -> None:
    del raw["model"]["qk_norm"]
    for layer in raw["weights"]["decoder"]:
        del layer["self_attn"]["q_norm"], layer["self_attn"]["k_norm"]


def qk_gamma_without_one(raw: dict[str, Any]) -> None:
    """Qwen3's mapping, γ = weight."""
    a = raw["weights"]["decoder"][0]["self_attn"]
    for norm in ("q_norm", "k_norm"):
        a[norm]["gamma"] = (np.asarray(a[norm]["gamma"]) - 1).tolist()


def q_and_k_norms_swapped(raw: dict[str, Any]) -> None:
    a = raw["weights"]["decoder"][0]["self_attn"]
    a["q_norm"], a["k_norm"] = a["k_norm"], a["q_norm"]


def pre_norm(raw: dict[str, Any]) -> None:
    raw["model"]["norm_position"] = "pre"
    for layer in raw["weights"]["decoder"]:
        del layer["self_attn"]["post_norm"], layer["ffn"]["post_norm"]


def every_layer_sliding(raw: dict[str, Any]) -> None:
    raw["model"]["window"] = max(w for w in raw["model"]["window"] if w is not None)


def scale_sqrt_head_dim(raw: dict[str, Any]) -> None:
    del raw["model"]["scale"]


@pytest.mark.parametrize(
    "mutate",
    [
        no_qk_norm,
        qk_gamma_without_one,
        q_and_k_norms_swapped,
        pre_norm,
        every_layer_sliding,
        scale_sqrt_head_dim,
    ],
)
def test_the_comparison_catches_a_wrong_mapping(mutate: Callable[[dict[str, Any]], None]) -> None:
    model = gemma3(SHAPES[1], 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = to_config(model, prompt)
    mutate(raw)
    expected = expected_of(model, prompt)
    value = traced(raw).value
    with pytest.raises(AssertionError):
        assert_matches(expected, value)
    assert largest_error(expected, value) > 1e-5


def one_base_the_full_layers(raw: dict[str, Any]) -> None:
    raw["model"]["pe_base"] = max(raw["model"]["pe_base"])


def one_base_the_sliding_layers(raw: dict[str, Any]) -> None:
    raw["model"]["pe_base"] = min(raw["model"]["pe_base"])


def scaling_on_every_layer(raw: dict[str, Any]) -> None:
    raw["model"]["rope_scaling"] = {"type": "linear", "factor": 8.0}


def scaling_on_no_layer(raw: dict[str, Any]) -> None:
    raw["model"]["rope_scaling"] = None


def bases_swapped(raw: dict[str, Any]) -> None:
    high, low = max(raw["model"]["pe_base"]), min(raw["model"]["pe_base"])
    raw["model"]["pe_base"] = [low if b == high else high for b in raw["model"]["pe_base"]]


@pytest.mark.parametrize(
    "shape, mutate",
    [
        (SHAPES[2], one_base_the_full_layers),
        (SHAPES[2], one_base_the_sliding_layers),
        (SHAPES[2], scaling_on_every_layer),
        (SHAPES[2], scaling_on_no_layer),
        (SHAPES[3], one_base_the_full_layers),
        (SHAPES[3], one_base_the_sliding_layers),
        (SHAPES[3], bases_swapped),
    ],
    ids=lambda x: x.__name__ if callable(x) else shape_id(x),
)
def test_the_comparison_catches_a_wrong_rope(
    shape: dict[str, Any], mutate: Callable[[dict[str, Any]], None]
) -> None:
    """Gemma 3's checkpoints' RoPE, a base per layer type and the full layers' linear
    scaling: one base for every layer, the scaling on every layer or on none fail."""
    model = gemma3(shape, 8)
    prompt = prompt_for(model, 8, PROMPT)
    raw = to_config(model, prompt)
    assert len(set(raw["model"]["pe_base"])) == 2  # the two bases, each layer its type's
    mutate(raw)
    expected = expected_of(model, prompt)
    value = traced(raw).value
    with pytest.raises(AssertionError):
        assert_matches(expected, value)
    assert largest_error(expected, value) > 1e-5


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_gemma3_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    assert_greedy_matches(gemma3(shape, 5), to_config, tmp_path, float64_gemma3)


# ---------------------------------------------------- README recipe: Gemma 3 → trace-tf


def recipes() -> dict[str, Any]:
    """The names the Gemma, Gemma 2 and Gemma 3 recipes define, run in that order."""
    scope = run_readme("From Hugging Face Gemma 2", scope=run_readme("From Hugging Face Gemma"))
    return run_readme("From Hugging Face Gemma 3", scope=scope)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    gemma2 = run_readme("From Hugging Face Gemma 2", scope=run_readme("From Hugging Face Gemma"))
    scope = assert_recipe_runs("From Hugging Face Gemma 3", "gemma3", float64_gemma3, after=gemma2)
    model = scope["model"]
    assert model.config.sliding_window < len(scope["prompt"])  # the window bites
    assert (model.model.layers[0].self_attn.q_norm.weight != 0).all()
    rope = model.config.rope_parameters  # Gemma 3 4B's: the recipe maps a real checkpoint's
    assert rope["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert rope["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_converts_any_gemma3(
    shape: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    scope = recipes()
    model = gemma3(shape, 7)
    prompt, vocab = prompt_for(model, 7, PROMPT), vocab_of(model)
    np.savez("m.npz", **scope["gemma3_arrays"](model, vocab))
    config = scope["gemma3_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert_matches(expected_of(model, prompt), decode_json("m.yaml"))


def test_the_readme_recipe_refuses_a_rope_type_gemma3_has_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RoPE type other than Gemma 3's default and linear: refused, not converted wrong."""
    monkeypatch.chdir(tmp_path)
    scope = recipes()
    model = gemma3(SHAPES[2], 0)
    model.config.rope_parameters["full_attention"] |= {"rope_type": "dynamic"}
    vocab = vocab_of(model)
    with pytest.raises(ValueError, match="RoPE is default or linear, not dynamic"):
        scope["gemma3_config"](model, vocab, vocab[:3], "m.npz")


def test_a_gemma3_config_s_own_bases_differ_by_layer_type() -> None:
    """README: Gemma3TextConfig's defaults (rope_local_base_freq, rope_theta) give its
    sliding and full layers different bases, which the recipe maps as model.pe_base's list."""
    config = Gemma3TextConfig(hidden_size=8, num_attention_heads=2, head_dim=4)
    bases = {t: p["rope_theta"] for t, p in config.rope_parameters.items()}
    assert bases == {"sliding_attention": 10000.0, "full_attention": 1000000.0}
