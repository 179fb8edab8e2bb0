"""The engine against Hugging Face's OLMoE (transformers' OlmoeForCausalLM, float64, eval):
LLaMA's pre-norm layers with OLMo 2's QK-norm over the whole projection and a sparse
mixture of experts laid out as Mixtral's, so the conversion is tests/test_hf_mixtral.py's
(LLaMA's and the experts) with `model.qk_norm: projection`, each layer's q_norm and k_norm
γ, and `experts_normalize: norm_topk_prob`.

transformers 5.23's OlmoeAttention: `q_norm(q_proj(x))`, an OlmoeRMSNorm(hidden_size)
over every head's columns at once, `k_norm(k_proj(x))` over (hidden / heads)·kv_heads,
then, if `clip_qkv`, q, k and v clamped to ±clip_qkv, the split into heads and
apply_rotary_pos_emb; OlmoeDecoderLayer: input_layernorm and post_attention_layernorm
on the sublayers' inputs (LLaMA's, not OLMo 2's places); OlmoeTopKRouter: Qwen3-MoE's
(softmax in float32, top k, divided by their sum only if `norm_topk_prob`, false by
default and in OLMoE-1B-7B); OlmoeExperts: MixtralExperts' fused layout, of
`intermediate_size`; every layer sparse; no sliding window. trace-tf has no clamp of q,
k and v, so the conversion refuses `clip_qkv` (None by default and in OLMoE-1B-7B's
config); a clamp that bites changes HF's numbers. HF's float32 norm, angles, softmax and
router softmax are done in float64: every hidden state, each head's attention weights,
each block's q_norm and k_norm output, each layer's router logits and the logits agree
to 1e-12, and greedy generate is HF's. norm_topk_prob flipped, k one less, or QK-norm
each head's on its own fail it.
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
    largest_error,
    listed,
    prompt_for,
    rotary_config,
    run_readme,
    traced,
    vocab_of,
)
from test_hf_mixtral import mixtral_config, router_float64, router_logits
from test_hf_olmo2 import olmo2_outputs
from transformers import OlmoeConfig, OlmoeForCausalLM
from transformers.models.olmoe import modeling_olmoe

# OlmoeConfig's defaults are OLMoE-1B-7B's: each is set small below, or the model is huge
BIG_DEFAULTS = {
    "vocab_size": 50304,
    "hidden_size": 2048,
    "intermediate_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "max_position_embeddings": 4096,
}

# OlmoeConfig's sizes and options, each model's own
SHAPES: list[dict[str, Any]] = [
    dict(  # norm_topk_prob off (the default, OLMoE-1B-7B's)
        num_hidden_layers=1,
        num_attention_heads=2,
        hidden_size=8,
        intermediate_size=6,
        num_experts=4,
        num_experts_per_tok=2,
    ),
    dict(  # renormalised, grouped-query
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=5,
        num_experts=5,
        num_experts_per_tok=3,
        norm_topk_prob=True,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
    ),
    dict(  # one expert per token, multi-query, biases, tied output
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        hidden_size=12,
        intermediate_size=8,
        num_experts=3,
        num_experts_per_tok=1,
        attention_bias=True,
        tie_word_embeddings=True,
    ),
]
PROMPT = 7


def olmoe(shape: dict[str, Any], seed: int) -> OlmoeForCausalLM:
    """An OlmoeForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`."""
    # the experts run as modeling_olmoe writes them (the default, grouped_mm, has no float64)
    config = rotary_config(OlmoeConfig, {**shape, "experts_implementation": "eager"})
    model = draw_parameters(OlmoeForCausalLM(config), seed)
    gammas = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    assert len(gammas) == 4 * config.num_hidden_layers + 1 and all((g != 1).all() for g in gammas)
    return model


def test_the_config_defaults_are_big_and_every_shape_sets_them_small() -> None:
    defaults = OlmoeConfig()
    assert {k: getattr(defaults, k) for k in BIG_DEFAULTS} == BIG_DEFAULTS
    assert defaults.clip_qkv is None and defaults.norm_topk_prob is False
    for shape in SHAPES:
        model = olmoe(shape, 0)
        for key, big in BIG_DEFAULTS.items():
            assert getattr(model.config, key) <= big / 2, (key, shape)


def olmoe_config(model: OlmoeForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """Mixtral's mapping (LLaMA's and the experts), QK-norm over the whole projection with
    each layer's q_norm and k_norm γ, and norm_topk_prob; clip_qkv refused."""
    c = model.config
    if c.clip_qkv is not None:
        raise ValueError(f"clip_qkv {c.clip_qkv}: trace-tf does not clamp q, k and v")
    raw = mixtral_config(model, prompt)
    raw["model"] |= {"qk_norm": "projection", "experts_normalize": c.norm_topk_prob}
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    for l, layer in enumerate(raw["weights"]["decoder"]):
        for norm in ("q_norm", "k_norm"):  # heads·head_dim, kv_heads·head_dim
            layer["self_attn"][norm] = listed(
                {"gamma": p[f"model.layers.{l}.self_attn.{norm}.weight"]}
            )
    return raw


@contextmanager
def float64_olmoe() -> Iterator[None]:
    """LLaMA's three float32 computations in float64 (hf_common.float64_hf), and the router's."""
    with float64_hf(modeling_olmoe, "Olmoe") as mp:
        mp.setattr(modeling_olmoe.OlmoeTopKRouter, "forward", router_float64)
        yield


def outputs(model: OlmoeForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    """olmo2_outputs (every hidden state, head, block's q_norm and k_norm, logit), and
    each layer's router logits."""
    return olmo2_outputs(model, prompt) | router_logits(model, prompt)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_router_and_logit_matches_olmoe(
    shape: dict[str, Any], seed: int
) -> None:
    model = olmoe(shape, seed)
    c = model.config
    prompt = prompt_for(model, seed, PROMPT)
    with float64_olmoe():
        expected = outputs(model, prompt)
    heads = c.num_hidden_layers * c.num_attention_heads
    assert len(expected) == 2 + c.num_hidden_layers + heads + 1 + 3 * c.num_hidden_layers
    trace = traced(olmoe_config(model, prompt))
    assert_matches(expected, trace.value)
    routed = trace.value("decoder.0.ffn.routed")
    assert ((routed > 0).sum(axis=1) == c.num_experts_per_tok).all()


def test_clip_qkv_is_refused_and_would_change_the_numbers() -> None:
    """A clamp that bites moves HF's values from the unclamped model's (trace-tf's) by more
    than 1e-3: the conversion refuses the config rather than give other numbers."""
    model = olmoe(SHAPES[1], 2)
    prompt = prompt_for(model, 2, PROMPT)
    value = traced(olmoe_config(model, prompt)).value
    model.config.clip_qkv = 0.5
    with pytest.raises(ValueError, match=r"clip_qkv 0\.5"):
        olmoe_config(model, prompt)
    with float64_olmoe():
        expected = outputs(model, prompt)
    shared = {k: v for k, v in expected.items() if not k.endswith(("q_norm", "k_norm"))}
    assert largest_error(shared, value) > 1e-3


def norm_topk_prob_flipped(raw: dict[str, Any]) -> None:
    raw["model"]["experts_normalize"] = not raw["model"]["experts_normalize"]


def top_k_one_less(raw: dict[str, Any]) -> None:
    raw["model"]["experts_top_k"] -= 1


def qk_norm_by_head(raw: dict[str, Any]) -> None:
    """Each head's q and k normalised on their own (Qwen3's place), γ the first head's."""
    raw["model"]["qk_norm"] = "head"
    d = raw["model"]["d_k"]
    for layer in raw["weights"]["decoder"]:
        for norm in ("q_norm", "k_norm"):
            layer["self_attn"][norm]["gamma"] = layer["self_attn"][norm]["gamma"][:d]


@pytest.mark.parametrize("shape", SHAPES[:2], ids=shape_id)
@pytest.mark.parametrize("mutate", [norm_topk_prob_flipped, top_k_one_less, qk_norm_by_head])
def test_the_comparison_catches_a_wrong_variant(
    mutate: Callable[[dict[str, Any]], None], shape: dict[str, Any]
) -> None:
    """norm_topk_prob the other way (from off, and from on), k one less, or QK-norm by
    head: the comparison fails by more than 1e-3 (over the values every variant has)."""
    model = olmoe(shape, 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = olmoe_config(model, prompt)
    mutate(raw)
    with float64_olmoe():
        expected = outputs(model, prompt)
    shared = {k: v for k, v in expected.items() if not k.endswith(("q_norm", "k_norm"))}
    assert largest_error(shared, traced(raw).value) > 1e-3


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_olmoe_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    """HF's cache and trace-tf's KV cache both on: each new token routed on its own."""
    assert_greedy_matches(olmoe(shape, 5), olmoe_config, tmp_path, float64_olmoe)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's OLMoE code, after LLaMA's, Mixtral's and Qwen3's, as printed; then its
    functions on drawn OLMoEs (renormalised or not, biases, tied output), and its
    refusal of clip_qkv."""
    monkeypatch.chdir(tmp_path)
    scope = run_readme("From Hugging Face LLaMA")
    scope = run_readme("From Hugging Face Mixtral", scope=scope)
    scope = run_readme("From Hugging Face Qwen3", scope=scope)
    scope = assert_recipe_runs(
        "From Hugging Face OLMoE", "olmoe", float64_olmoe, outputs, after=scope
    )
    written = yaml.safe_load(Path("olmoe.yaml").read_text(encoding="utf-8"))["model"]
    assert (written["experts"], written["experts_top_k"], written["qk_norm"]) == (
        4,
        2,
        "projection",
    )
    assert written["experts_normalize"] is False
    for shape in SHAPES:
        model = olmoe(shape, 8)
        prompt, vocab = prompt_for(model, 8, PROMPT), vocab_of(model)  # type: ignore[arg-type]
        np.savez("m.npz", **scope["olmoe_arrays"](model, vocab))
        config = scope["olmoe_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
        Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        with float64_olmoe():
            assert_matches(outputs(model, prompt), decode_json("m.yaml"))
    model.config.clip_qkv = 8.0
    with pytest.raises(ValueError, match=r"clip_qkv 8\.0"):
        scope["olmoe_config"](model, vocab, ["t1"], "m.npz")
