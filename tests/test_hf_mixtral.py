"""The engine against Hugging Face's Mixtral (transformers' MixtralForCausalLM, float64,
eval): Mistral with a sparse mixture of experts for each MLP, so the conversion is
tests/test_hf_llama.py's with `model.window`, `model.experts`, `experts_top_k` and
`experts_normalize: true`, and each layer's router and experts.

transformers 5.23's MixtralTopKRouter: router_logits = x gate.weightᵀ (no bias), a
softmax over the experts of `router_logits.float()`, torch.topk of the probabilities,
the k divided by their sum; MixtralExperts: every expert fused in `gate_up_proj`
[E, 2·ff, d] (chunk(2): the gate, then up) and `down_proj` [E, d, ff], each expert run on
its tokens only, weighted, `index_add_` in expert order. HF computes the router's softmax
in float32 whatever the dtype, beside LLaMA's three float32 computations; `float64_mixtral`
does all four in float64, so patched every hidden state, every head's attention weights,
each layer's router logits and the logits must match trace-tf to 1e-12. Every parameter
is drawn (MixtralConfig's defaults are a 47B's: every size is set here).
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
    listed,
    prompt_for,
    rotary_config,
    run_readme,
    traced,
    vocab_of,
)
from test_hf_llama import to_config
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral import modeling_mixtral

# MixtralConfig's sizes and options, each model's own (every size: its defaults are a 47B's)
SHAPES: list[dict[str, Any]] = [
    dict(
        num_hidden_layers=1,
        num_attention_heads=2,
        hidden_size=8,
        intermediate_size=6,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=12,
        num_local_experts=5,
        num_experts_per_tok=3,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
    ),
    dict(
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        hidden_size=8,
        intermediate_size=10,
        num_local_experts=3,
        num_experts_per_tok=1,
        sliding_window=3,
        tie_word_embeddings=True,
    ),
    dict(
        num_hidden_layers=1,
        num_attention_heads=1,
        hidden_size=6,
        intermediate_size=4,
        num_local_experts=2,
        num_experts_per_tok=2,
    ),
]
PROMPT = 7


def mixtral(shape: dict[str, Any], seed: int) -> MixtralForCausalLM:
    """A MixtralForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`."""
    # the experts run as modeling_mixtral writes them (the default, grouped_mm, has no float64)
    config = rotary_config(MixtralConfig, {**shape, "experts_implementation": "eager"})
    assert config.num_local_experts == shape["num_local_experts"]  # (not the 8 default)
    return draw_parameters(MixtralForCausalLM(config), seed)


def router_float64(self: Any, hidden_states: torch.Tensor) -> Any:
    """MixtralTopKRouter.forward without its cast to float32 before the softmax; also
    Qwen3MoeTopKRouter.forward (tests/test_hf_qwen3_moe.py), the same but for dividing the
    top k by their sum only if its `norm_topk_prob` (Mixtral's router always does)."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = torch.nn.functional.linear(hidden_states, self.weight)
    router_probs = torch.nn.functional.softmax(router_logits, dim=-1)
    top_value, indices = torch.topk(router_probs, self.top_k, dim=-1)
    if getattr(self, "norm_topk_prob", True):
        top_value /= top_value.sum(dim=-1, keepdim=True)
    return router_logits, top_value, indices


@contextmanager
def float64_mixtral() -> Iterator[None]:
    """LLaMA's three float32 computations in float64 (hf_common.float64_hf), and the router's."""
    with float64_hf(modeling_mixtral, "Mixtral") as mp:
        mp.setattr(modeling_mixtral.MixtralTopKRouter, "forward", router_float64)
        yield


@torch.no_grad()
def router_logits(model: Any, prompt: list[int]) -> dict[str, np.ndarray]:
    """Each sparse layer's router logits (HF's `output_router_logits`, recorded by the
    routers in layer order: a dense MLP has none), by trace-tf step."""
    out = model(torch.tensor([prompt]), output_router_logits=True)
    sparse = [l for l, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]
    pairs = zip(sparse, out.router_logits, strict=True)
    return {f"decoder.{l}.ffn.router": x.numpy() for l, x in pairs}


def outputs(model: MixtralForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    """hf_outputs (every hidden state, head and logit), and each layer's router logits."""
    return hf_outputs(model, prompt) | router_logits(model, prompt)


def mixtral_config(model: Any, prompt: list[int]) -> dict[str, Any]:
    """LLaMA's mapping, the window, and the experts (fused 3-D: cut per expert); also
    Qwen3-MoE's and OLMoE's but for QK-norm, d_ff and experts_normalize
    (test_hf_qwen3_moe.py, test_hf_olmoe.py).
    E is `num_experts` (MixtralConfig's alias of num_local_experts), ff the experts' own
    width, read off gate_up_proj (Qwen3-MoE's moe_intermediate_size)."""
    c = model.config
    raw = to_config(model, prompt)
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    # a layer without a router is a dense MLP (Qwen-MoE's mlp_only_layers), LLaMA's mapping
    experts = [
        c.num_experts if f"model.layers.{l}.mlp.gate.weight" in p else None
        for l in range(c.num_hidden_layers)
    ]
    raw["model"] |= {
        "window": getattr(c, "sliding_window", None),  # (OLMoE's config has none)
        "experts": experts if None in experts else c.num_experts,
        "experts_top_k": c.num_experts_per_tok,
        "experts_normalize": True,
    }
    for l, layer in enumerate(raw["weights"]["decoder"]):
        mlp = f"model.layers.{l}.mlp"
        if experts[l] is None:
            continue
        gate_up, down = p[f"{mlp}.experts.gate_up_proj"], p[f"{mlp}.experts.down_proj"]
        ff = down.shape[2]
        assert gate_up.shape == (c.num_experts, 2 * ff, c.hidden_size)
        layer["ffn"]["router"] = listed(p[f"{mlp}.gate.weight"].T)
        layer["ffn"]["experts"] = [
            listed({"W_1": gate_up[e, :ff].T, "W_3": gate_up[e, ff:].T, "W_2": down[e].T})
            for e in range(c.num_experts)
        ]
    return raw


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_router_and_logit_matches_mixtral(
    shape: dict[str, Any], seed: int
) -> None:
    model = mixtral(shape, seed)
    prompt = prompt_for(model, seed, PROMPT)
    with float64_mixtral():
        expected = outputs(model, prompt)
    trace = traced(mixtral_config(model, prompt))
    assert_matches(expected, trace.value)
    E, k = shape["num_local_experts"], shape["num_experts_per_tok"]
    routed = trace.value("decoder.0.ffn.routed")
    assert ((routed > 0).sum(axis=1) == k).all() and routed.shape == (PROMPT, E)


def no_renormalisation(raw: dict[str, Any]) -> None:
    raw["model"]["experts_normalize"] = False


def top_1(raw: dict[str, Any]) -> None:
    raw["model"]["experts_top_k"] = 1


def swapped_gate_and_up(raw: dict[str, Any]) -> None:
    for layer in raw["weights"]["decoder"]:
        for expert in layer["ffn"]["experts"]:
            expert["W_1"], expert["W_3"] = expert["W_3"], expert["W_1"]


@pytest.mark.parametrize("mutate", [no_renormalisation, top_1, swapped_gate_and_up])
def test_the_comparison_catches_a_wrong_variant(mutate: Callable[[dict[str, Any]], None]) -> None:
    """Without the renormalisation, with one expert per token, or with gate_up_proj's
    halves the other way round, the comparison fails."""
    model = mixtral(SHAPES[1], 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = mixtral_config(model, prompt)
    mutate(raw)
    with float64_mixtral():
        expected = outputs(model, prompt)
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(raw).value)


@pytest.mark.parametrize("shape", SHAPES[:3], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_mixtral_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    """HF's cache and trace-tf's KV cache both on: each new token routed on its own."""
    assert_greedy_matches(mixtral(shape, 5), mixtral_config, tmp_path, float64_mixtral)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's Mixtral code, after LLaMA's, as printed; then its functions on a drawn
    Mixtral with 3 of 5 experts and grouped-query attention."""
    monkeypatch.chdir(tmp_path)
    llama = run_readme("From Hugging Face LLaMA")
    scope = assert_recipe_runs(
        "From Hugging Face Mixtral", "mixtral", float64_mixtral, outputs, after=llama
    )
    written = yaml.safe_load(Path("mixtral.yaml").read_text(encoding="utf-8"))["model"]
    assert (written["experts"], written["experts_top_k"], written["window"]) == (4, 2, None)
    model = mixtral(SHAPES[1], 8)
    prompt, vocab = prompt_for(model, 8, PROMPT), vocab_of(model)  # type: ignore[arg-type]
    np.savez("m.npz", **scope["mixtral_arrays"](model, vocab))
    config = scope["mixtral_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with float64_mixtral():
        assert_matches(outputs(model, prompt), decode_json("m.yaml"))
