"""The engine against Hugging Face's GPT-J (transformers' GPTJForCausalLM, float64, eval):
parallel layers reading one shared norm (`model.parallel: shared`) and partial rotary by
adjacent pairs (`model.rope_dims` with `rope_pairs: adjacent`), with an output bias.

Small random GPT-Js, every parameter drawn anew (hf_common.draw_parameters, `ln_1` and
`ln_f` near 1), `rotary_dim` below and equal to the head size, are converted here by the
mapping written below (nested YAML data, fused form), and checked to 1e-12: every hidden
state, every head's attention weights (`output_attentions`), the logits, and
`generate --greedy` against `generate(do_sample=False)`.

The conventions mapped:
- GPTJBlock: attn(ln_1(x)) + mlp(ln_1(x)) + x, one norm both read: `parallel: shared`,
  its weights `self_attn.norm` (no `ffn.norm`).
- `rotate_every_two` turns columns (2i, 2i+1) together, `rope_pairs: adjacent`, within
  the first `rotary_dim` columns of each head (`rope_dims`), at `10000^(−2i/rotary_dim)`
  (create_sinusoidal_positions over `rotary_dim`; the base is fixed, `pe_base` 10000).
- q_proj, k_proj, v_proj, out_proj without bias (head h in rows h·d_k..: transposed, the
  fused form); fc_in, fc_out with bias; `gelu_new` (the tanh approximation) is
  `gelu_tanh`; `ln_f` the final norm; `lm_head` untied, with a bias (`output.b`).
- Two float32 internals of HF's GPT-J are replaced by their float64 formulas under
  `float64` below: its sin/cos table (create_sinusoidal_positions, in torch.float) and
  its attention (`_attn` casts q and k to float32: scores and softmax in float32).
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
    prompt_for,
    run_readme,
    traced,
    vocab_of,
)
from hf_common import hf_outputs as common_outputs
from transformers import GPTJConfig, GPTJForCausalLM
from transformers.models.gptj import modeling_gptj

from trace_tf import ops

# n_layer, n_head, n_embd, rotary_dim, vocab, and GPTJConfig's others (GPT-J 6B: 28 layers,
# 16 heads of 256, rotary_dim 64)
SHAPES: list[dict[str, Any]] = [
    dict(n_layer=1, n_head=2, n_embd=16, rotary_dim=4, vocab_size=10),
    dict(n_layer=2, n_head=2, n_embd=16, rotary_dim=8, vocab_size=13, layer_norm_epsilon=1e-3),
    dict(n_layer=2, n_head=4, n_embd=32, rotary_dim=6, vocab_size=11, n_inner=20),
    dict(n_layer=2, n_head=3, n_embd=24, rotary_dim=2, vocab_size=9, layer_norm_epsilon=0.1),
]  # fmt: skip


def positions_float64(self: Any, position_ids: torch.Tensor) -> torch.Tensor:
    """GPTJAttention._get_embed_positions with its table (create_sinusoidal_positions:
    sin | cos of pos · 10000^(−2i/rotary_dim), built in torch.float) in float64."""
    dim = self.pos_embd_dim
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.arange(self.max_positions, dtype=torch.float64)[:, None] * inv_freq
    table = torch.cat((torch.sin(angles), torch.cos(angles)), dim=1)
    return table.repeat(position_ids.shape[0], 1, 1)


def attn_float64(
    self: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTJAttention._attn without its casts of q and k to float32."""
    scores = torch.matmul(query, key.transpose(-1, -2)) / self.scale_attn
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.nn.functional.softmax(scores, dim=-1)
    return torch.matmul(weights, value), weights


@contextmanager
def float64() -> Iterator[pytest.MonkeyPatch]:
    """HF's GPT-J with its sin/cos table and its attention in float64."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modeling_gptj.GPTJAttention, "_get_embed_positions", positions_float64)
        mp.setattr(modeling_gptj.GPTJAttention, "_attn", attn_float64)
        yield mp


def gptj(shape: dict[str, Any], seed: int) -> GPTJForCausalLM:
    # GPTJConfig's own n_positions is 2048 (the sin/cos table's rows): 64 here
    config = GPTJConfig(
        bos_token_id=None, eos_token_id=None, n_positions=64, attn_implementation="eager", **shape
    )
    return draw_parameters(GPTJForCausalLM(config), seed, norms=("ln_1.weight", "ln_f.weight"))


def to_config(model: GPTJForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """The mapping, as nested config data with the weights in the YAML's fused form."""
    c, p = model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    vocab = vocab_of(model)

    def norm(name: str) -> dict[str, Any]:
        return {"gamma": p[f"{name}.weight"].tolist(), "beta": p[f"{name}.bias"].tolist()}

    layers = []
    for l in range(c.n_layer):
        h = f"transformer.h.{l}"
        attn = {f"W_{x}": p[f"{h}.attn.{x}_proj.weight"].T.tolist() for x in "qkv"}
        attn["W_o"] = p[f"{h}.attn.out_proj.weight"].T.tolist()
        attn["norm"] = norm(f"{h}.ln_1")
        ffn = {
            "W_1": p[f"{h}.mlp.fc_in.weight"].T.tolist(),
            "b_1": p[f"{h}.mlp.fc_in.bias"].tolist(),
            "W_2": p[f"{h}.mlp.fc_out.weight"].T.tolist(),
            "b_2": p[f"{h}.mlp.fc_out.bias"].tolist(),
        }  # no norm: the MLP reads ln_1's
        layers.append({"self_attn": attn, "ffn": ffn})
    wte = p["transformer.wte.weight"]
    return {
        "model": {
            "d_model": c.n_embd,
            "n_heads": c.n_head,
            "d_ff": c.n_inner or 4 * c.n_embd,
            "encoder_layers": 0,
            "decoder_layers": c.n_layer,
            "positional": "rope",
            "rope_pairs": "adjacent",
            "rope_dims": c.rotary_dim,
            "pe_base": 10000.0,
            "norm_position": "pre",
            "parallel": "shared",
            "norm_eps": c.layer_norm_epsilon,
            "final_norm": True,
            "activation": "gelu_tanh",
        },
        "vocab": vocab,
        "embeddings": {t: wte[i].tolist() for i, t in enumerate(vocab)},
        "target": [vocab[i] for i in prompt],
        "weights": {
            "decoder": layers,
            "decoder_final_norm": norm("transformer.ln_f"),
            "output": {"W": p["lm_head.weight"].T.tolist(), "b": p["lm_head.bias"].tolist()},
        },
    }


def hf_outputs(model: GPTJForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    """GPT-J's values under the trace-tf step each one is, in float64."""
    with float64():
        return common_outputs(model, prompt, model.transformer.ln_f)


def test_the_drawn_models_are_not_hf_s_init() -> None:
    """γ near 1 but not 1, β and every bias nonzero, an lm_head bias: a misplaced norm or
    a dropped bias would show."""
    model = gptj(SHAPES[0], 0)
    p = dict(model.named_parameters())
    for name in ("transformer.h.0.ln_1.weight", "transformer.ln_f.weight"):
        assert 0.05 < float((p[name].detach() - 1).abs().mean()) < 1  # near 1, not 1
    for name in ("transformer.h.0.ln_1.bias", "transformer.h.0.mlp.fc_in.bias", "lm_head.bias"):
        assert p[name].abs().min() > 0
    assert "transformer.h.0.attn.q_proj.bias" not in p


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_gptj(shape: dict[str, Any], seed: int) -> None:
    model = gptj(shape, seed)
    prompt = prompt_for(model, seed, 9)
    expected = hf_outputs(model, prompt)
    n, H = model.config.n_layer, model.config.n_head
    assert len(expected) == 2 + n * (1 + H) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


def halves(raw: dict[str, Any]) -> None:
    """rotate_half's pairs (i, i + r/2), GPT-NeoX's, not rotate_every_two's (2i, 2i+1)."""
    raw["model"]["rope_pairs"] = "halves"


def every_column_turned(raw: dict[str, Any]) -> None:
    """RoPE over all of the head, not rotary_dim."""
    raw["model"].pop("rope_dims")


def separate_norms(raw: dict[str, Any]) -> None:
    """A norm each (GPT-NeoX's), the FFN's left at γ 1, β 0: not the shared ln_1."""
    raw["model"]["parallel"] = "separate"


def sequential(raw: dict[str, Any]) -> None:
    """The sublayers in sequence, the FFN's norm a copy of ln_1."""
    raw["model"]["parallel"] = "none"
    for layer in raw["weights"]["decoder"]:
        layer["ffn"]["norm"] = layer["self_attn"]["norm"]


def no_output_bias(raw: dict[str, Any]) -> None:
    del raw["weights"]["output"]["b"]


def exact_gelu(raw: dict[str, Any]) -> None:
    raw["model"]["activation"] = "gelu"


@pytest.mark.parametrize(
    "mutate", [halves, every_column_turned, separate_norms, sequential, no_output_bias, exact_gelu]
)
def test_the_comparison_catches_a_wrong_mapping(mutate: Callable[[dict[str, Any]], None]) -> None:
    model = gptj(dict(SHAPES[0], n_layer=2), 3)  # rotary_dim 4 of 8 (2 would pair alike)
    prompt = prompt_for(model, 3, 6)
    raw = to_config(model, prompt)
    mutate(raw)
    with pytest.raises(AssertionError):
        assert_matches(hf_outputs(model, prompt), traced(raw).value)


def test_frequencies_over_head_size_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine turning the rotary columns at 10000^(−2i/head_size), not over
    rotary_dim, disagrees with GPT-J."""
    model = gptj(SHAPES[0], 4)  # rotary_dim 4 of head_size 8
    prompt = prompt_for(model, 4, 6)
    expected = hf_outputs(model, prompt)
    raw = to_config(model, prompt)
    assert_matches(expected, traced(raw).value)  # (as it is: equal)
    right = ops.rope_angles
    monkeypatch.setattr(ops, "rope_angles", lambda p, d, b, s=None: right(p, 8, b, s)[:, : d // 2])
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(raw).value)


@pytest.mark.parametrize("shape", SHAPES[:3], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_gptj_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    assert_greedy_matches(gptj(shape, 5), to_config, tmp_path, float64)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's GPT-J code, after GPT-2's (its Quoted), as printed: every value as GPT-J
    computes it, and greedy generate as its own; then its functions convert every test
    model (the mapping written again, independently of to_config)."""
    monkeypatch.chdir(tmp_path)
    gpt2 = run_readme("From Hugging Face GPT-2")
    scope = assert_recipe_runs("From Hugging Face GPT-J", "gptj", float64, hf_outputs, gpt2)
    for n, shape in enumerate(SHAPES):
        model = gptj(shape, 9 + n)
        prompt, vocab = prompt_for(model, 9 + n, 6), vocab_of(model)
        np.savez("m.npz", **scope["gptj_arrays"](model, vocab))
        config = scope["gptj_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
        Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        assert_matches(hf_outputs(model, prompt), decode_json("m.yaml"))
