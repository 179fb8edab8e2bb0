"""RoPE scaling (`model.rope_scaling`) against Hugging Face: the frequencies against
transformers' own rope init functions (modeling_rope_utils: linear, llama3, yarn) for many
drawn parameter sets, and whole LlamaForCausalLMs with scaled RoPE (every parameter
drawn) against trace-tf: every hidden state, head and logit to 1e-12, and greedy generate.

HF computes its inverse frequencies in float32 (`torch.float`) whatever the model's dtype;
`hf_common.hf_rope_init` runs its own functions with torch.float read as float64, and
`float64_llama` (hf_common.rotary_float64) uses them, so both sides compute in float64.
The conversion is tests/test_hf_llama.py's `to_config`, whose `rope_scaling` maps HF's
rope_parameters (written there independently of README's recipe, which is run as
printed here on scaled models too).

Each model's parameters put some of its pairs in every band the scaling has (llama3: kept,
smoothed, ÷ factor; yarn: kept, ramped, ÷ factor; asserted by a separate computation of
the bands here), and its prompt plus generated tokens run past original_max_len.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from conftest import config_from
from hf_common import (
    assert_greedy_matches,
    assert_matches,
    decode_json,
    hf_outputs,
    hf_rope_init,
    prompt_for,
    run_readme,
    traced,
    vocab_of,
)
from test_hf_llama import float64_llama, llama, to_config
from transformers import LlamaConfig

from trace_tf import ops
from trace_tf.config import Config

# ---------------------------------------------------- (a) the frequencies, HF's functions


def draw_rope(rng: np.random.Generator, kind: str) -> tuple[int, float, dict[str, Any]]:
    """A head size, a base and HF rope_parameters of type `kind`, each number drawn."""
    d = 2 * int(rng.integers(1, 65))
    base = float(10 ** rng.uniform(1, 6.5))
    factor = float(rng.choice([rng.uniform(1, 64), float(rng.integers(2, 33))]))
    original = int(rng.choice([rng.integers(4, 64), rng.integers(64, 16385)]))
    rope: dict[str, Any] = {"rope_type": kind, "factor": factor}
    if kind == "linear":
        rope["factor"] = float(rng.uniform(0.25, 64))
    elif kind == "llama3":
        low = float(rng.uniform(0.25, 4))
        rope |= {
            "low_freq_factor": low,
            "high_freq_factor": low + float(rng.uniform(0.25, 8)),
            "original_max_position_embeddings": original,
        }
    else:  # yarn
        beta_slow = float(rng.uniform(0.25, 4))
        rope |= {
            "original_max_position_embeddings": original,
            "beta_fast": beta_slow + float(rng.uniform(0, 64)),
            "beta_slow": beta_slow,
            "truncate": bool(rng.integers(2)),
        }
        which = int(rng.integers(3))
        if which == 1:
            rope["attention_factor"] = float(rng.uniform(0.5, 2))
        elif which == 2:
            rope |= {
                "mscale": float(rng.uniform(0.1, 2)),
                "mscale_all_dim": float(rng.uniform(0.1, 2)),
            }
    return d, base, rope


def hf_config(d: int, base: float, rope: dict[str, Any]) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=2 * d,
        num_attention_heads=2,
        head_dim=d,
        max_position_embeddings=1 << 20,
        rope_parameters={**rope, "rope_theta": base},
    )


def model_scaling(d: int, base: float, rope: dict[str, Any]) -> ops.RopeScaling:
    """The scaling trace-tf reads from `rope` mapped by test_hf_llama.rope_scaling."""
    from test_hf_llama import rope_scaling

    cfg = config_from(
        {
            "model": {
                "d_model": d, "d_k": d, "encoder_layers": 0, "decoder_layers": 1,
                "positional": "rope", "pe_base": base, "rope_scaling": rope_scaling(rope),
            },
            "vocab": ["a"],
        }
    )  # fmt: skip
    assert isinstance(cfg, Config) and cfg.model.rope_scaling is not None
    return cfg.model.rope_scaling


# LLaMA 3.1/3.2/3.3's own (head_dim 64 for 3.2-1B, 128 for 8B), linear's usual 2 and 4
KNOWN = [
    (64, 500000.0, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    (128, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    (128, 10000.0, {"rope_type": "linear", "factor": 2.0}),
    (64, 10000.0, {"rope_type": "linear", "factor": 4.0}),
    (128, 1000000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    (64, 10000.0, {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                   "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707}),
    # a band of one point (beta_fast = beta_slow, not truncated): HF widens it by 0.001
    (16, 100.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                 "beta_fast": 2.0, "beta_slow": 2.0, "truncate": False}),
]  # fmt: skip


def hf_theta(d: int, base: float) -> np.ndarray:
    """HF's unscaled inverse frequencies 1 / base^(2i/d) in float64 (its linear type with
    factor 1: the expression its llama3 and yarn types begin with)."""
    theta, _ = hf_rope_init(hf_config(d, base, {"rope_type": "linear", "factor": 1.0}))
    return theta.numpy()


def cases(kind: str) -> list[tuple[int, float, dict[str, Any]]]:
    """The known parameter sets of `kind` and 60 drawn ones."""
    rng = np.random.default_rng(["linear", "llama3", "yarn"].index(kind))
    return [c for c in KNOWN if c[2]["rope_type"] == kind] + [
        draw_rope(rng, kind) for _ in range(60)
    ]


@pytest.mark.parametrize("kind", ["linear", "llama3", "yarn"])
def test_the_scaling_is_hf_rope_init_functions(kind: str) -> None:
    """ops.rope_scaled of HF's own unscaled θ (the scaling as config.py reads it) against
    HF's function in float64: linear and llama3 bit for bit, yarn (which divides 1 by
    factor · base^(2i/d) where trace-tf divides θ by the factor) to 1e-15 relative; yarn's
    attention factor to 1e-15. The unscaled θ_i = base^(−2i/d) are HF's to 1e-15."""
    scaled = 0
    for d, base, rope in cases(kind):
        want, attention = hf_rope_init(hf_config(d, base, rope))
        theta = hf_theta(d, base)
        np.testing.assert_allclose(ops.rope_frequencies(d, base), theta, rtol=1e-15, atol=0)
        scaling = model_scaling(d, base, rope)
        got = ops.rope_scaled(theta, d, base, scaling)
        if kind == "yarn":
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-15, atol=0, err_msg=str(rope))
        else:
            np.testing.assert_array_equal(got, want.numpy(), err_msg=str(rope))
        assert scaling.attention_factor == pytest.approx(attention, rel=1e-15, abs=0)
        scaled += not np.allclose(got, theta, rtol=1e-9)
    assert scaled > 50  # (llama3 keeps every pair whose wavelengths are all short)


@pytest.mark.parametrize("kind", ["linear", "llama3", "yarn"])
def test_the_frequencies_used_are_hf_rope_init_functions(kind: str) -> None:
    """ops.rope_frequencies, trace-tf's θ_i scaled, against HF's in float64: to 1e-15
    relative, and llama3's to 1e-13: where a wavelength sits near an edge of the smoothed
    band, k = (L / λ − low) / (high − low) is a difference near 0 and magnifies θ's one
    rounding apart (HF's 1 / base^(2i/d), trace-tf's base^(−2i/d)) a hundredfold or so.
    HF's shipped float32 frequencies are some 1e-8 away."""
    for d, base, rope in cases(kind):
        want, _ = hf_rope_init(hf_config(d, base, rope))
        got = ops.rope_frequencies(d, base, model_scaling(d, base, rope))
        rtol = 1e-13 if kind == "llama3" else 1e-15
        np.testing.assert_allclose(got, want.numpy(), rtol=rtol, atol=0, err_msg=str(rope))


def test_a_wrong_scaling_is_caught_by_the_frequency_check() -> None:
    """The check above can fail: the frequencies of a neighbouring parameter set are not HF's."""
    d, base, rope = KNOWN[0]
    want, _ = hf_rope_init(hf_config(d, base, rope))
    for change in (
        {"factor": 16.0},
        {"high_freq_factor": 3.0},
        {"original_max_position_embeddings": 4096},
    ):
        wrong = model_scaling(d, base, {**rope, **change})
        assert not np.allclose(ops.rope_frequencies(d, base, wrong), want.numpy(), rtol=1e-9)


# ------------------------------------------------- (b) whole models, HF's LlamaForCausalLM

# LlamaConfig's sizes, rope_theta and rope_scaling (HF's rope_parameters, rope_theta aside)
SHAPES: list[dict[str, Any]] = [
    dict(  # head_dim 8, base 100: wavelengths 6.3, 20, 63, 199 against 8 / 1.25 and 8 / 0.25
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=16,
        intermediate_size=24, rope_theta=100.0,
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 0.25,
                      "high_freq_factor": 1.25, "original_max_position_embeddings": 8},
    ),
    dict(  # head_dim 16, LLaMA 3.1's factors, original_max_len 64 (LLaMA's is 8192)
        num_hidden_layers=1, num_attention_heads=2, hidden_size=32, intermediate_size=40,
        attention_bias=True, mlp_bias=True, max_position_embeddings=512,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ),
    dict(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=16,
        intermediate_size=20, rope_scaling={"rope_type": "linear", "factor": 2.5},
    ),
    dict(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=12, intermediate_size=10,
        head_dim=8, tie_word_embeddings=True, hidden_act="gelu", rope_theta=500000.0,
        rope_scaling={"rope_type": "linear", "factor": 0.5},
    ),
    dict(  # head_dim 8, base 100: the ramp over pairs 0..3 (0, 1/3, 2/3, 1)
        num_hidden_layers=2, num_attention_heads=2, hidden_size=16, intermediate_size=24,
        rope_theta=100.0,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                      "beta_fast": 2.0, "beta_slow": 0.125},
    ),
    dict(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=16, intermediate_size=24,
        rope_theta=100.0,
        rope_scaling={"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 8,
                      "beta_fast": 2.0, "beta_slow": 0.125, "truncate": False,
                      "mscale": 0.8, "mscale_all_dim": 0.3},
    ),
]  # fmt: skip
PROMPT = 12  # tokens: past every original_max_len above but 64 (generate goes on past it)


def _ids(shape: dict[str, Any]) -> str:
    rope = shape["rope_scaling"]
    return ",".join(f"{k}={v}" for k, v in rope.items()) + f",heads={shape['num_attention_heads']}"


def bands(model: Any) -> set[str]:
    """Which bands the model's pairs fall in, computed here from the papers' definitions:
    llama3 by wavelength 2π / base^(−2i/d) against original / high and original / low;
    yarn by the pair i against d ln(original / 2πβ) / (2 ln base) for β fast and slow."""
    c = model.config
    rope, d = c.rope_parameters, c.head_dim
    theta = rope["rope_theta"] ** (-np.arange(0, d, 2) / d)
    L = rope.get("original_max_position_embeddings", 0)
    if rope["rope_type"] == "llama3":
        wavelength = 2 * math.pi / theta
        kept = wavelength < L / rope["high_freq_factor"]
        divided = wavelength > L / rope["low_freq_factor"]
        return {
            n
            for n, b in (("kept", kept), ("divided", divided), ("smoothed", ~kept & ~divided))
            if b.any()
        }
    if rope["rope_type"] == "yarn":
        lo, hi = (d * math.log(L / (2 * math.pi * b)) / (2 * math.log(rope["rope_theta"]))
                  for b in (rope["beta_fast"], rope["beta_slow"]))  # fmt: skip
        if rope.get("truncate", True):  # whole pairs
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, d - 1)
        i = np.arange(d // 2)
        return {
            n
            for n, b in (("kept", i <= lo), ("divided", i >= hi), ("ramped", (i > lo) & (i < hi)))
            if b.any()
        }
    return {"divided"}


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_every_hidden_state_head_and_logit_matches_scaled_llama(shape: dict[str, Any]) -> None:
    model = llama(shape, 11)
    linear = shape["rope_scaling"]["rope_type"] == "linear"
    assert len(bands(model)) == (1 if linear else 3)  # (linear's one: every pair ÷ factor)
    prompt = prompt_for(model, 11, PROMPT)
    raw = to_config(model, prompt)
    assert raw["model"]["rope_scaling"]["type"] == shape["rope_scaling"]["rope_type"]
    with float64_llama():
        expected = hf_outputs(model, prompt)
    assert_matches(expected, traced(raw).value)


def unscaled(raw: dict[str, Any]) -> None:
    raw["model"]["rope_scaling"] = None


def factor_doubled(raw: dict[str, Any]) -> None:
    raw["model"]["rope_scaling"]["factor"] *= 2


def as_linear(raw: dict[str, Any]) -> None:
    raw["model"]["rope_scaling"] = {
        "type": "linear",
        "factor": raw["model"]["rope_scaling"]["factor"],
    }


def original_halved(raw: dict[str, Any]) -> None:
    raw["model"]["rope_scaling"]["original_max_len"] //= 2


def no_attention_factor(raw: dict[str, Any]) -> None:
    s = raw["model"]["rope_scaling"]
    for key in ("mscale", "mscale_all_dim"):
        s.pop(key, None)
    s["attention_factor"] = 1.0


WRONG: list[tuple[int, Callable[[dict[str, Any]], None]]] = [
    (0, unscaled), (0, factor_doubled), (0, as_linear), (0, original_halved),
    (2, unscaled), (2, factor_doubled),
    (5, unscaled), (5, factor_doubled), (5, as_linear), (5, original_halved), (5, no_attention_factor),
]  # fmt: skip


@pytest.mark.parametrize(("index", "mutate"), WRONG, ids=lambda x: getattr(x, "__name__", str(x)))
def test_a_wrong_scaling_fails_the_comparison(
    index: int, mutate: Callable[[dict[str, Any]], None]
) -> None:
    """No scaling, twice the factor, linear in place of llama3 or yarn, half the original
    context or no attention factor: each gives other numbers than HF's."""
    model = llama(SHAPES[index], 11)
    prompt = prompt_for(model, 11, PROMPT)
    raw = to_config(model, prompt)
    mutate(raw)
    with float64_llama():
        expected = hf_outputs(model, prompt)
    with pytest.raises(AssertionError):
        assert_matches(expected, traced(raw).value)


@pytest.mark.parametrize("shape", SHAPES[::2] + SHAPES[5:], ids=_ids)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_greedy_generate_matches_scaled_llama_generate(
    shape: dict[str, Any], tmp_path: Path
) -> None:
    """HF's cache and trace-tf's both on: the new tokens' q and k turn by the same scaled
    frequencies at positions 4..11, past original_max_len 8 for llama3 and yarn."""
    assert_greedy_matches(llama(shape, 5), to_config, tmp_path, float64_llama)


def test_the_float64_patch_is_what_closes_the_gap() -> None:
    """Unpatched, HF's float32 frequencies put a scaled model about 1e-7 away: the
    comparison above needs the patch, and the patch uses HF's own scaled frequencies."""
    from hf_common import largest_error

    model = llama(SHAPES[0], 4)
    prompt = prompt_for(model, 4, PROMPT)
    error = largest_error(hf_outputs(model, prompt), traced(to_config(model, prompt)).value)
    assert 1e-10 < error < 1e-5


@pytest.mark.parametrize("shape", SHAPES[:2] + SHAPES[4:5], ids=_ids)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_readme_recipe_converts_a_scaled_llama(
    shape: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's `llama_arrays` and `llama_config` (run as printed) map rope_parameters to
    model.rope_scaling: each step as HF computes it."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    scope = run_readme("From Hugging Face LLaMA")
    model = llama(shape, 7)
    prompt, vocab = prompt_for(model, 7, PROMPT), vocab_of(model)
    np.savez("m.npz", **scope["llama_arrays"](model, vocab))
    config = scope["llama_config"](model, vocab, [vocab[i] for i in prompt], "m.npz")
    assert config["model"]["rope_scaling"]["type"] == shape["rope_scaling"]["rope_type"]
    Path("m.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with float64_llama():
        assert_matches(hf_outputs(model, prompt), decode_json("m.yaml"))
