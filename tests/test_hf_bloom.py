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
    largest_error,
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
# H >= 9, where BLOOM's float32 slopes are not the paper's float64 ones (12: its last 4;
# 16: every one)
MANY_HEADS: list[dict[str, Any]] = [
    dict(n_layer=2, n_head=12, hidden_size=24, vocab_size=13),
    dict(n_layer=1, n_head=16, hidden_size=32, vocab_size=11, layer_norm_epsilon=1e-3),
]
_get_alibi_slopes = modeling_bloom._get_alibi_slopes  # HF's, float32


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


def slopes_float64(num_heads: int, device: Any) -> torch.Tensor:
    """HF's float32 slopes held in float64, so that BLOOM's bias m·j is a float64 product
    (slopes[:, None, None] * arange(...): a float32 one otherwise); the slopes the same."""
    return _get_alibi_slopes(num_heads, device).double()


@contextmanager
def float64(alibi: bool = True) -> Iterator[pytest.MonkeyPatch]:
    """HF's float32 internals computed in float64: the softmax, GELU's constant and (with
    `alibi`) the bias m·j, whose slopes stay BLOOM's float32 numbers."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modeling_bloom, "F", _Float64F("F"))
        mp.setattr(modeling_bloom, "bloom_gelu_forward", gelu_exact_constant)
        if alibi:
            mp.setattr(modeling_bloom, "_get_alibi_slopes", slopes_float64)
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
            "alibi_slopes": _get_alibi_slopes(H, "cpu").double().tolist(),  # float32's
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


def hf_outputs(
    model: BloomForCausalLM, prompt: list[int], alibi: bool = True
) -> dict[str, np.ndarray]:
    """BLOOM's values under the trace-tf step each one is (hidden_states[0] is after
    word_embeddings_layernorm: decoder.embed_norm), in float64 (its bias m·j a float32
    product unless `alibi`)."""
    with float64(alibi):
        values = common_outputs(model, prompt, model.transformer.ln_f)
    values["decoder.embed_norm"] = values.pop("decoder.input")
    return values


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES + MANY_HEADS, ids=shape_id)
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
    del raw["model"]["alibi_slopes"]


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
    raw = to_config(model, prompt)
    if variant == "reversed":
        right = ops.alibi_bias
        monkeypatch.setattr(ops, "alibi_bias", lambda *a, **k: -right(*a, **k))
    else:
        raw["model"]["alibi_slopes"] = _get_alibi_slopes(4, "cpu")[:3].tolist()
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(raw).value)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_up_to_8_heads_the_paper_s_rule_is_bloom_s(shape: dict[str, Any]) -> None:
    """Without alibi_slopes, the paper's slopes: BLOOM's float32 ones are the same numbers
    for H <= 8 (powers of two), so BLOOM to 1e-12 as with them."""
    model = bloom(shape, 7)
    prompt = prompt_for(model, 7, 6)
    raw = to_config(model, prompt)
    del raw["model"]["alibi_slopes"]
    assert_matches(hf_outputs(model, prompt), traced(raw).value)


@pytest.mark.parametrize("shape", MANY_HEADS, ids=shape_id)
def test_the_paper_s_float64_slopes_are_not_bloom_s_from_9_heads(shape: dict[str, Any]) -> None:
    """Without alibi_slopes (the paper's float64 slopes) BLOOM of 12 or 16 heads differs
    by about 1e-8 (its slopes' float32 rounding, up to 3e-7 of a slope): over 1e-12, under
    1e-6; with BLOOM's own slopes and its float32 product m·j as BLOOM computes it (not
    replaced by the float64 one), the product's rounding alone, of the same size."""
    model = bloom(shape, 6)
    prompt = prompt_for(model, 6, 6)
    raw = to_config(model, prompt)
    del raw["model"]["alibi_slopes"]
    rule = largest_error(hf_outputs(model, prompt), traced(raw).value)
    assert 1e-10 < rule < 1e-6
    as_bloom = largest_error(
        hf_outputs(model, prompt, alibi=False), traced(to_config(model, prompt)).value
    )
    assert 1e-10 < as_bloom < 1e-6


@torch.no_grad()
def test_a_pad_is_a_position_in_trace_tf_not_in_bloom() -> None:
    """BLOOM given an attention_mask numbers only the unmasked tokens (build_alibi_tensor's
    cumsum): with a pad between tokens, its logits after the pad are trace-tf's for the
    sequence without the pad, and not those of trace-tf's masked pad (README's ALiBi)."""
    model = bloom(SHAPES[2], 8)
    prompt, pad = [3, 1, 4, 0, 5, 9], 3  # token 0 at position 3, masked
    mask = torch.ones(1, len(prompt), dtype=torch.long)
    mask[0, pad] = 0
    with float64():
        logits = model(torch.tensor([prompt]), attention_mask=mask).logits[0].numpy()
    without = traced(to_config(model, prompt[:pad] + prompt[pad + 1 :])).value("logits")
    np.testing.assert_allclose(logits[pad + 1 :], without[pad:], rtol=1e-12, atol=1e-12)
    raw = to_config(model, prompt)
    raw["tokens"] = {"pad": raw["vocab"][0]}
    masked = traced(raw).value("logits")
    np.testing.assert_allclose(logits[:pad], masked[:pad], rtol=1e-12, atol=1e-12)
    assert np.abs(logits[pad + 1 :] - masked[pad + 1 :]).max() > 1e-4


@pytest.mark.parametrize("shape", SHAPES[1:] + MANY_HEADS[:1], ids=shape_id)
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
    for n, shape in enumerate(SHAPES + MANY_HEADS):
        model = bloom(shape, 9 + n)
        prompt, vocab = prompt_for(model, 9 + n, 6), vocab_of(model)
        np.savez("m.npz", **scope["bloom_arrays"](model, vocab))
        config = scope["bloom_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
        Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        assert_matches(hf_outputs(model, prompt), decode_json("m.yaml"))
