"""RoPE by decoder layer (model.pe_base and model.rope_scaling as lists, Gemma 3's local
and global layers): each layer's q and k turned by its own base and scaling, checked by
a rotation written here; a list of equal entries is the single value, step for step; the
header, the step formulas and `explain` name each layer's. (The torch reference, the KV
cache and float32: tests/test_engine_reference.py, test_generate.py and test_dtype.py run
configs with such lists; the refusals: tests/test_bad_inputs.py.)"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import config_from
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import conventions, run
from trace_tf.trace import Trace

runner = CliRunner()


def _data(bases: Any, scalings: Any = None, pairs: str = "adjacent") -> dict[str, Any]:
    """A 2-layer decoder-only RoPE model (d_k 6, two heads sharing one K/V head) on 5
    tokens, its weights drawn with a seed, with model.pe_base `bases` and
    model.rope_scaling `scalings` as given."""
    model: dict[str, Any] = {
        "d_model": 6,
        "n_heads": 2,
        "n_kv_heads": 1,
        "d_k": 6,
        "encoder_layers": 0,
        "decoder_layers": 2,
        "positional": "rope",
        "rope_pairs": pairs,
        "norm_position": "pre",
        "pe_base": bases,
        "seed": 3,
    }
    if scalings is not None:
        model["rope_scaling"] = scalings
    return {"model": model, "vocab": ["a", "b", "c"], "target": ["a", "b", "c", "a", "b"]}


def _traced(data: dict[str, Any]) -> tuple[Config, Trace]:
    cfg = config_from(copy.deepcopy(data))
    assert isinstance(cfg, Config)
    return cfg, run(cfg, "decode")


def turned(x: np.ndarray, base: float, factor: float, pairs: str) -> np.ndarray:
    """Row pos of x, pair i (columns 2i, 2i+1, or i, i + d/2 by halves) turned by
    pos · base^(−2i/d) / factor radians, entry by entry."""
    out = x.copy()
    L, d = x.shape
    for pos in range(L):
        for i in range(d // 2):
            theta = pos * base ** (-2 * i / d) / factor
            a, b = (2 * i, 2 * i + 1) if pairs == "adjacent" else (i, i + d // 2)
            c, s = np.cos(theta), np.sin(theta)
            out[pos, a] = x[pos, a] * c - x[pos, b] * s
            out[pos, b] = x[pos, a] * s + x[pos, b] * c
    return out


LINEAR = {"type": "linear", "factor": 4}
CASES = [
    # (pe_base, rope_scaling, pairs, each layer's (base, factor))
    ([10000, 10], None, "adjacent", [(10000, 1), (10, 1)]),
    ([10000, 10], [None, LINEAR], "halves", [(10000, 1), (10, 4)]),
    (100, [LINEAR, None], "adjacent", [(100, 4), (100, 1)]),  # one base, scaled in layer 0
]


@pytest.mark.parametrize("bases, scalings, pairs, layers", CASES)
def test_each_layer_turns_q_and_k_by_its_own_base_and_scaling(
    bases: Any, scalings: Any, pairs: str, layers: list[tuple[float, float]]
) -> None:
    cfg, trace = _traced(_data(bases, scalings, pairs))
    assert cfg.model.mixed_rope
    for l, (base, factor) in enumerate(layers):
        other = layers[1 - l]
        for head, name in (("h0", "q"), ("h1", "q"), ("h0", "k")):
            step = f"decoder.{l}.self_attn.{head}.{name}"
            raw = trace.value(step + "_raw")
            np.testing.assert_allclose(
                trace.value(step), turned(raw, base, factor, pairs), rtol=0, atol=1e-12
            )
            # the other layer's RoPE would be far from it (a check that can fail)
            wrong = turned(raw, other[0], other[1], pairs)
            assert np.max(np.abs(trace.value(step) - wrong)) > 1e-3


def test_a_list_of_equal_entries_is_the_single_value_step_for_step() -> None:
    one = _data(100, LINEAR)
    listed = _data([100, 100], [LINEAR, dict(LINEAR)])
    (a_cfg, a), (b_cfg, b) = _traced(one), _traced(listed)
    assert not b_cfg.model.mixed_rope
    assert b_cfg.model == a_cfg.model
    assert conventions(a_cfg) == conventions(b_cfg)
    assert list(a.steps) == list(b.steps)
    for path in a.steps:
        assert a[path].formula == b[path].formula, path
        assert np.array_equal(a.value(path), b.value(path)), path


def test_the_header_and_the_formulas_name_each_layer_s_rope() -> None:
    cfg, trace = _traced(_data([10000, 10], [None, LINEAR]))
    positions = " ".join(dict(conventions(cfg))["positions"].split())
    assert "RoPE on q and k in self-attention, base and scaling by layer" in positions
    assert (
        "θ_i = base^(−2i/d_k), by layer (model.pe_base.<l>, model.rope_scaling.<l>): base "
        "10000 in layer 0; base 10 scaled, linear (position interpolation): θ_i ÷ factor 4 "
        "in layer 1"
    ) in positions
    assert trace["decoder.0.self_attn.h0.q"].formula == (
        "Q = RoPE(Q_raw, pos), pairs (2i, 2i+1), base 10000"
    )
    assert trace["decoder.1.self_attn.h0.k"].formula == (
        "K = RoPE(K_raw, pos), pairs (2i, 2i+1), base 10, linear-scaled frequencies, "
        "K/V head 0 (shared by h0, h1)"
    )
    # one RoPE for every layer: the header as it always was
    single = dict(conventions(_traced(_data(10000))[0]))["positions"]
    assert single.startswith("RoPE on q and k in self-attention, base 10000: pair (2i, 2i+1)")


def test_explain_turns_an_entry_by_its_layer_s_base(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump(_data([10000, 10], [None, LINEAR])), encoding="utf-8")

    def said(step: str) -> str:
        result = runner.invoke(app, ["explain", step, str(f), "--cell", "3,1"])
        assert result.exit_code == 0, result.stderr
        return " ".join(result.stdout.split())

    layer1 = said("decoder.1.self_attn.h1.q")
    # θ = 3 · 10^(−0/6) / 4 = 0.75 for pair 0 (columns 0, 1)
    assert "θ = pos · θ_p = 3 · 0.25 = 0.75 rad (position 3, pair 0" in layer1
    assert "base 10: layer 1's (model.pe_base.1), model.rope_scaling.1: linear" in layer1
    assert "the arithmetic above agrees" in layer1
    layer0 = said("decoder.0.self_attn.h0.k")
    assert "3 · 10000^(−0/6) = 3 rad" in layer0
    assert "base 10000: layer 0's (model.pe_base.0)" in layer0
    assert "the arithmetic above agrees" in layer0


# ---------------------------------------------------------------------------
# Layers without RoPE (a null base: Cohere 2's full layers, NoPE)
# ---------------------------------------------------------------------------


def test_a_null_base_leaves_its_layer_s_q_and_k_unturned() -> None:
    cfg, trace = _traced(_data([10000, None], pairs="adjacent"))
    assert cfg.model.nope_layers == (1,)
    assert cfg.model.layer_turns(0) and not cfg.model.layer_turns(1)
    # layer 1: q and k straight from the projection, x W (no q_raw, no rotation)
    x = trace.value("decoder.1.self_attn.norm")
    w = cfg.decoder[1].self_attn.heads[0]
    b = 0 if w.b_q is None else w.b_q
    np.testing.assert_allclose(
        trace.value("decoder.1.self_attn.h0.q"), x @ w.W_q + b, rtol=0, atol=1e-12
    )
    assert "decoder.1.self_attn.h0.q_raw" not in trace.steps
    assert trace["decoder.1.self_attn.h0.q"].formula.startswith("Q = X W_q")
    # layer 0 still turned by its base (and a turned layer 1 would differ: can fail)
    raw = trace.value("decoder.0.self_attn.h0.k_raw")
    k0 = trace.value("decoder.0.self_attn.h0.k")
    np.testing.assert_allclose(k0, turned(raw, 10000, 1, "adjacent"), rtol=0, atol=1e-12)
    q1 = trace.value("decoder.1.self_attn.h0.q")
    assert np.max(np.abs(turned(q1, 10000, 1, "adjacent") - q1)) > 1e-3
    # the scores of layer 1 are those of the unturned q and k, by hand
    k1 = trace.value("decoder.1.self_attn.h0.k")
    np.testing.assert_allclose(
        trace.value("decoder.1.self_attn.h0.scores"), q1 @ k1.T, rtol=0, atol=1e-12
    )


def test_a_null_base_with_one_scaling_scales_the_turned_layers_only() -> None:
    cfg, trace = _traced(_data([None, 10], LINEAR, pairs="halves"))
    assert cfg.model.pe_base == 10  # (the first turned layer's)
    assert cfg.model.layer_rope_scalings[0] is None
    raw = trace.value("decoder.1.self_attn.h1.q_raw")
    np.testing.assert_allclose(
        trace.value("decoder.1.self_attn.h1.q"), turned(raw, 10, 4, "halves"), rtol=0, atol=1e-12
    )
    assert "decoder.0.self_attn.h0.q_raw" not in trace.steps


def test_the_header_and_explain_name_the_layers_without_rope(tmp_path: Path) -> None:
    cfg, _ = _traced(_data([10000, None]))
    positions = " ".join(dict(conventions(cfg))["positions"].split())
    assert (
        "base 10000 in layer 0; no RoPE (model.pe_base.<l> null: q and k as projected) in layer 1"
    ) in positions
    f = tmp_path / "n.yaml"
    f.write_text(yaml.safe_dump(_data([10000, None])), encoding="utf-8")
    result = runner.invoke(app, ["explain", "decoder.1.self_attn.h0.k", str(f), "--cell", "3,1"])
    assert result.exit_code == 0, result.stderr
    said = " ".join(result.stdout.split())
    assert "K = X W_k" in said and "RoPE" not in said and "the arithmetic above agrees" in said
