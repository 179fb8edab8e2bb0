"""The engine against Hugging Face's Falcon (transformers' FalconForCausalLM, float64, eval)
in its three config-driven forms: the new decoder architecture (Falcon 40B/180B: a norm
each, `parallel: separate`, grouped-query), the old 7B form (one shared norm,
`parallel: shared`, multi-query) and Falcon-RW (sequential pre-norm with ALiBi).

Small random Falcons, every parameter drawn anew (hf_common.draw_parameters, every
LayerNorm's γ near 1), are converted here by the mapping written below (nested YAML
data, fused form), and checked to 1e-12: every hidden state, every head's attention
weights (`output_attentions`), the logits, and `generate --greedy` against
`generate(do_sample=False)`.

The conventions mapped:
- `query_key_value` (out x in) has three layouts (FalconAttention._split_heads):
  new_decoder_architecture: per K/V group g (num_kv_heads of them), H/num_kv_heads
  query heads, then g's key, then g's value (`view(..., -1, H/G + 2, head_dim)`);
  multi_query: the H query heads, then one key, one value (`n_kv_heads: 1`);
  otherwise per head h its q, k, v (`view(..., H, 3, head_dim)`, BLOOM's).
- new_decoder_architecture: attn(ln_attn(x)) + mlp(ln_mlp(x)) + x, `parallel: separate`
  (with num_ln_in_parallel_attn 1, one input_layernorm: `shared`); parallel_attn: one
  input_layernorm both read, `shared`; neither: the sequential pre-norm layer.
- RoPE by `rotate_half` over the whole head (`rope_pairs: halves`), or with `alibi`
  ALiBi: Falcon adds m·j to the raw scores and scales the sum by 1/√d_k, so its slopes
  are m/√d_k in trace-tf's `S/√d_k − m'·(i − j)` (`model.alibi_slopes`), not BLOOM's m.
- `bias` on every linear layer or none; exact GELU; `ln_f` the final norm; `lm_head`
  tied to `word_embeddings` (or untied, no bias).
- HF's float32 internals are replaced under `float64` below: its rotary angles (LLaMA's
  rotary_float64, inv_freq in torch.float); and, for ALiBi, its eager attention given
  a zero `alibi` argument: FalconModel already folds alibi/√d_k into the attention mask,
  which the eager path adds to (scores + alibi)/√d_k, counting the bias twice (SDPA's
  path, Falcon's default, counts it once; both compared below). Falcon's bias is built
  from bfloat16 slopes times the positions in bfloat16 (build_alibi_tensor), exact for
  up to 8 heads (powers of two); for more, `float64(alibi_product=True)` computes the
  product in float64 from the same bfloat16 slopes, as test_hf_bloom does for BLOOM's.
"""

from __future__ import annotations

import math
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
    rotary_float64,
    run_readme,
    traced,
    vocab_of,
)
from hf_common import hf_outputs as common_outputs
from transformers import FalconConfig, FalconForCausalLM
from transformers.models.falcon import modeling_falcon

NORMS = ("norm.weight", "ln_attn.weight", "ln_mlp.weight", "ln_f.weight")
NEW = dict(new_decoder_architecture=True, parallel_attn=True, alibi=False)  # 40B, 180B
OLD_7B = dict(new_decoder_architecture=False, multi_query=True, parallel_attn=True, alibi=False)
RW = dict(new_decoder_architecture=False, multi_query=False, parallel_attn=False, alibi=True)

# the form, num_hidden_layers, num_attention_heads, hidden_size, vocab, and others
SHAPES: list[dict[str, Any]] = [
    dict(NEW, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2, hidden_size=32,
         vocab_size=10),
    dict(NEW, num_hidden_layers=1, num_attention_heads=4, num_kv_heads=1, hidden_size=16,
         vocab_size=11, bias=True, layer_norm_epsilon=1e-3, tie_word_embeddings=False),
    dict(NEW, num_hidden_layers=2, num_attention_heads=6, num_kv_heads=3, hidden_size=24,
         vocab_size=9, num_ln_in_parallel_attn=1, rope_parameters={"rope_type": "default",
         "rope_theta": 100.0}),  # one norm
    dict(OLD_7B, num_hidden_layers=2, num_attention_heads=2, hidden_size=16, vocab_size=12),
    dict(OLD_7B, num_hidden_layers=2, num_attention_heads=3, hidden_size=24, vocab_size=10,
         bias=True, ffn_hidden_size=20, layer_norm_epsilon=0.1),
    dict(RW, num_hidden_layers=2, num_attention_heads=4, hidden_size=16, vocab_size=11,
         bias=True),  # d_k 4: √d_k 2
    dict(RW, num_hidden_layers=2, num_attention_heads=3, hidden_size=24, vocab_size=13,
         layer_norm_epsilon=1e-3, tie_word_embeddings=False),  # d_k 8
    dict(num_hidden_layers=1, num_attention_heads=2, hidden_size=16, vocab_size=10,
         new_decoder_architecture=False, multi_query=False, parallel_attn=False,
         bias=True),  # sequential, RoPE, per-head interleaved q, k, v
]  # fmt: skip
# 9 heads or more: Falcon's bfloat16 slopes no longer powers of two
MANY_HEADS = dict(RW, num_hidden_layers=2, num_attention_heads=12, hidden_size=48, vocab_size=11)

_eager_forward = modeling_falcon.FalconAttention.forward
_build_alibi_tensor = modeling_falcon.build_alibi_tensor


def alibi_once(self: Any, *args: Any, alibi: Any = None, **kwargs: Any) -> Any:
    """FalconAttention.forward given a zero `alibi`: ALiBi's bias counted once, from the
    attention mask FalconModel folds alibi/√d_k into, as SDPA's path does."""
    return _eager_forward(self, *args, alibi=None if alibi is None else 0 * alibi, **kwargs)


def alibi_product_float64(mask: torch.Tensor, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """build_alibi_tensor with the same bfloat16 slopes (its bias at position 1) but their
    product with the positions in float64, not rounded to bfloat16."""
    slopes = _build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), num_heads, torch.float64)
    positions = ((mask.cumsum(dim=-1) - 1) * mask)[:, None, :]
    alibi = slopes[:, 0, 1][:, None] * positions.double()
    return alibi.reshape(-1, 1, mask.shape[1]).to(dtype)


@contextmanager
def float64(alibi_product: bool = False) -> Iterator[pytest.MonkeyPatch]:
    """HF's Falcon with its rotary angles in float64 and ALiBi's bias counted once (with
    `alibi_product`, its bias m·j a float64 product of the bfloat16 slopes)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modeling_falcon.FalconRotaryEmbedding, "forward", rotary_float64)
        mp.setattr(modeling_falcon.FalconAttention, "forward", alibi_once)
        if alibi_product:
            mp.setattr(modeling_falcon, "build_alibi_tensor", alibi_product_float64)
        yield mp


def falcon(shape: dict[str, Any], seed: int, attn: str = "eager") -> FalconForCausalLM:
    config = FalconConfig(bos_token_id=None, eos_token_id=None, attn_implementation=attn, **shape)
    return draw_parameters(FalconForCausalLM(config), seed, norms=NORMS)


def split_qkv(c: FalconConfig, fused: np.ndarray) -> tuple[np.ndarray, ...]:
    """query_key_value's rows (or bias) as W_q, W_k, W_v's rows: query head h in rows
    h·d_k.., K/V head j in rows j·d_k.."""
    H, dk = c.num_attention_heads, c.hidden_size // c.num_attention_heads
    rest = fused.shape[1:]
    if c.new_decoder_architecture:  # per group: its query heads, its key, its value
        G = c.num_kv_heads
        W = fused.reshape(G, H // G + 2, dk, *rest)
        return tuple(w.reshape(-1, *rest) for w in (W[:, :-2], W[:, -2], W[:, -1]))
    if c.multi_query:  # the H query heads, then one key, one value
        W = fused.reshape(H + 2, dk, *rest)
        return W[:H].reshape(H * dk, *rest), W[H], W[H + 1]
    W = fused.reshape(H, 3, dk, *rest)  # per head: its q, k, v
    return tuple(W[:, i].reshape(H * dk, *rest) for i in range(3))


def n_kv_heads(c: FalconConfig) -> int:
    if c.new_decoder_architecture:
        return int(c.num_kv_heads)
    return 1 if c.multi_query else int(c.num_attention_heads)


def falcon_slopes(model: FalconForCausalLM) -> list[float]:
    """Falcon's ALiBi slopes in trace-tf's form: its bias at position 1 (its bfloat16
    slope m), over √d_k (Falcon scales scores + m·j together)."""
    c = model.config
    m = _build_alibi_tensor(
        torch.ones(1, 2, dtype=torch.long), c.num_attention_heads, torch.float64
    )
    return (m[:, 0, 1] / math.sqrt(c.hidden_size // c.num_attention_heads)).tolist()


def to_config(model: FalconForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """The mapping, as nested config data with the weights in the YAML's fused form."""
    c, p = model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    vocab = vocab_of(model)

    def norm(name: str) -> dict[str, Any]:
        return {"gamma": p[f"{name}.weight"].tolist(), "beta": p[f"{name}.bias"].tolist()}

    separate = c.new_decoder_architecture and c.num_ln_in_parallel_attn == 2
    layers = []
    for l in range(c.num_hidden_layers):
        h = f"transformer.h.{l}"
        attn: dict[str, Any] = {}
        ffn: dict[str, Any] = {
            "W_1": p[f"{h}.mlp.dense_h_to_4h.weight"].T.tolist(),
            "W_2": p[f"{h}.mlp.dense_4h_to_h.weight"].T.tolist(),
        }
        W = split_qkv(c, p[f"{h}.self_attention.query_key_value.weight"])
        for x, w in zip("qkv", W, strict=True):
            attn[f"W_{x}"] = w.T.tolist()
        attn["W_o"] = p[f"{h}.self_attention.dense.weight"].T.tolist()
        if c.bias:
            b = split_qkv(c, p[f"{h}.self_attention.query_key_value.bias"])
            for x, v in zip("qkv", b, strict=True):
                attn[f"b_{x}"] = v.tolist()
            attn["b_o"] = p[f"{h}.self_attention.dense.bias"].tolist()
            ffn["b_1"] = p[f"{h}.mlp.dense_h_to_4h.bias"].tolist()
            ffn["b_2"] = p[f"{h}.mlp.dense_4h_to_h.bias"].tolist()
        if separate:
            attn["norm"], ffn["norm"] = norm(f"{h}.ln_attn"), norm(f"{h}.ln_mlp")
        else:
            attn["norm"] = norm(f"{h}.input_layernorm")
            if not c.parallel_attn and not c.new_decoder_architecture:
                ffn["norm"] = norm(f"{h}.post_attention_layernorm")
        layers.append({"self_attn": attn, "ffn": ffn})
    if separate:
        parallel = "separate"
    elif c.new_decoder_architecture or c.parallel_attn:
        parallel = "shared"
    else:
        parallel = "none"
    if c.alibi:
        positions: dict[str, Any] = {"positional": "alibi", "alibi_slopes": falcon_slopes(model)}
    else:
        rp = c.rope_parameters
        positions = {"positional": "rope", "rope_pairs": "halves", "pe_base": rp["rope_theta"]}
    embed = p["transformer.word_embeddings.weight"]
    weights: dict[str, Any] = {"decoder": layers, "decoder_final_norm": norm("transformer.ln_f")}
    if not c.tie_word_embeddings:
        weights["output"] = {"W": p["lm_head.weight"].T.tolist()}
    return {
        "model": {
            "d_model": c.hidden_size,
            "n_heads": c.num_attention_heads,
            "n_kv_heads": n_kv_heads(c),
            "d_ff": c.ffn_hidden_size,
            "encoder_layers": 0,
            "decoder_layers": c.num_hidden_layers,
            **positions,
            "norm_position": "pre",
            "parallel": parallel,
            "norm_eps": c.layer_norm_epsilon,
            "final_norm": True,
            "activation": c.activation,  # "gelu": exact, as trace-tf's gelu
            "tie_embeddings": c.tie_word_embeddings,
        },
        "vocab": vocab,
        "embeddings": {t: embed[i].tolist() for i, t in enumerate(vocab)},
        "target": [vocab[i] for i in prompt],
        "weights": weights,
    }


def hf_outputs(
    model: FalconForCausalLM, prompt: list[int], alibi_product: bool = False
) -> dict[str, np.ndarray]:
    """Falcon's values under the trace-tf step each one is, in float64."""
    with float64(alibi_product):
        return common_outputs(model, prompt, model.transformer.ln_f)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_falcon(shape: dict[str, Any], seed: int) -> None:
    model = falcon(shape, seed)
    prompt = prompt_for(model, seed, 8)
    expected = hf_outputs(model, prompt)
    n, H = model.config.num_hidden_layers, model.config.num_attention_heads
    assert len(expected) == 2 + n * (1 + H) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


def test_the_drawn_models_are_not_hf_s_init() -> None:
    """Every LayerNorm's γ near 1 but not 1, β and biases nonzero: a misplaced norm or a
    dropped bias would show."""
    p = {k: v.detach() for k, v in falcon(SHAPES[1], 0).named_parameters()}
    for name in ("h.0.ln_attn.weight", "h.0.ln_mlp.weight", "ln_f.weight"):
        assert 0.05 < float((p[f"transformer.{name}"] - 1).abs().mean()) < 1
    for name in ("h.0.ln_mlp.bias", "h.0.self_attention.query_key_value.bias"):
        assert p[f"transformer.{name}"].abs().min() > 0


@pytest.mark.parametrize("shape", [SHAPES[5], SHAPES[6], SHAPES[0]], ids=shape_id)
@torch.no_grad()
def test_alibi_once_is_falcon_s_sdpa_path(shape: dict[str, Any]) -> None:
    """The eager path with alibi zeroed (what the comparison runs) is HF's SDPA path, the
    default one, to 1e-12: logits and every hidden state; HF's own eager path, which adds
    ALiBi's bias twice, is not (by far), and trace-tf is SDPA's."""
    eager, sdpa = falcon(shape, 2), falcon(shape, 2, "sdpa")
    ids = torch.tensor([prompt_for(eager, 2, 8)])
    with float64():
        once = eager(ids, output_hidden_states=True)
        by_sdpa = sdpa(ids, output_hidden_states=True)
    ours, theirs = (*once.hidden_states, once.logits), (*by_sdpa.hidden_states, by_sdpa.logits)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-12)
    with float64() as mp:
        mp.setattr(modeling_falcon.FalconAttention, "forward", _eager_forward)
        twice = eager(ids, output_hidden_states=True).logits
    if shape["alibi"]:
        assert np.abs(twice.numpy() - by_sdpa.logits.numpy()).max() > 1e-4
    else:
        np.testing.assert_allclose(twice.numpy(), by_sdpa.logits.numpy(), rtol=1e-12, atol=1e-12)
    logits = traced(to_config(eager, ids[0].tolist())).value("logits")
    np.testing.assert_allclose(logits, by_sdpa.logits[0].numpy(), rtol=1e-12, atol=1e-12)


def shared(raw: dict[str, Any]) -> None:
    """ln_attn read by both, not ln_mlp by the MLP."""
    raw["model"]["parallel"] = "shared"
    for layer in raw["weights"]["decoder"]:
        del layer["ffn"]["norm"]


def sequential(raw: dict[str, Any]) -> None:
    raw["model"]["parallel"] = "none"
    for layer in raw["weights"]["decoder"]:
        layer["ffn"].setdefault("norm", layer["self_attn"]["norm"])


def separate_norms(raw: dict[str, Any]) -> None:
    """Side by side with a norm each: RW's layer, or the 7B's with the FFN's norm left at
    γ 1, β 0, not the shared input_layernorm."""
    raw["model"]["parallel"] = "separate"


def bloom_slopes(raw: dict[str, Any]) -> None:
    """BLOOM's slopes m (added to the scaled scores), not Falcon's m/√d_k."""
    raw["model"].pop("alibi_slopes")


def no_alibi(raw: dict[str, Any]) -> None:
    raw["model"]["positional"] = "none"
    del raw["model"]["alibi_slopes"]


def adjacent(raw: dict[str, Any]) -> None:
    raw["model"]["rope_pairs"] = "adjacent"


@pytest.mark.parametrize(
    "shape, mutate",
    [
        pytest.param(SHAPES[0], shared, id="new-shared"),
        pytest.param(SHAPES[0], sequential, id="new-sequential"),
        pytest.param(SHAPES[0], adjacent, id="new-adjacent"),
        pytest.param(SHAPES[4], sequential, id="7B-sequential"),
        pytest.param(SHAPES[4], separate_norms, id="7B-separate_norms"),
        pytest.param(SHAPES[5], separate_norms, id="RW-side_by_side"),
        pytest.param(SHAPES[5], bloom_slopes, id="RW-bloom_slopes"),
        pytest.param(SHAPES[5], no_alibi, id="RW-no_alibi"),
    ],
)
def test_the_comparison_catches_a_wrong_mapping(
    shape: dict[str, Any], mutate: Callable[[dict[str, Any]], None]
) -> None:
    model = falcon(shape, 3)
    prompt = prompt_for(model, 3, 6)
    raw = to_config(model, prompt)
    mutate(raw)
    with pytest.raises(AssertionError):
        assert_matches(hf_outputs(model, prompt), traced(raw).value)


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[7]], ids=shape_id)
def test_qkv_read_as_contiguous_blocks_fails(
    shape: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """query_key_value read as all of q's rows, then k's, then v's (GPT-2's c_attn
    order), not per K/V group (the new architecture) or per head (the old one)."""

    def contiguous(c: FalconConfig, fused: np.ndarray) -> tuple[np.ndarray, ...]:
        q, kv = c.hidden_size, n_kv_heads(c) * (c.hidden_size // c.num_attention_heads)
        return fused[:q], fused[q : q + kv], fused[q + kv :]

    model = falcon(shape, 3)
    prompt = prompt_for(model, 3, 6)
    expected = hf_outputs(model, prompt)
    assert_matches(expected, traced(to_config(model, prompt)).value)  # (as it is: equal)
    monkeypatch.setitem(globals(), "split_qkv", contiguous)
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(to_config(model, prompt)).value)


def test_many_heads_falcon_s_bfloat16_bias() -> None:
    """12 heads: Falcon's bfloat16 slopes are not the paper's (its last 4), and its bias
    m·j is rounded to bfloat16. With its own slopes (falcon_slopes) and that product in
    float64, trace-tf is Falcon to 1e-12; with the bfloat16 product as Falcon computes
    it, about 2e-3 of the outputs for 8 tokens (over 1e-6, under 1e-2); with the paper's
    float64 slopes (over √d_k) in place of Falcon's, over 1e-6 even with that product."""
    model = falcon(MANY_HEADS, 6)
    prompt = prompt_for(model, 6, 8)
    raw = to_config(model, prompt)
    assert_matches(hf_outputs(model, prompt, alibi_product=True), traced(raw).value)
    as_falcon = largest_error(hf_outputs(model, prompt), traced(raw).value)
    assert 1e-6 < as_falcon < 1e-2
    rule = [m / 2 for m in (2 ** (-8 * (k + 1) / 8) for k in range(8))]  # √d_k = 2
    rule += [2 ** (-8 * (2 * k + 1) / 16) / 2 for k in range(4)]
    assert not np.allclose(rule, raw["model"]["alibi_slopes"], rtol=1e-6, atol=0)
    raw["model"]["alibi_slopes"] = rule
    assert largest_error(hf_outputs(model, prompt, alibi_product=True), traced(raw).value) > 1e-6


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[4], SHAPES[5]], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_falcon_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    assert_greedy_matches(falcon(shape, 5), to_config, tmp_path, float64)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's Falcon code, after GPT-2's (its Quoted), as printed: every value as Falcon
    computes it, and greedy generate as its own; then its functions convert every test
    model, each form (the mapping written again, independently of to_config)."""
    monkeypatch.chdir(tmp_path)
    gpt2 = run_readme("From Hugging Face GPT-2")
    scope = assert_recipe_runs("From Hugging Face Falcon", "falcon", float64, hf_outputs, gpt2)
    for n, shape in enumerate(SHAPES):
        model = falcon(shape, 9 + n)
        prompt, vocab = prompt_for(model, 9 + n, 6), vocab_of(model)
        np.savez("m.npz", **scope["falcon_arrays"](model, vocab))
        config = scope["falcon_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
        Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        assert_matches(hf_outputs(model, prompt), decode_json("m.yaml"))
