"""The engine against Hugging Face's Qwen3 (transformers' Qwen3ForCausalLM, float64, eval):
LLaMA plus QK-norm, so the conversion is tests/test_hf_llama.py's with `model.qk_norm:
head` and each layer's q_norm and k_norm γ.

transformers 5.23's Qwen3Attention: `q_norm(q_proj(x).view(..., head_dim))`, a
Qwen3RMSNorm(head_dim) of each head's query, and `k_norm` likewise of each K/V head's
key, eps = rms_norm_eps, before apply_rotary_pos_emb; one γ of head_dim per layer, shared
by its heads. Every parameter is drawn (q_norm and k_norm γ near 1, not 1), HF's float32
norm (the q_norm and k_norm are Qwen3RMSNorms too), angles and softmax are done in float64
(hf_common.float64_hf): every hidden state, each head's attention weights, each head's
normalised q and k (hooked on q_norm and k_norm) and the logits agree to 1e-12. The
comparison fails for a Qwen3 that normalises after RoPE, over the whole projection (all
heads at once, OLMo 2's place) or not at all.

Its sliding window (`use_sliding_window`, off in Qwen3's checkpoints): Qwen3Config sets
`sliding_window` to None unless use_sliding_window, and derives `layer_types` (unless
given) as "sliding_attention" for the layers i >= max_window_layers when there is a
window, "full_attention" for the others; Qwen3Attention's layer of type
"sliding_attention" gets masking_utils' sliding-window mask, `kv_idx > q_idx −
sliding_window` and causal, query i seeing the keys i − W < j <= i: trace-tf's
`model.window` rule, given as a list by layer (`windows`, the mapping from layer_types).
The SLIDING models' windows are shorter than the prompt, with full and sliding layers
mixed; every layer windowed, none, or one key too many fail the comparison.
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
    prompt_for,
    rotary_config,
    run_readme,
    traced,
    vocab_of,
)
from test_hf_llama import to_config
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3 import modeling_qwen3

# Qwen3Config's sizes and options, each model's own (head_dim given: Qwen3's default is 128)
SHAPES: list[dict[str, Any]] = [
    dict(num_hidden_layers=1, num_attention_heads=2, hidden_size=8, head_dim=4),
    dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=20,
        head_dim=6,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
    ),
    dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        hidden_size=12,
        head_dim=4,
        attention_bias=True,
        tie_word_embeddings=True,
    ),
]
# with use_sliding_window: windows below the prompt's 6 tokens, full and sliding layers
# mixed, by max_window_layers (layers from it on slide) or by layer_types given
SLIDING: list[dict[str, Any]] = [
    dict(
        num_hidden_layers=2,
        num_attention_heads=2,
        hidden_size=8,
        head_dim=4,
        use_sliding_window=True,
        sliding_window=2,
        max_window_layers=1,
    ),
    dict(
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=20,
        head_dim=6,
        use_sliding_window=True,
        sliding_window=3,
        max_window_layers=1,
        rope_theta=100.0,
    ),
    dict(
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        hidden_size=12,
        head_dim=4,
        use_sliding_window=True,
        sliding_window=2,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        attention_bias=True,
        tie_word_embeddings=True,
    ),
]
PROMPT = 6


def qwen3(shape: dict[str, Any], seed: int) -> Qwen3ForCausalLM:
    """A Qwen3ForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`."""
    config = rotary_config(Qwen3Config, shape)
    model = draw_parameters(Qwen3ForCausalLM(config), seed)
    gammas = [
        p for n, p in model.named_parameters() if n.endswith(("q_norm.weight", "k_norm.weight"))
    ]
    assert len(gammas) == 2 * config.num_hidden_layers and all((g != 1).all() for g in gammas)
    return model


def float64_qwen3() -> Any:
    return float64_hf(modeling_qwen3, "Qwen3")


def windows(config: Any) -> list[int | None] | None:
    """model.window by layer from a Qwen2 or Qwen3 config: `sliding_window` for a layer of
    type "sliding_attention", None (full) for the others; None if no layer slides."""
    by_layer = [
        config.sliding_window if kind == "sliding_attention" else None
        for kind in config.layer_types
    ]
    return by_layer if any(w is not None for w in by_layer) else None


def with_qk_norm(raw: dict[str, Any], model: Any) -> dict[str, Any]:
    """`raw` with QK-norm on and each layer's q_norm and k_norm γ (Qwen3's, Qwen3-MoE's)."""
    raw["model"]["qk_norm"] = "head"
    p = model.state_dict()
    for l, layer in enumerate(raw["weights"]["decoder"]):
        for norm in ("q_norm", "k_norm"):
            gamma = p[f"model.layers.{l}.self_attn.{norm}.weight"].numpy().tolist()
            layer["self_attn"][norm] = {"gamma": gamma}
    return raw


def qwen3_config(model: Qwen3ForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """LLaMA's mapping, QK-norm on, each layer's q_norm and k_norm γ, and its window."""
    raw = with_qk_norm(to_config(model, prompt), model)  # type: ignore[arg-type]
    raw["model"]["window"] = windows(model.config)
    return raw


def _keep(seen: dict[str, torch.Tensor], key: str) -> Callable[..., None]:
    """A forward hook keeping its module's first output under `key` (returning None, so
    the output goes on unchanged)."""

    def hook(_module: Any, _args: Any, out: torch.Tensor) -> None:
        seen.setdefault(key, out[0])

    return hook


@torch.no_grad()
def qwen3_outputs(model: Qwen3ForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    """hf_outputs, and each head's q and k as q_norm and k_norm put out (before RoPE):
    `q_norm` of query head h, `k_norm` of its K/V head h // group."""
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
    c = model.config
    group = c.num_attention_heads // c.num_key_value_heads
    for l in range(c.num_hidden_layers):
        for h in range(c.num_attention_heads):
            base = f"decoder.{l}.self_attn.h{h}"
            values[f"{base}.q_norm"] = seen[f"{l}.q_norm"][:, h].numpy()  # [L, H, d] -> [L, d]
            values[f"{base}.k_norm"] = seen[f"{l}.k_norm"][:, h // group].numpy()
    return values


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_qwen3(shape: dict[str, Any], seed: int) -> None:
    model = qwen3(shape, seed)
    prompt = prompt_for(model, seed, PROMPT)
    with float64_qwen3():
        expected = qwen3_outputs(model, prompt)
    c = model.config
    heads = c.num_hidden_layers * c.num_attention_heads
    assert len(expected) == 2 + c.num_hidden_layers + heads * 3 + 1  # softmax, q_norm, k_norm
    assert_matches(expected, traced(qwen3_config(model, prompt)).value)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SLIDING, ids=shape_id)
def test_sliding_window_layers_match_qwen3(shape: dict[str, Any], seed: int) -> None:
    """Full and sliding layers mixed, the windows shorter than the prompt: every value as
    HF's, and HF's own weights 0 exactly beyond each sliding layer's window (so the
    window bites) and nowhere else below the diagonal of a full layer."""
    model = qwen3(shape, seed)
    c = model.config
    prompt = prompt_for(model, seed, PROMPT)
    with float64_qwen3():
        expected = qwen3_outputs(model, prompt)
    kinds = set(c.layer_types)
    assert kinds == {"sliding_attention", "full_attention"} and c.sliding_window < PROMPT
    i, j = np.indices((PROMPT, PROMPT))
    for l, kind in enumerate(c.layer_types):
        outside = j <= i - c.sliding_window if kind == "sliding_attention" else np.zeros_like(i > 0)
        for h in range(c.num_attention_heads):
            weights = expected[f"decoder.{l}.self_attn.h{h}.softmax"]
            assert (weights[outside | (j > i)] == 0).all()
            assert (weights[~outside & (j <= i)] > 0).all()
    raw = qwen3_config(model, prompt)
    assert raw["model"]["window"] == [
        c.sliding_window if kind == "sliding_attention" else None for kind in c.layer_types
    ]
    assert_matches(expected, traced(raw).value)


def test_qwen3_slides_the_layers_from_max_window_layers_on() -> None:
    """Qwen3Config's rule as the docstring states it: without use_sliding_window no layer
    slides (sliding_window set to None); with it, the layers i >= max_window_layers."""
    sizes = dict(num_hidden_layers=4, hidden_size=8, num_attention_heads=2, head_dim=4)
    off = Qwen3Config(**sizes, sliding_window=3, max_window_layers=1)
    assert off.sliding_window is None and set(off.layer_types) == {"full_attention"}
    assert windows(off) is None
    on = Qwen3Config(**sizes, use_sliding_window=True, sliding_window=3, max_window_layers=1)
    assert windows(on) == [None, 3, 3, 3]


def every_layer_windowed(raw: dict[str, Any]) -> None:
    raw["model"]["window"] = max(w for w in raw["model"]["window"] if w is not None)


def no_layer_windowed(raw: dict[str, Any]) -> None:
    raw["model"]["window"] = None


def windows_one_wider(raw: dict[str, Any]) -> None:
    """i − W <= j: one key too many on every sliding layer."""
    raw["model"]["window"] = [None if w is None else w + 1 for w in raw["model"]["window"]]


def windows_reversed(raw: dict[str, Any]) -> None:
    """The layers' windows in the opposite order (the wrong layers sliding)."""
    raw["model"]["window"] = raw["model"]["window"][::-1]


@pytest.mark.parametrize(
    "mutate", [every_layer_windowed, no_layer_windowed, windows_one_wider, windows_reversed]
)
def test_the_comparison_catches_a_wrong_window(mutate: Callable[[dict[str, Any]], None]) -> None:
    """Every layer windowed, none, one key too many, or the wrong layers sliding each
    make the comparison fail (layer types full, sliding, sliding: reversed is sliding,
    sliding, full)."""
    model = qwen3(SLIDING[1], 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = qwen3_config(model, prompt)
    assert raw["model"]["window"] == [None, 3, 3]
    mutate(raw)
    with float64_qwen3():
        expected = qwen3_outputs(model, prompt)
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(raw).value)


# ---------------------------------------------- wrong variants: each fails the comparison


def rms(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """x / √(mean(x²) + ε) · γ over the last axis, in float64."""
    return gamma * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def attention_as(variant: str) -> Callable[..., Any]:
    """Qwen3Attention.forward with QK-norm `variant`: `qwen3` as HF's (the control),
    `after_rope` (the norm after the rotation), `whole` (the rms over every head's entries
    at once, each head's γ the same, OLMo 2's place), `none` (no QK-norm)."""

    def forward(
        self: Any,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q, k = self.q_proj(hidden_states).view(shape), self.k_proj(hidden_states).view(shape)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        eps = self.q_norm.variance_epsilon
        if variant == "qwen3":
            q, k = rms(q, self.q_norm.weight, eps), rms(k, self.k_norm.weight, eps)
        elif variant == "whole":  # [B, L, H, d]: one rms over H·d
            q = rms(q.flatten(-2), self.q_norm.weight.repeat(q.shape[-2]), eps).view(q.shape)
            k = rms(k.flatten(-2), self.k_norm.weight.repeat(k.shape[-2]), eps).view(k.shape)
        q, k = modeling_qwen3.apply_rotary_pos_emb(
            q.transpose(1, 2), k.transpose(1, 2), *position_embeddings
        )
        if variant == "after_rope":
            q, k = rms(q, self.q_norm.weight, eps), rms(k, self.k_norm.weight, eps)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        out, weights = eager_float64(self, q, k, v, attention_mask, self.scaling)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1)), weights

    return forward


@contextmanager
def variant_qwen3(variant: str) -> Iterator[None]:
    with float64_qwen3() as mp:
        mp.setattr(modeling_qwen3.Qwen3Attention, "forward", attention_as(variant))
        yield


@pytest.mark.parametrize("variant", ["qwen3", "after_rope", "whole", "none"])
def test_the_comparison_catches_a_wrong_qk_norm(variant: str) -> None:
    """Against a Qwen3 whose attention normalises otherwise, trace-tf's numbers (Qwen3's
    QK-norm) fail; the control, the same forward written as HF's, passes, so the failures
    are the variants'. A trace-tf config without QK-norm fails against HF's own too."""
    model = qwen3(SHAPES[1], 3)
    prompt = prompt_for(model, 3, PROMPT)
    value = traced(qwen3_config(model, prompt)).value
    with variant_qwen3(variant):
        expected = hf_outputs(model, prompt)  # type: ignore[arg-type]
    if variant == "qwen3":
        assert_matches(expected, value)
        raw = qwen3_config(model, prompt)
        raw["model"]["qk_norm"] = "none"
        for layer in raw["weights"]["decoder"]:
            del layer["self_attn"]["q_norm"], layer["self_attn"]["k_norm"]
        with pytest.raises(AssertionError):
            assert_matches(expected, traced(raw).value)
        return
    with pytest.raises(AssertionError):
        assert_matches(expected, value)


# ------------------------------------------------------------ generate --greedy


@pytest.mark.parametrize("shape", SHAPES[1:] + SLIDING, ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_qwen3_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    """HF's cache and trace-tf's KV cache (its K normalised and turned) both on; with
    sliding layers, 4 prompt tokens and 8 new ones run past the windows, HF's sliding
    cache layers dropping the keys trace-tf's cache masks."""
    assert_greedy_matches(qwen3(shape, 5), qwen3_config, tmp_path, float64_qwen3)


# ------------------------------------------------------ README recipe: Qwen3 → trace-tf


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's Qwen3 code, after LLaMA's, as printed (its γ drawn, not HF's ones; layer 1
    sliding, its window shorter than the prompt)."""
    monkeypatch.chdir(tmp_path)
    llama = run_readme("From Hugging Face LLaMA")
    scope = assert_recipe_runs("From Hugging Face Qwen3", "qwen3", float64_qwen3, after=llama)
    assert (scope["model"].model.layers[0].self_attn.q_norm.weight != 1).all()
    window = yaml.safe_load(Path("qwen3.yaml").read_text(encoding="utf-8"))["model"]["window"]
    assert window == [None, 3] and len(scope["prompt"]) > 3


@pytest.mark.parametrize("shape", [SHAPES[2], *SLIDING], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_converts_any_qwen3(
    shape: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe's qwen3_arrays and qwen3_config on other Qwen3s: multi-query attention,
    biases and tied output; sliding layers by max_window_layers and by layer_types."""
    monkeypatch.chdir(tmp_path)
    scope = run_readme("From Hugging Face Qwen3", scope=run_readme("From Hugging Face LLaMA"))
    model = qwen3(shape, 8)
    prompt, vocab = prompt_for(model, 8, PROMPT), vocab_of(model)  # type: ignore[arg-type]
    np.savez("m.npz", **scope["qwen3_arrays"](model, vocab))
    config = scope["qwen3_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    assert config["model"]["window"] == windows(model.config)
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with float64_qwen3():
        assert_matches(qwen3_outputs(model, prompt), decode_json("m.yaml"))
