"""The engine against Hugging Face's Gemma (transformers' GemmaForCausalLM, Gemma 1,
float64, eval).

Gemma is LLaMA's shape (tests/test_hf_llama.py) with three conventions of its own, each
silent when mapped wrong:
- its MLP gates with `gelu_pytorch_tanh`, the TANH approximation of GELU:
  `activation: geglu_tanh` (trace-tf's `geglu` gates with the exact erf GELU);
- its RMSNorm multiplies by (1 + weight): γ = 1 + weight (exact in float64: HF's own
  1.0 + weight is the same rounding);
- it scales the embeddings by √hidden_size: `embed_scale: sqrt_d_model` (and ties the
  output to the unscaled table, `tie_embeddings`).
Its head_dim is independent of hidden_size (`d_k`, `d_v`) and it may be multi-query
(num_key_value_heads=1, `n_kv_heads: 1`).

Small random Gemmas, every parameter drawn anew (HF's own init leaves the norm weights
at 0, where a missing +1 would not show), are converted here by the mapping README "From
Hugging Face Gemma" states (written here independently, as nested YAML data in the fused
form; the README's own recipe, which writes an .npz, is run as printed).

HF computes four things in float32 whatever the model's dtype: GemmaRMSNorm (`x.float()`,
`1.0 + weight.float()`), the rotary angles and the eager softmax, as LLaMA does, and the
embedding scale, a float32 buffer `torch.tensor(hidden_size**0.5)`. `float64_gemma`
replaces the four with the same formulas in float64; so patched, every hidden state,
every head's attention weights and the logits must match trace-tf to 1e-12. As shipped
they differ by float32 roundings, which `test_as_shipped_*` bounds and requires.
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
    listed,
    prompt_for,
    rotary_config,
    run_readme,
    traced,
    vocab_of,
)
from transformers import GemmaConfig, GemmaForCausalLM
from transformers.models.gemma import modeling_gemma

# GemmaConfig's sizes and options, each model's own (hidden_act is always Gemma's
# gelu_pytorch_tanh; head_dim is always given, its default is 256)
SHAPES: list[dict[str, Any]] = [
    dict(
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        hidden_size=8,
        intermediate_size=12,
        head_dim=4,
    ),
    dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        hidden_size=12,
        intermediate_size=16,
        head_dim=6,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
    ),
    dict(
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        hidden_size=10,
        intermediate_size=20,
        head_dim=8,
        attention_bias=True,
        tie_word_embeddings=False,
        rms_norm_eps=0.1,
    ),
]


def gemma(shape: dict[str, Any], seed: int, eos: int | None = None) -> GemmaForCausalLM:
    """A GemmaForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`."""
    config = rotary_config(GemmaConfig, shape, eos)
    assert config.hidden_act == "gelu_pytorch_tanh"
    return draw_parameters(GemmaForCausalLM(config), seed, norm_weight=0.0)  # 1 + weight near 1


def to_config(model: GemmaForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """README's mapping, as nested config data with the weights in the YAML's fused form."""
    c = model.config
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    vocab, d = vocab_of(model), c.head_dim

    def gamma(key: str) -> dict[str, Any]:
        return {"gamma": 1.0 + p[key]}  # GemmaRMSNorm: x / rms(x) · (1 + weight)

    layers = []
    for l in range(c.num_hidden_layers):
        a, f = f"model.layers.{l}.self_attn", f"model.layers.{l}.mlp"
        attn: dict[str, Any] = {
            "W_q": p[f"{a}.q_proj.weight"].T,
            "W_k": p[f"{a}.k_proj.weight"].T,
            "W_v": p[f"{a}.v_proj.weight"].T,
            "W_o": p[f"{a}.o_proj.weight"].T,
            "norm": gamma(f"model.layers.{l}.input_layernorm.weight"),
        }
        if c.attention_bias:
            attn |= {f"b_{x}": p[f"{a}.{x}_proj.bias"] for x in "qkvo"}
        ffn: dict[str, Any] = {
            "W_1": p[f"{f}.gate_proj.weight"].T,
            "W_3": p[f"{f}.up_proj.weight"].T,
            "W_2": p[f"{f}.down_proj.weight"].T,
            "norm": gamma(f"model.layers.{l}.post_attention_layernorm.weight"),
        }
        layers.append({"self_attn": attn, "ffn": ffn})
    weights: dict[str, Any] = {"decoder": layers, "decoder_final_norm": gamma("model.norm.weight")}
    if not c.tie_word_embeddings:
        weights["output"] = {"W": p["lm_head.weight"].T}
    wte = p["model.embed_tokens.weight"]
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
            "pe_base": float(rope_theta(c)),
            "max_len": c.max_position_embeddings,
            "norm_position": "pre",
            "norm": "rms",
            "norm_eps": c.rms_norm_eps,
            "activation": "geglu_tanh",
            "embed_scale": "sqrt_d_model",
            "tie_embeddings": bool(c.tie_word_embeddings),
        },
        "vocab": vocab,
        "tokens": {} if c.eos_token_id is None else {"eos": vocab[c.eos_token_id]},
        "embeddings": {t: wte[i] for i, t in enumerate(vocab)},
        "target": [vocab[i] for i in prompt],
        "weights": weights,
    }
    return listed(raw)


def rope_theta(config: Any) -> float:
    """The RoPE base: Gemma 1's and 2's one, or with Gemma 3's by layer type its full
    layers' (tests/test_hf_gemma3.py's mapping then gives each layer its own)."""
    rope = config.rope_parameters
    return float(
        rope["rope_theta"] if "rope_theta" in rope else rope["full_attention"]["rope_theta"]
    )


def _rms_norm_float64(self: Any, x: torch.Tensor) -> torch.Tensor:
    """GemmaRMSNorm.forward without its casts to float32."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def _embed_float64(self: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """GemmaTextScaledWordEmbedding.forward with √hidden_size in float64, not its float32
    buffer."""
    return torch.nn.Embedding.forward(self, input_ids) * self.scalar_embed_scale


@contextmanager
def float64_gemma() -> Iterator[None]:
    """HF's Gemma with its four float32 computations done in float64."""
    with float64_hf(modeling_gemma, "Gemma", _rms_norm_float64) as mp:
        mp.setattr(modeling_gemma.GemmaTextScaledWordEmbedding, "forward", _embed_float64)
        yield


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_gemma(shape: dict[str, Any], seed: int) -> None:
    model = gemma(shape, seed)
    prompt = prompt_for(model, seed)
    with float64_gemma():
        expected = hf_outputs(model, prompt)
    c = model.config
    assert len(expected) == 2 + c.num_hidden_layers * (1 + c.num_attention_heads) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


def test_the_embeddings_are_scaled_and_the_output_tied_to_the_unscaled_table() -> None:
    """hidden_states[0] is √hidden_size times the embedding row; the logits of a tied
    model are the final hidden state times the unscaled table."""
    model = gemma(SHAPES[1], 2)
    prompt = prompt_for(model, 2)
    with float64_gemma():
        expected = hf_outputs(model, prompt)
    wte = model.model.embed_tokens.weight.detach().numpy()
    np.testing.assert_allclose(expected["decoder.input"], wte[prompt] * 12**0.5, rtol=1e-15)
    np.testing.assert_allclose(expected["logits"], expected["decoder.output"] @ wte.T, rtol=1e-12)


@pytest.mark.parametrize("shape", SHAPES[1:], ids=shape_id)
def test_as_shipped_gemma_differs_by_float32_roundings_only(shape: dict[str, Any]) -> None:
    """Unpatched, HF's float32 norm, angles, softmax and embedding scale put it about
    1e-7 away (relative to 1 + |value|): more than float64 roundings, less than any
    mapping error gives."""
    model = gemma(shape, 4)
    prompt = prompt_for(model, 4, 8)
    value = traced(to_config(model, prompt)).value
    error = largest_error(hf_outputs(model, prompt), value)
    assert 1e-10 < error < 1e-5


def gamma_without_one(raw: dict[str, Any]) -> None:
    """γ = weight, LLaMA's mapping, not 1 + weight."""
    f = raw["weights"]["decoder"][0]["ffn"]
    f["norm"]["gamma"] = (np.asarray(f["norm"]["gamma"]) - 1).tolist()


def final_gamma_without_one(raw: dict[str, Any]) -> None:
    norm = raw["weights"]["decoder_final_norm"]
    norm["gamma"] = (np.asarray(norm["gamma"]) - 1).tolist()


def exact_gelu_gate(raw: dict[str, Any]) -> None:
    raw["model"]["activation"] = "geglu"


def no_embed_scale(raw: dict[str, Any]) -> None:
    del raw["model"]["embed_scale"]


def gate_up_swapped(raw: dict[str, Any]) -> None:
    f = raw["weights"]["decoder"][0]["ffn"]
    f["W_1"], f["W_3"] = f["W_3"], f["W_1"]


@pytest.mark.parametrize(
    "mutate",
    [gamma_without_one, final_gamma_without_one, exact_gelu_gate, no_embed_scale, gate_up_swapped],
)
def test_the_comparison_catches_a_wrong_mapping(mutate: Callable[[dict[str, Any]], None]) -> None:
    """Each of Gemma's own conventions mapped as LLaMA's (γ = weight, an exact GELU gate,
    no embedding scale) makes the comparison above fail; the exact-GELU gate by far
    more than float32 roundings do (test_as_shipped_*)."""
    model = gemma(SHAPES[1], 3)
    prompt = prompt_for(model, 3)
    raw = to_config(model, prompt)
    mutate(raw)
    with float64_gemma():
        expected = hf_outputs(model, prompt)
    value = traced(raw).value
    with pytest.raises(AssertionError):
        assert_matches(expected, value)
    assert largest_error(expected, value) > 1e-5


def test_a_gemma_config_s_hidden_act_gelu_is_the_tanh_form() -> None:
    """README: GemmaConfig turns hidden_act="gelu" (old releases' value) into
    gelu_pytorch_tanh, so every Gemma 1 is `geglu_tanh`, never `geglu`."""
    config = GemmaConfig(hidden_act="gelu", head_dim=4, hidden_size=8)
    assert config.hidden_act == "gelu_pytorch_tanh"


# ------------------------------------------------------------ generate --greedy


@pytest.mark.parametrize("shape", SHAPES[1:], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_gemma_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    assert_greedy_matches(gemma(shape, 5), to_config, tmp_path, float64_gemma)


# ------------------------------------------------------ README recipe: Gemma → trace-tf


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_recipe_runs("From Hugging Face Gemma", "gemma", float64_gemma)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_converts_any_gemma(
    shape: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe's `gemma_arrays` and `gemma_config` on other models (norm weights away
    from 0, multi-query, biases, an untied output): each step as Gemma computes it."""
    monkeypatch.chdir(tmp_path)
    scope = run_readme("From Hugging Face Gemma")
    model = gemma(shape, 7)
    prompt, vocab = prompt_for(model, 7, 6), vocab_of(model)
    np.savez("m.npz", **scope["gemma_arrays"](model, vocab))
    config = scope["gemma_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with float64_gemma():
        assert_matches(hf_outputs(model, prompt), decode_json("m.yaml"))
