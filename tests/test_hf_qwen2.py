"""The engine against Hugging Face's Qwen2 (transformers' Qwen2ForCausalLM, float64, eval;
Qwen2.5's architecture too): LLaMA with biases on the q, k and v projections, so the
conversion is tests/test_hf_llama.py's with each layer's b_q, b_k and b_v, and Qwen3's
windows by layer (tests/test_hf_qwen3.py's `windows`).

transformers 5.23's Qwen2Attention builds q_proj, k_proj and v_proj with `bias=True` and
o_proj with `bias=False`, whatever the config (Qwen2Config has no attention_bias); the
rest is LLaMA's: RMSNorm, RoPE by halves (rotate_half), SwiGLU (its MLP without biases),
grouped-query attention (repeat_kv), an optional tied output. Its sliding window is
Qwen3's rule: Qwen2Config sets `sliding_window` to None unless use_sliding_window and
derives `layer_types` (unless given) as "sliding_attention" for the layers i >=
max_window_layers; a sliding layer gets masking_utils' sliding mask, query i seeing the
keys i − W < j <= i, trace-tf's `model.window` rule. Every parameter is drawn (the
biases too: HF's init leaves them 0, where a dropped bias would not show), HF's float32
norm, angles and softmax are done in float64 (hf_common.float64_hf): every hidden state,
each head's attention weights and the logits agree to 1e-12. The biases dropped (all or
one), o given a bias, every layer windowed or none each fail it.
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
from test_hf_llama import to_config as llama_to_config
from test_hf_qwen3 import windows
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2 import modeling_qwen2

PROMPT = 6  # tokens: longer than every window below

# Qwen2Config's sizes and options, each model's own; its defaults are a 7B's (vocab
# 151936, hidden 4096, intermediate 22016, 32 layers, 32 heads and 32 K/V heads, 32768
# positions, window 4096 from max_window_layers 28), every one set small here (the vocab,
# positions, MLP width and K/V heads by hf_common.rotary_config unless given)
SHAPES: list[dict[str, Any]] = [
    dict(num_hidden_layers=1, num_attention_heads=1, hidden_size=8, intermediate_size=12),
    dict(  # grouped-query, Qwen2's small ε and another RoPE base
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=20,
        rms_norm_eps=1e-3,
        rope_theta=100.0,
    ),
    dict(  # multi-query and tied output (Qwen2.5 0.5B's form)
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        hidden_size=24,
        intermediate_size=10,
        tie_word_embeddings=True,
        rms_norm_eps=0.1,
    ),
    dict(  # sliding layers from max_window_layers on, a window of 2
        num_hidden_layers=3,
        num_attention_heads=2,
        hidden_size=8,
        use_sliding_window=True,
        sliding_window=2,
        max_window_layers=1,
    ),
    dict(  # sliding layers by layer_types given, a window of 3, grouped-query
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        use_sliding_window=True,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        tie_word_embeddings=True,
    ),
]
SLIDING = SHAPES[3:]
PROJECTIONS = {"b_q": "q_proj", "b_k": "k_proj", "b_v": "v_proj"}


def qwen2(shape: dict[str, Any], seed: int) -> Qwen2ForCausalLM:
    """A Qwen2ForCausalLM of `shape` in float64, eval, every parameter drawn with `seed`:
    q, k and v's biases among them, o_proj without one."""
    config = rotary_config(Qwen2Config, shape)
    model = draw_parameters(Qwen2ForCausalLM(config), seed)
    for layer in model.model.layers:
        a = layer.self_attn
        assert all((getattr(a, proj).bias != 0).all() for proj in PROJECTIONS.values())
        assert a.o_proj.bias is None
    return model


@contextmanager
def float64_qwen2() -> Iterator[None]:
    """HF's Qwen2 with LLaMA's three float32 computations done in float64."""
    with float64_hf(modeling_qwen2, "Qwen2"):
        yield


def to_config(model: Qwen2ForCausalLM, prompt: list[int]) -> dict[str, Any]:
    """LLaMA's mapping, each layer's q, k and v biases (o has none), and the windows."""
    raw = llama_to_config(model, prompt)  # type: ignore[arg-type]
    assert not hasattr(model.config, "attention_bias")  # LLaMA's mapping wrote no bias
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    for l, layer in enumerate(raw["weights"]["decoder"]):
        for key, proj in PROJECTIONS.items():
            layer["self_attn"][key] = p[f"model.layers.{l}.self_attn.{proj}.bias"]
    raw["model"]["window"] = windows(model.config)
    return listed(raw)


def expected_of(model: Qwen2ForCausalLM, prompt: list[int]) -> dict[str, np.ndarray]:
    with float64_qwen2():
        return hf_outputs(model, prompt)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_hidden_state_head_and_logit_matches_qwen2(shape: dict[str, Any], seed: int) -> None:
    model = qwen2(shape, seed)
    prompt = prompt_for(model, seed, PROMPT)
    expected = expected_of(model, prompt)
    c = model.config
    assert len(expected) == 2 + c.num_hidden_layers * (1 + c.num_attention_heads) + 1
    assert_matches(expected, traced(to_config(model, prompt)).value)


@pytest.mark.parametrize("shape", SLIDING, ids=shape_id)
def test_the_window_bites_on_the_sliding_layers_only(shape: dict[str, Any]) -> None:
    """What the comparison covers is there in HF's own numbers: a sliding layer's weights
    are 0 exactly on the keys j <= i − sliding_window (and above the diagonal), a full
    layer's only above the diagonal; the test config's windows say the same layers."""
    model = qwen2(shape, 2)
    prompt = prompt_for(model, 2, PROMPT)
    expected = expected_of(model, prompt)
    c = model.config
    assert set(c.layer_types) == {"sliding_attention", "full_attention"}
    i, j = np.indices((PROMPT, PROMPT))
    for l, kind in enumerate(c.layer_types):
        outside = j <= i - c.sliding_window if kind == "sliding_attention" else np.zeros_like(i > 0)
        for h in range(c.num_attention_heads):
            weights = expected[f"decoder.{l}.self_attn.h{h}.softmax"]
            assert (weights[outside | (j > i)] == 0).all()
            assert (weights[~outside & (j <= i)] > 0).all()
    assert to_config(model, prompt)["model"]["window"] == [
        c.sliding_window if kind == "sliding_attention" else None for kind in c.layer_types
    ]


@pytest.mark.parametrize("shape", SHAPES[1:3], ids=shape_id)
def test_as_shipped_qwen2_differs_by_float32_roundings_only(shape: dict[str, Any]) -> None:
    """Unpatched, HF's float32 norm, angles and softmax put it about 1e-7 away (relative to
    1 + |value|): more than float64 roundings, less than any mapping error gives."""
    model = qwen2(shape, 4)
    prompt = prompt_for(model, 4, PROMPT)
    value = traced(to_config(model, prompt)).value
    error = largest_error(hf_outputs(model, prompt), value)
    assert 1e-10 < error < 1e-5


# ---------------------------------------------- wrong variants: each fails the comparison


def biases_dropped(raw: dict[str, Any]) -> None:
    """LLaMA's mapping as is (attention_bias off): no bias on q, k or v."""
    for layer in raw["weights"]["decoder"]:
        for key in PROJECTIONS:
            del layer["self_attn"][key]


def k_bias_dropped(raw: dict[str, Any]) -> None:
    for layer in raw["weights"]["decoder"]:
        del layer["self_attn"]["b_k"]


def v_bias_dropped(raw: dict[str, Any]) -> None:
    for layer in raw["weights"]["decoder"]:
        del layer["self_attn"]["b_v"]


def o_given_a_bias(raw: dict[str, Any]) -> None:
    """A b_o (LLaMA's attention_bias form), drawn, where Qwen2's o_proj has none."""
    g = np.random.default_rng(0)
    for layer in raw["weights"]["decoder"]:
        layer["self_attn"]["b_o"] = (0.3 * g.standard_normal(raw["model"]["d_model"])).tolist()


def every_layer_windowed(raw: dict[str, Any]) -> None:
    raw["model"]["window"] = max(w for w in raw["model"]["window"] if w is not None)


def no_layer_windowed(raw: dict[str, Any]) -> None:
    raw["model"]["window"] = None


@pytest.mark.parametrize(
    ("mutate", "shape"),
    [
        (biases_dropped, SHAPES[1]),
        (k_bias_dropped, SHAPES[1]),
        (v_bias_dropped, SHAPES[1]),
        (o_given_a_bias, SHAPES[1]),
        (every_layer_windowed, SHAPES[3]),
        (no_layer_windowed, SHAPES[3]),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_the_comparison_catches_a_wrong_mapping(
    mutate: Callable[[dict[str, Any]], None], shape: dict[str, Any]
) -> None:
    """The biases dropped (all, or k's alone: a key bias shifts each query's scores by
    q·b_k, which the softmax does not cancel when RoPE turns b_k by position), v's
    dropped, o given one, every layer windowed or none: each fails the comparison, by
    more than float32 roundings do (test_as_shipped_*)."""
    model = qwen2(shape, 3)
    prompt = prompt_for(model, 3, PROMPT)
    raw = to_config(model, prompt)
    mutate(raw)
    expected = expected_of(model, prompt)
    value = traced(raw).value
    with pytest.raises(AssertionError):
        assert_matches(expected, value)
    assert largest_error(expected, value) > 1e-5


# ------------------------------------------------------------ generate --greedy


@pytest.mark.parametrize("shape", SHAPES[1:], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_qwen2_generate(shape: dict[str, Any], tmp_path: Path) -> None:
    """HF's cache and trace-tf's KV cache (its K and V with their biases) both on; with
    sliding layers, 4 prompt tokens and 8 new ones run past the windows."""
    assert_greedy_matches(qwen2(shape, 5), to_config, tmp_path, float64_qwen2)


# ------------------------------------------------------ README recipe: Qwen2 → trace-tf


def recipes() -> dict[str, Any]:
    """The names README's LLaMA and Qwen3 code defines, which Qwen2's uses."""
    return run_readme("From Hugging Face Qwen3", scope=run_readme("From Hugging Face LLaMA"))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's Qwen2 code, after LLaMA's and Qwen3's, as printed (its biases drawn, not
    HF's zeros; layers 2 and 3 sliding, the window shorter than the prompt)."""
    monkeypatch.chdir(tmp_path)
    scope = assert_recipe_runs("From Hugging Face Qwen2", "qwen2", float64_qwen2, after=recipes())
    assert (scope["model"].model.layers[0].self_attn.k_proj.bias != 0).all()
    written = yaml.safe_load(Path("qwen2.yaml").read_text(encoding="utf-8"))
    assert written["model"]["window"] == [None, 3, 3] and len(scope["prompt"]) > 3


@pytest.mark.parametrize("shape", SHAPES[1:], ids=shape_id)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_converts_any_qwen2(
    shape: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe's qwen2_arrays and qwen2_config on other Qwen2s (grouped- and multi-
    query, tied output, sliding layers by max_window_layers and by layer_types)."""
    monkeypatch.chdir(tmp_path)
    scope = recipes()
    run_readme("From Hugging Face Qwen2", scope=scope)
    model = qwen2(shape, 7)
    prompt, vocab = prompt_for(model, 7, PROMPT), vocab_of(model)  # type: ignore[arg-type]
    np.savez("m.npz", **scope["qwen2_arrays"](model, vocab))
    config = scope["qwen2_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert_matches(expected_of(model, prompt), decode_json("m.yaml"))


def test_a_qwen2_config_has_no_window_and_biases_on_q_k_v_by_default() -> None:
    """README: Qwen2Config's default slides no layer (use_sliding_window off, so
    sliding_window None), has no attention_bias option, and its K/V heads default to 32."""
    config = Qwen2Config(num_hidden_layers=2, hidden_size=8, num_attention_heads=2)
    assert config.sliding_window is None and windows(config) is None
    assert not hasattr(config, "attention_bias") and Qwen2Config().num_key_value_heads == 32
    attention = Qwen2ForCausalLM(config).model.layers[0].self_attn
    assert all(getattr(attention, proj).bias is not None for proj in PROJECTIONS.values())
    assert attention.o_proj.bias is None
