"""The engine against Hugging Face's Mistral (transformers' MistralForCausalLM, float64,
eval): LLaMA plus a sliding window, so the conversion is tests/test_hf_llama.py's with
`model.window: sliding_window`.

transformers 5.23 builds Mistral's mask with masking_utils.sliding_window_causal_mask_function:
`kv_idx <= q_idx` (causal) and `kv_idx > q_idx - sliding_window` (sliding_window_overlay),
so query i sees the W keys i − W < j <= i; trace-tf's model.window is the same. Every
parameter is drawn, the prompts are longer than the window (and than W + 1, so a window
one too wide or too narrow shows), and HF's three float32 computations are done in
float64 (hf_common.float64_hf): every hidden state, head and logit agrees to 1e-12.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import shape_id
from hf_common import (
    assert_matches,
    assert_recipe_runs,
    decode_json,
    draw_parameters,
    float64_hf,
    hf_greedy,
    hf_outputs,
    invoke_json,
    prompt_for,
    rotary_config,
    run_readme,
    traced,
    vocab_of,
)
from test_hf_llama import to_config
from transformers import MistralConfig, MistralForCausalLM
from transformers.models.mistral import modeling_mistral

# MistralConfig's sizes and options, each model's own; sliding_window below the prompts' 7
SHAPES: list[dict[str, Any]] = [
    dict(num_hidden_layers=1, num_attention_heads=2, hidden_size=8, sliding_window=3),
    dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=20,
        sliding_window=2,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
    ),
    dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        hidden_size=12,
        intermediate_size=10,
        head_dim=4,
        sliding_window=4,
        tie_word_embeddings=True,
    ),
    dict(num_hidden_layers=1, num_attention_heads=1, hidden_size=6, sliding_window=1),
]
PROMPT = 7


def mistral(shape: dict[str, Any], seed: int) -> MistralForCausalLM:
    """A MistralForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`."""
    config = rotary_config(MistralConfig, shape)
    return draw_parameters(MistralForCausalLM(config), seed)


def float64_mistral() -> Any:
    return float64_hf(modeling_mistral, "Mistral")


def mistral_config(model: MistralForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """LLaMA's mapping, and the window."""
    raw = to_config(model, prompt)  # type: ignore[arg-type]
    raw["model"]["window"] = model.config.sliding_window
    return raw


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_mistral(
    shape: dict[str, Any], seed: int
) -> None:
    model = mistral(shape, seed)
    prompt = prompt_for(model, seed, PROMPT)
    with float64_mistral():
        expected = hf_outputs(model, prompt)  # type: ignore[arg-type]
    W = shape["sliding_window"]
    # HF's attention weights are 0 outside the window: it is in force there
    softmax = expected["decoder.0.self_attn.h0.softmax"]
    assert (softmax[PROMPT - 1, : PROMPT - W] == 0).all() and (softmax[-1, -W:] > 0).all()
    raw = mistral_config(model, prompt)
    assert raw["model"]["window"] == W
    assert_matches(expected, traced(raw).value)


def window_minus_one(raw: dict[str, Any]) -> None:
    raw["model"]["window"] -= 1


def window_plus_one(raw: dict[str, Any]) -> None:
    raw["model"]["window"] += 1


def no_window(raw: dict[str, Any]) -> None:
    del raw["model"]["window"]


@pytest.mark.parametrize("mutate", [window_minus_one, window_plus_one, no_window])
def test_the_comparison_catches_a_wrong_window(mutate: Callable[[dict[str, Any]], None]) -> None:
    """W − 1 (the keys i − W < j: one too few), W + 1 (i − W <= j: one too many) and no
    window each make the comparison fail."""
    model = mistral(SHAPES[1], 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = mistral_config(model, prompt)
    mutate(raw)
    with float64_mistral():
        expected = hf_outputs(model, prompt)  # type: ignore[arg-type]
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(raw).value)


@pytest.mark.parametrize("shape", SHAPES[:3], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_mistral_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    """HF's cache (its sliding-window layers) and trace-tf's KV cache both on, the prompt
    and the generated tokens running past the window."""
    model = mistral(shape, 5)
    prompt, n = prompt_for(model, 5, 4), 8
    with float64_mistral():
        tokens = hf_greedy(model, prompt, n, None)
    assert len(tokens) == n
    vocab = vocab_of(model)  # type: ignore[arg-type]
    path = tmp_path / "mistral.yaml"
    path.write_text(yaml.safe_dump(mistral_config(model, prompt)), encoding="utf-8")
    out = invoke_json("generate", str(path), "--greedy", "--max-tokens", str(n))
    assert out["generated"] == [vocab[i] for i in tokens]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's Mistral code, after LLaMA's, as printed; then its functions on a drawn
    Mistral with grouped-query attention and a window of 2."""
    monkeypatch.chdir(tmp_path)
    llama = run_readme("From Hugging Face LLaMA")
    scope = assert_recipe_runs("From Hugging Face Mistral", "mistral", float64_mistral, after=llama)
    assert yaml.safe_load(Path("mistral.yaml").read_text(encoding="utf-8"))["model"]["window"] == 3
    model = mistral(SHAPES[1], 8)
    prompt, vocab = prompt_for(model, 8, PROMPT), vocab_of(model)  # type: ignore[arg-type]
    np.savez("m.npz", **scope["llama_arrays"](model, vocab))
    config = scope["mistral_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with float64_mistral():
        assert_matches(hf_outputs(model, prompt), decode_json("m.yaml"))  # type: ignore[arg-type]
