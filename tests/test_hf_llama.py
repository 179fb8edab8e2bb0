"""The engine against Hugging Face's LLaMA (transformers' LlamaForCausalLM, float64, eval).

Small random LLaMAs, every parameter drawn anew (HF's own init leaves biases at 0 and
γ at 1, where a misplaced norm or bias would not show), are converted here by the
mapping README "From Hugging Face LLaMA" states (written here independently, as
nested YAML data in the fused form; the README's own recipe, which writes an .npz,
is run as printed by `test_the_readme_recipe_*`).

HF computes three things in float32 whatever the model's dtype: LlamaRMSNorm casts
its input to float32, LlamaRotaryEmbedding its angles (`position_ids.float() *
inv_freq.float()`), and the eager attention its softmax (`softmax(..., dtype=
torch.float32)`). `float64_llama` replaces those three with the same formulas in
float64; so patched, every hidden state, every head's attention weights and the
logits must match trace-tf to 1e-12. As shipped they differ by float32 roundings,
which `test_as_shipped_*` bounds and requires to be there (so that README's account of
the difference is true, and the patch is what closes it).

The conventions mapped:
- `hidden_states[0]` is `decoder.input` (the embeddings: RoPE adds nothing to them);
  `hidden_states[l]`, 0 < l < n_layers, is `decoder.<l-1>.ffn.residual`; the last is
  after the final norm, `decoder.output`. The last layer's own output is what
  `model.norm` reads (caught by a hook).
- nn.Linear keeps its weight out × in and computes `x Wᵀ + b`: every weight is
  transposed.
- RoPE pairs column i with i + head_dim/2 (`rotate_half`): `rope_pairs: halves`.
- Grouped-query attention (num_key_value_heads < num_attention_heads): query head h
  reads key/value head h // (heads / kv heads) (`repeat_kv`); trace-tf's
  `model.n_kv_heads` does the same, so k_proj.weight transposed is the fused W_k as
  is. The old recipe, each shared K/V projection given to every head of its group
  (`duplicated=True`), must still give the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
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
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

from trace_tf.errors import InputError

GATED = {"silu": "swiglu", "gelu": "geglu"}


# LlamaConfig's sizes and options (vocab_size, hidden_size, ...), each model's own
SHAPES: list[dict[str, Any]] = [
    dict(num_hidden_layers=1, num_attention_heads=1, hidden_size=8, intermediate_size=12),
    dict(
        num_hidden_layers=2,
        num_attention_heads=2,
        hidden_size=16,
        intermediate_size=24,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
    ),
    dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=20,
        attention_bias=True,
        mlp_bias=True,
    ),
    dict(
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        hidden_size=12,
        intermediate_size=10,
        head_dim=4,
        tie_word_embeddings=True,
        rms_norm_eps=0.1,
    ),
    dict(
        num_hidden_layers=1,
        num_attention_heads=2,
        hidden_size=8,
        intermediate_size=16,
        hidden_act="gelu",
        head_dim=6,
        rope_theta=500000.0,
    ),
]


def llama(shape: dict[str, Any], seed: int, eos: int | None = None) -> LlamaForCausalLM:
    """A LlamaForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`;
    `shape`'s rope_scaling (HF's rope_parameters but rope_theta) sets a scaled rope type."""
    config = rotary_config(LlamaConfig, shape, eos)
    return draw_parameters(LlamaForCausalLM(config), seed)


def head_dim(model: LlamaForCausalLM) -> int:
    c = model.config
    return int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)


def to_config(
    model: LlamaForCausalLM, prompt: list[int], duplicated: bool = False
) -> dict[str, Any]:
    """README's mapping, as nested config data with the weights in the YAML's fused form:
    grouped-query attention natively (n_kv_heads), or, `duplicated`, as before there was
    n_kv_heads: each K/V head's columns given to every query head of its group."""
    c = model.config
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    vocab, d, H = vocab_of(model), head_dim(model), c.num_attention_heads
    group = H // c.num_key_value_heads

    def shared(W: np.ndarray) -> np.ndarray:
        """A K or V projection's columns (kv head j: j·d..), given to each query head."""
        if not duplicated:
            return W
        return np.concatenate([W[:, (h // group) * d : (h // group + 1) * d] for h in range(H)], 1)

    def shared_bias(b: np.ndarray) -> np.ndarray:
        if not duplicated:
            return b
        return np.concatenate([b[(h // group) * d : (h // group + 1) * d] for h in range(H)])

    layers = []
    for l in range(c.num_hidden_layers):
        a, f = f"model.layers.{l}.self_attn", f"model.layers.{l}.mlp"
        attn: dict[str, Any] = {
            "W_q": p[f"{a}.q_proj.weight"].T,
            "W_k": shared(p[f"{a}.k_proj.weight"].T),
            "W_v": shared(p[f"{a}.v_proj.weight"].T),
            "W_o": p[f"{a}.o_proj.weight"].T,
            "norm": {"gamma": p[f"model.layers.{l}.input_layernorm.weight"]},
        }
        if getattr(c, "attention_bias", False):  # (Mistral's config has none)
            attn |= {
                "b_q": p[f"{a}.q_proj.bias"],
                "b_k": shared_bias(p[f"{a}.k_proj.bias"]),
                "b_v": shared_bias(p[f"{a}.v_proj.bias"]),
                "b_o": p[f"{a}.o_proj.bias"],
            }
        ffn: dict[str, Any] = {
            "norm": {"gamma": p[f"model.layers.{l}.post_attention_layernorm.weight"]}
        }
        if f"{f}.gate_proj.weight" in p:  # a dense MLP (Mixtral's experts: test_hf_mixtral)
            ffn |= {
                "W_1": p[f"{f}.gate_proj.weight"].T,
                "W_3": p[f"{f}.up_proj.weight"].T,
                "W_2": p[f"{f}.down_proj.weight"].T,
            }
        if getattr(c, "mlp_bias", False):
            ffn |= {
                "b_1": p[f"{f}.gate_proj.bias"],
                "b_3": p[f"{f}.up_proj.bias"],
                "b_2": p[f"{f}.down_proj.bias"],
            }
        layers.append({"self_attn": attn, "ffn": ffn})
    weights: dict[str, Any] = {
        "decoder": layers,
        "decoder_final_norm": {"gamma": p["model.norm.weight"]},
    }
    if not c.tie_word_embeddings:
        weights["output"] = {"W": p["lm_head.weight"].T}
    wte = p["model.embed_tokens.weight"]
    raw = {
        "model": {
            "d_model": c.hidden_size,
            "n_heads": H,
            "n_kv_heads": H if duplicated else c.num_key_value_heads,
            "d_k": d,
            "d_v": d,
            "d_ff": c.intermediate_size,
            "encoder_layers": 0,
            "decoder_layers": c.num_hidden_layers,
            "positional": "rope",
            "rope_pairs": "halves",
            "pe_base": float(c.rope_parameters["rope_theta"]),
            "rope_scaling": rope_scaling(c.rope_parameters),
            "max_len": c.max_position_embeddings,
            "norm_position": "pre",
            "norm": "rms",
            "norm_eps": c.rms_norm_eps,
            "activation": GATED[c.hidden_act],
            "tie_embeddings": bool(c.tie_word_embeddings),
        },
        "vocab": vocab,
        "tokens": {} if c.eos_token_id is None else {"eos": vocab[c.eos_token_id]},
        "embeddings": {t: wte[i] for i, t in enumerate(vocab)},
        "target": [vocab[i] for i in prompt],
        "weights": weights,
    }
    return listed(raw)


# rope_parameters' keys (but rope_type and rope_theta) by their model.rope_scaling names
ROPE_SCALING_KEYS = {
    "factor": "factor",
    "low_freq_factor": "low_freq_factor",
    "high_freq_factor": "high_freq_factor",
    "original_max_position_embeddings": "original_max_len",
    "beta_fast": "beta_fast",
    "beta_slow": "beta_slow",
    "attention_factor": "attention_factor",
    "mscale": "mscale",
    "mscale_all_dim": "mscale_all_dim",
    "truncate": "truncate",
}


def rope_scaling(rope: dict[str, Any]) -> dict[str, Any] | None:
    """HF's rope_parameters as model.rope_scaling: None for the default type (no scaling),
    else its type and each parameter under trace-tf's name (the old key `type` dropped)."""
    if rope["rope_type"] == "default":
        return None
    given = {k: v for k, v in rope.items() if k not in ("rope_type", "rope_theta", "type")}
    return {"type": rope["rope_type"], **{ROPE_SCALING_KEYS[k]: v for k, v in given.items()}}


def float64_llama() -> AbstractContextManager[pytest.MonkeyPatch]:
    """HF's LLaMA with its three float32 computations done in float64."""
    return float64_hf(modeling_llama, "Llama")


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_llama(shape: dict[str, Any], seed: int) -> None:
    model = llama(shape, seed)
    prompt = prompt_for(model, seed)
    with float64_llama():
        expected = hf_outputs(model, prompt)
    c = model.config
    assert len(expected) == 2 + c.num_hidden_layers * (1 + c.num_attention_heads) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


@pytest.mark.parametrize("shape", SHAPES[1:3], ids=shape_id)
def test_as_shipped_llama_differs_by_float32_roundings_only(shape: dict[str, Any]) -> None:
    """Unpatched, HF's float32 norm, angles and softmax put it about 1e-7 away (relative to
    1 + |value|): more than float64 roundings, less than anything a mapping error gives."""
    model = llama(shape, 4)
    prompt = prompt_for(model, 4, 8)
    value = traced(to_config(model, prompt)).value
    error = largest_error(hf_outputs(model, prompt), value)
    assert 1e-10 < error < 1e-5


def swap_q_k(raw: dict[str, Any]) -> None:
    a = raw["weights"]["decoder"][0]["self_attn"]
    a["W_q"], a["W_k"] = a["W_k"], a["W_q"]


def gate_up_swapped(raw: dict[str, Any]) -> None:
    f = raw["weights"]["decoder"][0]["ffn"]
    f["W_1"], f["W_3"] = f["W_3"], f["W_1"]


def rope_adjacent(raw: dict[str, Any]) -> None:
    raw["model"]["rope_pairs"] = "adjacent"


def layer_norm(raw: dict[str, Any]) -> None:
    raw["model"]["norm"] = "layer"


def kv_heads_reversed(raw: dict[str, Any]) -> None:
    """The K/V heads' columns of W_k and W_v in the wrong order (kv head 0 read by h2, h3)."""
    a = raw["weights"]["decoder"][0]["self_attn"]
    n, d = raw["model"]["n_kv_heads"], raw["model"]["d_k"]
    for key in ("W_k", "W_v"):
        W = np.asarray(a[key])
        blocks = [W[:, j * d : (j + 1) * d] for j in range(n)]
        a[key] = np.concatenate(blocks[::-1], axis=1).tolist()


def multi_head(raw: dict[str, Any]) -> None:
    """n_kv_heads left out: the GQA weights (2 K/V heads wide) read as 4 heads' weights."""
    del raw["model"]["n_kv_heads"]


@pytest.mark.parametrize(
    "mutate", [swap_q_k, gate_up_swapped, rope_adjacent, layer_norm, kv_heads_reversed]
)
def test_the_comparison_catches_a_wrong_mapping(mutate: Callable[[dict[str, Any]], None]) -> None:
    """Each plausible conversion mistake makes the comparison above fail (or, W_q and
    W_k swapped under grouped-query attention, their widths refused)."""
    model = llama(SHAPES[2], 3)
    prompt = prompt_for(model, 3)
    raw = to_config(model, prompt)
    mutate(raw)
    with float64_llama():
        expected = hf_outputs(model, prompt)
    with pytest.raises((AssertionError, InputError)):
        assert_matches(expected, traced(raw).value)


def test_left_out_n_kv_heads_is_an_error_that_names_the_fused_width() -> None:
    model = llama(SHAPES[2], 3)
    raw = to_config(model, prompt_for(model, 3))
    multi_head(raw)
    with pytest.raises(InputError, match=r"W_k.*n_heads·d_k"):
        traced(raw)


@pytest.mark.parametrize("shape", [SHAPES[2], SHAPES[3]], ids=shape_id)
def test_the_duplicated_kv_recipe_gives_the_native_numbers(shape: dict[str, Any]) -> None:
    """Before n_kv_heads, README gave each query head its K/V head's columns: the same
    model, every step equal to the native one's (bit for bit) and to LLaMA's."""
    model = llama(shape, 6)
    prompt = prompt_for(model, 6)
    native, old = to_config(model, prompt), to_config(model, prompt, duplicated=True)
    assert native["model"]["n_kv_heads"] < old["model"]["n_kv_heads"]
    a, b = traced(native), traced(old)
    assert list(a.steps) == list(b.steps)
    for path in a.steps:
        assert np.array_equal(a.value(path), b.value(path)), path
    with float64_llama():
        assert_matches(hf_outputs(model, prompt), b.value)


# ------------------------------------------------------------ generate --greedy


@pytest.mark.parametrize("shape", SHAPES[1:4], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_llama_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    assert_greedy_matches(llama(shape, 5), to_config, tmp_path, float64_llama)


# ------------------------------------------------------ README recipe: LLaMA → trace-tf


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_recipe_runs("From Hugging Face LLaMA", "llama", float64_llama)


@pytest.mark.parametrize("shape", [SHAPES[2], SHAPES[3], SHAPES[4]], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_converts_any_llama(
    shape: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe's `llama_arrays` and `llama_config` on other models (grouped-query
    attention, biases, head_dim, tied output, GeGLU): each step as LLaMA computes it."""
    monkeypatch.chdir(tmp_path)
    scope = run_readme("From Hugging Face LLaMA")
    model = llama(shape, 7)
    prompt, vocab = prompt_for(model, 7, 6), vocab_of(model)
    np.savez("m.npz", **scope["llama_arrays"](model, vocab))
    config = scope["llama_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with float64_llama():
        assert_matches(hf_outputs(model, prompt), decode_json("m.yaml"))
