"""The engine against Hugging Face's GPT-2 (transformers' GPT2LMHeadModel, float64, eval).

Small random GPT-2s, every parameter drawn anew (HF's own init leaves biases and β at
0 and γ at 1, where a misplaced norm or bias would not show), are converted here by
the mapping README "From Hugging Face GPT-2" states (written here independently, as
nested YAML data in the fused form; the README's own recipe, which writes an .npz,
is run as printed by `test_the_readme_recipe_*`). Checked to 1e-12: every hidden
state, every head's attention weights (eager attention, `output_attentions`), the
logits, and `generate --greedy` against `generate(do_sample=False)`.

The conventions mapped:
- `hidden_states[0]` is `decoder.input`; `hidden_states[l]`, 0 < l < n_layer, is
  `decoder.<l-1>.ffn.residual`; the last is after ln_f, `decoder.output`. The last
  block's own output is what ln_f reads (caught by a hook).
- GPT-2 masks with finfo.min, trace-tf with -inf: the same softmax.
- Conv1D weights are in x out, as trace-tf's: nothing is transposed.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from conftest import readme_python, shape_id
from hf_common import (
    assert_greedy_matches,
    assert_matches,
    assert_recipe_runs,
    decode_json,
    hf_greedy,
    invoke_json,
    prompt_for,
    run_readme,
    traced,
    vocab_of,
)
from hf_common import hf_outputs as common_outputs
from transformers import GPT2Config, GPT2LMHeadModel

ACTIVATION = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}


# n_layer, n_head, n_embd, vocab, and GPT2Config's other options
SHAPES: list[dict[str, Any]] = [
    dict(n_layer=1, n_head=1, n_embd=8, vocab_size=10),
    dict(n_layer=2, n_head=2, n_embd=16, vocab_size=20, layer_norm_epsilon=1e-3, n_inner=24),
    dict(n_layer=3, n_head=4, n_embd=32, vocab_size=30, layer_norm_epsilon=0.1),
    dict(
        n_layer=2,
        n_head=4,
        n_embd=8,
        vocab_size=17,
        activation_function="relu",
        layer_norm_epsilon=1e-6,
        scale_attn_weights=False,
    ),
    dict(n_layer=2, n_head=2, n_embd=12, vocab_size=13, activation_function="gelu"),
    dict(
        n_layer=1,
        n_head=3,
        n_embd=12,
        vocab_size=11,
        activation_function="gelu_pytorch_tanh",
        layer_norm_epsilon=0.5,
    ),
    dict(n_layer=3, n_head=1, n_embd=9, vocab_size=14, scale_attn_weights=False, n_inner=5),
]


def gpt2(shape: dict[str, Any], seed: int, eos: int | None = None) -> GPT2LMHeadModel:
    """A GPT2LMHeadModel of `shape` in float64, eval, every parameter drawn with `seed`."""
    config = GPT2Config(
        n_positions=16, bos_token_id=None, eos_token_id=eos, attn_implementation="eager", **shape
    )
    model = GPT2LMHeadModel(config).double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # lm_head.weight is wte.weight: not listed
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if (
                name.endswith("ln_1.weight")
                or name.endswith("ln_2.weight")
                or "ln_f.weight" in name
            ):
                p.copy_(1 + 0.3 * noise)  # γ near 1
            elif p.dim() == 1:
                p.copy_(0.3 * noise)  # biases and β
            elif name.startswith("transformer.w"):
                p.copy_(noise)  # wte, wpe
            else:
                p.copy_(noise / p.shape[0] ** 0.5)  # Conv1D, in x out: unit-size outputs
    return model


def to_config(model: GPT2LMHeadModel, prompt: list[int]) -> dict[str, Any]:
    """README's mapping, as nested config data with the weights in the YAML's fused form."""
    c, p = model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    vocab = vocab_of(model)

    def norm(name: str) -> dict[str, Any]:
        return {"gamma": p[f"{name}.weight"].tolist(), "beta": p[f"{name}.bias"].tolist()}

    layers = []
    for l in range(c.n_layer):
        h = f"transformer.h.{l}"
        W, b = p[f"{h}.attn.c_attn.weight"], p[f"{h}.attn.c_attn.bias"]
        d = c.n_embd
        attn = {
            f"{m}_{x}": (W[:, i * d : (i + 1) * d] if m == "W" else b[i * d : (i + 1) * d]).tolist()
            for i, x in enumerate("qkv")
            for m in ("W", "b")
        }
        attn |= {
            "W_o": p[f"{h}.attn.c_proj.weight"].tolist(),
            "b_o": p[f"{h}.attn.c_proj.bias"].tolist(),
            "norm": norm(f"{h}.ln_1"),
        }
        ffn = {
            "W_1": p[f"{h}.mlp.c_fc.weight"].tolist(),
            "b_1": p[f"{h}.mlp.c_fc.bias"].tolist(),
            "W_2": p[f"{h}.mlp.c_proj.weight"].tolist(),
            "b_2": p[f"{h}.mlp.c_proj.bias"].tolist(),
            "norm": norm(f"{h}.ln_2"),
        }
        layers.append({"self_attn": attn, "ffn": ffn})
    wte = p["transformer.wte.weight"]
    return {
        "model": {
            "d_model": c.n_embd,
            "n_heads": c.n_head,
            "d_ff": c.n_inner or 4 * c.n_embd,
            "encoder_layers": 0,
            "decoder_layers": c.n_layer,
            "positional": "learned",
            "max_len": c.n_positions,
            "norm_position": "pre",
            "norm_eps": c.layer_norm_epsilon,
            "activation": ACTIVATION[c.activation_function],
            "scale": "sqrt_dk" if c.scale_attn_weights else 1,
            "tie_embeddings": True,
        },
        "vocab": vocab,
        "tokens": {} if c.eos_token_id is None else {"eos": vocab[c.eos_token_id]},
        "embeddings": {t: wte[i].tolist() for i, t in enumerate(vocab)},
        "target": [vocab[i] for i in prompt],
        "weights": {
            "decoder": layers,
            "decoder_final_norm": norm("transformer.ln_f"),
            "positional": p["transformer.wpe.weight"].tolist(),
        },
    }


def hf_outputs(model: GPT2LMHeadModel, prompt: list[int]) -> dict[str, np.ndarray]:
    """GPT-2's values under the trace-tf step each one is, for `prompt` (batch of one)."""
    return common_outputs(model, prompt, model.transformer.ln_f)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_gpt2(shape: dict[str, Any], seed: int) -> None:
    model = gpt2(shape, seed)
    prompt = prompt_for(model, seed)
    expected = hf_outputs(model, prompt)
    assert len(expected) == 2 + model.config.n_layer * (1 + model.config.n_head) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


def swap_q_k(raw: dict[str, Any]) -> None:
    a = raw["weights"]["decoder"][0]["self_attn"]
    a["W_q"], a["W_k"] = a["W_k"], a["W_q"]


def heads_interleaved(raw: dict[str, Any]) -> None:
    """Head h read from every n_head-th column instead of a contiguous block."""
    a, H = raw["weights"]["decoder"][0]["self_attn"], raw["model"]["n_heads"]
    for key in ("W_q", "W_k", "W_v"):
        W = np.asarray(a[key])
        d_k = W.shape[1] // H
        a[key] = W.reshape(-1, d_k, H).transpose(0, 2, 1).reshape(W.shape).tolist()


def exact_gelu(raw: dict[str, Any]) -> None:
    raw["model"]["activation"] = "gelu"


def ln_eps_default(raw: dict[str, Any]) -> None:
    raw["model"]["norm_eps"] = 1e-5 if raw["model"]["norm_eps"] != 1e-5 else 1e-6


def norms_swapped(raw: dict[str, Any]) -> None:
    layer = raw["weights"]["decoder"][0]
    layer["self_attn"]["norm"], layer["ffn"]["norm"] = (
        layer["ffn"]["norm"],
        layer["self_attn"]["norm"],
    )


@pytest.mark.parametrize(
    "mutate", [swap_q_k, heads_interleaved, exact_gelu, ln_eps_default, norms_swapped]
)
def test_the_comparison_catches_a_wrong_mapping(mutate: Callable[[dict[str, Any]], None]) -> None:
    """Each plausible conversion mistake makes the comparison above fail."""
    model = gpt2(dict(n_layer=2, n_head=4, n_embd=16, vocab_size=12, layer_norm_epsilon=0.1), 3)
    prompt = prompt_for(model, 3)
    raw = to_config(model, prompt)
    mutate(raw)
    with pytest.raises(AssertionError):
        assert_matches(hf_outputs(model, prompt), traced(raw).value)


# ------------------------------------------------------------ generate --greedy


@pytest.mark.parametrize("shape", SHAPES[1:4], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_gpt2_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    assert_greedy_matches(gpt2(shape, 5), to_config, tmp_path)


# ------------------------------------------------------- README recipe: GPT-2 → trace-tf


def readme_recipe() -> str:
    return readme_python("From Hugging Face GPT-2")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_recipe_runs("From Hugging Face GPT-2", "gpt2", nullcontext, hf_outputs, eos=11)


@pytest.mark.parametrize("shape", [SHAPES[2], SHAPES[3], SHAPES[6]], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_converts_any_gpt2(
    shape: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe's `gpt2_arrays` and `gpt2_config` on other models (every parameter drawn,
    relu, no scaling, n_inner): each step as GPT-2 computes it, through the CLI."""
    monkeypatch.chdir(tmp_path)
    scope = run_readme("From Hugging Face GPT-2")
    model = gpt2(shape, 7)
    prompt, vocab = prompt_for(model, 7, 6), vocab_of(model)
    np.savez("m.npz", **scope["gpt2_arrays"](model, vocab))
    config = scope["gpt2_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert_matches(hf_outputs(model, prompt), decode_json("m.yaml"))


# A tokenizer's tokens that YAML could read as something else: PyYAML's safe_dump
# leaves `1e3`, `0o17` and `08` plain (strings in YAML 1.1), trace-tf reads them as
# YAML 1.2 numbers (1000, 15, 8: `08` would then be the token `8`, twice).
TOKENIZER_VOCAB = [
    "Ġthe", "1e3", "0o17", "08", "8", "true", "null", "~", "a: b", "- x", "a\nb\t", "<|endoftext|>",
]  # fmt: skip


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_keeps_a_tokenizers_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe as printed, its `vocab` line replaced by a tokenizer's tokens: each
    token is read back as itself (the logits and greedy tokens as GPT-2's)."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    line = 'vocab = [f"w{i}" for i in range(config.vocab_size)]'
    recipe = readme_recipe()
    assert line in recipe
    scope: dict[str, Any] = {}
    code = recipe.replace(line, f"vocab = {TOKENIZER_VOCAB!r}")
    exec(compile(code, "README.md", "exec"), scope)  # our own README
    model, prompt = scope["model"], scope["prompt"]
    assert [TOKENIZER_VOCAB[i] for i in prompt] == ["08", "1e3", "8"]
    assert_matches(hf_outputs(model, prompt), decode_json("gpt2.yaml"))
    out = invoke_json("generate", "gpt2.yaml", "--greedy", "--max-tokens", "8")
    assert out["tokens"]["target"] == ["08", "1e3", "8"]
    assert list(out["iterations"][0]["probs"]) == TOKENIZER_VOCAB
    assert out["generated"] == [TOKENIZER_VOCAB[i] for i in hf_greedy(model, prompt, 8, 11)]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_reorder_and_upcast_attn_in_float64_as_readme_says() -> None:
    """README: a `.double()` GPT-2 with `reorder_and_upcast_attn` raises in transformers
    (its scores are float32 whatever the dtype); turned off in each block, the model
    matches trace-tf to 1e-12."""
    model = gpt2(dict(SHAPES[1], reorder_and_upcast_attn=True), 3)
    prompt = prompt_for(model, 3)
    with pytest.raises(RuntimeError, match="float32"), torch.no_grad():
        model(torch.tensor([prompt]))
    for b in model.transformer.h:
        b.attn.reorder_and_upcast_attn = False
    assert_matches(hf_outputs(model, prompt), traced(to_config(model, prompt)).value)
