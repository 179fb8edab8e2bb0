"""Invariants of the math, checked with hypothesis over random small models (issue 5).

Each property is a fact about the Transformer, not a number the code printed:
softmax rows sum to 1; without positions self-attention is permutation-equivariant;
the causal mask hides later tokens; pads change nothing at real tokens; LayerNorm rows
have mean 0 and variance var / (var + eps); per-head and fused weights are one model;
tracing does not disturb the computation; JSON gives back every float64 bit.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import config_from
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from random_configs import PAD, WORDS, random_config, to_per_head
from typer.testing import CliRunner

from trace_tf import model, ops, render
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.errors import InputError
from trace_tf.runner import run
from trace_tf.trace import NULL_TRACER, Trace, Tracer

SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
CLOSE = {"rtol": 1e-9, "atol": 1e-11}  # summation order may differ; nothing else may


@st.composite
def shapes(draw: st.DrawFn, **fixed: Any) -> dict[str, Any]:
    """Keyword arguments of random_config for a small model of any kind SPEC allows."""
    shape: dict[str, Any] = {
        "d_model": draw(st.integers(1, 6)),
        "n_heads": draw(st.integers(1, 3)),
        "d_k": draw(st.integers(1, 3)),
        "d_v": draw(st.integers(1, 3)),
        "d_ff": draw(st.integers(1, 6)),
        "encoder_layers": draw(st.integers(0, 2)),
        "decoder_layers": draw(st.integers(0, 2)),
        "norm_position": draw(st.sampled_from(["post", "pre"])),
        "norm": draw(st.sampled_from(["layer", "rms"])),
        "activation": draw(
            st.sampled_from(
                ["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh", "swiglu_oss"]
            )
        ),
        "positional": draw(st.sampled_from(["sinusoidal", "learned", "rope", "none"])),
        "rope_pairs": draw(st.sampled_from(["adjacent", "halves"])),
        "biases": draw(st.booleans()),
        "fused": draw(st.booleans()),
        "src_len": draw(st.integers(1, 5)),
        "tgt_len": draw(st.integers(1, 5)),
    }
    # Fixed values override the draws; a strategy among them is drawn from.
    shape.update({k: draw(v) if isinstance(v, st.SearchStrategy) else v for k, v in fixed.items()})
    if shape["encoder_layers"] == 0 and shape["decoder_layers"] == 0:
        shape["encoder_layers"] = 1
    return shape


def make(seed: int, shape: dict[str, Any]) -> dict[str, Any]:
    return random_config(np.random.default_rng(seed), **shape)


def build(cfg_dict: dict[str, Any]) -> Config:
    cfg = config_from(cfg_dict)
    assert isinstance(cfg, Config)
    return cfg


def trace_of(cfg_dict: dict[str, Any]) -> Trace:
    return run(build(cfg_dict), "full")


seeds = st.integers(0, 2**32 - 1)


# ---------------------------------------------------------------------------
# softmax and normalisation
# ---------------------------------------------------------------------------

finite = st.floats(-1e300, 1e300, allow_nan=False)
rows = hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=7), elements=finite)


@SETTINGS
@given(rows, st.data())
def test_softmax_rows_sum_to_one(x: np.ndarray, data: st.DataObject) -> None:
    # Mask some entries, never a whole row, and use a temperature.
    hide = data.draw(hnp.arrays(np.bool_, x.shape))
    hide[:, 0] = False
    t = data.draw(st.floats(0.05, 20))
    p = ops.softmax(np.where(hide, -np.inf, x), t)
    assert np.all((p >= 0) & (p <= 1))
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=0, atol=1e-12 * x.shape[1])
    assert np.all(p[hide] == 0)
    # The largest visible score gets the largest weight.
    visible = np.where(hide, -np.inf, x)
    top = np.argmax(visible, axis=-1)
    assert np.all(p[np.arange(len(p)), top] == p.max(axis=-1))


moderate = st.floats(-1e3, 1e3, allow_nan=False)


@SETTINGS
@given(
    hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, min_side=2), elements=moderate)
)
def test_layer_norm_rows_have_mean_0_and_variance_var_over_var_plus_eps(x: np.ndarray) -> None:
    var = x.var(axis=-1)
    assume(np.all(var > 1e-3))
    d = x.shape[1]
    for eps in (0.0, 1e-5, 0.5):
        y = ops.layer_norm(x, np.ones(d), np.zeros(d), eps)
        np.testing.assert_allclose(y.mean(axis=-1), 0.0, atol=1e-9)
        # Biased variance of the output: var / (var + eps), exactly 1 when eps is 0.
        np.testing.assert_allclose(y.var(axis=-1), var / (var + eps), rtol=1e-9)
    r = ops.rms_norm(x, np.ones(d), np.zeros(d), 0.0)
    np.testing.assert_allclose((r * r).mean(axis=-1), 1.0, rtol=1e-9)


# ---------------------------------------------------------------------------
# attention: permutations, the causal mask, padding
# ---------------------------------------------------------------------------


@SETTINGS
@given(
    seeds,
    shapes(positional="none", src_len=st.integers(2, 5), encoder_layers=st.integers(1, 2)),
    st.data(),
)
def test_self_attention_without_positions_is_permutation_equivariant(
    seed: int, shape: dict[str, Any], data: st.DataObject
) -> None:
    cfg = make(seed, shape)
    perm = data.draw(st.permutations(range(len(cfg["source"]))))
    permuted = copy.deepcopy(cfg)
    permuted["source"] = [cfg["source"][i] for i in perm]
    a, b = trace_of(cfg), trace_of(permuted)
    np.testing.assert_allclose(b.value("encoder.output"), a.value("encoder.output")[perm], **CLOSE)
    if shape["decoder_layers"]:
        # Cross-attention sums over the source: its order does not matter either.
        np.testing.assert_allclose(b.value("logits"), a.value("logits"), **CLOSE)


@SETTINGS
@given(seeds, shapes(decoder_layers=st.integers(1, 2), tgt_len=4), st.data())
def test_later_target_tokens_do_not_change_earlier_decoder_outputs(
    seed: int, shape: dict[str, Any], data: st.DataObject
) -> None:
    cfg = make(seed, shape)
    cut = data.draw(st.integers(0, len(cfg["target"]) - 2))
    changed = copy.deepcopy(cfg)
    later = data.draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3))
    changed["target"] = cfg["target"][: cut + 1] + later
    a, b = trace_of(cfg), trace_of(changed)
    for step in ("decoder.output", "logits", "probs"):
        np.testing.assert_allclose(b.value(step)[: cut + 1], a.value(step)[: cut + 1], **CLOSE)


def _without_pads(tokens: list[str]) -> list[str]:
    return [t for t in tokens if t != PAD]


@SETTINGS
@given(seeds, shapes(pad=True, src_len=st.integers(2, 5), tgt_len=4))
def test_trailing_pads_change_nothing_at_real_tokens(seed: int, shape: dict[str, Any]) -> None:
    padded = make(seed, shape)
    plain = copy.deepcopy(padded)
    for key in ("source", "target"):
        if key in plain:
            plain[key] = _without_pads(plain[key])
    a, b = trace_of(padded), trace_of(plain)
    if "source" in padded:
        n = len(plain["source"])
        assume(n < len(padded["source"]))
        np.testing.assert_allclose(
            a.value("encoder.output")[:n], b.value("encoder.output"), **CLOSE
        )
    if "target" in padded:
        m = len(plain["target"])
        for step in ("decoder.output", "logits"):
            np.testing.assert_allclose(a.value(step)[:m], b.value(step), **CLOSE)


@SETTINGS
@given(seeds, shapes(positional="none", src_len=3, encoder_layers=st.integers(1, 2)), st.data())
def test_pads_anywhere_change_nothing_at_real_tokens_without_positions(
    seed: int, shape: dict[str, Any], data: st.DataObject
) -> None:
    plain = make(seed, {**shape, "pad": True})
    plain["source"] = _without_pads(plain["source"]) or ["t2"]
    if "target" in plain:
        plain["target"] = _without_pads(plain["target"])
    padded = copy.deepcopy(plain)
    where = data.draw(st.lists(st.integers(0, len(plain["source"])), min_size=1, max_size=3))
    source = list(plain["source"])
    for i in sorted(where, reverse=True):
        source.insert(i, PAD)
    padded["source"] = source
    real = [i for i, t in enumerate(source) if t != PAD]
    a, b = trace_of(padded), trace_of(plain)
    np.testing.assert_allclose(a.value("encoder.output")[real], b.value("encoder.output"), **CLOSE)
    if "target" in plain:
        np.testing.assert_allclose(a.value("logits"), b.value("logits"), **CLOSE)


# ---------------------------------------------------------------------------
# one model, however it is written down or run
# ---------------------------------------------------------------------------


@SETTINGS
@given(seeds, shapes(fused=True))
def test_per_head_and_fused_weights_give_identical_traces(seed: int, shape: dict[str, Any]) -> None:
    fused = make(seed, shape)
    a, b = trace_of(fused), trace_of(to_per_head(fused))
    assert list(a.steps) == list(b.steps)
    for path, step in a.steps.items():
        np.testing.assert_array_equal(step.value, b.value(path), err_msg=path)


@SETTINGS
@given(seeds, shapes())
def test_traced_equals_untraced(seed: int, shape: dict[str, Any]) -> None:
    cfg = build(make(seed, shape))
    tr = Tracer()
    traced = model.run_full(cfg, tr)
    untraced = model.run_full(cfg, NULL_TRACER)
    np.testing.assert_array_equal(traced, untraced)
    last = "probs" if cfg.vocab else "encoder.output"
    np.testing.assert_array_equal(tr.trace.value(last), untraced)


@SETTINGS
@given(seeds, shapes())
def test_the_size_limit_never_underestimates_a_run(seed: int, shape: dict[str, Any]) -> None:
    cfg_dict = make(seed, shape)
    cfg = build(cfg_dict)
    held = sum(a.size for a in cfg.named_arrays().values()) + sum(s.value.size for s in run(cfg))
    with pytest.raises(InputError, match="too large"):
        config_from(cfg_dict, max_elements=held - 1)


# ---------------------------------------------------------------------------
# JSON gives back every value exactly
# ---------------------------------------------------------------------------

NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def from_json(value: Any) -> np.ndarray:
    def back(v: Any) -> Any:
        if isinstance(v, list):
            return [back(x) for x in v]
        return NON_FINITE[v] if isinstance(v, str) else v

    return np.array(back(value), dtype=np.float64)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as float64 bit patterns (any NaN equal to any NaN: JSON keeps no payload)."""
    if a.shape != b.shape:
        return False
    nan = np.isnan(a)
    return bool(
        np.array_equal(nan, np.isnan(b))
        and np.array_equal(a[~nan].view(np.int64), b[~nan].view(np.int64))
    )


@SETTINGS
@given(
    hnp.arrays(np.float64, hnp.array_shapes(max_dims=3, max_side=5), elements=st.floats(width=64))
)
def test_json_values_round_trip_every_bit(x: np.ndarray) -> None:
    # Any float64 at all: subnormals, -0.0, the extremes, NaN and both infinities.
    text = json.dumps(render.json_value(x), allow_nan=False)
    assert same_bits(from_json(json.loads(text)), x)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=seeds, shape=shapes(pad=True, src_len=3))
def test_json_output_of_a_run_round_trips_every_step(
    seed: int, shape: dict[str, Any], tmp_path: Path
) -> None:
    cfg_dict = make(seed, shape)
    path = tmp_path / "random.yaml"
    path.write_text(json.dumps(cfg_dict))  # JSON is YAML; floats written by repr, exactly
    result = CliRunner().invoke(app, ["step", str(path), "--stage", "*", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    steps = json.loads(result.stdout)["steps"]
    expected = trace_of(cfg_dict)
    assert [s["path"] for s in steps] == list(expected.steps)
    for s in steps:
        assert same_bits(from_json(s["value"]), expected.value(s["path"])), s["path"]
