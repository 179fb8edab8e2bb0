"""The engine against Hugging Face's Phi (transformers' PhiForCausalLM, Phi-1, 1.5 and 2;
float64, eval): parallel layers reading one shared norm (`model.parallel: shared`) with
partial rotary (`model.rope_dims`), the shared-norm check of tests/test_hf_gpt_neox.py.

Small random Phis, every parameter drawn anew (hf_common.draw_parameters), are converted
here (nested YAML data, fused form) and checked to 1e-12: every hidden state, every
head's attention weights, the logits, and `generate --greedy` against
`generate(do_sample=False)`.

The conventions mapped:
- PhiDecoderLayer: attn(input_layernorm(x)) + mlp(input_layernorm(x)) + x, one norm
  both read: `parallel: shared`, its weights `self_attn.norm` (no `ffn.norm`).
- `rotary_ndims = int(head_dim · partial_rotary_factor)` (Phi-2's 0.4) is `rope_dims`,
  turned by `rotate_half` (`rope_pairs: halves`) within the rotary part.
- q_proj, k_proj, v_proj, dense, fc1, fc2 and lm_head all with biases; `gelu_new` (the
  tanh approximation) is `gelu_tanh`; `final_layernorm` the final norm; untied output.
- As for LLaMA (hf_common): rotary angles and eager softmax replaced by their float64
  formulas; the K/V heads of `num_key_value_heads` repeated per group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import shape_id
from hf_common import (
    assert_greedy_matches,
    assert_matches,
    draw_parameters,
    eager_float64,
    prompt_for,
    rotary_float64,
    traced,
    vocab_of,
)
from hf_common import hf_outputs as common_outputs
from transformers import PhiConfig, PhiForCausalLM
from transformers.models.phi import modeling_phi


def rope(factor: float, theta: float = 10000.0) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": factor}


# num_hidden_layers, num_attention_heads, hidden_size, vocab, and PhiConfig's others
SHAPES: list[dict[str, Any]] = [
    dict(num_hidden_layers=1, num_attention_heads=2, hidden_size=20, vocab_size=10,
         intermediate_size=24, rope_parameters=rope(0.4)),  # Phi-2's: 4 of head_dim 10
    dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=16, vocab_size=12,
         intermediate_size=20, rope_parameters=rope(0.5, 100.0), layer_norm_eps=1e-3),
    dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
         vocab_size=11, intermediate_size=16, rope_parameters=rope(1.0), layer_norm_eps=0.1),
]  # fmt: skip


@contextmanager
def float64() -> Iterator[pytest.MonkeyPatch]:
    """HF's Phi with its rotary angles and eager softmax in float64."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modeling_phi.PhiRotaryEmbedding, "forward", rotary_float64)
        mp.setattr(modeling_phi, "eager_attention_forward", eager_float64)
        yield mp


def phi(shape: dict[str, Any], seed: int) -> PhiForCausalLM:
    config = PhiConfig(bos_token_id=None, eos_token_id=None, attn_implementation="eager", **shape)
    return draw_parameters(PhiForCausalLM(config), seed)


def to_config(model: PhiForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """The mapping, as nested config data with the weights in the YAML's fused form."""
    c, p = model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    vocab = vocab_of(model)
    H, d = c.num_attention_heads, c.hidden_size
    dk = d // H

    layers = []
    for l in range(c.num_hidden_layers):
        h = f"model.layers.{l}"
        attn: dict[str, Any] = {}
        for x in "qkv":  # out x in, head h in rows h·d_k..: transposed, the fused form
            attn[f"W_{x}"] = p[f"{h}.self_attn.{x}_proj.weight"].T.tolist()
            attn[f"b_{x}"] = p[f"{h}.self_attn.{x}_proj.bias"].tolist()
        attn["W_o"] = p[f"{h}.self_attn.dense.weight"].T.tolist()
        attn["b_o"] = p[f"{h}.self_attn.dense.bias"].tolist()
        attn["norm"] = {
            "gamma": p[f"{h}.input_layernorm.weight"].tolist(),
            "beta": p[f"{h}.input_layernorm.bias"].tolist(),
        }
        ffn = {
            "W_1": p[f"{h}.mlp.fc1.weight"].T.tolist(),
            "b_1": p[f"{h}.mlp.fc1.bias"].tolist(),
            "W_2": p[f"{h}.mlp.fc2.weight"].T.tolist(),
            "b_2": p[f"{h}.mlp.fc2.bias"].tolist(),
        }  # no norm: the FFN reads input_layernorm's
        layers.append({"self_attn": attn, "ffn": ffn})
    embed = p["model.embed_tokens.weight"]
    rp = c.rope_parameters
    return {
        "model": {
            "d_model": d,
            "n_heads": H,
            "n_kv_heads": c.num_key_value_heads,
            "d_ff": c.intermediate_size,
            "encoder_layers": 0,
            "decoder_layers": c.num_hidden_layers,
            "positional": "rope",
            "rope_pairs": "halves",
            "rope_dims": int(dk * rp["partial_rotary_factor"]),
            "pe_base": rp["rope_theta"],
            "norm_position": "pre",
            "parallel": "shared",
            "norm_eps": c.layer_norm_eps,
            "final_norm": True,
            "activation": "gelu_tanh",
        },
        "vocab": vocab,
        "embeddings": {t: embed[i].tolist() for i, t in enumerate(vocab)},
        "target": [vocab[i] for i in prompt],
        "weights": {
            "decoder": layers,
            "decoder_final_norm": {
                "gamma": p["model.final_layernorm.weight"].tolist(),
                "beta": p["model.final_layernorm.bias"].tolist(),
            },
            "output": {"W": p["lm_head.weight"].T.tolist(), "b": p["lm_head.bias"].tolist()},
        },
    }


def hf_outputs(model: PhiForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    with float64():
        return common_outputs(model, prompt, model.model.final_layernorm)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_phi(shape: dict[str, Any], seed: int) -> None:
    model = phi(shape, seed)
    prompt = prompt_for(model, seed, 8)
    expected = hf_outputs(model, prompt)
    n, H = model.config.num_hidden_layers, model.config.num_attention_heads
    assert len(expected) == 2 + n * (1 + H) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


def separate_norms(raw: dict[str, Any]) -> None:
    """A norm each (GPT-NeoX's), the FFN's left at γ 1, β 0: not the shared one."""
    raw["model"]["parallel"] = "separate"


def sequential(raw: dict[str, Any]) -> None:
    """The sublayers in sequence, the FFN's norm a copy of the attention's."""
    raw["model"]["parallel"] = "none"
    for layer in raw["weights"]["decoder"]:
        layer["ffn"]["norm"] = layer["self_attn"]["norm"]


def every_column_turned(raw: dict[str, Any]) -> None:
    raw["model"].pop("rope_dims")


@pytest.mark.parametrize("mutate", [separate_norms, sequential, every_column_turned])
def test_the_comparison_catches_a_wrong_mapping(mutate: Callable[[dict[str, Any]], None]) -> None:
    model = phi(SHAPES[0], 3)
    prompt = prompt_for(model, 3, 6)
    raw = to_config(model, prompt)
    mutate(raw)
    with pytest.raises(AssertionError):
        assert_matches(hf_outputs(model, prompt), traced(raw).value)


@pytest.mark.parametrize("shape", SHAPES[:2], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_phi_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    assert_greedy_matches(phi(shape, 5), to_config, tmp_path, float64)
