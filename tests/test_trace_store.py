"""How the tracer keeps what it records (issue 6): each stored array is copied once
into the tracer's blocks, read-only; a step that is another step's array stays that
same array; every input is still named after the copy. And the quick check for NaN
and infinity agrees with numpy's elementwise one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import config_from

from trace_tf.config import Config
from trace_tf.runner import run
from trace_tf.trace import _all_finite, _Blocks


def _wide_cfg() -> Config:
    # 40 tokens x d_model 32 in float64: 10 KiB per [L, d] array, so they are copied
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(6)]
    cfg = config_from(
        {
            "model": {"d_model": 32, "n_heads": 2, "positional": "none"},
            "vocab": words,
            "embeddings": {w: rng.normal(size=32).round(3).tolist() for w in words},
            "source": [words[i] for i in rng.integers(0, 6, 40)],
        }
    )
    assert isinstance(cfg, Config)
    return cfg


def test_large_steps_are_copied_once_into_blocks_and_read_only() -> None:
    trace = run(_wide_cfg(), "encode")
    spans: dict[int, tuple[int, int, str]] = {}
    for s in trace:
        assert not s.value.flags.writeable, s.path
        if s.value.nbytes >= _Blocks.SMALLEST_COPIED:
            assert s.value.base is not None, s.path  # a view into a block
        start = s.value.__array_interface__["data"][0]
        spans.setdefault(id(s.value), (start, start + s.value.nbytes, s.path))
    # distinct stored arrays never overlap: nothing is held twice
    ordered = sorted(spans.values())
    for (_, end, a), (start, _, b) in itertools.pairwise(ordered):
        assert end <= start, (a, b)


def test_a_step_that_is_another_steps_array_stays_that_array() -> None:
    trace = run(_wide_cfg(), "encode")
    # no positions and no scale: the input is the embedding matrix itself
    assert trace.value("encoder.input") is trace.value("encoder.embed")
    assert trace["encoder.input"].inputs == ("encoder.embed",)
    assert trace.value("encoder.output") is trace.value("encoder.0.ffn.norm")
    assert trace["encoder.output"].inputs == ("encoder.0.ffn.norm",)


def test_inputs_are_named_after_the_copy() -> None:
    trace = run(_wide_cfg(), "encode")
    head = "encoder.0.self_attn.h1"
    assert trace[f"{head}.q"].inputs == ("encoder.input", "weights.encoder.0.self_attn.heads.1.W_q")
    assert trace[f"{head}.scores"].inputs == (f"{head}.q", f"{head}.k")
    assert trace["encoder.0.self_attn.concat"].inputs == (
        "encoder.0.self_attn.h0.context",
        "encoder.0.self_attn.h1.context",
    )
    # and the numbers are those of the arrays they name, recomputed here
    q, k = trace.value(f"{head}.q"), trace.value(f"{head}.k")
    np.testing.assert_allclose(trace.value(f"{head}.scores"), q @ k.T, rtol=1e-12)


def test_blocks_grow_and_keep_each_array_aligned_and_equal() -> None:
    blocks = _Blocks()
    rng = np.random.default_rng(0)
    sizes = [(1000, 3), (7, 5), (3000, 100), (600, 1000), (50, 50)]  # up to 4.6 MiB
    kept = []
    for shape in sizes:
        for dtype in (np.float64, np.float32):
            a = rng.normal(size=shape).astype(dtype)
            b = blocks.store(a)
            assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b)
            if a.nbytes >= _Blocks.SMALLEST_COPIED:
                assert b is not a and b.__array_interface__["data"][0] % 64 == 0
            else:
                assert b is a
            kept.append((a.copy(), b))
    for a, b in kept:  # later arrays never overwrote earlier ones
        assert np.array_equal(a, b)
    view = np.ones((100, 100))[::2]
    assert blocks.store(view) is view  # a view (perhaps of another step) is kept as it is


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_quick_finite_check_agrees_with_isfinite(dtype: type) -> None:
    big = float(np.finfo(dtype).max) / 2  # finite, but its square overflows
    cases = [
        np.zeros((0, 3)),
        np.array(1.5),
        np.array([[1.0, 2.0], [3.0, 4.0]]),
        np.array([big, -big, big]),
        np.array([1.0, np.nan]),
        np.array([np.inf, 1.0]),
        np.array([-np.inf, 1.0]),
        np.array([[1.0, np.nan], [2.0, 3.0]]).T,  # not contiguous
        np.array([[1.0, 5.0], [big, 3.0]]).T,
    ]
    for a in cases:
        a = a.astype(dtype)
        assert _all_finite(a) == bool(np.isfinite(a).all()), a
