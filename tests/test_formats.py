"""--format npz (every step under its path) and --format csv (one step) (issue 6)."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from random_configs import random_config
from reference_torch import reference_forward
from typer.testing import CliRunner

from trace_tf.cli import app

runner = CliRunner()


def _config(tmp_path: Path, wide: bool = False) -> tuple[str, dict[str, object]]:
    # wide: [L, d] arrays of 40 x 32 floats (10 KiB), which the tracer copies into
    # its blocks; the small ones it keeps as they are
    size = dict(d_model=32, src_len=40, tgt_len=36) if wide else dict(d_model=4)
    raw = random_config(np.random.default_rng(2), n_heads=2, decoder_layers=1, pad=True, **size)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return str(path), raw


@pytest.mark.parametrize("wide", [False, True], ids=["small", "wide"])
def test_npz_holds_every_step_under_its_path_exactly(tmp_path: Path, wide: bool) -> None:
    path, raw = _config(tmp_path, wide)
    out = tmp_path / "steps.npz"
    result = runner.invoke(app, ["decode", path, "--format", "npz", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    expected = reference_forward(raw)  # PyTorch, float64
    with np.load(out) as npz:
        keys = list(npz.keys())
        paths = json.loads(runner.invoke(app, ["decode", path, "--format", "json"]).stdout)
        steps = {s["path"]: s for s in paths["steps"]}
        assert keys == list(steps)  # every step, in order, under its path
        for key in keys:
            assert npz[key].shape == tuple(steps[key]["shape"]) and npz[key].dtype == np.float64
        for key, want in expected.items():
            np.testing.assert_allclose(npz[key], want, rtol=1e-10, atol=1e-10, err_msg=key)
        # the JSON's full-precision numbers are the same floats: the round trip is exact
        probs = np.array(steps["probs"]["value"], dtype=np.float64)
        assert np.array_equal(npz["probs"], probs)


def test_npz_of_a_selection_and_its_refusals(tmp_path: Path) -> None:
    path, _ = _config(tmp_path)
    out = tmp_path / "s.npz"
    args = ["step", path, "--stage", "softmax", "--head", "0", "--format", "npz"]
    result = runner.invoke(app, [*args, "--output", str(out)])
    assert result.exit_code == 0, result.output
    with np.load(out) as npz:
        assert sorted(npz.keys()) == sorted(
            [
                "encoder.0.self_attn.h0.softmax",
                "decoder.0.self_attn.h0.softmax",
                "decoder.0.cross_attn.h0.softmax",
            ]
        )
    result = runner.invoke(app, args)  # no --output: a binary file needs one
    assert result.exit_code == 2 and "--output" in result.stderr
    result = runner.invoke(app, [*args, "--output", str(out)])  # exists, no --force
    assert result.exit_code == 2 and "--force" in result.stderr
    result = runner.invoke(app, ["check", "--format", "npz", "--output", str(tmp_path / "x.npz")])
    assert result.exit_code == 2 and "no" in result.stderr


def test_step_inputs_writes_the_numbers_each_step_was_computed_from(tmp_path: Path) -> None:
    path, raw = _config(tmp_path)
    args = ["step", path, "--stage", "encoder.0.ffn.hidden", "--format", "json"]
    plain = json.loads(runner.invoke(app, args).stdout)
    assert "inputs" not in plain  # (only asked for)
    result = runner.invoke(app, [*args, "--inputs"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["steps"] == plain["steps"]
    (hidden,) = out["steps"]
    inputs = {i["path"]: i for i in out["inputs"]}
    assert list(inputs) == hidden["inputs"]  # each named input, once, in order
    ffn = raw["weights"]["encoder"][0]["ffn"]  # type: ignore[index]
    W_1, b_1 = (np.array(ffn[k], dtype=np.float64) for k in ("W_1", "b_1"))
    assert np.array_equal(np.array(inputs["weights.encoder.0.ffn.W_1"]["value"]), W_1)
    assert np.array_equal(np.array(inputs["weights.encoder.0.ffn.b_1"]["value"]), b_1)
    assert "c.yaml" in inputs["weights.encoder.0.ffn.W_1"]["source"]["text"]
    x = np.array(inputs["encoder.0.self_attn.norm"]["value"])  # an earlier step, as PyTorch has it
    np.testing.assert_allclose(x, reference_forward(raw)["encoder.0.self_attn.norm"], atol=1e-10)
    assert inputs["encoder.0.self_attn.norm"]["formula"]  # (a step: as `steps` writes one)
    np.testing.assert_allclose(np.array(hidden["value"]), x @ W_1 + b_1, atol=1e-12)

    # npz: the inputs under their paths beside the steps; each head's inputs once
    npz_out = tmp_path / "s.npz"
    many = ["step", path, "--stage", "softmax", "--inputs", "--format"]
    assert runner.invoke(app, [*many, "npz", "--output", str(npz_out)]).exit_code == 0
    many_json = json.loads(runner.invoke(app, [*many, "json"]).stdout)
    with np.load(npz_out) as npz:
        paths = [s["path"] for s in many_json["steps"]] + [i["path"] for i in many_json["inputs"]]
        assert list(npz.keys()) == paths and len(set(paths)) == len(paths)
        for s in many_json["steps"]:  # a head's softmax reads its scaled (or masked) scores
            (name,) = s["inputs"]
            e = np.exp(npz[name] - npz[name].max(axis=-1, keepdims=True))
            np.testing.assert_allclose(npz[s["path"]], e / e.sum(-1, keepdims=True), atol=1e-15)

    refused = runner.invoke(app, [*args[:-1], "csv", "--inputs"])
    assert refused.exit_code == 2 and "--format json or npz" in refused.stderr
    table = ["step", path, "--stage", "encoder.0.ffn.hidden"]
    warned = runner.invoke(app, [*table, "--inputs"])
    assert "unused by tables" in warned.stderr
    assert warned.stdout == runner.invoke(app, table).stdout


def test_csv_writes_one_step_labelled_by_tokens(tmp_path: Path) -> None:
    path, raw = _config(tmp_path)
    step = "encoder.0.self_attn.h1.softmax"
    result = runner.invoke(app, ["step", path, "--stage", step, "--format", "csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout)))
    source = [str(t) for t in raw["source"]]  # type: ignore[union-attr]
    assert rows[0] == [step, *source]  # columns: the key tokens
    assert [r[0] for r in rows[1:]] == source  # rows: the query tokens
    values = np.array([[float(v) for v in r[1:]] for r in rows[1:]])
    want = reference_forward(raw)[step]
    np.testing.assert_allclose(values, want, rtol=1e-12, atol=1e-15)
    assert "-inf" not in result.stdout and "0.0" in result.stdout  # the pad column is 0


def test_csv_writes_non_finite_numbers_as_words(tmp_path: Path) -> None:
    path, _ = _config(tmp_path)
    result = runner.invoke(app, ["step", path, "--stage", "encoder.mask", "--format", "csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert all(v in ("0.0", "-inf") for r in rows[1:] for v in r[1:]) and "-inf" in rows[1]


def test_csv_to_a_file_and_its_refusals(tmp_path: Path) -> None:
    path, _ = _config(tmp_path)
    out = tmp_path / "logits.csv"
    result = runner.invoke(
        app, ["step", path, "--stage", "logits", "--format", "csv", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    header = out.read_text(encoding="utf-8").splitlines()[0].split(",")
    assert header[0] == "logits" and "t0" in header  # columns: the vocabulary
    for args in (["encode", path], ["step", path, "--stage", "softmax"]):
        result = runner.invoke(app, [*args, "--format", "csv"])
        assert result.exit_code == 2, result.output
        assert "one step" in result.stderr and "--stage" in result.stderr
    result = runner.invoke(app, ["encode", path, "--format", "xml"])
    assert result.exit_code == 2 and "npz" in result.stderr


def test_generate_writes_its_traced_steps(tmp_path: Path) -> None:
    out = tmp_path / "g.npz"
    args = ["generate", "--greedy", "--max-tokens", "2", "--trace"]
    result = runner.invoke(app, [*args, "--format", "npz", "--output", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    with np.load(out) as npz:
        assert list(npz.keys()) == [s["path"] for s in data["steps"]]
        assert np.array_equal(npz["t1.probs"], np.array(data["steps"][-1]["value"]))
    result = runner.invoke(app, [*args, "--stage", "t1.probs", "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("t1.probs,hello,mundo,world")
    result = runner.invoke(app, ["generate", "--greedy", "--format", "csv"])  # nothing traced
    assert result.exit_code == 2 and "add --trace" in result.stderr


@pytest.mark.parametrize(
    "args, formats",
    [
        (["check"], "table, json"),
        (["stages"], "table, json"),
        (["cost"], "table, json"),
        (["diff", "hello", "hello"], "table, json"),
        (["explain", "encoder.input"], "table, json"),
        (["attend", "--q", "1", "--k", "1", "--v", "1"], "table, json, npz"),
        (["norm", "--x", "1 2"], "table, json, npz"),
    ],
)
def test_a_command_offers_only_the_formats_it_can_write(args: list[str], formats: str) -> None:
    # Their help offered npz and csv; asked for, they said to give --output, then that
    # they had no steps.
    for fmt in ("npz", "csv"):
        if fmt in formats:
            continue
        result = runner.invoke(app, [*args, "--format", fmt])
        assert result.exit_code == 2
        assert f"--format must be one of {formats}, not '{fmt}'" in result.stderr
    help_text = runner.invoke(app, [args[0], "--help"], env={"COLUMNS": "200"}).stdout
    assert ("npz" in help_text) == ("npz" in formats) and "csv (one step" not in help_text


def _help(command: str) -> str:
    """A command's --help as one line: rich's box and wrapping taken out."""
    text = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).stdout
    return " ".join(text.replace("│", " ").split())


@pytest.mark.parametrize(
    "args, hint",
    [
        (["step", "--stage", "encoder.0.self_attn.h0.softmax"], "select it with --stage PATH"),
        (["generate", "--trace", "--stage", "t0.probs"], "select it with --trace --stage PATH"),
        (["pe", "--length", "2", "--d-model", "2"], "csv (its one step, pe:"),
    ],
)
def test_format_help_says_how_this_command_writes_its_csv_step(args: list[str], hint: str) -> None:
    # Every command's help said "csv (one step: select it with `step --stage PATH`)":
    # for generate that needs --trace --stage, and pe has only one step to write.
    assert hint in _help(args[0])
    result = runner.invoke(app, [*args, "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert "select it with `step --stage PATH`" in _help("encode")


@pytest.mark.parametrize(
    ("args", "paths"),
    [
        (("attend", "--q", "1 0", "--k", "1 0; 0 1", "--v", "1 2; 3 4"), "attn.scores, "
         "attn.scaled, attn.masked with a mask, attn.softmax, attn.context, and a score "
         "function's own"),
        (("attend", "--q", "1 0", "--k", "1 0; 0 1", "--v", "1 2; 3 4", "--mask", "0 -inf"),
         "attn.scores, attn.scaled, attn.masked with a mask, attn.softmax, attn.context, and "
         "a score function's own"),
        (("norm", "--x", "1 2; 3 5"), "norm.mean, norm.var, norm.centered and norm.out"),
        (("norm", "--x", "1 2; 3 5", "--kind", "rms"), "norm.rms and norm.out"),
    ],
)  # fmt: skip
def test_a_calculator_without_csv_says_so_and_names_the_steps_it_records(
    args: tuple[str, ...], paths: str
) -> None:
    # norm's and attend's --format help did not mention csv, and refusing it they said
    # "csv writes one traced step": now the help says why there is none, naming the
    # steps the command records, and those are the steps it writes
    text = _help(args[0])
    assert "; no csv (it writes a single matrix, and " in text and paths in text, text
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    recorded = [s["path"] for s in json.loads(result.stdout)["steps"]]
    # every step it records named, in the order it records them
    assert [p for p in re.findall(r"(?:attn|norm)\.\w+", paths) if p in recorded] == recorded
    result = runner.invoke(app, [*args, "--format", "csv"])
    assert result.exit_code == 2
    assert "(csv writes a single step's matrix, and this command has" in result.stderr


@pytest.mark.parametrize(("kind", "columns"), [("sinusoidal", 6), ("rope", 3)])
def test_pe_csv_writes_what_its_help_says(kind: str, columns: int) -> None:
    # pe's help said csv writes "its one step, pe"; it now says how that step is laid out
    text = _help("pe")
    assert (
        "or csv (its one step, pe: a header row, pe and the column indices, then a row per "
        "position, pos 0, pos 1, ..., of its d numbers, or with rope of its angles, one a pair)"
    ) in text, text
    args = ["pe", "--length", "3", "--d-model", "6", "--kind", kind, "--format", "csv"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [line.split(",") for line in result.stdout.splitlines()]
    assert rows[0] == ["pe", *map(str, range(columns))]
    assert [r[0] for r in rows[1:]] == ["pos 0", "pos 1", "pos 2"]
    assert all(len(r) == columns + 1 for r in rows)
    pos, i = 2, columns - 1  # the last column of the last row, computed here
    expected = (
        math.cos(pos / 10000 ** (2 * (i // 2) / 6))
        if kind == "sinusoidal"
        else pos * 10000 ** (-2 * i / 6)
    )
    assert float(rows[3][-1]) == pytest.approx(expected, rel=1e-15)


def test_json_is_written_step_by_step_as_json_dumps_writes_it() -> None:
    """A trace's JSON was built whole (the large model's decode: 517 MB of text, 2.7 GB
    of Python lists at once) before a byte was written. The steps are now made and
    written one at a time (text.Each, text.write_json): the same text as json.dumps,
    each step made only after the one before it is written."""
    from trace_tf.text import Each, write_json

    out = io.StringIO()
    items = [{"path": "a", "value": [[1.5, "nan"], [-0.0, 1e-310]]}, {"é": []}, "x\n"]

    def made() -> Iterator[object]:
        for k, item in enumerate(items):
            if k:  # the item before is already written
                assert out.getvalue().endswith(json.dumps(items[k - 1]))
            yield item

    whole = {"trace_tf": "0", "title": "t\u2028", "steps": items, "n": [1, 2.5]}
    write_json(out, {**whole, "steps": Each(made())})
    assert out.getvalue() == json.dumps(whole, allow_nan=False)
    out = io.StringIO()
    write_json(out, Each(iter(items)))
    assert out.getvalue() == json.dumps(items)


@pytest.mark.parametrize(
    "args",
    [["encode"], ["decode", "--set", "model.scale=1e-200"], ["generate", "--beam", "2", "--trace"]],
)
def test_a_traces_json_is_what_json_dumps_writes_of_it(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["steps"]) > 20
    assert result.stdout == json.dumps(data, allow_nan=False) + "\n"
