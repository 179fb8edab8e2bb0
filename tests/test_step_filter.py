"""`step` stores only what it shows: filtering while tracing gives exactly what
filtering a full trace gives (issue 6)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import config_from
from random_configs import random_config
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import run
from trace_tf.trace import Trace, matches

SELECTIONS = [
    ("softmax", None, 1),
    ("scores", 0, 0),
    ("qkv", None, None),
    ("cross", None, None),
    ("decoder.0.*.h1.*", None, None),
    ("add_norm", 1, None),
    ("logits", None, None),
    ("output", None, None),
    ("masked", None, None),
]


def _cfg() -> Config:
    raw = random_config(
        np.random.default_rng(5),
        d_model=8,
        n_heads=2,
        encoder_layers=2,
        decoder_layers=2,
        pad=True,
        src_len=5,
        tgt_len=4,
    )
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    return cfg


def _same(a: Trace, b: Trace, path: str) -> None:
    x, y = a[path], b[path]
    assert (x.formula, x.inputs, x.rows, x.cols) == (y.formula, y.inputs, y.rows, y.cols), path
    assert x.value is not None and np.array_equal(x.value, y.value, equal_nan=True), path


@pytest.mark.parametrize(("stage", "layer", "head"), SELECTIONS)
def test_filtered_trace_shows_what_the_full_trace_shows(
    stage: str, layer: int | None, head: int | None
) -> None:
    cfg = _cfg()
    full = run(cfg, "full")
    kept = run(cfg, "full", keep=lambda p: matches(p, stage, layer, head), with_inputs=True)
    want = full.select(stage, layer, head)
    got = kept.select(stage, layer, head)
    assert want and [s.path for s in got] == [s.path for s in want]
    for s in want:
        _same(kept, full, s.path)
        for name in s.inputs:  # each input the step is shown with
            if name in full:
                assert name in kept, (s.path, name)
                _same(kept, full, name)
    assert len(kept) < len(full)  # the rest was never stored
    assert kept.stages() == full.stages()  # stage names still known, for check_stage
    assert kept.warnings == full.warnings


def test_only_selected_steps_and_their_inputs_are_stored() -> None:
    cfg = _cfg()
    alone = run(cfg, "full", keep=lambda p: matches(p, "scores", 1, 0))
    assert sorted(alone.steps) == [
        "decoder.1.cross_attn.h0.scores",
        "decoder.1.self_attn.h0.scores",
        "encoder.1.self_attn.h0.scores",
    ]
    kept = run(cfg, "full", keep=lambda p: matches(p, "scores", 1, 0), with_inputs=True)
    assert sorted(kept.steps) == sorted(
        [
            "encoder.1.self_attn.h0.scores",
            "encoder.1.self_attn.h0.q",
            "encoder.1.self_attn.h0.k",
            "decoder.1.self_attn.h0.scores",
            "decoder.1.self_attn.h0.q",
            "decoder.1.self_attn.h0.k",
            "decoder.1.cross_attn.h0.scores",
            "decoder.1.cross_attn.h0.q",
            "decoder.1.cross_attn.h0.k",
        ]
    )


def test_steps_are_stored_not_copied() -> None:
    cfg = config_from(
        {
            "model": {"d_model": 2, "positional": "none"},
            "vocab": ["a", "b"],
            "embeddings": {"a": [1, 2], "b": [3, 4]},
            "source": ["a", "b"],
        }
    )
    assert isinstance(cfg, Config)
    trace = run(cfg, "encode")
    # no positions and no scale: the input is the embedding matrix itself
    assert trace.value("encoder.input") is trace.value("encoder.embed")
    assert trace["encoder.input"].inputs == ("encoder.embed",)
    # the output is the last norm itself, and names it as its input
    assert trace.value("encoder.output") is trace.value("encoder.0.ffn.norm")
    assert trace["encoder.output"].inputs == ("encoder.0.ffn.norm",)
    assert trace["encoder.0.self_attn.h0.q"].inputs == (
        "encoder.input",
        "weights.encoder.0.self_attn.heads.0.W_q",
    )


def test_step_takes_one_whole_path_and_refuses_an_unknown_one() -> None:
    runner = CliRunner()
    ok = runner.invoke(
        app, ["step", "--stage", "decoder.0.cross_attn.h1.softmax", "--format", "json"]
    )
    assert ok.exit_code == 0, ok.output
    assert [s["path"] for s in json.loads(ok.stdout)["steps"]] == [
        "decoder.0.cross_attn.h1.softmax"
    ]
    bad = runner.invoke(app, ["step", "--stage", "encoder.9.self_attn.h0.softmax"])
    assert bad.exit_code == 2
    assert "did you mean 'encoder.0.self_attn.h0.softmax'" in bad.stderr
