"""The engine against Hugging Face's Qwen2-MoE (transformers' Qwen2MoeForCausalLM, float64,
eval; Qwen1.5-MoE-A2.7B's and Qwen2-57B-A14B's architecture): Qwen2's attention (q, k, v
biases: `qkv_bias`, default true) with a sparse mixture of experts and a gated shared
expert for each MLP, so the conversion is tests/test_hf_qwen2.py's (LLaMA's, the biases,
the windows by layer) with tests/test_hf_mixtral.py's router and fused experts, and the
shared expert.

transformers 5.23's Qwen2MoeTopKRouter: router_logits = x gate.weightᵀ (no bias), a
softmax over the experts in float32, torch.topk of the probabilities, divided by their
sum only if `norm_topk_prob` (False by default); Qwen2MoeExperts: MixtralExperts'
layout, of `moe_intermediate_size`. Qwen2MoeSparseMoeBlock adds
σ(shared_expert_gate(x)) · shared_expert(x), the shared expert a SwiGLU MLP of
`shared_expert_intermediate_size` (5632 by default, four times the experts' 1408) and
the gate a Linear(hidden, 1) without a bias: `model.shared_expert: gated`,
`shared_expert_d_ff`, `ffn.shared` and `ffn.shared_gate` (the gate's weight
transposed). A layer l gets the sparse block unless l is in `mlp_only_layers` or
(l + 1) % `decoder_sparse_step` != 0 (or num_experts is 0); the others a dense
Qwen2MoeMLP of `intermediate_size` and no shared expert: `model.experts` a list, None
for each dense layer, converted where intermediate_size is moe_intermediate_size
(trace-tf has one d_ff) and refused otherwise. HF's float32 norm, angles, softmax and
router softmax are done in float64: every hidden state, each head's attention weights,
each sparse layer's router logits and the logits agree to 1e-12, `generate --greedy`
with `generate(do_sample=False)`. Every parameter is drawn (Qwen2MoeConfig's defaults
are a 14B's: every size is set here). No shared expert, its gate left out, the dense
layers in the wrong places, or norm_topk_prob flipped each fail it.
"""

from __future__ import annotations

import re
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
    listed,
    prompt_for,
    rotary_config,
    run_readme,
    traced,
    vocab_of,
)
from test_hf_llama import to_config as llama_to_config
from test_hf_mixtral import router_float64, router_logits
from test_hf_qwen2 import PROJECTIONS
from test_hf_qwen3 import windows
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
from transformers.models.qwen2_moe import modeling_qwen2_moe

# Qwen2MoeConfig's defaults (Qwen1.5-MoE-A2.7B's): each is set small below, or the model is huge
BIG_DEFAULTS = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "max_position_embeddings": 32768,
}

# Qwen2MoeConfig's sizes and options, each model's own
SHAPES: list[dict[str, Any]] = [
    dict(  # every layer sparse, norm_topk_prob off (the default), the shared expert wider
        num_hidden_layers=1,
        num_attention_heads=2,
        hidden_size=8,
        moe_intermediate_size=4,
        shared_expert_intermediate_size=10,
        num_experts=4,
        num_experts_per_tok=2,
    ),
    dict(  # decoder_sparse_step 2: layers 0 and 2 dense; renormalised, grouped-query
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=5,
        moe_intermediate_size=5,
        shared_expert_intermediate_size=7,
        num_experts=5,
        num_experts_per_tok=3,
        norm_topk_prob=True,
        decoder_sparse_step=2,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
    ),
    dict(  # mlp_only_layers [1]; one expert per token, multi-query, tied, layer 0 slides
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        hidden_size=8,
        intermediate_size=6,
        moe_intermediate_size=6,
        shared_expert_intermediate_size=4,
        num_experts=3,
        num_experts_per_tok=1,
        mlp_only_layers=[1],
        tie_word_embeddings=True,
        use_sliding_window=True,
        sliding_window=3,
        max_window_layers=1,
    ),
]
PROMPT = 7


def qwen2_moe(shape: dict[str, Any], seed: int) -> Qwen2MoeForCausalLM:
    """A Qwen2MoeForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`:
    q, k and v's biases and the shared expert's gate among them."""
    # the experts run as modeling_qwen2_moe writes them (the default, grouped_mm, has no float64)
    shape = {"intermediate_size": shape["moe_intermediate_size"], **shape}
    config = rotary_config(Qwen2MoeConfig, {**shape, "experts_implementation": "eager"})
    assert (config.num_experts, config.shared_expert_intermediate_size) == (
        shape["num_experts"],
        shape["shared_expert_intermediate_size"],
    )  # (not the 60 experts and 5632 of the defaults)
    return draw_parameters(Qwen2MoeForCausalLM(config), seed)


def dense_layers(c: Qwen2MoeConfig) -> list[int]:
    """The layers Qwen2MoeDecoderLayer gives a dense Qwen2MoeMLP, not the sparse block."""
    return [
        l
        for l in range(c.num_hidden_layers)
        if l in c.mlp_only_layers or c.num_experts == 0 or (l + 1) % c.decoder_sparse_step
    ]


def qwen2_moe_config(model: Qwen2MoeForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """LLaMA's mapping (a dense layer's MLP included), the q/k/v biases and windows by
    layer (Qwen2's), and each sparse layer's router, experts (fused 3-D: cut per expert),
    shared expert and its gate; a dense layer of another width than the experts' refused."""
    c = model.config
    dense = dense_layers(c)
    if dense and c.intermediate_size != c.moe_intermediate_size:
        raise ValueError(f"layers {dense} have a dense MLP of another width than the experts'")
    raw = llama_to_config(model, prompt)  # type: ignore[arg-type]
    experts = [None if l in dense else c.num_experts for l in range(c.num_hidden_layers)]
    raw["model"] |= {
        "window": windows(c),
        "d_ff": c.moe_intermediate_size,
        "experts": experts if dense else c.num_experts,
        "experts_top_k": c.num_experts_per_tok,
        "experts_normalize": c.norm_topk_prob,
        "shared_expert": "gated",
        "shared_expert_d_ff": c.shared_expert_intermediate_size,
    }
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    for l, layer in enumerate(raw["weights"]["decoder"]):
        a, mlp = f"model.layers.{l}.self_attn", f"model.layers.{l}.mlp"
        for key, proj in PROJECTIONS.items():
            layer["self_attn"][key] = p[f"{a}.{proj}.bias"]
        if l in dense:
            continue
        gate_up, down = p[f"{mlp}.experts.gate_up_proj"], p[f"{mlp}.experts.down_proj"]
        ff = c.moe_intermediate_size
        assert gate_up.shape == (c.num_experts, 2 * ff, c.hidden_size)
        shared = f"{mlp}.shared_expert"
        layer["ffn"] |= {
            "router": p[f"{mlp}.gate.weight"].T,
            "experts": [
                {"W_1": gate_up[e, :ff].T, "W_3": gate_up[e, ff:].T, "W_2": down[e].T}
                for e in range(c.num_experts)
            ],
            "shared": {
                "W_1": p[f"{shared}.gate_proj.weight"].T,
                "W_3": p[f"{shared}.up_proj.weight"].T,
                "W_2": p[f"{shared}.down_proj.weight"].T,
            },
            "shared_gate": p[f"{mlp}.shared_expert_gate.weight"].T,  # [1, d] -> [d, 1]
        }
    return listed(raw)


@contextmanager
def float64_qwen2_moe() -> Iterator[None]:
    """Qwen2's three float32 computations in float64 (hf_common.float64_hf), and the router's."""
    with float64_hf(modeling_qwen2_moe, "Qwen2Moe") as mp:
        mp.setattr(modeling_qwen2_moe.Qwen2MoeTopKRouter, "forward", router_float64)
        yield


def outputs(model: Qwen2MoeForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    """hf_outputs (every hidden state, head, logit), and each sparse layer's router logits."""
    return hf_outputs(model, prompt) | router_logits(model, prompt)


def test_the_config_defaults_are_big_and_every_shape_sets_them_small() -> None:
    defaults = Qwen2MoeConfig()
    assert {k: getattr(defaults, k) for k in BIG_DEFAULTS} == BIG_DEFAULTS
    assert defaults.norm_topk_prob is False and defaults.qkv_bias is True
    assert dense_layers(defaults) == [] and defaults.sliding_window == 0  # (no window)
    for shape in SHAPES:
        model = qwen2_moe(shape, 0)
        for key, big in BIG_DEFAULTS.items():
            assert getattr(model.config, key) < big, (key, shape)  # each set, none the default


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_router_and_logit_matches_qwen2_moe(
    shape: dict[str, Any], seed: int
) -> None:
    model = qwen2_moe(shape, seed)
    c = model.config
    dense = [
        l
        for l, layer in enumerate(model.model.layers)
        if isinstance(layer.mlp, modeling_qwen2_moe.Qwen2MoeMLP)
    ]
    assert dense_layers(c) == dense
    for l, layer in enumerate(model.model.layers):  # every drawn: a zero would hide a slip
        assert (layer.self_attn.k_proj.bias != 0).all()
        if l not in dense:
            assert (layer.mlp.shared_expert_gate.weight != 0).all()
    prompt = prompt_for(model, seed, PROMPT)
    with float64_qwen2_moe():
        expected = outputs(model, prompt)
    n, heads = c.num_hidden_layers, c.num_hidden_layers * c.num_attention_heads
    assert len(expected) == 2 + n + heads + 1 + n - len(dense)
    raw = qwen2_moe_config(model, prompt)
    trace = traced(raw)
    assert_matches(expected, trace.value)
    sparse = next(l for l in range(n) if l not in dense)
    gate = trace.value(f"decoder.{sparse}.ffn.shared.gate")
    assert gate.shape == (PROMPT, 1) and (gate > 0).all() and (gate < 1).all()
    routed = trace.value(f"decoder.{sparse}.ffn.routed")
    sums = routed.sum(axis=1)  # renormalised: each row sums to 1; otherwise below 1 (k < E)
    assert np.allclose(sums, 1) if c.norm_topk_prob else (sums < 1 - 1e-6).all()


def test_a_dense_layer_of_another_width_is_refused() -> None:
    """intermediate_size (a dense MLP's) not moe_intermediate_size: trace-tf has one d_ff."""
    model = qwen2_moe({**SHAPES[1], "intermediate_size": 6}, 0)
    with pytest.raises(ValueError, match=re.escape("layers [0, 2] have a dense MLP")):
        qwen2_moe_config(model, [1, 2])


def no_shared_expert(raw: dict[str, Any]) -> None:
    raw["model"] |= {"shared_expert": "none", "shared_expert_d_ff": None}
    for layer in raw["weights"]["decoder"]:
        layer["ffn"].pop("shared", None), layer["ffn"].pop("shared_gate", None)


def its_gate_left_out(raw: dict[str, Any]) -> None:
    raw["model"]["shared_expert"] = "plain"
    for layer in raw["weights"]["decoder"]:
        layer["ffn"].pop("shared_gate", None)


def dense_layers_moved(raw: dict[str, Any]) -> None:
    """Each layer's FFN and model.experts' entry one layer on (the dense ones elsewhere)."""
    ffns = [layer["ffn"] for layer in raw["weights"]["decoder"]]
    for layer, ffn in zip(raw["weights"]["decoder"], ffns[1:] + ffns[:1], strict=True):
        layer["ffn"] = ffn
    experts = raw["model"]["experts"]
    raw["model"]["experts"] = experts[1:] + experts[:1]
    assert raw["model"]["experts"] != experts


def norm_topk_prob_flipped(raw: dict[str, Any]) -> None:
    raw["model"]["experts_normalize"] = not raw["model"]["experts_normalize"]


@pytest.mark.parametrize(
    "mutate", [no_shared_expert, its_gate_left_out, dense_layers_moved, norm_topk_prob_flipped]
)
def test_the_comparison_catches_a_wrong_variant(mutate: Callable[[dict[str, Any]], None]) -> None:
    """No shared expert, its gate left out (plain), the dense layers in the wrong places, or
    norm_topk_prob the other way: the comparison fails, by more than 1e-3 (over the values
    every variant has: not the router logits of a layer a moved FFN made dense)."""
    model = qwen2_moe(SHAPES[1], 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = qwen2_moe_config(model, prompt)
    mutate(raw)
    with float64_qwen2_moe():
        expected = outputs(model, prompt)
    trace = traced(raw)
    shared = {k: v for k, v in expected.items() if k in trace}
    assert len(shared) >= len(expected) - 1
    assert largest_error(shared, trace.value) > 1e-3


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_qwen2_moe_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    """HF's cache and trace-tf's KV cache both on: each new token routed on its own, and
    through the shared expert."""
    assert_greedy_matches(qwen2_moe(shape, 5), qwen2_moe_config, tmp_path, float64_qwen2_moe)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's Qwen2-MoE code, after LLaMA's, Mixtral's, Qwen3-MoE's, Qwen3's and Qwen2's,
    as printed (a dense layer among sparse ones); then its functions on the drawn shapes,
    and its refusal of a dense layer of another width than the experts'."""
    monkeypatch.chdir(tmp_path)
    scope = run_readme("From Hugging Face LLaMA")
    for section in ("Mixtral", "Qwen3", "Qwen3-MoE", "Qwen2"):
        scope = run_readme(f"From Hugging Face {section}", scope=scope)
    scope = assert_recipe_runs(
        "From Hugging Face Qwen2-MoE", "qwen2_moe", float64_qwen2_moe, outputs, after=scope
    )
    written = yaml.safe_load(Path("qwen2_moe.yaml").read_text(encoding="utf-8"))["model"]
    assert (written["experts"], written["shared_expert"]) == ([4, None, 4], "gated")
    assert (written["d_ff"], written["shared_expert_d_ff"]) == (6, 12)
    for shape in SHAPES:
        model = qwen2_moe(shape, 8)
        prompt, vocab = prompt_for(model, 8, PROMPT), vocab_of(model)  # type: ignore[arg-type]
        np.savez("m.npz", **scope["qwen2_moe_arrays"](model, vocab))
        config = scope["qwen2_moe_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
        Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        with float64_qwen2_moe():
            assert_matches(outputs(model, prompt), decode_json("m.yaml"))
    other = qwen2_moe({**SHAPES[1], "intermediate_size": 6}, 0)
    with pytest.raises(ValueError, match=r"layers \[0, 2\] have a dense MLP of intermediate_size"):
        scope["qwen2_moe_config"](other, vocab_of(other), ["t1"], "m.npz")
