"""`step` stores only what it shows: filtering while tracing gives exactly what
filtering a full trace gives (issue 6)."""

from __future__ import annotations

import json
import re
from pathlib import Path

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


# What a selection that selects nothing says (the packaged `hello`: post-norm, one
# encoder and one decoder layer, two heads, sinusoidal positions, scaled_dot).
NOT_RECORDED = [
    ("final_norm", "model.norm_position: pre, sandwich or output, or model.final_norm: true"),
    ("post_norm", "model.norm_position: sandwich"),
    ("q_raw", "model.positional: rope"),
    ("k_raw", "model.positional: rope"),
    ("q_a", "model.score: additive"),
    ("k_a", "model.score: additive"),
    ("tanh", "model.score: additive"),
    ("q_b", "model.score: bilinear"),
    ("rms", "model.norm: rms"),
    ("centered", "only in the norm calculator, trace-tf norm"),
]


def _step(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["step", "hello", *args])
    return result.exit_code, result.stderr


@pytest.mark.parametrize(("stage", "why"), NOT_RECORDED)
def test_a_stage_this_config_does_not_record_is_named_as_a_stage(stage: str, why: str) -> None:
    code, err = _step("--stage", stage)
    assert code == 2 and "Traceback" not in err
    assert f"stage '{stage}' exists, but it is not recorded by this config" in err
    assert why in err and "unknown stage" not in err and "did you mean" not in err
    assert len(err.strip().splitlines()) == 1


def test_an_unknown_stage_still_gets_the_nearest_name() -> None:
    code, err = _step("--stage", "final_nrm")
    assert code == 2 and "unknown stage 'final_nrm'" in err and "did you mean" in err


def test_a_layer_the_model_lacks_is_named_with_the_layers_it_has() -> None:
    code, err = _step("--stage", "softmax", "--layer", "5")
    assert code == 2 and "no step matches --stage softmax --layer 5" in err
    assert "the model has no layer 5" in err
    assert "expected a layer from 0 to 0 (1 encoder + 1 decoder layer), found 5" in err


def test_a_head_the_model_lacks_is_named_with_the_heads_it_has() -> None:
    code, err = _step("--stage", "softmax", "--head", "2")
    assert code == 2 and "the model has no head 2" in err
    assert "expected a head from 0 to 1 (2 heads per attention block), found 2" in err


def test_a_stage_outside_the_layers_says_so() -> None:
    code, err = _step("--stage", "embed", "--layer", "0")
    assert code == 2 and "no step matches --stage embed --layer 0" in err
    assert "the steps --stage embed selects are outside the layers" in err
    assert "without --layer" in err and "found --layer 0" in err
    code, err = _step("--stage", "wo", "--head", "0")
    assert code == 2 and "the steps --stage wo selects are not per head" in err


def test_a_stage_recorded_in_other_layers_names_them() -> None:
    raw = random_config(
        np.random.default_rng(5), d_model=4, n_heads=2, encoder_layers=2, decoder_layers=1
    )
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    from trace_tf.errors import InputError
    from trace_tf.trace import check_selection

    trace = run(cfg, "full")
    with pytest.raises(InputError) as exc:
        check_selection(trace, "cross", 1, None)
    assert "--stage cross is recorded in layer 0 only" in str(exc.value)
    with pytest.raises(InputError) as exc:
        check_selection(trace, "softmax", 2, None)
    assert "(2 encoder + 1 decoder layers), found 2" in str(exc.value)
    check_selection(trace, "softmax", 1, 0)  # encoder layer 1: selects steps


def test_generate_trace_checks_the_selection_as_step_does() -> None:
    runner = CliRunner()
    for args in (
        ["--stage", "k", "--layer", "3"],
        ["--stage", "final_norm"],
        ["--stage", "v", "--head", "7"],
    ):
        gen = runner.invoke(app, ["generate", "hello", "--trace", "--max-tokens", "2", *args])
        step = runner.invoke(app, ["step", "hello", *args])
        assert gen.exit_code == 2 and step.exit_code == 2, (args, gen.stdout)
        assert gen.stderr == step.stderr and gen.stdout == ""
    for args in (["--layer", "0"], ["--head", "1"]):  # no --stage: every step of that layer
        ok = runner.invoke(app, ["generate", "hello", "--trace", "--max-tokens", "2", *args])
        assert ok.exit_code == 0, ok.stderr
    bad = runner.invoke(app, ["generate", "hello", "--trace", "--max-tokens", "2", "--head", "2"])
    assert bad.exit_code == 2 and "no step matches --head 2: the model has no head 2" in bad.stderr


def test_the_cross_group_is_everything_under_decoder_l_cross_attn_and_nothing_else() -> None:
    # SPEC section 3: `cross` is "everything under decoder.*.cross_attn". The mask the
    # cross-attention reads, decoder.cross_mask, is a step of the decoder, not under it
    # (select it by its own name, `--stage cross_mask`).
    pads = ["--set", "tokens.pad=hello", "--set", "source=[world, hello]"]
    result = CliRunner().invoke(app, ["decode", *pads, "--format", "json"])
    assert result.exit_code == 0, result.output
    every = [s["path"] for s in json.loads(result.stdout)["steps"]]
    assert "decoder.cross_mask" in every  # the source pad applies
    under = [p for p in every if re.match(r"decoder\.\d+\.cross_attn\.", p)]
    result = CliRunner().invoke(app, ["step", *pads, "--stage", "cross", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert [s["path"] for s in json.loads(result.stdout)["steps"]] == under
    args = ["generate", *pads, "--max-tokens", "2", "--trace", "--stage", "cross"]
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    paths = [s["path"] for s in json.loads(result.stdout)["steps"]]
    assert paths and all(re.match(r"t\d+\.decoder\.\d+\.cross_attn\.", p) for p in paths)
    result = CliRunner().invoke(app, ["step", *pads, "--stage", "cross_mask", "--format", "json"])
    assert [s["path"] for s in json.loads(result.stdout)["steps"]] == ["decoder.cross_mask"]


@pytest.mark.parametrize("kind", ["layer", "rms", "batch"])
def test_add_norm_selects_every_step_of_the_norm_calculator(tmp_path: Path, kind: str) -> None:
    # As `attention` selects all of attend's attn.* steps, add_norm selects all of the norm
    # calculator's: it selected its statistics (norm.mean, norm.var) but not its output.
    path = tmp_path / "n.yaml"
    path.write_text("norm: {kind: KIND, x: [[1, 2], [3, 5]]}\n".replace("KIND", kind))
    every = CliRunner().invoke(app, ["step", str(path), "--stage", "*", "--format", "json"])
    assert every.exit_code == 0, every.output
    paths = [s["path"] for s in json.loads(every.stdout)["steps"]]
    assert "norm.out" in paths and len(paths) >= 2
    group = CliRunner().invoke(app, ["step", str(path), "--stage", "add_norm", "--format", "json"])
    assert group.exit_code == 0, group.output
    assert [s["path"] for s in json.loads(group.stdout)["steps"]] == paths


def _wide(args: list[str]) -> str:
    """What a command prints on a terminal 200 columns wide."""
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


def _table_after(out: str, title: str) -> list[list[str]]:
    """The cells of the table printed under the line that starts with `title`: its header
    row, then each body row (label first), up to its bottom border."""
    lines = [x.strip("│ ") for x in out.splitlines()]
    start = next(i for i, x in enumerate(lines) if x.startswith(title))
    rows: list[list[str]] = []
    for x in lines[start + 1 :]:
        if x.startswith("└"):
            break
        if x and not x.startswith(("┏", "┡")):  # (borders)
            rows.append([c.strip() for c in re.split(r"[┃│]", x.strip("┃│ "))])
    return rows


def test_step_shows_a_tied_output_weight_with_the_vocabulary_over_its_columns() -> None:
    # It was named ("input embeddings (tied, transposed)") but not shown. Tied, W is
    # the embedding table transposed: its column for a token is that token's embedding.
    out = _wide(["step", "--stage", "logits", "--set", "model.tie_embeddings=true"])
    header, *body = _table_after(
        out,
        "embeddings (tied, transposed)   weight (tied: the embeddings transposed; "
        "model.tie_embeddings from --set)   [4 × 10]",
    )
    vocab = ["hello", "mundo", "world", "how", "?", "EOS", "SOS", "a", "hola", "c"]
    assert header[-10:] == vocab
    column = {tok: [float(r[1 + k]) for r in body] for k, tok in enumerate(vocab)}
    assert column["hello"] == [1, 2, 3, 4] and column["world"] == [2, 3, 4, 5]  # 001's E


def test_step_labels_given_arrays_as_the_steps_made_from_them() -> None:
    # A single operation's Q and K were named, not shown; a relative bias table's
    # entries were labelled 0..4 where they are the offsets j − i = −2..+2.
    out = _wide(["step", "fixtures/002_database_query.yaml", "--stage", "scores"])
    assert [r[0] for r in _table_after(out, "Q   given   [1 × 3]")[1:]] == ["q0"]
    k = _table_after(out, "K   given   [4 × 3]")
    assert [r[0] for r in k[1:]] == ["k0", "k1", "k2", "k3"]
    assert [float(x) for x in k[4][1:]] == [1, 4, 0]  # 002's fourth key, [1, 4, 0]
    out = _wide(["step", "fixtures/000_relative_bias.yaml", "--stage", "rel_bias"])
    table = _table_after(
        out,
        "weights.encoder.0.self_attn.heads.0.rel_bias   "
        "weight (fixtures/000_relative_bias.yaml line 29)   [5]",
    )
    assert table[0][-5:] == ["-2", "-1", "0", "+1", "+2"]
    assert [float(x) for x in table[1][-5:]] == [-1, 0.5, 0, 1, 2]  # b(−2) .. b(+2)
