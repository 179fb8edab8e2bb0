"""The command line through typer's CliRunner: every command, JSON, exit codes 0, 1, 2, 3."""

from __future__ import annotations

import json
import math
import signal
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES
from typer.testing import CliRunner

from trace_tf.cli import app

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_encode_default_example_shows_every_encoder_step() -> None:
    code, out, err = invoke("encode")
    assert code == 0, err
    for text in (
        "encoder.pe",
        "encoder.0.self_attn.h0.softmax",
        "encoder.0.ffn.norm",
        "encoder.output",
        "post-norm",
    ):
        assert text in out
    assert "decoder.0.self_attn.h0" not in out and "logits" not in out


def test_encode_document_variant_prints_the_documents_K1() -> None:
    code, out, _ = invoke("encode", "--variant", "document", "--precision", "2")
    assert code == 0
    assert "6.84" in out and "9.99" in out


def test_a_packaged_example_given_by_name_is_named_as_when_left_out() -> None:
    # `check hello` named the example by its installed path (site-packages/.../hello.yaml),
    # in messages and in JSON's "config", where `check` alone says "hello (packaged example)"
    label = "hello (packaged example)"
    for args in (["check"], ["check", "hello"]):
        data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
        assert {r["config"] for r in data["results"]} == {label}
    bad = ["--set", "model.n_heads=1"]
    for name in ([], ["hello"]):
        for args in (["encode", *name, *bad], ["diff", *name, *bad, "--set-b", "model.seed=1"]):
            result = runner.invoke(app, args)
            assert result.exit_code == 2, result.output
            assert result.stderr.startswith(f"trace-tf: error: {label}:41: weights.encoder.0"), args


def test_decode_json_matches_spec_section_5() -> None:
    code, out, err = invoke("decode", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["trace_tf"] == "0.1.0" and data["title"].startswith("Hello World")
    assert data["tokens"] == {"source": ["hello", "world"], "target": ["SOS"]}
    paths = [s["path"] for s in data["steps"]]
    assert paths[0] == "encoder.embed" and paths[-2:] == ["logits", "probs"]
    q = next(s for s in data["steps"] if s["path"] == "encoder.0.self_attn.h0.q")
    assert q["stage"] == "q" and q["formula"] == "Q = X W_q" and q["shape"] == [2, 3]
    assert set(q) == {"path", "stage", "formula", "shape", "inputs", "value"}
    assert q["inputs"] == ["encoder.input", "weights.encoder.0.self_attn.heads.0.W_q"]
    # SPEC section 3: cross-attention's keys and values come from encoder.output
    k = next(s for s in data["steps"] if s["path"] == "decoder.0.cross_attn.h1.k")
    assert k["inputs"] == ["encoder.output", "weights.decoder.0.cross_attn.heads.1.W_k"]
    assert q["value"][0] == [8.0, 3.0, 3.0]  # hello + PE(0) = [1, 3, 3, 5] times W_q1
    mask = next(s for s in data["steps"] if s["path"] == "decoder.mask")
    assert mask["value"] == [[0.0]]
    probs = data["steps"][-1]["value"][0]
    assert math.isclose(sum(probs), 1.0, abs_tol=1e-12) and len(probs) == 10


def test_what_a_file_leaves_out_takes_the_spec_defaults(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    # SPEC section 2, black-box: only d_model given. One head of d_k = d_v = d_model,
    # d_ff 4 d_model, one encoder layer and no decoder (logits read the encoder), sinusoidal
    # positions of base 10000, embeddings unscaled, scores / sqrt(d_k), post-norm without
    # a final norm, every array drawn with seed 0 and std 1, output.W drawn (not tied).
    def drawn(path: str, shape: tuple[int, ...]) -> Any:
        return np.random.default_rng([0, zlib.crc32(path.encode())]).standard_normal(shape)

    code, out, err = invoke(
        "encode",
        tmp_yaml("model: {d_model: 4}\nvocab: [a, b]\nsource: [b, a, b]\n"),
        "--format",
        "json",
    )
    assert code == 0, err
    steps = {s["path"]: np.array(s["value"]) for s in json.loads(out)["steps"]}
    assert not any(".h1." in p or "final_norm" in p or "decoder" in p for p in steps)
    E = np.array([drawn(f"embeddings.{t}", (4,)) for t in ("b", "a", "b")])
    pos, i = np.arange(3)[:, None], np.arange(4)[None, :]
    angle = pos / 10000 ** ((i - i % 2) / 4)
    pe = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    np.testing.assert_array_equal(steps["encoder.embed"], E)
    np.testing.assert_allclose(steps["encoder.input"], E + pe, rtol=0, atol=1e-15)
    x = steps["encoder.input"]
    q = x @ drawn("encoder.0.self_attn.heads.0.W_q", (4, 4))
    k = x @ drawn("encoder.0.self_attn.heads.0.W_k", (4, 4))
    np.testing.assert_allclose(steps["encoder.0.self_attn.h0.scaled"], q @ k.T / 2, rtol=1e-13)
    assert steps["encoder.0.ffn.hidden"].shape == (3, 16)
    np.testing.assert_allclose(
        steps["logits"], steps["encoder.output"] @ drawn("output.W", (4, 2)), rtol=1e-13
    )


def test_json_writes_infinities_as_strings(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    path = tmp_yaml(
        "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1}\nvocab: [a, b]\ntarget: [a, b]\n"
    )
    code, out, _ = invoke("decode", path, "--format", "json")
    assert code == 0
    mask = next(s for s in json.loads(out)["steps"] if s["path"] == "decoder.mask")
    assert mask["value"] == [[0.0, "-inf"], [0.0, 0.0]]


PADDED = """\
model: {d_model: 4, n_heads: 2, decoder_layers: 1}
vocab: [a, b, P, S, E]
tokens: {bos: S, eos: E, pad: P}
source: [a, P]
target: [S, P]
expect:
  - {step: decoder.cross_mask, value: [[0, -.inf], [0, -.inf]]}
"""
MASK = ["--q", "1; 2", "--k", "1; 3", "--v", "1; 2"]


@pytest.mark.parametrize(
    "args",
    [
        ["encode", "{c}"],
        ["decode", "{c}"],
        ["step", "{c}", "--stage", "masked"],
        ["generate", "{c}", "--greedy", "--max-tokens", "2", "--trace"],
        ["generate", "{c}", "--sample", "--max-tokens", "2", "--trace"],
        ["generate", "{c}", "--beam", "2", "--max-tokens", "2", "--trace"],
        ["diff", "{c}", "--set-b", "source=[P, a]"],  # the pad moves: -inf against a number
        ["explain", "decoder.cross_mask", "{c}", "--cell", "0,1"],
        ["cost", "{c}"],
        ["check", "{c}"],
        ["attend", *MASK, "--mask", "0 -inf; -inf -inf"],
        ["norm", "--x", "1 1", "--eps", "0"],
        ["pe", "--length", "2", "--d-model", "3"],
        ["stages"],
    ],
    ids=lambda a: "-".join(a[:3]),
)
def test_every_json_command_prints_one_strict_json_object(tmp_yaml, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    # SPEC section 5: one JSON object on stdout and nothing else; no infinities or NaN
    # as bare tokens (json.loads would take them; a strict reader does not)
    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in JSON")

    path = tmp_yaml(PADDED)
    code, out, err = invoke(*[a.replace("{c}", path) for a in args], "--format", "json")
    assert code == 0, err
    data = json.loads(out, parse_constant=refuse)
    assert isinstance(data, dict) and data["trace_tf"] == "0.1.0"
    assert out.count("\n") == 1 and out.endswith("}\n")
    if args[0] in ("encode", "decode", "step", "generate", "diff", "explain", "attend"):
        assert '"-inf"' in out  # the pad masks, written as strings
    if args[0] in ("attend", "norm"):
        assert '"nan"' in out  # a fully masked row; a constant row with eps 0


def test_step_selects_by_stage_layer_and_head() -> None:
    code, out, _ = invoke("step", "--stage", "softmax", "--head", "1", "--format", "json")
    assert code == 0
    paths = [s["path"] for s in json.loads(out)["steps"]]
    assert paths == [
        "encoder.0.self_attn.h1.softmax",
        "decoder.0.self_attn.h1.softmax",
        "decoder.0.cross_attn.h1.softmax",
    ]
    code, out, _ = invoke("step", "--stage", "cross", "--format", "json")
    assert code == 0 and all(".cross_attn." in s["path"] for s in json.loads(out)["steps"])


def test_step_table_shows_inputs_and_formula() -> None:
    code, out, _ = invoke("step", "--stage", "scores", "--layer", "0", "--head", "0")
    assert code == 0
    assert "computed from: encoder.0.self_attn.h0.q, encoder.0.self_attn.h0.k" in out
    assert "S = Q Kᵀ" in out


def test_step_qkv_group_shows_weights_as_inputs() -> None:
    code, out, _ = invoke("step", "--stage", "q", "--layer", "0", "--head", "0")
    assert code == 0 and "weights.encoder.0.self_attn.heads.0.W_q" in out


def test_unknown_stage_exits_2_with_suggestion() -> None:
    code, _, err = invoke("step", "--stage", "softmx")
    assert code == 2 and "did you mean 'softmax'" in err and "Traceback" not in err


def test_check_passes_on_fixtures_and_fails_with_exit_1(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = invoke("check", str(FIXTURES / "hello.yaml"))
    assert code == 0 and "passed, 0 failed" in out
    bad = tmp_yaml(
        "pe: {length: 2, d_model: 2}\nexpect:\n  - {step: pe, value: [[0, 1], [0.84, 0.99]], atol: 1.0e-6}\n"
    )
    code, out, _ = invoke("check", bad, "--format", "json")
    assert code == 1
    result = json.loads(out)["results"][0]
    assert result["ok"] is False and math.isclose(
        result["max_abs_error"], 0.99 - math.cos(1), abs_tol=1e-12
    )


def test_bad_input_exits_2_naming_file_and_key(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    path = tmp_yaml("model: {d_model: 4, n_head: 2}\nsource: [[1, 2, 3, 4]]\n")
    code, _, err = invoke("encode", path)
    assert code == 2
    assert path in err and "model.n_head" in err and "did you mean 'n_heads'" in err
    assert "Traceback" not in err


def test_missing_file_and_bad_set_exit_2() -> None:
    assert invoke("encode", "no/such/file.yaml")[0] == 2
    code, _, err = invoke("encode", "--set", "model.scale")
    assert code == 2 and "KEY=VALUE" in err


def test_encode_on_decoder_only_is_an_error(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    path = tmp_yaml(
        "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1}\nvocab: [a]\ntarget: [a]\n"
    )
    code, _, err = invoke("encode", path)
    assert code == 2 and "decoder-only" in err


def test_internal_error_exits_3_and_debug_shows_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import trace_tf.runner

    def boom(*a: object, **k: object) -> None:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(trace_tf.runner, "run", boom)
    code, _, err = invoke("encode")
    assert code == 3 and "internal error" in err and "--debug" in err and "Traceback" not in err
    # --debug adds the traceback, never changes the code: Python's own 1 would read as
    # a check's mismatch (SPEC section 6)
    code, _, err = invoke("encode", "--debug")
    assert code == 3 and "Traceback" in err and "ZeroDivisionError: boom" in err


def test_bad_input_under_debug_still_exits_2(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    code, out, err = invoke("encode", tmp_yaml("model: {d_model: 0}\n"), "--debug")
    assert code == 2 and out == "" and "Traceback" in err
    assert err.rstrip().splitlines()[-1].startswith("trace-tf: error: ")


def test_fully_masked_row_warns_and_strict_fails(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    text = "model: {d_model: 2}\nvocab: [a, P]\ntokens: {pad: P}\nsource: [P, P]\n"
    path = tmp_yaml(text)
    code, _, err = invoke("encode", path)
    assert code == 0 and "NaN first appears in step encoder.0.self_attn.h0.softmax" in err
    code, _, err = invoke("encode", path, "--strict")
    assert code == 2 and "NaN" in err


def test_output_never_overwrites_without_force(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    assert invoke("encode", "--format", "json", "--output", str(out))[0] == 0
    before = out.read_text()
    assert json.loads(before)["steps"]
    code, _, err = invoke("encode", "--output", str(out))
    assert code == 2 and "exists" in err and out.read_text() == before
    assert invoke("encode", "--output", str(out), "--force")[0] == 0
    assert out.read_text() != before


def test_large_matrices_are_elided_unless_full(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    path = tmp_yaml(
        "model: {d_model: 64, n_heads: 4}\nsource: "
        + str([[0.01 * i] * 64 for i in range(40)])
        + "\n"
    )
    code, out, _ = invoke("step", path, "--stage", "input")
    assert code == 0 and "…" in out
    lines_elided = len(out.splitlines())
    code, out, _ = invoke("step", path, "--stage", "input", "--full")
    assert code == 0 and len(out.splitlines()) > lines_elided + 20


def _at_60_columns(
    monkeypatch: pytest.MonkeyPatch, path: str, command: tuple[str, ...], *options: str
) -> list[str]:
    """The lines `command` prints for the config at `path` on a 60-column terminal."""
    monkeypatch.setenv("COLUMNS", "60")
    code, out, err = invoke(command[0], path, *command[1:], *options)
    assert code == 0, err
    return out.splitlines()


@pytest.mark.parametrize("command", [("encode",), ("step", "--stage", "input")])
def test_full_shows_every_column_however_narrow_the_terminal(
    tmp_yaml, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]
) -> None:  # type: ignore[no-untyped-def]
    from rich.cells import cell_len

    # 40 columns of -0.0NNN: each row of the input is far wider than 60 cells. `step`
    # shows it in a panel, `encode` at the top level; neither may crop it.
    path = tmp_yaml(
        "model: {d_model: 40, n_heads: 4, positional: none}\nsource: "
        + str([[-0.001 * (i + j) for j in range(40)] for i in range(3)])
        + "\n"
    )
    lines = _at_60_columns(monkeypatch, path, command, "--full")
    header = lines[: lines.index(next(x for x in lines if x.startswith("╰")))]
    assert max(cell_len(x) for x in header) <= 60  # the rest keeps the terminal's width
    # the input's last row (x2: -0.0020 ... -0.0410), in every step that shows it
    rows = [x for x in lines if "│ x2 │ -0.0020 " in x]
    assert rows and all(x.count("│") >= 42 and x.rstrip("│ ").endswith("-0.0410") for x in rows)
    elided = _at_60_columns(monkeypatch, path, command)
    assert max(cell_len(x) for x in elided) <= 60


@pytest.mark.parametrize("command", [("encode",), ("step", "--stage", "input")])
def test_no_line_is_wider_than_the_terminal_with_long_tokens_and_many_digits(
    tmp_yaml, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]
) -> None:  # type: ignore[no-untyped-def]
    from rich.cells import cell_len

    # A 16-letter token and 10 digits: at 60 columns only the first and last column of
    # a 16-wide matrix fit beside the label (18 + 16 + 4 + 16 + 1 cells).
    path = tmp_yaml(
        "model: {d_model: 16, n_heads: 2}\n"
        "vocab: [incomprehensible, a]\nsource: [incomprehensible, a]\n"
    )
    lines = _at_60_columns(monkeypatch, path, command, "--precision", "10")
    assert max(cell_len(x) for x in lines) <= 60
    rows = [x for x in lines if "│ incomprehensible │" in x]
    # every row whole, none cut off (inside step's panel: before the panel's border)
    inner = [x[2:-1].rstrip() if x.startswith("│ │") else x for x in rows]
    assert rows and all(x.endswith("│") for x in inner)
    assert any("│ … │" in x for x in rows)  # columns elided instead


@pytest.mark.parametrize("command", [("encode",), ("step", "--stage", "input")])
def test_piped_output_is_elided_for_the_width_it_is_printed_at(
    tmp_yaml, command: tuple[str, ...]
) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    from rich.cells import cell_len

    # Into a pipe, with no $COLUMNS: tables were elided for 120 columns but printed at
    # rich's 80, which cropped their last columns. 15 digits: 3 columns fit in 120.
    path = tmp_yaml("model: {d_model: 8, n_heads: 2}\nvocab: [a, b]\nsource: [a, b]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run(
        [sys.executable, "-m", "trace_tf", command[0], path, *command[1:], "--precision", "15"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert max(cell_len(x) for x in lines) == 120
    rows = [x for x in lines if "│ a │" in x or "│ b │" in x]
    inner = [x[2:-1].rstrip() if x.startswith("│ │") else x for x in rows]
    assert rows and all(x.endswith("│") for x in inner)  # every row whole
    assert all("│ … │" in x for x in rows if x.count("│") > 6)  # wide ones elided


@pytest.mark.parametrize("width", [120, 100, 80])
def test_a_matrix_that_fits_the_width_is_shown_whole(width: int) -> None:
    # The packaged example's probs over its 10 words, 98 cells wide: at 120 columns it
    # used to hide `?` and `EOS` behind an ellipsis, from a guess of 11 cells a column.
    from rich.cells import cell_len

    result = runner.invoke(app, ["decode"], env={"COLUMNS": str(width)})
    lines = result.stdout.splitlines()
    head = lines[lines.index(next(x for x in lines if x.startswith("probs "))) + 2]
    words = [w.strip() for w in head.strip("┃").split("┃")][1:]
    if width >= 98:
        assert words == ["hello", "mundo", "world", "how", "?", "EOS", "SOS", "a", "hola", "c"]
    else:  # elided, and still as many columns as fit
        assert "…" in words and cell_len(head) <= width
        assert cell_len(head) + 2 * 9 > width  # a 0.1234 column more each side would not fit
    assert max(cell_len(x) for x in lines) <= width


MARKUP = """\
title: "[bold red]title[/] [/]"
model: {d_model: 2, n_heads: 1, decoder_layers: 1, positional: none}
vocab: ["[/]", "[bold]x", S, E, ":smile:"]
embeddings: {"[/]": [1, 0], "[bold]x": [0, 1], S: [1, 1], E: [0, 0], ":smile:": [2, 0]}
tokens: {bos: S, eos: E}
source: ["[/]", "[bold]x", ":smile:"]
target: [S, "[/]"]
expect:
  - {step: encoder.embed, value: [[1, 0], [0, 1], [2, 0]], note: "[/] a [bold]note"}
"""


@pytest.mark.parametrize(
    "command",
    [
        ("encode",),
        ("decode",),
        ("step", "--stage", "probs"),
        ("check",),
        ("generate", "--beam", "2", "--max-tokens", "2"),
        ("generate", "--sample", "--max-tokens", "2"),
        ("diff", "--set-b", "model.scale=2"),
        ("explain", "probs"),
    ],
)
def test_tokens_titles_and_notes_are_text_not_rich_markup(
    tmp_yaml, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]
) -> None:  # type: ignore[no-untyped-def]
    # "[/]" read as markup would be an error (closing nothing); "[bold]x" would print "x"
    path = tmp_yaml(MARKUP)
    monkeypatch.setenv("COLUMNS", "160")
    name, *rest = command
    code, out, err = invoke(*([name, *rest, path] if name == "explain" else [name, path, *rest]))
    assert code == 0, err
    if command[0] != "explain":
        assert "[/]" in out
    if command[0] in ("encode", "decode", "step"):
        assert "[bold]x" in out and "[bold red]title[/] [/]" in out and ":smile:" in out
    if command[0] == "check":
        assert "[/] a [bold]note" in out


@pytest.mark.parametrize(
    "command",
    [("encode",), ("decode",), ("generate", "--beam", "2"), ("generate", "--sample")],
)
def test_a_newline_or_tab_token_stays_on_its_line(tmp_yaml, command: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    path = tmp_yaml(
        'model: {d_model: 2, decoder_layers: 1}\nvocab: ["a\\nb", "c\\td", S, E]\n'
        "tokens: {bos: S, eos: E}\n"
        'source: ["a\\nb", "c\\td"]\ntarget: [S, "a\\nb"]\n'
    )
    extra = ["--max-tokens", "2"] if command[0] == "generate" else []
    code, out, err = invoke(command[0], path, *command[1:], *extra)
    assert code == 0, err
    assert "a\\nb" in out and "\t" not in out
    assert not any(line.startswith("b ") or line.startswith("│ b ") for line in out.splitlines())


def test_examples_lists_every_packaged_example_in_name_order() -> None:
    code, out, _ = invoke("examples")
    names = [line.split()[0] for line in out.splitlines() if not line.startswith(" ")]
    assert code == 0 and names[0] == "000_relative_bias" and names[-1] == "hello"
    assert names == sorted(names) and len(names) == 14
    assert "002_database_query   " in out and "Hello World" in out


# Every command: an unexpected exception is one line, exit 3, and --debug re-raises it.
# Each entry patches a function the command calls (module, attribute) to raise.
INTERNAL = [
    (["encode"], "trace_tf.config", "read_document"),
    (["decode"], "trace_tf.config", "read_document"),
    (["step", "--stage", "q"], "trace_tf.config", "read_document"),
    (["check"], "trace_tf.config", "read_document"),
    (["encode"], "trace_tf.runner", "run"),
    (["check"], "trace_tf.runner", "check"),
    (["step", "--stage", "q"], "trace_tf.render", "step_with_inputs"),
    (["examples"], "trace_tf.loader", "example_names"),
    (["generate"], "trace_tf.config", "read_document"),
    (["generate"], "trace_tf.generate", "run"),
    (["attend", "--q", "1", "--k", "1", "--v", "1"], "trace_tf.runner", "run"),
    (["norm", "--x", "1 2"], "trace_tf.runner", "run"),
    (["pe", "--length", "2", "--d-model", "2"], "trace_tf.runner", "run"),
    (["diff", "--set-b", "model.scale=2"], "trace_tf.runner", "run"),
    (["explain", "encoder.pe"], "trace_tf.runner", "run"),
    (["stages"], "trace_tf.stages", "STAGES"),
    (["cost"], "trace_tf.config", "read_document"),
    (["step", "--stage", "encoder.output", "--format", "csv"], "trace_tf.render", "step_csv"),
]


class Boom:
    """Stands in for a function or a table and fails however it is used."""

    def __call__(self, *a: object, **k: object) -> None:
        raise KeyError("a bug")

    def __getattr__(self, name: str) -> None:
        raise KeyError("a bug")

    def __iter__(self) -> None:
        raise KeyError("a bug")


@pytest.mark.parametrize("args, module, name", INTERNAL, ids=lambda x: str(x))
def test_internal_error_in_every_command(
    args: list[str], module: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    monkeypatch.setattr(importlib.import_module(module), name, Boom())
    code, out, err = invoke(*args)
    assert code == 3 and out == ""
    assert err == (
        "trace-tf: internal error (KeyError: 'a bug'); this is a bug. "
        "Run again with --debug to see the traceback.\n"
    )
    code, out, err = invoke(*args, "--debug")
    assert code == 3 and out == "" and "Traceback" in err
    assert err.endswith("trace-tf: internal error (KeyError: 'a bug'); this is a bug.\n")


def test_every_command_is_guarded() -> None:
    # A command added later (or on another branch) is covered too: its body must run
    # inside `guarded`, which turns bad input into exit 2 and a bug into exit 3.
    import inspect

    names = []
    for command in app.registered_commands:
        assert command.callback is not None
        names.append(command.name or command.callback.__name__)
        assert "with guarded(" in inspect.getsource(command.callback), names[-1]
    # The commands present when this was written are also checked by behaviour above.
    assert {a[0] for a, _, _ in INTERNAL} <= set(names)


class CtrlC:
    """Stands in for a function or a table and is interrupted however it is used."""

    def __call__(self, *a: object, **k: object) -> None:
        raise KeyboardInterrupt

    def __getattr__(self, name: str) -> None:
        raise KeyboardInterrupt

    def __iter__(self) -> None:
        raise KeyboardInterrupt


@pytest.mark.parametrize("args, module, name", INTERNAL, ids=lambda x: str(x))
def test_ctrl_c_exits_130_in_every_command(
    args: list[str], module: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # never 1, which says `check` found a mismatch
    import importlib

    monkeypatch.setattr(importlib.import_module(module), name, CtrlC())
    code, out, err = invoke(*args)
    assert (code, out, err) == (130, "", "trace-tf: interrupted\n")


def test_out_of_memory_is_bad_input_not_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    import trace_tf.runner

    def huge(*a: object, **k: object) -> None:
        raise MemoryError

    monkeypatch.setattr(trace_tf.runner, "run", huge)
    code, _, err = invoke("encode")
    assert code == 2 and err.startswith("trace-tf: error: out of memory") and err.count("\n") == 1


def _cases_for_app_for() -> list[list[str]]:
    """Every command run as INTERNAL runs it, with --help, and with an unknown option;
    and what names no command."""
    names = [c.name or c.callback.__name__ for c in app.registered_commands if c.callback]
    runs = [args for args, _, _ in INTERNAL]
    per_command = [[n, extra] for n in names for extra in ("--help", "--no-such-option")]
    return [*runs, *per_command, [], ["--help"], ["encod"], ["examples", "extra"]]


@pytest.mark.parametrize("args", _cases_for_app_for(), ids=lambda a: " ".join(a) or "(none)")
def test_the_app_for_one_command_behaves_as_the_whole_app(args: list[str]) -> None:
    from trace_tf.cli import app_for

    one = app_for(args)
    names = [c.callback.__name__ for c in one.registered_commands if c.callback]
    if args and args[0] in names:
        assert names == [args[0]]  # built with only the command asked for
    else:
        assert one is app
    a = runner.invoke(app, args)
    b = runner.invoke(one, args)
    assert (b.exit_code, b.stdout, b.stderr) == (a.exit_code, a.stdout, a.stderr)


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGPIPE"), reason="no SIGPIPE here")
@pytest.mark.parametrize("command", ["encode", "check"])
def test_a_closed_pipe_ends_the_command_by_sigpipe_not_exit_1(tmp_yaml, command: str) -> None:  # type: ignore[no-untyped-def]
    # `trace-tf check ... | head` must not exit 1, which says a check failed. Each
    # output is far over a pipe's 64 KiB, so it cannot all be written before the
    # reader goes after one line.
    import os
    import signal
    import subprocess
    import sys

    if command == "encode":
        args = [
            "encode",
            tmp_yaml("model: {d_model: 64}\nsource: " + str([[0.5] * 64] * 40)),
            "--full",
        ]
    else:
        args = ["check", *[str(FIXTURES / "hello.yaml")] * 200]  # 4,400 rows, ~350 KB
    proc = subprocess.Popen(
        [sys.executable, "-m", "trace_tf", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == -signal.SIGPIPE
    assert err == b""


def test_help_usage_names_the_config_as_the_readme_does() -> None:
    # typer named the argument by its parameter, "[config]"; the README and SPEC say
    # CONFIG, as for every other metavar.
    for name in ("encode", "decode", "step", "generate", "check", "cost", "explain"):
        usage = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"}).stdout
        assert "[CONFIG" in usage.splitlines()[1], name
        assert "[config" not in usage
    for name in ("attend", "norm", "pe"):  # SPEC section 4: `trace-tf attend [FILE]`
        usage = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"}).stdout
        assert f"trace-tf {name} [OPTIONS] [FILE]" in usage.splitlines()[1], name
        assert "[file]" not in usage


@pytest.mark.parametrize("name", ["generate", "diff"])
def test_help_paragraphs_wrap_to_the_terminal_not_to_the_source(name: str) -> None:
    # Typer keeps the line breaks of a docstring's paragraphs; on a wide terminal a
    # paragraph written on two source lines must still be one line.
    wide = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).stdout
    summary = next(line for line in wide.splitlines() if f" {name} " in line)
    own = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"}).stdout
    lines = [line.strip() for line in own.splitlines() if line.strip()]
    first, detail = lines[1], lines[2]  # after "Usage: ...": the summary, then the detail
    assert summary.split(name, 1)[1].strip().strip("│").strip() == first
    doc = next(
        c.callback.__doc__
        for c in app.registered_commands
        if c.callback and c.callback.__name__ == name
    )
    assert doc is not None
    assert detail == " ".join(doc.split("\n\n")[1].split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["step", "--precision", "100"],
            "Invalid value for '--precision': 100 is not in the range",
        ),
        (["step", "--bogus"], "--bogus"),  # click's wording varies with its version
        (["generate", "--beam", "abc"], "'abc' is not a valid int"),
        (["encde"], "No such command 'encde'. Did you mean 'encode'? (see 'trace-tf --help')"),
        (["examples", "hello", "extra"], "unexpected extra argument"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2_like_any_bad_input(
    args: list[str], message: str
) -> None:
    result = runner.invoke(app, args, prog_name="trace-tf")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("trace-tf: error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr and result.stderr.endswith(" --help')\n")


def test_no_command_still_shows_the_help() -> None:
    result = runner.invoke(app, [], prog_name="trace-tf")
    assert result.exit_code == 2 and "Commands" in result.stdout and result.stderr == ""
    assert runner.invoke(app, ["encode", "--help"]).exit_code == 0


def test_config_dash_is_read_from_stdin() -> None:
    config = "model: {d_model: 2, n_heads: 1}\nvocab: [ab, cd]\nsource: [ab, cd]\n"
    result = runner.invoke(app, ["encode", "-"], input=config)
    assert result.exit_code == 0, result.stderr
    assert "encoder.output" in result.stdout and "│ cd │" in result.stdout
    result = runner.invoke(app, ["encode", "-"], input="model: {d_model: 0}\n")
    assert result.exit_code == 2
    assert result.stderr.startswith("trace-tf: error: <stdin>:1: model.d_model: ")


@pytest.mark.parametrize("args", [["check", "-", "-"], ["diff", "-", "-"]])
def test_stdin_given_twice_is_refused_not_read_as_empty(args: list[str]) -> None:
    # the second - found stdin at its end and said "the config is empty"
    config = (FIXTURES / "hello.yaml").read_text()
    result = runner.invoke(app, args, input=config)
    assert result.exit_code == 2
    assert result.stderr == "trace-tf: error: <stdin>: standard input is read once; give - once\n"


def test_an_empty_config_name_is_not_the_current_directory() -> None:
    code, out, err = invoke("encode", "")
    assert (code, out) == (2, "")
    assert err.startswith("trace-tf: error: an empty config name;") and "found ''" in err


@pytest.mark.parametrize("columns", [40, 60, 80, 100, 160])
def test_check_keeps_every_verdict_and_error_in_view_at_any_width(
    monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    from rich.cells import cell_len

    # 12 of hello's 24 entries fail at scale 3. At 60 and 80 columns the config and
    # tolerance columns had crushed the verdict to nothing; now shared values go in the
    # title, notes get only the room left, and paths too long for their column go over
    # lines after their dots (at 40 columns, cut, h0's and h1's softmax both read
    # "…softmax"), the rows then set apart by blank lines.
    monkeypatch.setenv("COLUMNS", str(columns))
    hello = str(FIXTURES / "hello.yaml")
    code, out, _ = invoke("check", hello, "--set", "model.scale=3")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("trace-tf check  hello.yaml")
    if columns >= 60:  # (at 40, wider: errors in full, 0.0006250596046, are whole)
        assert max(cell_len(x) for x in lines) <= columns
    _, data, _ = invoke("check", hello, "--set", "model.scale=3", "--format", "json")
    results = json.loads(data)["results"]
    rows: list[list[str]] = []  # each entry's cells, its path as the lines it is shown on
    paths: list[str] = []
    header = next(i for i, x in enumerate(lines) if x.startswith("step "))
    for line in lines[header + 1 :]:  # after the title and the header
        cells = line.split()
        if len(cells) > 1:
            rows.append(cells)
            paths.append(cells[0])
        elif cells and len(rows) < len(results):
            paths[-1] += cells[0]
    rows, paths = rows[: len(results)], paths[: len(results)]
    assert paths == [r["step"] for r in results]  # every path whole
    for cells, r in zip(rows, results, strict=True):
        assert ("ok" if r["ok"] else "FAIL") in cells
        assert f"{r['max_abs_error']:.3g}" in cells
    assert ("note" in lines[1].split()) == (columns >= 100)  # given room, the notes


def test_check_says_in_full_why_an_entry_failed(tmp_yaml, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_yaml(
        "model: {d_model: 2, n_heads: 1}\nvocab: [a, b]\nsource: [a, b]\nexpect:\n"
        "  - {step: encoder.0.self_attn.h0.nope, value: [[1, 2]]}\n"
        "  - {step: encoder.embed, value: [[1, 2, 3]]}\n"
        "  - {step: encoder.0.self_attn.h0.sofmax, value: [[1, 0], [0, 1]]}\n"
    )
    code, out, _ = invoke("check", path)
    name = Path(path).name
    assert code == 1
    assert f"FAIL {name}: encoder.0.self_attn.h0.nope: no such step\n" in out
    # a misspelt path names the nearest recorded one, as an unknown key does (a path
    # merely of the same head, as .nope above, is not "near")
    misspelt = "encoder.0.self_attn.h0.sofmax: no such step"
    assert f"FAIL {name}: {misspelt} (did you mean 'encoder.0.self_attn.h0.softmax'?)" in out
    assert f"FAIL {name}: encoder.embed: shape 2 x 2 but expected 1 x 3" in out
    assert out.splitlines()[0].rstrip() == f"trace-tf check  {name}  (atol 1e-06)"


def test_check_never_shows_an_error_rounded_to_the_other_side_of_its_tolerance(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    # attn.scores is Q K^T = [[1, 0]]; each entry's error is |1 - expected| in cell 0
    path = tmp_yaml(
        "attention: {Q: [[1, 0]], K: [[1, 0], [0, 1]], V: [[1, 2], [3, 4]], scale: 1}\n"
        "expect:\n"
        "  - {step: attn.scores, value: [1.5, 0], atol: 0.5}\n"
        "  - {step: attn.scores, value: [1.5000000000000002, 0], atol: 0.5}\n"
        "  - {step: attn.scores, value: [1.49996, 0], atol: 0.49996}\n"
    )
    beyond, below = abs(1 - 1.5000000000000002), abs(1 - 1.49996)
    assert beyond > 0.5 and f"{beyond:.3g}" == "0.5"  # 3 digits would say "within"
    assert below <= 0.49996 and float(f"{below:.3g}") > 0.49996  # and here "beyond"
    code, out, _ = invoke("check", path, "--format", "json")
    assert code == 1
    assert [r["ok"] for r in json.loads(out)["results"]] == [True, False, True]
    code, out, _ = invoke("check", path)
    rows = [line.split() for line in out.splitlines() if line.startswith("attn.scores")]
    assert [row[1:3] for row in rows] == [
        ["ok", "0.5"],
        ["FAIL", repr(beyond)],
        ["ok", repr(below)],
    ]


@pytest.mark.parametrize("columns", [44, 50, 60, 80])
def test_generate_keeps_tokens_and_probabilities_whole_on_a_narrow_terminal(
    monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    from rich.cells import cell_len

    # The bars give way, not the numbers: at 50 columns the tokens read "he…" and the
    # probabilities "0.0…" while the bars kept their 24 cells.
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, _ = invoke("generate", "--max-tokens", "1")
    assert code == 0
    assert max(cell_len(x) for x in out.splitlines()) <= columns
    _, data, _ = invoke("generate", "--max-tokens", "1", "--format", "json")
    probs = json.loads(data)["iterations"][0]["probs"]
    ranked = sorted(probs.items(), key=lambda kv: -kv[1])
    rows = [x.strip("│ ").split() for x in out.splitlines() if x.startswith("│ ")]
    for rank, (token, p) in enumerate(ranked, start=1):
        assert [str(rank), token, f"{p:.4f}"] in [row[:3] for row in rows]
    assert "◀ chosen" in out or columns < 80  # the mark shortens to its arrow only when tight


_TINY = (  # softmax([0, -46]): a weight of 1.05e-20, which no absolute tolerance checks
    "attention: {Q: [[1]], K: [[0], [-46]], V: [[1], [0]], scale: 1}\nexpect:\n"
    "  - {step: attn.softmax, value: [[1, %s]], atol: 0, rtol: 5.0e-9}\n"
)


def test_check_rtol_checks_every_digit_of_a_tiny_printed_number(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    # |actual - expected| <= atol + rtol |expected| per cell: 1.0530617357553812e-20 to
    # its 9 digits; one digit off fails though the absolute error is 1e-27.
    code, out, _ = invoke("check", tmp_yaml(_TINY % "1.05306174e-20"))
    assert code == 0, out
    assert out.splitlines()[0].rstrip().endswith("(atol 0, rtol 5e-09)")
    code, out, _ = invoke("check", tmp_yaml(_TINY % "1.05306184e-20"), "--format", "json")
    [r] = json.loads(out)["results"]
    assert code == 1 and r["ok"] is False and r["rtol"] == 5e-9 and r["max_abs_error"] < 2e-27
    ok = tmp_yaml(_TINY % "1.05306174e-20" + "  - {step: attn.scores, value: [[0, -46]]}\n")
    code, out, _ = invoke("check", ok)
    assert code == 0 and "tolerance" in out.splitlines()[1].split()
    assert [line.split()[3] for line in out.splitlines()[2:4]] == ["5e-09·|v|", "1e-06"]


def test_check_rtol_never_lets_an_infinite_expectation_pass_a_finite_value(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    path = tmp_yaml(
        "model: {d_model: 2, n_heads: 1, encoder_layers: 0, decoder_layers: 1}\n"
        "vocab: [a, b]\ntarget: [a, b]\nexpect:\n"
        "  - {step: decoder.mask, value: [[0, -.inf], [0, -.inf]], rtol: 0.5}\n"
    )
    code, out, _ = invoke("check", path, "--format", "json")
    [r] = json.loads(out)["results"]
    assert code == 1 and r["ok"] is False and r["max_abs_error"] == "inf"


_PE = (  # PE(1) = [sin 1, cos 1]; "document" is what a tutorial printed for it
    "pe: {length: 2, d_model: 2}\nexpect:\n"
    "  - step: pe\n    value: [[0, 1], [0.8414709848078965, 0.5403023058681398]]\n"
    "    document: %s\n    document_atol: 0.005\n"
)


def test_check_reports_a_recorded_document_error(tmp_yaml, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_yaml(_PE % "[[0, 1], [0.84, 0.99]]", "pe.yaml")
    code, out, _ = invoke("check", path)
    assert code == 0 and "1 passed, 0 failed" in out
    assert (
        "document error pe.yaml: pe: the document prints 0.99 at [1, 1] where its formula "
        "gives 0.5403023059: off by 0.45, and 1 of 4 cells beyond its printed precision 0.005"
    ) in out
    code, out, _ = invoke("check", path, "--format", "json")
    [r] = json.loads(out)["results"]
    assert r["ok"] is True and r["document"] == {
        "max_abs_error": pytest.approx(0.99 - math.cos(1), abs=1e-15),
        "atol": 0.005,
        "at": [1, 1],
        "printed": 0.99,
        "computed": math.cos(1),
        "cells_wrong": 1,
        "cells": 4,
    }


def test_check_fails_a_false_document_error(tmp_yaml, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # The printed [0.84, 0.54] is right to its two decimals: recording it as wrong is a
    # mistake in the fixture, and check says so (exit 1), not "document error".
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_yaml(_PE % "[[0, 1], [0.84, 0.54]]", "pe.yaml")
    code, out, _ = invoke("check", path)
    assert code == 1 and "document error pe.yaml" not in out
    assert (
        "FAIL pe.yaml: pe: the document's value agrees with the result within "
        "document_atol 0.005: no document error to record"
    ) in out


_QUERY = (  # 002's database query: softmax([1, 1, 0, 1]) printed as [1/3, 1/3, 0, 1/3]
    "attention: {Q: [[1, 0, 0]], K: [[1, 2, 0], [1, 2, 0], [0, 0, 2], [1, 4, 0]], "
    "V: [[18], [20], [22], [19]], scale: 1}\nexpect:\n"
    "  - step: attn.softmax\n    value: [%s]\n"
    "    document: [0.3333333333333333, 0.3333333333333333, 0, 0.3333333333333333]\n"
)


@pytest.mark.parametrize(
    ("override", "printed_as_result"),
    [("attention.scale=2", False), ("attention.temperature=0.001", True)],
)
def test_check_judges_a_document_error_only_where_the_entry_reproduces_its_formula(
    tmp_yaml, monkeypatch: pytest.MonkeyPatch, override: str, printed_as_result: bool
) -> None:  # type: ignore[no-untyped-def]
    # Varied with --set, the run no longer computes the document's formula: its result
    # says nothing of the document. By hand, scale 2 gives weights e^0.5 : e^0.5 : 1 :
    # e^0.5 (0.168 for the third, not the formula's 1/(3e + 1) = 0.109), and temperature
    # 0.001 gives the printed [1/3, 1/3, 0, 1/3]; neither is a document error nor its
    # absence, and the entry fails on its own value alone.
    monkeypatch.setenv("COLUMNS", "200")
    e = math.e
    value = ", ".join(repr(w / (3 * e + 1)) for w in (e, e, 1.0, e))
    path = tmp_yaml(_QUERY % value, "query.yaml")
    code, out, _ = invoke("check", path)
    assert (
        code == 0
        and "document error query.yaml: attn.softmax: the document prints 0 at [0, 2]" in out
    )
    code, out, _ = invoke("check", path, "--set", override)
    assert code == 1 and "1 failed" in out
    assert "document error" not in out and "no document error to record" not in out
    third = math.exp(-0.5) / (3 + math.exp(-0.5)) if not printed_as_result else 0.0
    code, out, _ = invoke("check", path, "--set", override, "--format", "json")
    [r] = json.loads(out)["results"]
    assert r["ok"] is False and "document" not in r and not r.get("problem")
    assert r["max_abs_error"] == pytest.approx(abs(third - 1 / (3 * e + 1)), abs=1e-9)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("document: [[0, 1]]", "expect.0.document: wrong shape"),
        ("document_atol: 0.1", "expect.0.document_atol: a tolerance for a document value"),
        ("rtol: -1", "expect.0.rtol: must be at least 0"),
        ("document: [[0, 1e400], [1, 1]]", "expect.0.document.0.1: number too large"),
        ("documents: 1", "expect.0.documents: unknown key 'documents' (did you mean 'document'?)"),
    ],
)
def test_check_refuses_a_bad_document_or_rtol(tmp_yaml, entry: str, message: str) -> None:  # type: ignore[no-untyped-def]
    entries = f"  - {{step: pe, value: [[0, 1], [1, 1]], {entry}}}\n"
    path = tmp_yaml("pe: {length: 2, d_model: 2}\nexpect:\n" + entries)
    code, _, err = invoke("check", path)
    assert code == 2 and message in err, err


def test_check_of_a_config_without_expect_entries_says_so(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    path = tmp_yaml("model: {d_model: 2, n_heads: 1}\nvocab: [a, b]\nsource: [a, b]\n")
    code, out, _ = invoke("check", path)
    assert code == 0
    assert out.splitlines() == [
        "trace-tf check: no `expect` entries to check",
        "0 passed, 0 failed",
    ]


def _cells_at(monkeypatch: pytest.MonkeyPatch, columns: int, *args: str) -> tuple[str, set[str]]:
    """What `args` prints at `columns` columns, and its cells: the words between spaces
    and table borders (so that "2.8" is not found in "2.84e-14")."""
    import re

    monkeypatch.setenv("COLUMNS", str(columns))
    result = runner.invoke(app, list(args))
    assert result.exit_code in (0, 1), result.stderr
    return result.stdout, set(re.split(r"[\s│┃]+", result.stdout))


def _json_of(monkeypatch: pytest.MonkeyPatch, *args: str) -> dict:  # type: ignore[type-arg]
    monkeypatch.setenv("COLUMNS", "200")
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _assert_whole(monkeypatch: pytest.MonkeyPatch, numbers: list[str], *args: str) -> None:
    """Every one of `numbers` is a cell of what `args` prints at 200 columns, and at 80
    and 40 too: a narrow terminal never cuts a number."""
    assert numbers
    for columns in (200, 80, 40):
        out, cells = _cells_at(monkeypatch, columns, *args)
        missing = [x for x in numbers if x not in cells]
        assert not missing, f"at {columns} columns, cut or missing: {missing}\n{out}"


def test_check_never_cuts_an_error_or_a_tolerance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At 40 columns `max |error|` read "2.8" for 2.84e-14 and the failing row's error was
    # blank; at 50, atol read "1e-" for 1e-06.
    import trace_tf

    hello = (Path(trace_tf.__file__).parent / "examples" / "hello.yaml").read_text()
    first = "    value: [[1, 2, 3, 4], [2, 3, 4, 5]]\n"
    assert first in hello
    path = tmp_path / "X.yaml"
    path.write_text(hello.replace(first, first.replace("[[1,", "[[2,"), 1))
    results = _json_of(monkeypatch, "check", str(path))["results"]
    assert [r["ok"] for r in results].count(False) == 1
    numbers = [f"{r['max_abs_error']:.3g}" for r in results] + [f"{r['atol']:g}" for r in results]
    _assert_whole(monkeypatch, numbers, "check", str(path))
    for columns in (40, 50):
        _, cells = _cells_at(monkeypatch, columns, "check", str(path))
        assert {"2.84e-14", "4.89e-09", "1.1e-07", "5e-09", "FAIL"} <= cells


def test_diff_never_cuts_a_difference_where_or_a_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # At 40 columns the `at` column read "[1" and "[0", and `cells` was not shown.
    args = ("diff", "hello", "--set-b", "model.scale=30")
    steps = [s for s in _json_of(monkeypatch, *args)["steps"] if s["status"] == "differs"]
    numbers = [f"{s['max_abs_diff']:.3g}" for s in steps]
    numbers += ["[" + ",".join(map(str, s["at"])) + "]" for s in steps]
    numbers += [f"{s['cells_differing']}/{math.prod(s['shape_b'])}" for s in steps]
    _assert_whole(monkeypatch, numbers, *args)


def test_cost_never_cuts_a_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # At 40 columns the L column had no width and the counts read "2,3…" and "36.…".
    from trace_tf.render import _si

    args = ("cost", "--vary", "L=8,16,32")
    data = _json_of(monkeypatch, *args)
    numbers = [f"{c['macs']:,}" for c in data["ledger"] if c["macs"]]
    numbers += [f"{n:,}" for n in data["totals"]["by_stage"].values()]
    numbers += [f"{data['totals']['total']:,}"]
    for row in data["vary"]["rows"]:  # the times are measured anew each run: not compared
        numbers += [str(row["value"]), _si(row["total"])]
        numbers += [_si(n) for n in row["by_kind"].values() if n]
        numbers += [f"{row['by_kind']['attention'] / row['total']:.1%}"]
    _assert_whole(monkeypatch, numbers, *args)


def test_generate_beam_summary_never_cuts_a_log_probability(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At 80 and 120 columns the long token lists took the width and logP, score and
    # the result mark were cut to "…".
    args = ("generate", "--beam", "3")
    data = _json_of(monkeypatch, *args)
    hypotheses = data["finished"] + data["unfinished"]
    numbers = [f"{h['logprob']:.4f}" for h in hypotheses] + [
        f"{h['score']:.4f}" for h in hypotheses
    ]
    _assert_whole(monkeypatch, numbers, *args)
    for columns in (80, 120):
        out, _ = _cells_at(monkeypatch, columns, *args)
        summary = out[out.index("hypotheses (") :]
        assert "◀ result" in summary
        for h in hypotheses:
            assert f"{h['logprob']:.4f}" in summary and f"{h['score']:.4f}" in summary


def test_generate_beam_rows_that_wrap_are_set_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    # At 50 columns each token list wrapped one token a line, and the continuation
    # lines read as more hypotheses; a blank line now separates the hypotheses.
    args = ("generate", "--beam", "3", "--max-tokens", "4")
    data = _json_of(monkeypatch, *args)
    hypotheses = data["finished"] + data["unfinished"]
    assert len(hypotheses) == 3

    def rows(columns: int) -> list[str]:
        out, _ = _cells_at(monkeypatch, columns, *args)
        table = out[out.index("hypotheses (") :].splitlines()
        table = table[next(i for i, x in enumerate(table) if "tokens " in x) + 1 :]  # below it
        return [
            line.strip("│ ") for line in table[: table.index(next(x for x in table if "cut:" in x))]
        ]

    narrow = rows(50)
    blocks = "\n".join(narrow).split("\n\n")
    ended = ["eos"] * len(data["finished"]) + ["cut"] * len(data["unfinished"])
    for block, h, how in zip(blocks, hypotheses, ended, strict=True):  # one hypothesis each
        cells = [str(len(h["tokens"])), f"{h['logprob']:.4f}", f"{h['score']:.4f}", how]
        words = block.split()
        assert all(c in words for c in cells)
        assert [w for w in words if w not in {*cells, "◀", "result"}] == h["tokens"]
    wide = rows(120)
    assert "" not in wide and len(wide) == len(hypotheses)


def test_generate_beam_rows_that_cannot_wrap_are_not_set_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At 30 columns the summary is printed wider than the terminal, as wide as its
    # numbers need; there each one-token hypothesis fits its line, yet blank lines were
    # put between them, as if they wrapped (the width compared was the terminal's).
    args = ("generate", "--beam", "3", "--max-tokens", "1")
    data = _json_of(monkeypatch, *args)
    hypotheses = [h["tokens"] for h in data["finished"] + data["unfinished"]]
    assert len(hypotheses) == 3 and all(len(h) == 1 for h in hypotheses)
    out, _ = _cells_at(monkeypatch, 30, *args)
    table = out[out.index("hypotheses (") :].splitlines()
    table = table[next(i for i, x in enumerate(table) if "tokens " in x) + 1 :]  # below it
    rows = [
        line.strip("│ ") for line in table[: next(i for i, x in enumerate(table) if "cut:" in x)]
    ]
    assert [row.split()[:1] for row in rows] == hypotheses  # no blank line between


def test_a_library_that_cannot_be_loaded_is_one_line_not_a_bug(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # numpy's ImportError is a page long; under `ulimit -v` its last line is the cause
    import trace_tf.runner

    def unloadable(*a: object, **k: object) -> None:
        raise ImportError(
            "\nIMPORTANT: PLEASE READ THIS\n\nOriginal error was: _umath.so: failed to map "
            "segment from shared object\n",
            name="numpy",
        )

    monkeypatch.setattr(trace_tf.runner, "run", unloadable)
    code, out, err = invoke("encode")
    assert (code, out) == (3, "")
    assert err == (
        "trace-tf: error: cannot load numpy (_umath.so: failed to map segment from shared "
        "object); expected a working installation and the memory to load it\n"
    )
    assert "bug" not in err


def test_a_broken_numpy_is_named_though_its_error_carries_no_name(tmp_path: Path) -> None:
    # numpy re-raises the failure of its C core (a broken install, `ulimit -v` too low to
    # map it) as a new ImportError without a name: the message said "cannot load a
    # library it needs" where the README promises "cannot load numpy (...)". A stand-in
    # numpy that fails as the real one does, first on the path of a real process:
    import os
    import subprocess

    fake = tmp_path / "numpy"
    fake.mkdir()
    (fake / "_core.py").write_text(
        "raise ImportError('_umath.so: failed to map segment from shared object', "
        "name='_multiarray_umath')\n"
    )
    (fake / "__init__.py").write_text(
        "try:\n    from . import _core\nexcept ImportError as exc:\n"
        "    raise ImportError('IMPORTANT: PLEASE READ THIS\\n\\nOriginal error was: "
        "_umath.so: failed to map segment from shared object') from exc\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "trace_tf", "encode"], capture_output=True, text=True, env=env
    )
    assert (proc.returncode, proc.stdout) == (3, ""), proc.stderr
    assert proc.stderr == (
        "trace-tf: error: cannot load numpy (_umath.so: failed to map segment from shared "
        "object); expected a working installation and the memory to load it\n"
    )


def test_out_of_memory_outside_a_command_is_still_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import trace_tf.cli

    def parse_fails(args: list[str]) -> object:
        raise MemoryError

    monkeypatch.setattr(trace_tf.cli, "app_for", parse_fails)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # keep pytest's SIGPIPE handling
    monkeypatch.setattr(sys, "argv", ["trace-tf", "encode"])
    with pytest.raises(SystemExit) as done:
        trace_tf.cli.main()
    assert done.value.code == 2
    assert capsys.readouterr().err == trace_tf.cli.OUT_OF_MEMORY + "\n"


def test_a_named_scale_is_not_written_as_if_the_quotient_equalled_it() -> None:
    # "S / sqrt(d_k) = 1.73205" read as S/√d_k = 1.73205: the value is said after the
    # formula, as the embedding scale's is (hello: d_k = 3, √3 ≈ 1.73205)
    code, out, _ = invoke("step", "--stage", "scaled", "--head", "0", "--format", "json")
    assert code == 0
    formulas = {s["path"]: s["formula"] for s in json.loads(out)["steps"]}
    assert formulas["encoder.0.self_attn.h0.scaled"] == "S / sqrt(d_k),  sqrt(d_k) ≈ 1.73205"
    assert "scores / sqrt(d_k),  sqrt(d_k) ≈ 1.73205" in invoke("encode")[1]
    code, out, _ = invoke("step", "--stage", "scaled", "--variant", "document_scale30")
    assert code == 0 and "S / 30   " in out


def test_constants_the_user_gave_are_written_back_unrounded() -> None:
    # They were written with :g, six digits: ε = 1.23457e-05, T = 0.123457.
    from trace_tf.text import exact

    assert [exact(x) for x in (1e-5, 10000.0, 1.23456789e-5, 0.1, 2.5e20, 30)] == [
        "1e-05",
        "10000",
        "1.23456789e-05",
        "0.1",
        "2.5e+20",
        "30",
    ]
    for args, shown in (
        (("encode", "--set", "model.norm_eps=1.23456789e-5"), "ε = 1.23456789e-05"),
        (("encode", "--set", "model.pe_base=12345.6789"), "base 12345.6789"),
        (("encode", "--set", "model.scale=2.718281828"), "scores / 2.718281828"),
        (
            (
                "explain",
                "encoder.0.self_attn.norm",
                "--cell",
                "0,0",
                "--set",
                "model.norm_eps=1.23456789e-5",
            ),
            "+ 1.23456789e-05)",
        ),
        (
            (
                "generate",
                "--sample",
                "--temperature",
                "0.123456789",
                "--top-p",
                "0.912345678",
                "--max-tokens",
                "1",
            ),
            "T = 0.123456789 top-p 0.912345678",
        ),
    ):
        code, out, err = invoke(*args)
        assert code == 0, err
        assert shown in " ".join(out.replace("│", " ").split()), args


@pytest.mark.parametrize("columns", [80, 200])
def test_a_long_matrix_shows_its_first_and_last_four_rows_at_any_width(
    monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    # The rows' elision took the columns' edge, which grows with the width: at 200
    # columns a 26-row matrix showed 20 rows.
    source = "[" + ", ".join(["hello", "world"] * 13) + "]"
    out, _ = _cells_at(
        monkeypatch, columns, "step", "--stage", "encoder.pe", "--set", f"source={source}"
    )
    rows = [line for line in out.splitlines() if line.startswith("│ │")]  # in the panel
    labels = [row.split("│")[2].strip() for row in rows]
    assert labels == [
        "[0] hello",
        "[1] world",
        "[2] hello",
        "[3] world",
        "…",
        "[22] hello",
        "[23] world",
        "[24] hello",
        "[25] world",
    ]


def test_the_calculators_do_not_offer_dtype() -> None:
    # Their --help listed --dtype, which they then refused: they compute in float64.
    # (test_bad_inputs checks the message that refuses it.)
    for name in ("attend", "norm", "pe"):
        help_text = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"}).stdout
        assert "--dtype" not in help_text, name
    assert "--dtype" in runner.invoke(app, ["encode", "--help"], env={"COLUMNS": "200"}).stdout


FAR_APART = (
    "model: {d_model: 2, positional: none}\nsource: [[1.0e308, 1]]\n"
    "expect: [{step: encoder.embed, value: [[-1.0e308, 1]]}]\n"
)


def test_check_and_diff_of_numbers_beyond_float64_apart_let_no_numpy_warning_out(
    tmp_yaml: Any,
) -> None:
    # 1e308 against -1e308 is 2e308 apart: inf, as the error and the difference, and
    # no RuntimeWarning (a warning let out here is exit 3).
    import warnings

    path = tmp_yaml(FAR_APART)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        code, out, err = invoke("check", path, "--format", "json")
        assert code == 1, err
        assert json.loads(out)["results"][0]["max_abs_error"] == "inf"
        code, out, err = invoke(
            "diff", path, "--set-b", "source=[[-1.0e308, 1]]", "--format", "json"
        )
        assert code == 0, err
        first = json.loads(out)["steps"][0]
        assert first["path"] == "encoder.embed" and first["max_abs_diff"] == "inf"


_EMBED = "model: {d_model: 2, positional: none}\nsource: [[1.0e308, 1]]\n"
_OVERFLOW = "attention: {Q: [[1.0e200]], K: [[1.0e200]], V: [[1]], scale: 1}\n"  # Q K^T: inf


@pytest.mark.parametrize(
    ("config", "entry", "ok"),
    [
        # 1e308 against -1e308: 2e308 apart, beyond 1.9e308 and within 2.1e308 (both
        # tolerances themselves beyond float64)
        (_EMBED, "{step: encoder.embed, value: [[-1.0e308, 1]], atol: 0, rtol: 1.9}", False),
        (_EMBED, "{step: encoder.embed, value: [[-1.0e308, 1]], atol: 0, rtol: 2.1}", True),
        (_EMBED, "{step: encoder.embed, value: [[1.0e307, 1]], atol: 0, rtol: 1.0e300}", True),
        # an overflow (inf) never meets a finite expectation, however wide its tolerance
        (_OVERFLOW, "{step: attn.scores, value: [[1.0e308]], rtol: 2}", False),
        (_OVERFLOW, "{step: attn.scores, value: [[.inf]], rtol: 2}", True),
    ],
    ids=["apart-beyond", "apart-within", "huge-rtol", "inf-vs-finite", "inf-vs-inf"],
)
def test_check_rtol_beyond_float64_is_decided_by_the_exact_rule(
    tmp_yaml: Any, config: str, entry: str, ok: bool
) -> None:
    # |actual - expected| <= atol + rtol |expected| in real numbers: a tolerance or a
    # difference beyond float64 (inf) decides nothing by itself, and no numpy warning
    # gets out (a warning let out here is exit 3).
    import warnings

    path = tmp_yaml(config + f"expect: [{entry}]\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        code, out, err = invoke("check", path, "--format", "json")
    assert code == (0 if ok else 1), err
    assert json.loads(out)["results"][0]["ok"] is ok


def test_a_numeric_matrix_source_is_its_own_embedding_rows_labelled_x0_x1(tmp_yaml: Any) -> None:
    # SPEC section 2: a numeric L x d_model source is used as the embeddings; its rows
    # have no tokens, so tables and JSON's `tokens` label them x0, x1 (README).
    path = tmp_yaml("model: {d_model: 2, n_heads: 1, positional: none}\nsource: [[1, 2], [3, 4]]\n")
    code, out, err = invoke("encode", path, "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["tokens"] == {"source": ["x0", "x1"]}
    steps = {s["path"]: s["value"] for s in data["steps"]}
    assert steps["encoder.embed"] == [[1, 2], [3, 4]] == steps["encoder.input"]
    code, out, _ = invoke("encode", path)
    rows = [line.split() for line in out.splitlines()]
    assert code == 0 and ["│", "x0", "│", "1.0000", "│", "2.0000", "│"] in rows
    assert ["│", "x1", "│", "3.0000", "│", "4.0000", "│"] in rows


def _run_module(*args: str | bytes, env: dict[str, str] | None = None, cwd: Path | None = None):  # type: ignore[no-untyped-def]
    """`python -m trace_tf ARGS` in a real process (bytes arguments: a file name that is
    not UTF-8), with `env` added to the environment."""
    import os
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "trace_tf", *args],
        capture_output=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize("args", [["encode"], ["check"], ["cost"], ["stages"]])
def test_an_output_that_cannot_take_the_tables_is_one_line_not_a_bug(
    encoding: str, args: list[str]
) -> None:
    # The tables draw boxes, minus signs and Greek letters: a stdout set to ASCII or
    # Latin-1 cannot take them. That is the terminal's state, not a bug (was exit 3).
    done = _run_module(*args, env={"PYTHONIOENCODING": encoding})
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1, err
    assert err.startswith(
        f"trace-tf: error: cannot write standard output: its encoding, {encoding}"
    )
    assert err.rstrip().endswith(
        "expected an output that takes UTF-8 (a UTF-8 locale, or PYTHONIOENCODING=utf-8)"
    )
    assert (
        _run_module("encode", "--format", "json", env={"PYTHONIOENCODING": encoding}).returncode
        == 0
    )


def test_a_config_named_in_bytes_that_are_not_utf8_is_shown_with_them(tmp_path: Path) -> None:
    # The file name b"c\xff.yaml" titles the tables: written back byte for byte, to a
    # strict UTF-8 stdout and into an --output file (both were exit 3).
    name = b"c\xff.yaml"
    (tmp_path / "c\udcff.yaml").write_text("model: {d_model: 2}\nvocab: [a]\nsource: [a]\n")
    done = _run_module("encode", name, env={"PYTHONIOENCODING": "utf-8"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert b"\xe2\x94\x80 " + name + b" \xe2\x94\x80" in done.stdout  # "─ c\xff.yaml ─"
    done = _run_module("encode", name, "--output", "out.txt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert b" " + name + b" " in (tmp_path / "out.txt").read_bytes()


@pytest.mark.parametrize("width", [1, 20, 40, 50])
@pytest.mark.parametrize(
    "command", [("encode",), ("step", "--stage", "softmax"), ("attend",), ("pe",)]
)
def test_a_matrix_too_wide_for_any_elision_is_printed_whole_not_cut(
    tmp_yaml, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...], width: int
) -> None:  # type: ignore[no-untyped-def]
    # Elided to its first and last column, a matrix may still not fit a narrow terminal
    # (two columns of 17 digits are over 50 cells): it is printed wider, as the other
    # tables are, rather than cut at the edge (`1.00000000` for 1.0000000000000000e+00).
    path = tmp_yaml(
        "model: {d_model: 4, n_heads: 2}\nvocab: [a, b]\nsource: [a, b]\n"
        "embeddings: {a: [1, 2, 3, 4], b: [4, 3, 2, -9]}\n"
    )
    args = {
        "attend": ["--q", "1e-9 1; 1 1", "--k", "1 1; 30 1", "--v", "1 2; 3 4"],
        "pe": ["--length", "3", "--d-model", "12"],
    }.get(command[0], [path])
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, err = invoke(command[0], *args, *command[1:], "--precision", "17")
    assert code == 0, err
    rows = []  # the matrices' lines, inside step's panels or not
    for line in out.splitlines():
        if line.startswith("│ ") and line[2:3] in "┏┃┡│└":
            rows.append(line[2:].rstrip()[:-1].rstrip())  # less the panel's borders
        elif line[:1] in "┏┃┡│└":
            rows.append(line.rstrip())
    assert len(rows) >= 6 and all(x[-1] in "┓┃┩│┘" for x in rows), out  # each whole


def test_a_terminal_of_one_column_is_laid_out_forty_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    # COLUMNS=1 left the header's panel no room: it printed two corners and no text.
    from rich.cells import cell_len

    monkeypatch.setenv("COLUMNS", "1")
    code, out, _ = invoke("generate", "--max-tokens", "1")
    assert code == 0 and "decoding" in out and "greedy" in out and "next how" in out
    assert max(cell_len(x) for x in out.splitlines()) == 40


def test_ctrl_c_while_the_command_line_loads_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Loading typer, rich and the commands takes a tenth of a second; a Ctrl-C then
    # came before any guard and printed a traceback. The script's entry catches it.
    import types

    class Loading(types.ModuleType):
        def __getattr__(self, name: str) -> None:
            raise KeyboardInterrupt  # as if interrupted while trace_tf.cli loads

    from trace_tf.__main__ import main

    monkeypatch.setitem(sys.modules, "trace_tf.cli", Loading("trace_tf.cli"))
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 130
    assert capsys.readouterr() == ("", "trace-tf: interrupted\n")


def test_the_script_and_python_m_enter_through_the_same_guard() -> None:
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert 'trace-tf = "trace_tf.__main__:main"' in pyproject.splitlines()


def test_names_too_long_or_looping_are_bad_input_not_bugs(tmp_path: Path) -> None:
    # ENAMETOOLONG and ELOOP came out of Path.exists() as internal errors (exit 3).
    long = str(tmp_path / ("x" * 300))
    for args in (["encode", "--output", long], ["explain", long], ["explain", "encoder.pe", long]):
        code, out, err = invoke(*args)
        assert code == 2 and out == "" and err.count("\n") == 1, (args, err)
        assert "too long" in err or "no such file" in err or "no step" in err, err
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    code, _, err = invoke("encode", str(tmp_path / "loop"))
    assert (code, err) == (
        2,
        f"trace-tf: error: {tmp_path}/loop: cannot read: Too many levels of symbolic links\n",
    )


def test_an_output_name_of_250_characters_is_written(tmp_path: Path) -> None:
    # valid (at most 255), though the temporary file beside it, named after it, was not
    out = tmp_path / ("y" * 250)
    code, _, err = invoke("encode", "--output", str(out))
    assert code == 0, err
    assert "hello" in out.read_text() and sorted(tmp_path.iterdir()) == [out]


def test_a_terminal_of_a_billion_columns_is_laid_out_a_thousand_wide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Panels fill the width: COLUMNS=999999999 padded every line to a billion spaces
    # (out of memory), and 99999 made 20 kB of tables 1.5 MB.
    from rich.cells import cell_len

    monkeypatch.setenv("COLUMNS", "999999999")
    code, out, _ = invoke("encode")
    assert code == 0 and max(cell_len(x) for x in out.splitlines()) == 1000


@pytest.mark.parametrize(
    ("step", "value", "verdict"),
    [
        ("attn.scores", "[1, 0, 0, 1]", "shape 2 x 2 but expected 4"),  # 2 x 2: not a vector
        ("attn.scores", "[[1, 0], [0, 1]]", "ok"),
        ("attn.context", "[1, 0]", "ok"),  # a vector for its 2 x 1
        ("attn.context", "[[1, 0]]", "shape 2 x 1 but expected 1 x 2"),  # transposed
    ],
)
def test_check_takes_a_value_that_leaves_out_only_axes_of_length_1(
    tmp_yaml: Any, step: str, value: str, verdict: str
) -> None:
    # A flat vector of 4 passed against a 2 x 2 step: any value of the same size was
    # reshaped to the step's shape. Now only axes of length 1 may be left out.
    # Q = K = I, scale 1, V = [[1], [0]]: scores = I (by hand), context = softmax(I) V.
    path = tmp_yaml(
        "attention: {Q: [[1, 0], [0, 1]], K: [[1, 0], [0, 1]], V: [[1], [0]], scale: 1}\n"
        f"expect: [{{step: {step}, value: {value}, atol: 0.3}}]\n"
    )
    code, out, err = invoke("check", path, "--format", "json")
    [r] = json.loads(out)["results"]
    assert (r["ok"], r.get("problem", "ok")) == (verdict == "ok", verdict), err
    assert code == (0 if verdict == "ok" else 1)


def _option_help(command: str, option: str) -> str:
    """The help text of one option of a command, as one line."""
    text = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).stdout
    rows = [line.strip(" │").strip() for line in text.splitlines()]
    start = next(i for i, r in enumerate(rows) if r.split(" ", 1)[0] == option)
    end = next(i for i in range(start + 1, len(rows)) if rows[i].startswith("-") or "─" in rows[i])
    return " ".join(" ".join(rows[start:end]).split())


Q, K, V = ("--q", "1 0; 0 2"), ("--k", "1 2; 3 -1; 0 1"), ("--v", "1; 2; 4")


@pytest.mark.parametrize(
    "command, option, stated, base, given",
    [  # each default the help states, against a run that gives that value
        ("attend", "--scale", "default sqrt_dk", [*Q, *K, *V], ["--scale", "sqrt_dk"]),
        (
            "attend",
            "--scale",
            "1 for the other scores",
            [*Q, *K, *V, "--score", "dot"],
            ["--scale", "1"],
        ),
        ("attend", "--temperature", "default 1", [*Q, *K, *V], ["--temperature", "1"]),
        ("attend", "--w", "default 1", [*Q, *K, *V, "--score", "gaussian"], ["--w", "1"]),
        ("attend", "--mask", "default none", [*Q, *K, *V], ["--mask", "0 0 0; 0 0 0"]),
        ("norm", "--gamma", "default 1", ["--x", "1 2 4; 0 3 3"], ["--gamma", "1 1 1"]),
        ("norm", "--beta", "default 0", ["--x", "1 2 4; 0 3 3"], ["--beta", "0 0 0"]),
        (
            "explain",
            "--cell",
            "default: the first",
            ["encoder.0.self_attn.h0.q"],
            ["--cell", "0,0"],
        ),
        ("generate", "--top-k", "default: every token", ["--sample"], ["--top-k", "10"]),
        ("generate", "--top-p", "default 1", ["--sample"], ["--top-p", "1"]),
    ],
)
def test_a_help_states_the_option_s_default(
    command: str, option: str, stated: str, base: list[str], given: list[str]
) -> None:
    # Their help named no default (attend's --scale is sqrt_dk or 1 depending on the
    # score; norm's gamma and beta ones and zeros; explain's first cell).
    assert stated in _option_help(command, option), _option_help(command, option)

    def values(args: list[str]) -> Any:
        result = runner.invoke(app, [command, *args, "--format", "json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        if command == "generate":  # (renormalising every token may move the last bit)
            probs = [p for it in data["iterations"] for p in it["probs"].values()]
            return [data["generated"], *probs]
        if command == "explain":
            return data["step"], data["cell"], data["value"]
        return {s["path"]: s["value"] for s in data["steps"] if s["path"] != "attn.masked"}

    default, explicit = values(base), values([*base, *given])
    if command == "generate":
        assert default[0] == explicit[0]
        assert default[1:] == pytest.approx(explicit[1:], rel=1e-14, abs=0)
    else:
        assert default == explicit


@pytest.mark.parametrize("option", ["--layer", "--head"])
def test_generate_help_says_layer_and_head_need_trace(option: str) -> None:
    assert _option_help("generate", option).startswith(f"{option} <int range> [x>=0] With --trace")
    result = runner.invoke(app, ["generate", option, "0"])
    assert result.exit_code == 2 and "add --trace" in result.stderr


def test_norm_eps_help_says_where_rms_adds_it() -> None:
    # The help said ε is "added to the variance", but rms norm has no variance: its ε
    # goes under the root with mean(x²), x / √(mean(x²) + ε).
    assert "for rms to mean(x²)" in _option_help("norm", "--eps"), _option_help("norm", "--eps")
    args = ["norm", "--x", "1 3 -2", "--kind", "rms", "--eps", "0.5", "--format", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    out = {s["path"]: s["value"] for s in json.loads(result.stdout)["steps"]}
    x = np.array([[1.0, 3.0, -2.0]])
    want = x / np.sqrt((1.0 + 9.0 + 4.0) / 3 + 0.5)
    np.testing.assert_allclose(out["norm.out"], want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("command", ["encode", "check"])
def test_a_warning_is_one_line_whatever_the_file_name_holds(command: str, tmp_path: Path) -> None:
    # Errors were escaped to one line (text.printable), warnings not: a config named
    # "we\nird.yaml" split "trace-tf: warning: we" from the rest of the line.
    from trace_tf.config import resolve

    config = tmp_path / "we\nird\x1b.yaml"
    config.write_text(resolve(None).read_text(encoding="utf-8"))
    args = [command, str(config), "--set", "model.embed_scale=1e308", "--format", "json"]
    result = runner.invoke(app, args)
    warnings = [x for x in result.stderr.splitlines() if x]
    # (check: its steps fail against the infinities, exit 1)
    assert result.exit_code == (1 if command == "check" else 0) and warnings, result.stderr
    for w in warnings:
        assert w.startswith("trace-tf: warning: ") and "we\\nird\\x1b.yaml" in w, w


@pytest.mark.parametrize("command", ["encode", "check", "diff"])
def test_a_title_or_file_name_reaches_the_terminal_escaped(command: str, tmp_path: Path) -> None:
    # The header's title (the config's title:, or its file name), check's and diff's
    # file names went out raw: an escape character coloured what followed, a newline
    # broke the panel's or the table's title line. (Tokens and messages were escaped.)
    from trace_tf.config import resolve

    config = tmp_path / "f\x1b[31m\n.yaml"
    text = resolve(None).read_text(encoding="utf-8")
    config.write_text('title: "T\\e[32m\\nU"\n' + text.split("\n", 1)[1])
    args = [command, str(config)] + (
        [str(config), "--set-b", "model.norm_eps=1"] * (command == "diff")
    )
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code in (0, 1), result.output
    assert "\x1b" not in result.stdout, result.stdout
    shown = "T\\x1b[32m\\nU" if command == "encode" else "f\\x1b[31m\\n.yaml"
    assert shown in result.stdout, result.stdout


def test_the_two_apostrophe_token_and_the_ellipsis_token_show_as_themselves(
    tmp_yaml: Any,
) -> None:
    # hello.yaml with the tokens '' (two apostrophes) and … in place of hello and world
    text = (FIXTURES / "hello.yaml").read_text(encoding="utf-8")
    for old, new in [
        ("vocab: [hello, mundo, world,", 'vocab: ["\'\'", mundo, "…",'),
        ("  hello: [1, 2, 3, 4]", "  \"''\": [1, 2, 3, 4]"),
        ("  world: [2, 3, 4, 5]", '  "…": [2, 3, 4, 5]'),
        ("source: [hello, world]", 'source: ["\'\'", "…"]'),
    ]:
        assert old in text
        text = text.replace(old, new)
    path = tmp_yaml(text)
    code, out, err = invoke("encode", path)
    assert code == 0, err
    assert "│ \"''\" │ 1.0000 │ 2.0000 │ 3.0000 │ 4.0000 │" in out  # encoder.embed, row 0
    assert "│ '…'  │ 2.0000 │ 3.0000 │ 4.0000 │ 5.0000 │" in out  # and row 1
    code, out, err = invoke("generate", path, "--max-tokens", "1")
    assert code == 0, err
    rows = [line.split() for line in out.splitlines()]
    assert any(r[2:3] == ["\"''\""] for r in rows) and any(r[2:3] == ["'…'"] for r in rows)
    code, out, err = invoke("explain", "encoder.embed", path, "--cell", "0,1")
    assert code == 0, err
    assert "embedding[\"''\"][1] = 2" in out and "row 0 is the token \"''\";" in out
    code, out, err = invoke("explain", "encoder.0.self_attn.h0.q", path, "--cell", "1,1")
    assert code == 0, err
    assert "row 1 ('…') of encoder.input" in out


DOTTED = """\
model: {d_model: 2, n_heads: 1, d_ff: 2, encoder_layers: 1, decoder_layers: 0}
vocab: [hi, ".", e.g., "0"]
embeddings:
  hi: [1, 2]
  ".": [3, 4]
  e.g.: [5, 6]
  "0": [7, 8]
source: [hi, ".", e.g., "0"]
"""


@pytest.mark.parametrize(
    ("set_", "rows"),
    [
        ("embeddings..=[9, 9]", [[1, 2], [9, 9], [5, 6], [7, 8]]),
        ("embeddings.e.g.=[9, 9]", [[1, 2], [3, 4], [9, 9], [7, 8]]),
        ("embeddings.e.g..1=9", [[1, 2], [3, 4], [5, 9], [7, 8]]),
        ("embeddings.hi.0=9", [[9, 2], [3, 4], [5, 6], [7, 8]]),
        ("embeddings.0=[9, 9]", [[1, 2], [3, 4], [5, 6], [9, 9]]),  # the token "0"
    ],
)
def test_set_addresses_a_token_that_holds_dots(tmp_yaml, set_: str, rows: Any) -> None:  # type: ignore[no-untyped-def]
    code, out, err = invoke(
        "step", tmp_yaml(DOTTED), "--set", set_, "--stage", "embed", "--format", "json"
    )
    assert code == 0, err
    (step,) = json.loads(out)["steps"]
    assert step["value"] == rows


@pytest.mark.parametrize(
    "sets",
    [
        ["vocab=[hi, x.y]", "embeddings.x.y=[9, 8]"],
        ["embeddings.x.y=[9, 8]", "vocab=[hi, x.y]"],  # (was refused: token "x" not in vocab)
        ["embeddings.x.y.1=8", "embeddings.x.y.0=9", "vocab.1=x.y"],
        ["embeddings.x.y.0=9", "vocab.1=x.y", "embeddings.x.y.1=8"],
    ],
)
def test_a_token_with_dots_is_read_whatever_the_order_of_the_sets(
    tmp_yaml, sets: list[str]
) -> None:  # type: ignore[no-untyped-def]
    """A dotted token below embeddings is one part if the vocab the overrides leave holds
    it, not only when vocab holds it before that --set."""
    text = "model: {d_model: 2, n_heads: 1}\nvocab: [hi, there]\nsource: [hi, hi]\n"
    args = [a for s in [*sets, "source=[x.y, hi]"] for a in ("--set", s)]
    code, out, err = invoke("step", tmp_yaml(text), *args, "--stage", "embed", "--format", "json")
    assert code == 0, err
    (step,) = json.loads(out)["steps"]
    assert step["value"][0] == [9, 8]


@pytest.mark.parametrize(
    "sets",
    [
        ["embeddings.x.0=6", "embeddings.x.y=[3, 4]"],  # (was: 'embeddings.x.y: no such entry')
        ["embeddings.x.y=[3, 4]", "embeddings.x.0=6"],
        ["embeddings.x.y.0=5", "embeddings.x=[7, 7]", "embeddings.x.y.0=3"],
    ],
)
def test_a_set_of_a_token_is_not_inside_a_longer_token_it_begins(tmp_yaml, sets: list[str]) -> None:  # type: ignore[no-untyped-def]
    """`embeddings.x.y` (token x.y) is not an entry of token x: setting one leaves the
    other as it would be, drawn by SPEC's rule, or as set."""
    text = "model: {d_model: 2, n_heads: 1, seed: 4}\nvocab: [x, x.y]\nsource: [x, x.y]\n"
    args = [a for s in sets for a in ("--set", s)]
    code, out, err = invoke("step", tmp_yaml(text), *args, "--stage", "embed", "--format", "json")
    assert code == 0, err
    (step,) = json.loads(out)["steps"]

    def drawn(token: str) -> list[float]:
        rng = np.random.default_rng([4, zlib.crc32(f"embeddings.{token}".encode())])
        return list(rng.standard_normal(2))

    x, xy = drawn("x"), drawn("x.y")
    if "embeddings.x=[7, 7]" in sets:
        x, xy = [7.0, 7.0], [3.0, xy[1]]
    else:
        x, xy = [6.0, x[1]], [3.0, 4.0]
    assert step["value"] == [x, xy]


@pytest.mark.parametrize(
    "key", ["embeddings..x", "embeddings...", "embeddings.e.g..", "embeddings.hi."]
)
def test_set_below_embeddings_with_an_empty_part_and_no_such_token_is_refused(
    tmp_yaml, key: str
) -> None:  # type: ignore[no-untyped-def]
    code, _, err = invoke("encode", tmp_yaml(DOTTED), "--set", f"{key}=1")
    assert code == 2
    assert f"cannot set {key}: an empty part between its dots" in err
    assert "Traceback" not in err


def test_a_typeset_minus_in_the_file_is_named_as_such(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    text = DOTTED.replace("hi: [1, 2]", "hi: [1, −2]")  # U+2212, as a PDF or a web page types it
    code, _, err = invoke("encode", tmp_yaml(text))
    assert code == 2
    assert "embeddings.hi.1: not a number" in err
    assert "found the string '−2' (its '−' is a typeset minus sign: write '-')" in err
    code, _, err = invoke("encode", tmp_yaml(DOTTED), "--set", "embeddings.hi=[1, −2]")
    assert code == 2 and "typeset minus" in err
    code, _, err = invoke("encode", tmp_yaml(text.replace("−2", "'a−b'")))
    assert code == 2 and "typeset minus" not in err  # not a number either way: no hint


def test_an_option_given_twice_takes_the_last_as_the_readme_says() -> None:
    # the stated convention (README, after the options table): the last value wins
    twice = runner.invoke(app, ["step", "--stage", "q", "--stage", "embed", "--format", "json"])
    assert twice.exit_code == 0, twice.stderr
    assert [s["path"] for s in json.loads(twice.stdout)["steps"]] == [
        "encoder.embed",
        "decoder.embed",
    ]
    shown = runner.invoke(app, ["step", "--stage", "embed", "--precision", "3", "--precision", "6"])
    assert shown.exit_code == 0 and "1.000000 │ 2.000000" in shown.stdout, shown.stdout


# The documents' worked examples, packaged: each runs by name where there is no clone.

A_FAILING_HELLO = """title: mine
norm:
  kind: layer
  x: [[1, 3]]
expect:
  - step: norm.out
    value: [[5, 5]]
"""


def test_a_worked_example_runs_by_name_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only hello was packaged: "002_database_query: no such file or packaged example".
    monkeypatch.chdir(tmp_path)
    code, out, err = invoke("check", "002_database_query", "--format", "json")
    assert code == 0, err
    results = json.loads(out)["results"]
    assert {r["config"] for r in results} == {"002_database_query (packaged example)"}
    # the document's printed answer 19 against softmax's 19.3277 (fixtures/README.md)
    [context] = [r for r in results if r["step"] == "attn.context" and r["variant"] is None]
    assert context["document"]["printed"] == 19
    assert context["document"]["computed"] == pytest.approx((57 * math.e + 22) / (3 * math.e + 1))


def test_check_examples_replays_every_packaged_example_whatever_the_directory_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trace_tf.loader import example_names

    names = example_names()
    fixtures = list(map(str, sorted(FIXTURES.glob("*.yaml"))))
    in_clone = json.loads(invoke("check", *fixtures, "--format", "json")[1])["results"]
    monkeypatch.chdir(tmp_path)
    by_name = runner.invoke(app, ["check", *names])
    (tmp_path / "hello").write_text(A_FAILING_HELLO)  # a file `hello` wins over the example
    assert invoke("check", "hello")[0] == 1
    # still the packaged hello, and the table and exit code of `check NAME ...`
    code, out, err = invoke("check", "--examples")
    assert (code, out, err) == (0, by_name.stdout, "")
    assert out.splitlines()[-1] == "98 passed, 0 failed"
    # the clone's fixtures' results, in name order, each config named as an example
    code, out, _ = invoke("check", "--examples", "--format", "json")
    results = json.loads(out)["results"]
    configs = list(dict.fromkeys(r["config"] for r in results))
    assert configs == [f"{n} (packaged example)" for n in names] and len(names) == 14
    for r in [*results, *in_clone]:
        r["config"] = Path(r["config"].removesuffix(" (packaged example)")).stem
    assert results == in_clone


def test_check_examples_exits_1_where_one_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trace_tf.config
    import trace_tf.loader

    (tmp_path / "a.yaml").write_text(A_FAILING_HELLO)
    (tmp_path / "b.yaml").write_text(
        A_FAILING_HELLO.replace("[[5, 5]]", "[[-1, 1]]\n    atol: 1e-4")
    )
    for module in (trace_tf.config, trace_tf.loader):
        monkeypatch.setattr(module, "examples_dir", lambda: tmp_path)
    code, out, _ = invoke("check", "--examples", "--format", "json")
    assert code == 1
    assert [(r["config"], r["ok"]) for r in json.loads(out)["results"]] == [
        ("a (packaged example)", False),
        ("b (packaged example)", True),
    ]


def test_check_examples_with_a_config_is_refused() -> None:
    code, out, err = invoke("check", "--examples", "hello")
    assert code == 2 and out == ""
    assert err == "trace-tf: error: --examples checks every packaged example; give it no CONFIG\n"


def test_an_unknown_config_name_is_one_short_line_naming_where_the_examples_are() -> None:
    # It listed every packaged example's name: with 14, a line of 400 characters.
    code, _, err = invoke("encode", "002_databse_query")
    assert code == 2
    assert err == (
        "trace-tf: error: 002_databse_query: no such file or packaged example (did you mean "
        "'002_database_query'?); expected a config file path or a packaged example's name "
        "(trace-tf examples lists them), found '002_databse_query'\n"
    )


@pytest.mark.parametrize("given", ["fixtures/002_database_query.yaml", "hello.yml"])
def test_a_missing_fixture_path_names_its_packaged_example(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Outside a clone, `check fixtures/002_database_query.yaml` said only "no such file".
    monkeypatch.chdir(tmp_path)
    stem = Path(given).stem
    code, _, err = invoke("check", given)
    assert code == 2
    assert err == (
        f"trace-tf: error: {given}: no such file (the packaged example of that name is "
        f"'{stem}', given without a directory or .yaml)\n"
    )


def test_a_file_named_like_an_example_says_it_is_read_instead_of_the_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `trace-tf encode hello --output hello`, then `trace-tf check hello`: the file wins
    # (README), and its error said only "hello:8: malformed YAML", as if the packaged
    # example were broken.
    monkeypatch.chdir(tmp_path)
    assert invoke("encode", "hello", "--output", "hello")[0] == 0
    code, out, err = invoke("check", "hello")
    assert code == 2 and out == ""
    label = "hello (a file in the current directory, not the packaged example)"
    assert err.startswith(f"trace-tf: error: {label}:8: malformed YAML"), err
    (tmp_path / "hello").write_text(A_FAILING_HELLO)
    data = json.loads(invoke("check", "hello", "--format", "json")[1])
    assert {r["config"] for r in data["results"]} == {label}
    # a name that is no example's, and a path, are named as before
    for given, named in (("mine", "mine"), ("./hello", "hello"), ("hello.yaml", "hello.yaml")):
        (tmp_path / given).write_text(A_FAILING_HELLO)
        data = json.loads(invoke("check", given, "--format", "json")[1])
        assert {r["config"] for r in data["results"]} == {named}


def test_examples_name_prints_the_packaged_file_to_start_a_config_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Installed, with no clone, the examples could be run and listed but not read: the
    # YAML of a single-operation file, an `expect` entry or a note was nowhere to see.
    monkeypatch.chdir(tmp_path)
    packaged = (FIXTURES / "002_database_query.yaml").read_text(encoding="utf-8")
    code, out, err = invoke("examples", "002_database_query")
    assert (code, out, err) == (0, packaged, "")
    # the copy is a config like any: edited, it runs as the user's own file
    (tmp_path / "mine.yaml").write_text(out.replace("Q: [[1, 0, 0]]", "Q: [[0, 1, 0]]"))
    code, out, err = invoke("attend", "mine.yaml", "--format", "json")
    assert code == 0, err
    [scores] = [s["value"] for s in json.loads(out)["steps"] if s["path"] == "attn.scores"]
    assert scores == [[2.0, 2.0, 0.0, 4.0]]  # q = [0, 1, 0] against the keys' 2nd column
    code, out, err = invoke("examples", "002_databse_query")
    assert (code, out) == (2, "")
    assert err == (
        "trace-tf: error: 002_databse_query: no such packaged example (did you mean "
        "'002_database_query'?); expected a name trace-tf examples lists, found "
        "'002_databse_query'\n"
    )


def test_version_is_the_installed_distributions() -> None:
    # There was no --version: a user reporting a number had to find it in the JSON.
    import re
    from importlib.metadata import version

    pyproject = (FIXTURES.parent / "pyproject.toml").read_text()
    declared = re.search(r'^version = "(.+)"$', pyproject, re.M)
    assert declared is not None
    code, out, err = invoke("--version")
    assert (code, out, err) == (0, f"trace-tf {version('trace-tf')}\n", "")
    assert version("trace-tf") == declared.group(1)  # (the installed one is this checkout's)
    assert invoke("encode", "--version")[0] == 2  # an option of trace-tf, not of a command
