"""The engine against Hugging Face's Qwen3-MoE (transformers' Qwen3MoeForCausalLM, float64,
eval): Qwen3's attention (QK-norm of each head) with a sparse mixture of experts for
each MLP, so the conversion is tests/test_hf_mixtral.py's (LLaMA's, the window, the
router and the fused experts) with tests/test_hf_qwen3.py's q_norm and k_norm γ,
`d_ff: moe_intermediate_size` and `experts_normalize: norm_topk_prob`.

transformers 5.23's Qwen3MoeTopKRouter: router_logits = x gate.weightᵀ (no bias), a
softmax over the experts in float32 (`dtype=torch.float`), torch.topk of the
probabilities, divided by their sum only if `norm_topk_prob` (False by default, as
Qwen3-30B-A3B's config says True); Qwen3MoeExperts: MixtralExperts' layout to the line,
`gate_up_proj` [E, 2·moe_intermediate_size, d] (chunk(2): the gate, then up) and
`down_proj` [E, d, moe_intermediate_size]. A layer l gets Qwen3MoeSparseMoeBlock unless
l is in `mlp_only_layers` or (l + 1) % `decoder_sparse_step` != 0 (or num_experts is 0):
a dense Qwen3MoeMLP of `intermediate_size` instead: `model.experts` a list, None for
each dense layer, where intermediate_size is moe_intermediate_size (trace-tf has one
d_ff), and refused otherwise. Its sliding window,
unlike Qwen3's, is Mistral's: `sliding_window` (None unless use_sliding_window) on every
layer, no layer_types. HF's float32 norm, angles, softmax and router softmax are done in
float64 (test_hf_mixtral's router_float64 honours norm_topk_prob): every hidden state,
each head's attention weights and normalised q and k, each layer's router logits and the
logits agree to 1e-12. Every parameter is drawn (Qwen3MoeConfig's defaults are a 15B's:
every size is set here). norm_topk_prob flipped, a wrong k or no QK-norm fail it.
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
    largest_error,
    prompt_for,
    rotary_config,
    run_readme,
    traced,
    vocab_of,
)
from test_hf_mixtral import mixtral_config, router_float64, router_logits
from test_hf_qwen3 import qwen3_outputs, with_qk_norm
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe import modeling_qwen3_moe

# Qwen3MoeConfig's defaults are a 15B's (its docstring's Qwen3-15B-A2B; head_dim hidden / heads unless given; Qwen3-30B-A3B's
# config gives 128): each is set small below, or the model is huge
BIG_DEFAULTS = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "max_position_embeddings": 32768,
}

# Qwen3MoeConfig's sizes and options, each model's own
SHAPES: list[dict[str, Any]] = [
    dict(  # norm_topk_prob off (the config's default)
        num_hidden_layers=1,
        num_attention_heads=2,
        hidden_size=8,
        head_dim=4,
        moe_intermediate_size=6,
        num_experts=4,
        num_experts_per_tok=2,
    ),
    dict(  # renormalised (Qwen3-30B-A3B's), grouped-query, head_dim not hidden / heads
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        head_dim=6,
        moe_intermediate_size=5,
        num_experts=5,
        num_experts_per_tok=3,
        norm_topk_prob=True,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
    ),
    dict(  # one expert per token, multi-query, biases, tied output, a window on every layer
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        hidden_size=12,
        head_dim=4,
        moe_intermediate_size=8,
        num_experts=3,
        num_experts_per_tok=1,
        attention_bias=True,
        tie_word_embeddings=True,
        use_sliding_window=True,
        sliding_window=3,
    ),
    dict(  # every expert chosen, no head_dim (hidden / heads)
        num_hidden_layers=1,
        num_attention_heads=1,
        hidden_size=6,
        moe_intermediate_size=4,
        num_experts=2,
        num_experts_per_tok=2,
        norm_topk_prob=True,
    ),
]
PROMPT = 7


def qwen3_moe(shape: dict[str, Any], seed: int) -> Qwen3MoeForCausalLM:
    """A Qwen3MoeForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`."""
    # the experts run as modeling_qwen3_moe writes them (the default, grouped_mm, has no float64)
    config = rotary_config(Qwen3MoeConfig, {**shape, "experts_implementation": "eager"})
    assert (config.num_experts, config.moe_intermediate_size) == (
        shape["num_experts"],
        shape["moe_intermediate_size"],
    )  # (not the 128 of 768 defaults)
    return draw_parameters(Qwen3MoeForCausalLM(config), seed)


def test_the_config_defaults_are_big_and_every_shape_sets_them_small() -> None:
    defaults = Qwen3MoeConfig()
    assert {k: getattr(defaults, k) for k in BIG_DEFAULTS} == BIG_DEFAULTS
    assert defaults.norm_topk_prob is False and dense_layers(defaults) == []
    for shape in SHAPES:
        model = qwen3_moe(shape, 0)
        for key, big in BIG_DEFAULTS.items():
            assert getattr(model.config, key) <= big / 2, (key, shape)


def dense_layers(c: Qwen3MoeConfig) -> list[int]:
    """The layers Qwen3MoeDecoderLayer gives a dense Qwen3MoeMLP, not the sparse block."""
    return [
        l
        for l in range(c.num_hidden_layers)
        if l in c.mlp_only_layers or c.num_experts == 0 or (l + 1) % c.decoder_sparse_step
    ]


def qwen3_moe_config(model: Qwen3MoeForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """Mixtral's mapping (LLaMA's, the window, the experts; a dense layer's MLP as
    LLaMA's, None in model.experts), Qwen3's QK-norm, the experts' width and
    norm_topk_prob; a dense layer of another width than the experts' refused."""
    c = model.config
    dense = dense_layers(c)
    if dense and c.intermediate_size != c.moe_intermediate_size:
        raise ValueError(f"layers {dense} have a dense MLP of another width than the experts'")
    raw = with_qk_norm(mixtral_config(model, prompt), model)
    assert raw["model"]["experts"] == (
        [None if l in dense else c.num_experts for l in range(c.num_hidden_layers)]
        if dense
        else c.num_experts
    )
    raw["model"] |= {"d_ff": c.moe_intermediate_size, "experts_normalize": c.norm_topk_prob}
    return raw


@contextmanager
def float64_qwen3_moe() -> Iterator[None]:
    """Qwen3's three float32 computations in float64 (hf_common.float64_hf), and the router's."""
    with float64_hf(modeling_qwen3_moe, "Qwen3Moe") as mp:
        mp.setattr(modeling_qwen3_moe.Qwen3MoeTopKRouter, "forward", router_float64)
        yield


def outputs(model: Qwen3MoeForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    """qwen3_outputs (every hidden state, head, normalised q and k, logit), and each
    layer's router logits."""
    return qwen3_outputs(model, prompt) | router_logits(model, prompt)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_router_and_logit_matches_qwen3_moe(
    shape: dict[str, Any], seed: int
) -> None:
    model = qwen3_moe(shape, seed)
    c = model.config
    assert dense_layers(c) == [] and all(
        isinstance(layer.mlp, modeling_qwen3_moe.Qwen3MoeSparseMoeBlock)
        for layer in model.model.layers
    )
    prompt = prompt_for(model, seed, PROMPT)
    with float64_qwen3_moe():
        expected = outputs(model, prompt)
    heads = c.num_hidden_layers * c.num_attention_heads
    assert len(expected) == 2 + c.num_hidden_layers + heads * 3 + 1 + c.num_hidden_layers
    raw = qwen3_moe_config(model, prompt)
    assert raw["model"]["window"] == (3 if c.use_sliding_window else None)
    trace = traced(raw)
    assert_matches(expected, trace.value)
    E, k = shape["num_experts"], shape["num_experts_per_tok"]
    routed = trace.value("decoder.0.ffn.routed")
    assert ((routed > 0).sum(axis=1) == k).all() and routed.shape == (PROMPT, E)
    sums = routed.sum(axis=1)  # renormalised: each row sums to 1; otherwise below 1 (k < E)
    assert np.allclose(sums, 1) if c.norm_topk_prob or k == E else (sums < 1 - 1e-6).all()


def test_the_window_bites_on_every_layer() -> None:
    """Qwen3-MoE's window is Mistral's, every layer: HF's weights 0 exactly beyond it."""
    model = qwen3_moe(SHAPES[2], 0)
    with float64_qwen3_moe():
        expected = outputs(model, prompt_for(model, 0, PROMPT))
    i, j = np.indices((PROMPT, PROMPT))
    for l in range(model.config.num_hidden_layers):
        weights = expected[f"decoder.{l}.self_attn.h0.softmax"]
        assert (weights[(j <= i - 3) | (j > i)] == 0).all()
        assert (weights[(j > i - 3) & (j <= i)] > 0).all()


@pytest.mark.parametrize(
    "options",
    [dict(decoder_sparse_step=2), dict(mlp_only_layers=[1]), dict(mlp_only_layers=[0, 2])],
    ids=shape_id,
)
def test_dense_layers_among_sparse_ones_match_qwen3_moe(options: dict[str, Any]) -> None:
    """decoder_sparse_step 2 (layers 0 and 2 dense) or mlp_only_layers: the layers
    dense_layers names are those HF builds with a Qwen3MoeMLP, each mapped as LLaMA's MLP
    (intermediate_size the experts' width), and every value matches; the FFNs put in the
    wrong layers (model.experts and the weights turned by one layer) fail it."""
    shape = {**SHAPES[1], "num_hidden_layers": 3, "intermediate_size": 5, **options}
    model = qwen3_moe(shape, 2)
    dense = [
        l
        for l, layer in enumerate(model.model.layers)
        if isinstance(layer.mlp, modeling_qwen3_moe.Qwen3MoeMLP)
    ]
    assert dense and dense_layers(model.config) == dense
    prompt = prompt_for(model, 2, PROMPT)
    with float64_qwen3_moe():
        expected = outputs(model, prompt)
    assert sum(k.endswith(".ffn.router") for k in expected) == 3 - len(dense)
    raw = qwen3_moe_config(model, prompt)
    assert [l for l, e in enumerate(raw["model"]["experts"]) if e is None] == dense
    assert_matches(expected, traced(raw).value)
    for layer in raw["weights"]["decoder"]:
        assert ("W_1" in layer["ffn"]) != ("router" in layer["ffn"])
    ffns = [layer["ffn"] for layer in raw["weights"]["decoder"]]
    for layer, ffn in zip(raw["weights"]["decoder"], ffns[1:] + ffns[:1], strict=True):
        layer["ffn"] = ffn
    experts = raw["model"]["experts"]
    raw["model"]["experts"] = experts[1:] + experts[:1]
    assert raw["model"]["experts"] != experts
    shared = {k: v for k, v in expected.items() if not k.endswith(".ffn.router")}
    assert largest_error(shared, traced(raw).value) > 1e-3


def test_a_dense_layer_of_another_width_is_refused() -> None:
    """intermediate_size (a dense MLP's) not moe_intermediate_size: trace-tf has one d_ff."""
    model = qwen3_moe({**SHAPES[1], "num_hidden_layers": 3, "decoder_sparse_step": 2}, 0)
    assert model.config.intermediate_size != model.config.moe_intermediate_size
    with pytest.raises(ValueError, match=re.escape("layers [0, 2] have a dense MLP")):
        qwen3_moe_config(model, [1, 2])


def norm_topk_prob_flipped(raw: dict[str, Any]) -> None:
    raw["model"]["experts_normalize"] = not raw["model"]["experts_normalize"]


def top_k_one_less(raw: dict[str, Any]) -> None:
    raw["model"]["experts_top_k"] -= 1


def top_k_one_more(raw: dict[str, Any]) -> None:
    raw["model"]["experts_top_k"] += 1


def no_qk_norm(raw: dict[str, Any]) -> None:
    raw["model"]["qk_norm"] = "none"
    for layer in raw["weights"]["decoder"]:
        del layer["self_attn"]["q_norm"], layer["self_attn"]["k_norm"]


@pytest.mark.parametrize("shape", SHAPES[:2], ids=shape_id)
@pytest.mark.parametrize(
    "mutate", [norm_topk_prob_flipped, top_k_one_less, top_k_one_more, no_qk_norm]
)
def test_the_comparison_catches_a_wrong_variant(
    mutate: Callable[[dict[str, Any]], None], shape: dict[str, Any]
) -> None:
    """norm_topk_prob the other way (from off, and from on), k one less or one more, or
    no QK-norm: the comparison fails, by more than 1e-3 (over the values every variant
    has: all but the q_norm and k_norm steps, which a model without QK-norm lacks)."""
    model = qwen3_moe(shape, 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = qwen3_moe_config(model, prompt)
    mutate(raw)
    with float64_qwen3_moe():
        expected = outputs(model, prompt)
    shared = {k: v for k, v in expected.items() if not k.endswith(("q_norm", "k_norm"))}
    assert largest_error(shared, traced(raw).value) > 1e-3


@pytest.mark.parametrize("shape", SHAPES[:3], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_qwen3_moe_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    """HF's cache and trace-tf's KV cache both on: each new token routed on its own; with
    the window, 4 prompt tokens and 8 new ones run past it."""
    assert_greedy_matches(qwen3_moe(shape, 5), qwen3_moe_config, tmp_path, float64_qwen3_moe)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's Qwen3-MoE code, after LLaMA's, Mixtral's and Qwen3's, as printed; then its
    functions on drawn Qwen3-MoEs (renormalised or not, a window), and its refusal of a
    dense layer of another width than the experts', its mapping of one of theirs."""
    monkeypatch.chdir(tmp_path)
    scope = run_readme("From Hugging Face LLaMA")
    scope = run_readme("From Hugging Face Mixtral", scope=scope)
    scope = run_readme("From Hugging Face Qwen3", scope=scope)
    scope = assert_recipe_runs(
        "From Hugging Face Qwen3-MoE", "qwen3_moe", float64_qwen3_moe, outputs, after=scope
    )
    written = yaml.safe_load(Path("qwen3_moe.yaml").read_text(encoding="utf-8"))["model"]
    assert (written["experts"], written["experts_top_k"], written["qk_norm"]) == (4, 2, "head")
    assert (written["d_ff"], written["experts_normalize"]) == (6, True)
    for shape in SHAPES[:3]:
        model = qwen3_moe(shape, 8)
        prompt, vocab = prompt_for(model, 8, PROMPT), vocab_of(model)  # type: ignore[arg-type]
        np.savez("m.npz", **scope["qwen3_moe_arrays"](model, vocab))
        config = scope["qwen3_moe_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
        Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        with float64_qwen3_moe():
            assert_matches(outputs(model, prompt), decode_json("m.yaml"))
    # a dense layer (mlp_only_layers) of the experts' width: mapped; of another: refused
    model = qwen3_moe(
        {**SHAPES[1], "num_hidden_layers": 3, "intermediate_size": 5, "mlp_only_layers": [1]}, 8
    )
    prompt, vocab = prompt_for(model, 8, PROMPT), vocab_of(model)  # type: ignore[arg-type]
    np.savez("m.npz", **scope["qwen3_moe_arrays"](model, vocab))
    config = scope["qwen3_moe_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    assert config["model"]["experts"] == [5, None, 5]
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with float64_qwen3_moe():
        assert_matches(outputs(model, prompt), decode_json("m.yaml"))
    dense = Qwen3MoeForCausalLM(
        rotary_config(Qwen3MoeConfig, {**SHAPES[1], "decoder_sparse_step": 2})
    )
    with pytest.raises(ValueError, match=r"layers \[0\] have a dense MLP of intermediate_size"):
        scope["qwen3_moe_config"](dense, vocab_of(dense), ["t1"], "m.npz")
