"""The engine against Hugging Face's BLOOM (transformers' BloomForCausalLM, float64, eval):
ALiBi (`model.positional: alibi`) against the model it comes from.

Small random BLOOMs, every parameter drawn anew (tests/hf_common.py's draw_parameters),
are converted here by the mapping written below (nested YAML data, fused form), and
checked to 1e-12: every hidden state, every head's attention weights
(`output_attentions`), the logits, and `generate --greedy` against
`generate(do_sample=False)`.

The conventions mapped:
- `query_key_value` (3·hidden × hidden, out x in) holds, per head h, the rows
  h·3·d_k .. : d_k of q, then d_k of k, then d_k of v (BloomAttention._reshape's
  view(..., n_head, 3, head_dim)): each transposed into column block h of W_q, W_k, W_v.
- `word_embeddings_layernorm` is `weights.decoder_embed_norm` (`model.embed_norm`), so
  `hidden_states[0]` is `decoder.embed_norm`; `ln_f` the final norm; `lm_head` is tied.
- BLOOM adds m·j where trace-tf adds −m·(i − j): the same softmax (a per-row constant).
- Two float32 internals of HF's BLOOM are replaced by their float64 formulas under
  `float64` below: its softmax (`F.softmax(..., dtype=torch.float32)`) and its GELU's
  constant 0.79788456 (√(2/π) rounded to 8 digits, 1e-9 from trace-tf's exact one).
"""

from __future__ import annotations

import math
import types
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
    prompt_for,
    run_readme,
    traced,
    vocab_of,
)
from hf_common import hf_outputs as common_outputs
from transformers import BloomConfig, BloomForCausalLM
from transformers.models.bloom import modeling_bloom

# n_layer, n_head, hidden_size, vocab, and BloomConfig's other options
SHAPES: list[dict[str, Any]] = [
    dict(n_layer=1, n_head=2, hidden_size=8, vocab_size=10),
    dict(n_layer=2, n_head=3, hidden_size=12, vocab_size=13, layer_norm_epsilon=1e-3),
    dict(n_layer=2, n_head=4, hidden_size=16, vocab_size=11, layer_norm_epsilon=0.1),
]


class _Float64F(types.ModuleType):
    """torch.nn.functional whose softmax keeps the input's dtype (BLOOM asks float32)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.nn.functional, name)

    @staticmethod
    def softmax(x: torch.Tensor, dim: int, dtype: Any = None) -> torch.Tensor:
        return torch.nn.functional.softmax(x, dim=dim)


def gelu_exact_constant(x: torch.Tensor) -> torch.Tensor:
    """bloom_gelu_forward with √(2/π) in full, as trace-tf's gelu_tanh."""
    return x * 0.5 * (1.0 + torch.tanh(math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x * x)))


@contextmanager
def float64() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modeling_bloom, "F", _Float64F("F"))
        mp.setattr(modeling_bloom, "bloom_gelu_forward", gelu_exact_constant)
        yield mp


def bloom(shape: dict[str, Any], seed: int) -> BloomForCausalLM:
    config = BloomConfig(bos_token_id=None, eos_token_id=None, attn_implementation="eager", **shape)
    return draw_parameters(BloomForCausalLM(config), seed)


def to_config(model: BloomForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """The mapping, as nested config data with the weights in the YAML's fused form."""
    c, p = model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    vocab = vocab_of(model)
    H, d = c.n_head, c.hidden_size
    dk = d // H

    def norm(name: str) -> dict[str, Any]:
        return {"gamma": p[f"{name}.weight"].tolist(), "beta": p[f"{name}.bias"].tolist()}

    layers = []
    for l in range(c.n_layer):
        h = f"transformer.h.{l}"
        W = p[f"{h}.self_attention.query_key_value.weight"].reshape(H, 3, dk, d)
        b = p[f"{h}.self_attention.query_key_value.bias"].reshape(H, 3, dk)
        attn: dict[str, Any] = {}
        for i, x in enumerate("qkv"):  # [H, d_k, d] -> columns h·d_k.. of [d, H·d_k]
            attn[f"W_{x}"] = W[:, i].reshape(H * dk, d).T.tolist()
            attn[f"b_{x}"] = b[:, i].reshape(H * dk).tolist()
        attn |= {
            "W_o": p[f"{h}.self_attention.dense.weight"].T.tolist(),
            "b_o": p[f"{h}.self_attention.dense.bias"].tolist(),
            "norm": norm(f"{h}.input_layernorm"),
        }
        ffn = {
            "W_1": p[f"{h}.mlp.dense_h_to_4h.weight"].T.tolist(),
            "b_1": p[f"{h}.mlp.dense_h_to_4h.bias"].tolist(),
            "W_2": p[f"{h}.mlp.dense_4h_to_h.weight"].T.tolist(),
            "b_2": p[f"{h}.mlp.dense_4h_to_h.bias"].tolist(),
            "norm": norm(f"{h}.post_attention_layernorm"),
        }
        layers.append({"self_attn": attn, "ffn": ffn})
    wte = p["transformer.word_embeddings.weight"]
    return {
        "model": {
            "d_model": d,
            "n_heads": H,
            "d_ff": 4 * d,
            "encoder_layers": 0,
            "decoder_layers": c.n_layer,
            "positional": "alibi",
            "norm_position": "pre",
            "norm_eps": c.layer_norm_epsilon,
            "embed_norm": True,
            "final_norm": True,
            "activation": "gelu_tanh",
            "tie_embeddings": True,
        },
        "vocab": vocab,
        "embeddings": {t: wte[i].tolist() for i, t in enumerate(vocab)},
        "target": [vocab[i] for i in prompt],
        "weights": {
            "decoder": layers,
            "decoder_embed_norm": norm("transformer.word_embeddings_layernorm"),
            "decoder_final_norm": norm("transformer.ln_f"),
        },
    }


def hf_outputs(model: BloomForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    """BLOOM's values under the trace-tf step each one is (hidden_states[0] is after
    word_embeddings_layernorm: decoder.embed_norm), in float64."""
    with float64():
        values = common_outputs(model, prompt, model.transformer.ln_f)
    values["decoder.embed_norm"] = values.pop("decoder.input")
    return values


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_bloom(shape: dict[str, Any], seed: int) -> None:
    model = bloom(shape, seed)
    prompt = prompt_for(model, seed, 6)
    expected = hf_outputs(model, prompt)
    assert len(expected) == 2 + model.config.n_layer * (1 + model.config.n_head) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


def three_heads_slopes(raw: dict[str, Any]) -> None:
    """4 heads given the slopes of 3 (and the 4th's): another H's."""
    raw["model"]["n_heads"] = 3  # changes d_k too: refused, or wrong


def no_alibi(raw: dict[str, Any]) -> None:
    raw["model"]["positional"] = "none"


def qkv_contiguous(raw: dict[str, Any]) -> None:
    """q, k, v read as three contiguous thirds (GPT-2's c_attn), not per head interleaved."""
    for layer in raw["weights"]["decoder"]:
        a = layer["self_attn"]
        W = np.concatenate([np.asarray(a[f"W_{x}"]) for x in "qkv"], axis=1)
        H = raw["model"]["n_heads"]
        per_head = W.reshape(W.shape[0], 3, H, -1).transpose(0, 2, 1, 3).reshape(W.shape)
        for i, x in enumerate("qkv"):
            a[f"W_{x}"] = np.split(per_head, 3, axis=1)[i].tolist()


@pytest.mark.parametrize("mutate", [no_alibi, qkv_contiguous])
def test_the_comparison_catches_a_wrong_mapping(mutate: Callable[[dict[str, Any]], None]) -> None:
    model = bloom(SHAPES[2], 3)
    prompt = prompt_for(model, 3, 6)
    raw = to_config(model, prompt)
    mutate(raw)
    with pytest.raises(AssertionError):
        assert_matches(hf_outputs(model, prompt), traced(raw).value)


@pytest.mark.parametrize("variant", ["reversed", "other_H"])
def test_wrong_slopes_fail(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine with the sign of B reversed, or the slopes of another H, disagrees."""
    from trace_tf import ops

    model = bloom(SHAPES[1], 4)  # 3 heads: slopes 1/16, 1/256, 1/4
    prompt = prompt_for(model, 4, 6)
    expected = hf_outputs(model, prompt)
    right = ops.alibi_slopes
    if variant == "reversed":
        monkeypatch.setattr(ops, "alibi_slopes", lambda H: -right(H))
    else:
        monkeypatch.setattr(ops, "alibi_slopes", lambda H: right(H + 1)[:H])
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(to_config(model, prompt)).value)


@pytest.mark.parametrize("shape", SHAPES[1:], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_bloom_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    assert_greedy_matches(bloom(shape, 5), to_config, tmp_path, float64)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's BLOOM code, after GPT-2's (its Quoted), as printed: every value as BLOOM
    computes it, and greedy generate as BLOOM's; then its functions convert every test
    model (the mapping written again, independently of to_config above)."""
    monkeypatch.chdir(tmp_path)
    gpt2 = run_readme("From Hugging Face GPT-2")
    scope = assert_recipe_runs("From Hugging Face BLOOM", "bloom", float64, hf_outputs, gpt2)
    for n, shape in enumerate(SHAPES):
        model = bloom(shape, 9 + n)
        prompt, vocab = prompt_for(model, 9 + n, 6), vocab_of(model)
        np.savez("m.npz", **scope["bloom_arrays"](model, vocab))
        config = scope["bloom_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
        Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        assert_matches(hf_outputs(model, prompt), decode_json("m.yaml"))
