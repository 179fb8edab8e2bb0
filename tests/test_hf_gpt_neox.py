"""The engine against Hugging Face's GPT-NeoX (transformers' GPTNeoXForCausalLM, the Pythia
suite's model; float64, eval): parallel layers (`model.parallel: separate`) and partial
rotary (`model.rope_dims`) against the model they come from.

Small random GPT-NeoXs, every parameter drawn anew (tests/hf_common.py's
draw_parameters), with `use_parallel_residual` on and off and `partial_rotary_factor`
0.25, 0.5 and 1, are converted here by the mapping written below (nested YAML data,
fused form), and checked to 1e-12: every hidden state, every head's attention weights
(`output_attentions`), the logits, and `generate --greedy` against
`generate(do_sample=False)`.

The conventions mapped:
- `query_key_value` (3·hidden × hidden, out x in) holds, per head h, the rows
  h·3·d_k .. : d_k of q, then d_k of k, then d_k of v (GPTNeoXAttention's
  `view(..., -1, 3 * head_size)` then `chunk(3)`): each transposed into column block h
  of W_q, W_k, W_v.
- `use_parallel_residual`: mlp(post_attention_layernorm(x)) + attention(input_layernorm(x))
  + x, `model.parallel: separate`; off, the sequential pre-norm layer (`parallel: none`).
- `rotary_ndims = int(head_size · partial_rotary_factor)` is `model.rope_dims`; the
  rotary part turns by `rotate_half` (`rope_pairs: halves` within it) at frequencies
  `rope_theta^(−2i/rotary_ndims)`.
- LayerNorms with biases, exact GELU (`hidden_act: gelu`), `embed_in`, `final_layer_norm`
  the final norm, `lm_head` (Pythia's checkpoints' `embed_out`) untied, no bias.
- Two float32 internals of HF's GPT-NeoX are replaced by their float64 formulas under
  `float64` below (hf_common's, as for LLaMA): its rotary angles (inv_freq in
  torch.float) and its eager softmax (`dtype=torch.float32`).
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
    eager_float64,
    prompt_for,
    rotary_float64,
    run_readme,
    traced,
    vocab_of,
)
from hf_common import hf_outputs as common_outputs
from test_hf_llama import rope_scaling
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
from transformers.models.gpt_neox import modeling_gpt_neox

from trace_tf import ops

# num_hidden_layers, num_attention_heads, hidden_size, vocab, and GPTNeoXConfig's others
SHAPES: list[dict[str, Any]] = [
    dict(num_hidden_layers=1, num_attention_heads=2, hidden_size=16, vocab_size=10),
    dict(
        num_hidden_layers=2,
        num_attention_heads=2,
        hidden_size=16,
        vocab_size=13,
        use_parallel_residual=False,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5},
        layer_norm_eps=1e-3,
    ),
    dict(
        num_hidden_layers=2,
        num_attention_heads=3,
        hidden_size=24,
        vocab_size=11,
        intermediate_size=20,
        rope_parameters={"rope_type": "default", "rope_theta": 50.0, "partial_rotary_factor": 1.0},
        layer_norm_eps=0.1,
    ),
    dict(
        num_hidden_layers=3,
        num_attention_heads=4,
        hidden_size=32,
        vocab_size=9,
        attention_bias=False,
    ),
    # partial rotary with scaled frequencies: llama3 and yarn over the rotary_ndims columns
    dict(
        num_hidden_layers=2,
        num_attention_heads=2,
        hidden_size=32,
        vocab_size=10,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 100.0,
            "partial_rotary_factor": 0.5,
            "factor": 4.0,
            "low_freq_factor": 0.25,
            "high_freq_factor": 1.25,
            "original_max_position_embeddings": 8,
        },
    ),
    dict(
        num_hidden_layers=1,
        num_attention_heads=2,
        hidden_size=32,
        vocab_size=10,
        use_parallel_residual=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 100.0,
            "partial_rotary_factor": 0.5,
            "factor": 4.0,
            "original_max_position_embeddings": 4,
        },
    ),
]


@contextmanager
def float64() -> Iterator[pytest.MonkeyPatch]:
    """HF's GPT-NeoX with its rotary angles and eager softmax in float64."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modeling_gpt_neox.GPTNeoXRotaryEmbedding, "forward", rotary_float64)
        mp.setattr(modeling_gpt_neox, "eager_attention_forward", eager_float64)
        yield mp


def neox(shape: dict[str, Any], seed: int) -> GPTNeoXForCausalLM:
    # GPTNeoXConfig's own intermediate_size is 24,576: Pythia's 4·hidden unless given
    shape = {"intermediate_size": 4 * shape["hidden_size"], **shape}
    config = GPTNeoXConfig(
        bos_token_id=None, eos_token_id=None, attn_implementation="eager", **shape
    )
    return draw_parameters(GPTNeoXForCausalLM(config), seed)


def to_config(model: GPTNeoXForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """The mapping, as nested config data with the weights in the YAML's fused form."""
    c, p = model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    vocab = vocab_of(model)
    H, d = c.num_attention_heads, c.hidden_size
    dk = d // H
    rope = dict(c.rope_parameters)

    def norm(name: str) -> dict[str, Any]:
        return {"gamma": p[f"{name}.weight"].tolist(), "beta": p[f"{name}.bias"].tolist()}

    def bias(name: str) -> dict[str, Any]:
        return {"b": p[name].tolist()} if name in p else {}

    layers = []
    for l in range(c.num_hidden_layers):
        h = f"gpt_neox.layers.{l}"
        W = p[f"{h}.attention.query_key_value.weight"].reshape(H, 3, dk, d)
        attn: dict[str, Any] = {}
        for i, x in enumerate("qkv"):  # [H, d_k, d] -> columns h·d_k.. of [d, H·d_k]
            attn[f"W_{x}"] = W[:, i].reshape(H * dk, d).T.tolist()
        if c.attention_bias:
            b = p[f"{h}.attention.query_key_value.bias"].reshape(H, 3, dk)
            for i, x in enumerate("qkv"):
                attn[f"b_{x}"] = b[:, i].reshape(H * dk).tolist()
            attn["b_o"] = p[f"{h}.attention.dense.bias"].tolist()
        attn["W_o"] = p[f"{h}.attention.dense.weight"].T.tolist()
        attn["norm"] = norm(f"{h}.input_layernorm")
        ffn = {
            "W_1": p[f"{h}.mlp.dense_h_to_4h.weight"].T.tolist(),
            "b_1": p[f"{h}.mlp.dense_h_to_4h.bias"].tolist(),
            "W_2": p[f"{h}.mlp.dense_4h_to_h.weight"].T.tolist(),
            "b_2": p[f"{h}.mlp.dense_4h_to_h.bias"].tolist(),
            "norm": norm(f"{h}.post_attention_layernorm"),
        }
        layers.append({"self_attn": attn, "ffn": ffn})
    embed = p["gpt_neox.embed_in.weight"]
    scaling = rope_scaling({k: v for k, v in rope.items() if k != "partial_rotary_factor"})
    return {
        "model": {
            "d_model": d,
            "n_heads": H,
            "d_ff": c.intermediate_size,
            "encoder_layers": 0,
            "decoder_layers": c.num_hidden_layers,
            "positional": "rope",
            "rope_pairs": "halves",
            "rope_dims": int(dk * rope["partial_rotary_factor"]),
            "pe_base": rope["rope_theta"],
            **({"rope_scaling": scaling} if scaling else {}),
            "norm_position": "pre",
            "parallel": "separate" if c.use_parallel_residual else "none",
            "norm_eps": c.layer_norm_eps,
            "final_norm": True,
            "activation": "gelu",
        },
        "vocab": vocab,
        "embeddings": {t: embed[i].tolist() for i, t in enumerate(vocab)},
        "target": [vocab[i] for i in prompt],
        "weights": {
            "decoder": layers,
            "decoder_final_norm": norm("gpt_neox.final_layer_norm"),
            "output": {"W": p["lm_head.weight"].T.tolist(), **bias("lm_head.bias")},
        },
    }


def hf_outputs(model: GPTNeoXForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    """GPT-NeoX's values under the trace-tf step each one is, in float64."""
    with float64():
        return common_outputs(model, prompt, model.gpt_neox.final_layer_norm)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_gpt_neox(
    shape: dict[str, Any], seed: int
) -> None:
    model = neox(shape, seed)
    prompt = prompt_for(model, seed, 9)
    expected = hf_outputs(model, prompt)
    n, H = model.config.num_hidden_layers, model.config.num_attention_heads
    assert len(expected) == 2 + n * (1 + H) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


@pytest.mark.parametrize("factor", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_and_partial_rotary_each_as_gpt_neox(parallel: bool, factor: float) -> None:
    """use_parallel_residual on and off, rotary_ndims 2, 4 and 8 of head_size 8."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": factor}
    shape = dict(
        num_hidden_layers=2,
        num_attention_heads=2,
        hidden_size=16,
        vocab_size=12,
        use_parallel_residual=parallel,
        rope_parameters=rope,
    )
    model = neox(shape, 7)
    prompt = prompt_for(model, 7, 7)
    raw = to_config(model, prompt)
    assert raw["model"]["rope_dims"] == int(8 * factor)
    assert_matches(hf_outputs(model, prompt), traced(raw).value)


def sequential(raw: dict[str, Any]) -> None:
    """The layers in sequence, not side by side (use_parallel_residual read wrongly)."""
    raw["model"]["parallel"] = "none"


def every_column_turned(raw: dict[str, Any]) -> None:
    """RoPE over all of head_size, not rotary_ndims."""
    raw["model"].pop("rope_dims")


def qkv_contiguous(raw: dict[str, Any]) -> None:
    """q, k, v read as three contiguous thirds (GPT-2's c_attn), not per head interleaved."""
    for layer in raw["weights"]["decoder"]:
        a = layer["self_attn"]
        W = np.concatenate([np.asarray(a[f"W_{x}"]) for x in "qkv"], axis=1)
        H = raw["model"]["n_heads"]
        per_head = W.reshape(W.shape[0], 3, H, -1).transpose(0, 2, 1, 3).reshape(W.shape)
        for i, x in enumerate("qkv"):
            a[f"W_{x}"] = np.split(per_head, 3, axis=1)[i].tolist()


def adjacent(raw: dict[str, Any]) -> None:
    raw["model"]["rope_pairs"] = "adjacent"


@pytest.mark.parametrize("mutate", [sequential, every_column_turned, qkv_contiguous, adjacent])
def test_the_comparison_catches_a_wrong_mapping(mutate: Callable[[dict[str, Any]], None]) -> None:
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    shape = dict(SHAPES[0], num_hidden_layers=2, rope_parameters=rope)
    model = neox(shape, 3)  # parallel, rotary_ndims 4 of 8 (2 would pair alike both ways)
    prompt = prompt_for(model, 3, 6)
    raw = to_config(model, prompt)
    mutate(raw)
    with pytest.raises(AssertionError):
        assert_matches(hf_outputs(model, prompt), traced(raw).value)


def test_frequencies_over_head_size_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine turning the rotary columns at rope_theta^(−2i/head_size), not over
    rotary_ndims, disagrees with GPT-NeoX."""
    model = neox(SHAPES[1], 4)  # rotary_ndims 4 of head_size 8
    prompt = prompt_for(model, 4, 6)
    expected = hf_outputs(model, prompt)
    raw = to_config(model, prompt)
    assert_matches(expected, traced(raw).value)  # (as it is: equal)
    right = ops.rope_angles
    monkeypatch.setattr(ops, "rope_angles", lambda p, d, b, s=None: right(p, 8, b, s)[:, : d // 2])
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(raw).value)


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[1], SHAPES[4]], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_gpt_neox_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    assert_greedy_matches(neox(shape, 5), to_config, tmp_path, float64)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's GPT-NeoX code, after GPT-2's (its Quoted), as printed: every value as
    GPT-NeoX computes it, and greedy generate as its own; then its functions convert every
    default-RoPE test model (the mapping written again, independently of to_config)."""
    monkeypatch.chdir(tmp_path)
    gpt2 = run_readme("From Hugging Face GPT-2")
    scope = assert_recipe_runs(
        "From Hugging Face GPT-NeoX (Pythia)", "neox", float64, hf_outputs, gpt2
    )
    for n, shape in enumerate(SHAPES[:4]):
        model = neox(shape, 9 + n)
        prompt, vocab = prompt_for(model, 9 + n, 6), vocab_of(model)
        np.savez("m.npz", **scope["neox_arrays"](model, vocab))
        config = scope["neox_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
        Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        assert_matches(hf_outputs(model, prompt), decode_json("m.yaml"))
