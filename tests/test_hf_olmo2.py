"""The engine against Hugging Face's OLMo 2 (transformers' Olmo2ForCausalLM, float64, eval):
LLaMA with its norms moved to the sublayers' outputs and QK-norm over the whole projection,
so the config is LLaMA's with `model.norm_position: output` and `model.qk_norm: projection`.

transformers 5.23's Olmo2DecoderLayer: `x + post_attention_layernorm(self_attn(x))`, then
`x + post_feedforward_layernorm(mlp(x))`, no norm on a sublayer's input, `model.norm` at
the end; Olmo2Attention: `q_norm(q_proj(x))`, an Olmo2RMSNorm(heads·head_dim) over every
head's columns at once, `k_norm(k_proj(x))` over kv_heads·head_dim, then the split into
heads and apply_rotary_pos_emb. Every parameter is drawn (every γ not 1), HF's float32
norm, angles and softmax are done in float64 (hf_common.float64_hf): every hidden state,
each head's attention weights, each block's q_norm and k_norm output and the logits agree
to 1e-12, and greedy generate is HF's. The comparison fails for an OLMo 2 normalising each
sublayer's input instead of its output, or each head's q and k on their own.
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
    eager_float64,
    float64_hf,
    hf_outputs,
    listed,
    prompt_for,
    rotary_config,
    run_readme,
    traced,
    vocab_of,
)
from test_hf_llama import GATED, head_dim
from transformers import Olmo2Config, Olmo2ForCausalLM
from transformers.models.olmo2 import modeling_olmo2

# Olmo2Config's defaults are OLMo 2 7B's: each is set small below, or the model is huge
BIG_DEFAULTS = {
    "vocab_size": 50304,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
}

# Olmo2Config's sizes and options, each model's own
SHAPES: list[dict[str, Any]] = [
    dict(num_hidden_layers=1, num_attention_heads=2, hidden_size=8),
    dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=20,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
    ),
    dict(
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        hidden_size=12,
        attention_bias=True,
        tie_word_embeddings=True,
    ),
]
PROMPT = 6


def test_the_config_defaults_are_big_and_every_shape_sets_them_small() -> None:
    defaults = Olmo2Config()
    assert {k: getattr(defaults, k) for k in BIG_DEFAULTS} == BIG_DEFAULTS
    for shape in SHAPES:
        model = olmo2(shape, 0)
        for key, big in BIG_DEFAULTS.items():
            assert getattr(model.config, key) <= big / 8, (key, shape)


def olmo2(shape: dict[str, Any], seed: int) -> Olmo2ForCausalLM:
    """An Olmo2ForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`."""
    config = rotary_config(Olmo2Config, shape)
    model = draw_parameters(Olmo2ForCausalLM(config), seed)
    gammas = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    assert len(gammas) == 4 * config.num_hidden_layers + 1 and all((g != 1).all() for g in gammas)
    return model


def float64_olmo2() -> Any:
    return float64_hf(modeling_olmo2, "Olmo2")


def olmo2_config(model: Olmo2ForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """README's mapping, as nested config data in the fused form: LLaMA's, but each
    sublayer's one norm (post_attention_layernorm, post_feedforward_layernorm) is its
    `norm`, on its output, and q_norm, k_norm are the whole projection's γ."""
    c = model.config
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    vocab = vocab_of(model)
    layers = []
    for l in range(c.num_hidden_layers):
        m = f"model.layers.{l}"
        a, f = f"{m}.self_attn", f"{m}.mlp"
        attn: dict[str, Any] = {
            "W_q": p[f"{a}.q_proj.weight"].T,
            "W_k": p[f"{a}.k_proj.weight"].T,
            "W_v": p[f"{a}.v_proj.weight"].T,
            "W_o": p[f"{a}.o_proj.weight"].T,
            "q_norm": {"gamma": p[f"{a}.q_norm.weight"]},  # heads·head_dim
            "k_norm": {"gamma": p[f"{a}.k_norm.weight"]},  # kv_heads·head_dim
            "norm": {"gamma": p[f"{m}.post_attention_layernorm.weight"]},
        }
        if c.attention_bias:
            attn |= {f"b_{x}": p[f"{a}.{x}_proj.bias"] for x in "qkvo"}
        ffn = {
            "W_1": p[f"{f}.gate_proj.weight"].T,
            "W_3": p[f"{f}.up_proj.weight"].T,
            "W_2": p[f"{f}.down_proj.weight"].T,
            "norm": {"gamma": p[f"{m}.post_feedforward_layernorm.weight"]},
        }
        layers.append({"self_attn": attn, "ffn": ffn})
    weights: dict[str, Any] = {
        "decoder": layers,
        "decoder_final_norm": {"gamma": p["model.norm.weight"]},
    }
    if not c.tie_word_embeddings:
        weights["output"] = {"W": p["lm_head.weight"].T}
    d = head_dim(model)  # type: ignore[arg-type]
    raw = {
        "model": {
            "d_model": c.hidden_size,
            "n_heads": c.num_attention_heads,
            "n_kv_heads": c.num_key_value_heads,
            "d_k": d,
            "d_v": d,
            "d_ff": c.intermediate_size,
            "encoder_layers": 0,
            "decoder_layers": c.num_hidden_layers,
            "positional": "rope",
            "rope_pairs": "halves",
            "pe_base": float(c.rope_parameters["rope_theta"]),
            "max_len": c.max_position_embeddings,
            "norm_position": "output",
            "norm": "rms",
            "norm_eps": c.rms_norm_eps,
            "qk_norm": "projection",
            "activation": GATED[c.hidden_act],
            "tie_embeddings": bool(c.tie_word_embeddings),
        },
        "vocab": vocab,
        "embeddings": {t: p["model.embed_tokens.weight"][i] for i, t in enumerate(vocab)},
        "target": [vocab[i] for i in prompt],
        "weights": weights,
    }
    return dict(listed(raw))


def _keep(seen: dict[str, torch.Tensor], key: str) -> Callable[..., None]:
    """A forward hook keeping its module's first output under `key`."""

    def hook(_module: Any, _args: Any, out: torch.Tensor) -> None:
        seen.setdefault(key, out[0])

    return hook


@torch.no_grad()
def olmo2_outputs(model: Olmo2ForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    """hf_outputs, and each layer's q_norm and k_norm output (before the split into heads
    and RoPE), trace-tf's block steps `self_attn.q_norm`, `self_attn.k_norm`."""
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for l, layer in enumerate(model.model.layers):
        for norm in ("q_norm", "k_norm"):
            module = getattr(layer.self_attn, norm)
            hooks.append(module.register_forward_hook(_keep(seen, f"{l}.{norm}")))
    try:
        values = hf_outputs(model, prompt)  # type: ignore[arg-type]
    finally:
        for hook in hooks:
            hook.remove()
    for l in range(model.config.num_hidden_layers):
        for norm in ("q_norm", "k_norm"):
            values[f"decoder.{l}.self_attn.{norm}"] = seen[f"{l}.{norm}"].numpy()  # [L, n·d]
    return values


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_olmo2(shape: dict[str, Any], seed: int) -> None:
    model = olmo2(shape, seed)
    prompt = prompt_for(model, seed, PROMPT)
    with float64_olmo2():
        expected = olmo2_outputs(model, prompt)
    c = model.config
    heads = c.num_hidden_layers * c.num_attention_heads
    assert len(expected) == 2 + c.num_hidden_layers + heads + 2 * c.num_hidden_layers + 1
    assert_matches(expected, traced(olmo2_config(model, prompt)).value)


# ---------------------------------------------- wrong variants: each fails the comparison


def rms(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """x / √(mean(x²) + ε) · γ over the last axis, in float64."""
    return gamma * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def attention_as(variant: str) -> Callable[..., Any]:
    """Olmo2Attention.forward with QK-norm `variant`: `olmo2` as HF's, the whole projection
    (the control), or `head`, each head's d entries on their own (Qwen3's axis, the same γ
    column by column)."""

    def forward(
        self: Any,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q, k = self.q_proj(hidden_states), self.k_proj(hidden_states)
        eps = self.q_norm.variance_epsilon
        if variant == "olmo2":
            q, k = rms(q, self.q_norm.weight, eps), rms(k, self.k_norm.weight, eps)
        else:  # per head: [B, L, n, d], γ reshaped alike
            q = rms(q.view(shape), self.q_norm.weight.view(-1, self.head_dim), eps)
            k = rms(k.view(shape), self.k_norm.weight.view(-1, self.head_dim), eps)
        q, k = q.reshape(shape).transpose(1, 2), k.reshape(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        q, k = modeling_olmo2.apply_rotary_pos_emb(q, k, *position_embeddings)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        out, weights = eager_float64(self, q, k, v, attention_mask, self.scaling)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1)), weights

    return forward


def layer_normalising_inputs(
    self: Any,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    past_key_values: Any = None,
    use_cache: bool | None = False,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Olmo2DecoderLayer.forward with each norm on its sublayer's input (pre-norm, LLaMA's
    place) instead of its output: the wrong variant."""
    h, _ = self.self_attn(
        hidden_states=self.post_attention_layernorm(hidden_states),
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    hidden_states = hidden_states + h
    return hidden_states + self.mlp(self.post_feedforward_layernorm(hidden_states))


@contextmanager
def variant_olmo2(variant: str) -> Iterator[None]:
    with float64_olmo2() as mp:
        if variant == "input_norm":
            mp.setattr(modeling_olmo2.Olmo2DecoderLayer, "forward", layer_normalising_inputs)
        else:
            mp.setattr(modeling_olmo2.Olmo2Attention, "forward", attention_as(variant))
        yield


@pytest.mark.parametrize("variant", ["olmo2", "head", "input_norm"])
def test_the_comparison_catches_a_wrong_norm(variant: str) -> None:
    """Against an OLMo 2 that normalises each head's q and k on their own, or each
    sublayer's input, trace-tf's numbers (OLMo 2's) fail; the control, the forward written
    as HF's, passes. A trace-tf config with pre-norm, or head-wise QK-norm, fails against
    HF's own too."""
    model = olmo2(SHAPES[1], 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = olmo2_config(model, prompt)
    value = traced(raw).value
    with variant_olmo2(variant):
        expected = hf_outputs(model, prompt)  # type: ignore[arg-type]
    if variant != "olmo2":
        with pytest.raises(AssertionError):
            assert_matches(expected, value)
        return
    assert_matches(expected, value)
    pre = {**raw, "model": {**raw["model"], "norm_position": "pre"}}
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(pre).value)
    head = {**raw, "model": {**raw["model"], "qk_norm": "head"}}  # γ of d_k: the first d_k
    dk = raw["model"]["d_k"]
    for layer in head["weights"]["decoder"]:
        for norm in ("q_norm", "k_norm"):
            layer["self_attn"][norm] = {"gamma": layer["self_attn"][norm]["gamma"][:dk]}
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(head).value)


# ------------------------------------------------------------ generate --greedy


@pytest.mark.parametrize("shape", SHAPES[1:], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_olmo2_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    """HF's cache and trace-tf's KV cache (its K normalised over the whole projection and
    turned, row by row) both on."""
    assert_greedy_matches(olmo2(shape, 5), olmo2_config, tmp_path, float64_olmo2)


# ------------------------------------------------------ README recipe: OLMo 2 → trace-tf


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's OLMo 2 code, after LLaMA's, as printed (its γ drawn, not HF's ones); then
    its functions on a drawn OLMo 2 with multi-query attention, biases and tied output."""
    monkeypatch.chdir(tmp_path)
    llama = run_readme("From Hugging Face LLaMA")
    scope = assert_recipe_runs(
        "From Hugging Face OLMo 2", "olmo2", float64_olmo2, olmo2_outputs, after=llama
    )
    layer = scope["model"].model.layers[0]
    assert (layer.self_attn.q_norm.weight != 1).all()
    assert (layer.post_feedforward_layernorm.weight != 1).all()
    model = olmo2(SHAPES[2], 8)
    prompt, vocab = prompt_for(model, 8, PROMPT), vocab_of(model)  # type: ignore[arg-type]
    np.savez("m.npz", **scope["olmo2_arrays"](model, vocab))
    config = scope["olmo2_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with float64_olmo2():
        assert_matches(olmo2_outputs(model, prompt), decode_json("m.yaml"))
