"""The engine against Hugging Face's GPT-OSS (transformers' GptOssForCausalLM, float64,
eval): LLaMA's layout (tests/test_hf_llama.py's conversion) with q/k/v/o biases, a
sink logit per head (`model.attn_sinks`), sliding-window and full layers alternating
(`model.window` a list, by `layer_types`), YaRN RoPE with `truncate: false`, and a
mixture of experts whose router has a bias (`ffn.router_bias`) and whose experts are
the clamped SwiGLU (`model.activation: swiglu_oss`).

transformers 5.23's GptOssTopKRouter: router_logits = F.linear(x, weight, bias),
torch.topk of the logits, a softmax over those k (trace-tf's softmax over the E, top k,
renormalised: the same numbers); GptOssExperts: `gate_up_proj` [E, d, 2·ff] used as
x W (not transposed), the gate its even columns (::2) and the up projection its odd
ones (1::2), `_apply_gate` (min(gate, limit), clamp(up, ±limit), gate·σ(α·gate), (up +
1)·glu), `down_proj` [E, ff, d], biases on both, `index_add_` in expert order.
GptOssRotaryEmbedding's angles and GptOssRMSNorm are float32 whatever the dtype (the
attention's softmax and the router are in the model's dtype): `float64_gpt_oss` does
both in float64, so every hidden state, every head's attention weights, each layer's
router logits and the logits must match trace-tf to 1e-12. Every parameter is drawn
(GptOssConfig's defaults are a 20B's: every size is set here).
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
    hf_outputs,
    hf_rope_init,
    listed,
    prompt_for,
    rms_norm_float64,
    rotary_config,
    run_readme,
    traced,
    vocab_of,
)
from test_hf_llama import to_config
from transformers import GptOssConfig, GptOssForCausalLM
from transformers.models.gpt_oss import modeling_gpt_oss

# GPT-OSS's own RoPE (GptOssConfig's default rope_parameters) but a context of 8
YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 8,
}
# GptOssConfig's sizes and options, each model's own (every size: its defaults are a 20B's)
SHAPES: list[dict[str, Any]] = [
    dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=4,
        hidden_size=8,
        intermediate_size=6,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=3,
        rope_theta=150000.0,
        rope_scaling=YARN,
        max_position_embeddings=256,  # factor × original, as GPT-OSS's 131072 = 32 × 4096
    ),
    dict(
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,  # (wider than hidden / heads, as GPT-OSS's 64 · 64 > 2880)
        hidden_size=8,
        intermediate_size=5,
        num_local_experts=5,
        num_experts_per_tok=3,
        sliding_window=2,
        rms_norm_eps=1e-3,
        swiglu_limit=0.8,  # (7 is never reached by unit-size values: here both clamps bite)
        swiglu_alpha=1.3,
        rope_theta=100.0,
        # a band edge between pairs 4 and 5 (4.03): truncate true would round it to 5
        rope_scaling=YARN | {"factor": 4.0, "original_max_position_embeddings": 64},
        max_position_embeddings=256,
    ),
    dict(
        num_hidden_layers=1,
        num_attention_heads=1,
        head_dim=4,
        hidden_size=6,
        intermediate_size=4,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=4,
        tie_word_embeddings=True,
        swiglu_limit=0.5,
    ),
]
PROMPT = 7


def gpt_oss(shape: dict[str, Any], seed: int) -> GptOssForCausalLM:
    """A GptOssForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`."""
    # the experts run as modeling_gpt_oss writes them (the default, grouped_mm, has no float64)
    config = rotary_config(GptOssConfig, {**shape, "experts_implementation": "eager"})
    c = config
    assert (c.num_local_experts, c.head_dim) == (shape["num_local_experts"], shape["head_dim"])
    assert c.sliding_window == shape["sliding_window"] and c.attention_bias  # (not 128; biases)
    return draw_parameters(GptOssForCausalLM(config), seed)


def rotary_float64(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> Any:
    """GptOssRotaryEmbedding.forward with its angles in float64: the default inverse
    frequencies written here, yarn's by HF's own function run in float64
    (hf_common.hf_rope_init), cos and sin of head_dim / 2 (GPT-OSS's _apply_rotary_emb
    turns each half by them, not a rotate_half of two copies), times yarn's attention
    scaling."""
    c = self.config
    if c.rope_parameters["rope_type"] == "default":
        base, d = c.rope_parameters["rope_theta"], c.head_dim
        inv_freq, scaling = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)), 1.0
    else:
        inv_freq, scaling = hf_rope_init(c)
    freqs = position_ids[..., None].double() * inv_freq
    return (freqs.cos() * scaling).to(x.dtype), (freqs.sin() * scaling).to(x.dtype)


@contextmanager
def float64_gpt_oss() -> Iterator[None]:
    """GPT-OSS's two float32 computations, its RMSNorm and its rotary angles, in float64
    (its eager attention, sinks and router already compute in the model's dtype)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modeling_gpt_oss.GptOssRMSNorm, "forward", rms_norm_float64)
        mp.setattr(modeling_gpt_oss.GptOssRotaryEmbedding, "forward", rotary_float64)
        yield


@torch.no_grad()
def outputs(model: GptOssForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    """hf_outputs (every hidden state, head and logit), and each layer's router logits."""
    values = hf_outputs(model, prompt)
    out = model(torch.tensor([prompt]), output_router_logits=True)
    assert len(out.router_logits) == model.config.num_hidden_layers
    for l, logits in enumerate(out.router_logits):
        values[f"decoder.{l}.ffn.router"] = logits.numpy()
    return values


def gpt_oss_config(model: GptOssForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """LLaMA's mapping (with its attention biases and YaRN); the sinks, the windows by
    layer type, and the experts (fused 3-D, gate and up interleaved: cut per expert)."""
    c, ff = model.config, model.config.intermediate_size
    raw = to_config(model, prompt)  # type: ignore[arg-type]
    raw["model"] |= {
        "attn_sinks": True,
        "window": [c.sliding_window if t == "sliding_attention" else None for t in c.layer_types],
        "activation": "swiglu_oss",
        "swiglu_limit": c.swiglu_limit,
        "swiglu_alpha": c.swiglu_alpha,
        "experts": c.num_local_experts,
        "experts_top_k": c.num_experts_per_tok,
        "experts_normalize": True,  # a softmax over the top-k logits: the same weights
    }
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    for l, layer in enumerate(raw["weights"]["decoder"]):
        mlp = f"model.layers.{l}.mlp"
        gate_up, down = p[f"{mlp}.experts.gate_up_proj"], p[f"{mlp}.experts.down_proj"]
        assert gate_up.shape == (c.num_local_experts, c.hidden_size, 2 * ff)
        gate_up_b, down_b = (
            p[f"{mlp}.experts.gate_up_proj_bias"],
            p[f"{mlp}.experts.down_proj_bias"],
        )
        layer["self_attn"]["sinks"] = listed(p[f"model.layers.{l}.self_attn.sinks"])
        layer["ffn"]["router"] = listed(p[f"{mlp}.router.weight"].T)
        layer["ffn"]["router_bias"] = listed(p[f"{mlp}.router.bias"])
        layer["ffn"]["experts"] = [
            listed(
                {
                    "W_1": gate_up[e][:, ::2],  # the gate: the even columns
                    "b_1": gate_up_b[e][::2],
                    "W_3": gate_up[e][:, 1::2],  # the up projection: the odd ones
                    "b_3": gate_up_b[e][1::2],
                    "W_2": down[e],  # already in × out
                    "b_2": down_b[e],
                }
            )
            for e in range(c.num_local_experts)
        ]
    return raw


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_router_and_logit_matches_gpt_oss(
    shape: dict[str, Any], seed: int
) -> None:
    model = gpt_oss(shape, seed)
    prompt = prompt_for(model, seed, PROMPT)
    with float64_gpt_oss():
        expected = outputs(model, prompt)
    c = model.config
    assert len(expected) == 2 + c.num_hidden_layers * (2 + c.num_attention_heads) + 1
    trace = traced(gpt_oss_config(model, prompt))
    assert_matches(expected, trace.value)
    E, k = shape["num_local_experts"], shape["num_experts_per_tok"]
    routed = trace.value("decoder.0.ffn.routed")
    assert ((routed > 0).sum(axis=1) == k).all() and routed.shape == (PROMPT, E)


def test_the_shapes_reach_what_they_check() -> None:
    """The windows cut (a sliding layer's row sees fewer than all its past), and in
    SHAPES[1] both clamps bite: a wrong limit or clamp could not pass unseen."""
    model = gpt_oss(SHAPES[1], 0)
    trace = traced(gpt_oss_config(model, prompt_for(model, 0, PROMPT)))
    assert np.isinf(trace.value("decoder.0.self_attn.mask")).sum() > PROMPT * (PROMPT - 1) // 2
    assert np.isinf(trace.value("decoder.mask")).sum() == PROMPT * (PROMPT - 1) // 2  # full
    gates = [trace.value(p) for p in trace.paths() if p.endswith(".hidden")]
    ups = [trace.value(p) for p in trace.paths() if p.endswith(".up")]
    assert any((g > 0.8).any() for g in gates) and any((np.abs(u) > 0.8).any() for u in ups)


def no_sinks(raw: dict[str, Any]) -> None:
    raw["model"]["attn_sinks"] = False
    for layer in raw["weights"]["decoder"]:
        del layer["self_attn"]["sinks"]


def no_router_bias(raw: dict[str, Any]) -> None:
    for layer in raw["weights"]["decoder"]:
        del layer["ffn"]["router_bias"]


def plain_swiglu(raw: dict[str, Any]) -> None:
    raw["model"]["activation"] = "swiglu"
    del raw["model"]["swiglu_limit"], raw["model"]["swiglu_alpha"]


def gate_and_up_halves(model: GptOssForCausalLM) -> Callable[[dict[str, Any]], None]:
    """gate_up_proj cut in halves (Mixtral's chunk(2)) instead of interleaved."""

    def mutate(raw: dict[str, Any]) -> None:
        ff = model.config.intermediate_size
        for l, layer in enumerate(raw["weights"]["decoder"]):
            mlp = f"model.layers.{l}.mlp.experts"
            gate_up = model.state_dict()[f"{mlp}.gate_up_proj"].numpy()
            b = model.state_dict()[f"{mlp}.gate_up_proj_bias"].numpy()
            for e, expert in enumerate(layer["ffn"]["experts"]):
                expert |= listed({"W_1": gate_up[e][:, :ff], "W_3": gate_up[e][:, ff:]})
                expert |= listed({"b_1": b[e][:ff], "b_3": b[e][ff:]})

    return mutate


def windows_swapped(raw: dict[str, Any]) -> None:
    """The window on the full layers and none on the sliding ones."""
    W = next(w for w in raw["model"]["window"] if w is not None)
    raw["model"]["window"] = [W if w is None else None for w in raw["model"]["window"]]


def no_yarn(raw: dict[str, Any]) -> None:
    raw["model"]["rope_scaling"] = None


def yarn_truncated(raw: dict[str, Any]) -> None:
    raw["model"]["rope_scaling"]["truncate"] = True


@pytest.mark.parametrize(
    "mutate",
    [no_sinks, no_router_bias, plain_swiglu, "halves", windows_swapped, no_yarn, yarn_truncated],
    ids=lambda m: m if isinstance(m, str) else m.__name__,
)
def test_the_comparison_catches_a_wrong_variant(mutate: Any) -> None:
    """Without the sinks, without the router's bias, with the plain SwiGLU, with
    gate_up_proj's halves for gate and up (not its interleaved columns), with the sliding
    and full layers the other way round, without YaRN or with YaRN's band edges rounded
    (truncate: true, not GPT-OSS's false), the comparison fails."""
    model = gpt_oss(SHAPES[1], 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = gpt_oss_config(model, prompt)
    (gate_and_up_halves(model) if mutate == "halves" else mutate)(raw)
    with float64_gpt_oss():
        expected = outputs(model, prompt)
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(raw).value)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_gpt_oss_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    """HF's cache and trace-tf's KV cache both on: each new token routed on its own, the
    sliding layers' window over the cached keys."""
    assert_greedy_matches(gpt_oss(shape, 5), gpt_oss_config, tmp_path, float64_gpt_oss)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's GPT-OSS code, after LLaMA's, as printed; then its functions on a drawn
    GPT-OSS with 3 of 5 experts, clamps that bite and three layers."""
    monkeypatch.chdir(tmp_path)
    llama = run_readme("From Hugging Face LLaMA")
    scope = assert_recipe_runs(
        "From Hugging Face GPT-OSS", "gpt_oss", float64_gpt_oss, outputs, after=llama
    )
    written = yaml.safe_load(Path("gpt_oss.yaml").read_text(encoding="utf-8"))["model"]
    assert (written["experts"], written["experts_top_k"]) == (4, 2)
    assert written["activation"] == "swiglu_oss" and written["attn_sinks"] is True
    assert (
        written["rope_scaling"]["type"] == "yarn" and written["rope_scaling"]["truncate"] is False
    )
    model = gpt_oss(SHAPES[1], 8)
    prompt, vocab = prompt_for(model, 8, PROMPT), vocab_of(model)  # type: ignore[arg-type]
    np.savez("m.npz", **scope["gpt_oss_arrays"](model, vocab))
    config = scope["gpt_oss_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with float64_gpt_oss():
        assert_matches(outputs(model, prompt), decode_json("m.yaml"))
