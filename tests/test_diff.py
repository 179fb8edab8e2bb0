"""`trace-tf diff`: two configs, or one against variations of itself, step by step."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES
from typer.testing import CliRunner

from trace_tf import render
from trace_tf.cli import app
from trace_tf.config import load
from trace_tf.diff import DIFFERS, SAME, SHAPE, compare
from trace_tf.runner import run

runner = CliRunner()
ROPE = str(FIXTURES / "000_rope_relative_position.yaml")


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def diff_json(*args: str) -> dict[str, Any]:
    code, out, err = invoke("diff", *args, "--format", "json")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def test_scale_30_against_sqrt3_differs_from_scaled_on() -> None:
    data = diff_json("hello", "--variant", "document", "--set-b", "model.scale=30")
    assert data["identical"] is False
    assert data["first_difference"] == "encoder.0.self_attn.h0.scaled"
    steps = {s["path"]: s for s in data["steps"]}
    for same in ("encoder.input", "encoder.0.self_attn.h0.q", "encoder.0.self_attn.h0.scores"):
        assert steps[same]["status"] == SAME
    # the document's scores [[68, 105.21], [87.88, 135.5517]] / sqrt(3) vs / 30: the largest
    # change is at [1,1], 135.5517 (1/sqrt 3 - 1/30)
    scaled = steps["encoder.0.self_attn.h0.scaled"]
    assert scaled["status"] == DIFFERS and scaled["at"] == [1, 1]
    assert math.isclose(
        scaled["max_abs_diff"], 135.5517 * (1 / math.sqrt(3) - 1 / 30), abs_tol=1e-9
    )
    assert math.isclose(scaled["a_at"], 135.5517 / math.sqrt(3), abs_tol=1e-9)
    assert math.isclose(scaled["b_at"], 135.5517 / 30, abs_tol=1e-9)
    assert scaled["cells_differing"] == 4 and len(scaled["differing"]) == 4
    assert data["a"]["variant"] == "document" and data["b"]["overrides"] == {"model.scale": 30}


def test_steps_on_one_side_only_are_listed() -> None:
    data = diff_json(ROPE, "--variant-b", "absolute")
    assert data["only_a"] == ["encoder.0.self_attn.h0.q_raw", "encoder.0.self_attn.h0.k_raw"]
    assert data["only_b"] == ["encoder.pe"]
    code, out, _ = invoke("diff", ROPE, "--variant-b", "absolute", "--brief")
    assert code == 0 and "only in A" in out and "only in B" in out


def test_shape_changes_are_reported() -> None:
    data = diff_json(ROPE, "--variant-b", "shifted", "--stage", "scores")
    [scores] = data["steps"]
    assert scores["status"] == SHAPE and scores["shape_a"] == [2, 2] and scores["shape_b"] == [4, 4]


def test_two_files_and_identical_runs() -> None:
    data = diff_json("hello", str(FIXTURES / "hello.yaml"))
    assert data["identical"] is True and all(s["status"] == SAME for s in data["steps"])
    code, out, _ = invoke("diff", "hello", "hello", "--exit-code")
    assert code == 0 and "identical" in out


def test_exit_code_option_and_tolerance() -> None:
    args = ("diff", "hello", "--set-b", "model.norm_eps=1.1e-5", "--brief")
    assert invoke(*args)[0] == 0
    assert invoke(*args, "--exit-code")[0] == 1
    # the eps change moves the outputs by far less than 1e-3
    assert invoke(*args, "--exit-code", "--atol", "1e-3")[0] == 0


@pytest.mark.parametrize("atol", ["nan", "inf", "-inf", "1e400", "-1"])
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_tolerance_that_is_not_a_finite_number_is_refused(atol: str, fmt: str) -> None:
    """--atol nan said "identical" (every |B − A| > nan is false) and exited 0 even with
    --exit-code; --atol inf in JSON was exit 3 (JSON has no infinity)."""
    code, out, err = invoke(
        "diff", "hello", "--set-b", "model.scale=30", "--atol", atol, "--exit-code",
        "--brief", "--format", fmt,
    )  # fmt: skip
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    if atol == "1e400":  # float64 reads it as inf: refused as typed, as a file's 1e400 is
        assert "--atol: number too large" in err and err.rstrip().endswith("found 1e400")
    else:
        assert "--atol must be" in err and f"expected a finite number >= 0, found {atol}" in err


def test_set_applies_to_both_sides() -> None:
    data = diff_json("hello", "--set", "model.scale=30", "--set-b", "model.scale=30")
    assert data["identical"] is True


def test_diff_of_calculator_files() -> None:
    data = diff_json(str(FIXTURES / "002_database_query.yaml"), "--variant-b", "cold")
    statuses = {s["path"]: s["status"] for s in data["steps"]}
    assert statuses == {
        "attn.scores": SAME,
        "attn.scaled": SAME,
        "attn.softmax": DIFFERS,
        "attn.context": DIFFERS,
    }
    context = next(s for s in data["steps"] if s["path"] == "attn.context")
    e = math.e
    assert math.isclose(context["max_abs_diff"], (57 * e + 22) / (3 * e + 1) - 19, abs_tol=1e-9)


def test_table_shows_differing_steps_and_the_matrices() -> None:
    code, out, _ = invoke(
        "diff", "hello", "--set-b", "model.scale=30", "--stage", "encoder.0.self_attn.h0.*"
    )
    assert code == 0
    assert "first difference: encoder.0.self_attn.h0.scaled" in out
    assert "highlighted: 4 of 4 cells differ" in out
    assert "encoder.0.self_attn.h0.q " not in out  # same steps are listed only with --all
    code, out, _ = invoke(
        "diff", "hello", "--set-b", "model.scale=30", "--stage", "encoder.0.self_attn.h0.*", "--all"
    )
    assert code == 0 and "encoder.0.self_attn.h0.q " in out


def test_differing_cells_are_highlighted_and_the_others_not() -> None:
    a = run(load(None))
    b = run(load(None, ["embeddings.world=[2, 3, 4, 6]"]))
    diffs = {d.path: d for d in compare(a, b)}
    d = diffs["encoder.embed"]
    assert d.status == DIFFERS and d.where == (1, 3) and d.max_abs == 1.0
    np.testing.assert_array_equal(d.differing, [[False] * 4, [False, False, False, True]])
    grid = render.matrix_table(d.b.value, highlight=d.differing)  # type: ignore[union-attr]
    # lines: 0 top rule, 1 header, 2 rule, 3 row 0, 4 row 1
    styled = [
        (i, line[:k], seg.text)
        for i, line in enumerate(grid.lines)
        for k, seg in enumerate(line)
        if seg.style == render.HIGHLIGHT
    ]
    assert len(styled) == 1
    line, before, text = styled[0]
    column = "".join(seg.text for seg in before).count("│") - 1  # after the label
    assert (line - 3, column - 1) == (1, 3) and text == "6.0000"


def test_compare_treats_equal_infinities_and_nans_as_equal() -> None:
    path = str(FIXTURES / "004_causal_padding_mask.yaml")
    a = run(load(path))
    diffs = compare(a, run(load(path)))
    assert all(d.status == SAME for d in diffs)
    kept = compare(a, a, keep=lambda p: p == "decoder.mask")
    assert [(d.path, d.status) for d in kept] == [("decoder.mask", SAME)]


def test_diff_needs_something_to_compare() -> None:
    code, _, err = invoke("diff", "hello")
    assert code == 2 and "--set-b" in err
    code, _, err = invoke("diff", "hello", "--variant-b", "nope")
    assert code == 2 and "unknown variant 'nope'" in err
    code, _, err = invoke("diff", "hello", "--set-b", "model.scale=30", "--stage", "sclaed")
    assert code == 2 and "did you mean 'scaled'" in err


@pytest.mark.parametrize("columns", [80, 160])
def test_the_summary_fits_the_terminal_and_keeps_its_numbers(columns: int) -> None:
    from rich.cells import cell_len

    result = runner.invoke(
        app, ["diff", "hello", "--set-b", "model.scale=30"], env={"COLUMNS": str(columns)}
    )
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert max(cell_len(x) for x in lines) <= columns
    data = json.loads(
        runner.invoke(
            app, ["diff", "hello", "--set-b", "model.scale=30", "--format", "json"]
        ).stdout
    )
    start = next(i for i, x in enumerate(lines) if x.startswith("steps, in A's order")) + 2
    differing = [s for s in data["steps"] if s["status"] == DIFFERS]
    for row, s in zip(lines[start:], differing, strict=False):
        cells = row.split()
        assert cells[0] == s["path"] and cells[1] == DIFFERS  # whole: it fits
        assert cells[2] == f"{s['max_abs_diff']:.3g}"
    assert ("A → B there" in result.stdout) == (columns >= 100)


def _decimals(text: str) -> int:
    mantissa = text.split("e")[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def test_values_that_differ_are_never_written_the_same() -> None:
    """float32 against float64: cells 3e-8 apart were written `0.5403 → 0.5403`. Now with
    the digits that tell them apart, each still a faithful rounding of its value."""
    args = ("hello", "--set-b", "model.dtype=float32")
    data = diff_json(*args)
    exact = {s["path"]: (float(s["a_at"]), float(s["b_at"])) for s in data["steps"] if "a_at" in s}
    result = runner.invoke(app, ["diff", *args, "--brief"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if " → " in line]
    pairs = {r[0]: (r[-3], r[-1]) for r in rows if r[0] in exact and r[-2] == "→"}
    assert len(pairs) == len(exact) > 50
    widened = 0
    for path, (a_text, b_text) in pairs.items():
        a, b = exact[path]
        assert a != b and a_text != b_text, (path, a_text, b_text)
        for text, value in ((a_text, a), (b_text, b)):
            if "e" in text:  # scientific: half a unit of the mantissa's last digit
                unit = 10.0 ** (int(text.split("e")[1]) - _decimals(text))
            else:
                unit = 10.0 ** -_decimals(text)
            assert abs(float(text) - value) <= 0.5 * unit * (1 + 1e-9), (path, text, value)
        widened += _decimals(a_text) > 4
        if f"{a:.4f}" != f"{b:.4f}":  # apart at the display precision: written as before
            assert (a_text, b_text) == (f"{a:.4f}", f"{b:.4f}")
    assert widened > 10  # most float32 differences are below the 4th decimal


@pytest.mark.parametrize("a", [1e-10, 0.5403023058681398, 1e20, -7.25])
def test_neighbouring_floats_are_written_apart(a: float) -> None:
    b = float(np.nextafter(a, math.inf))  # the next float64: the closest two values can be
    ta, tb = render._apart(a, b, 4)
    assert ta != tb
    # each text is a rounding of its own value, closer to it than to the other
    assert abs(float(ta) - a) < abs(float(ta) - b) and abs(float(tb) - b) < abs(float(tb) - a)


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--set-b", "model.d_model=8"],
            "embeddings.hello: wrong shape (model.d_model set by --set-b) (in run B); expected",
        ),
        (["--set-b", "model.scale=-1"], "must be positive (set by --set-b model.scale) (in run B)"),
        (["--set", "model.scale=-1"], "must be positive (set by --set model.scale) (in run A)"),
    ],
)
def test_a_config_bad_for_one_run_says_which(args: list[str], says: str) -> None:
    result = runner.invoke(app, ["diff", "hello", *args, "--set-b", "model.seed=1"])
    assert result.exit_code == 2 and says in result.stderr and result.stderr.count("\n") == 1


def test_a_warning_says_which_run_it_is_from() -> None:
    # A and B are one file here: the overflow is B's alone, and says so.
    args = ["diff", "hello", "--set-b", "embeddings.hello=[1e308, 1e308, 1e308, 1e308]"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0
    assert result.stderr.endswith(
        "overflow: an infinity first appears in step encoder.0.self_attn.h0.q (in run B)\n"
    )
    assert result.stderr.count("\n") == 1
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    assert data["warnings"] == [
        "overflow: an infinity first appears in step encoder.0.self_attn.h0.q (in run B)"
    ]


def test_a_one_step_run_is_counted_in_the_singular(tmp_path: Any) -> None:
    """A calculator's file has one step: 'the 1 step agrees', 'of 1 step, 1 differs'."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("pe: {length: 3, d_model: 4}\n")
    b.write_text("pe: {length: 3, d_model: 4, base: 100}\n")  # column 2: pos / 100, not / 10000
    code, out, _ = invoke("diff", str(a), str(a))
    assert code == 0 and "identical: the 1 step agrees within atol" in out
    code, out, _ = invoke("diff", str(a), str(b))
    assert code == 0 and "first difference: pe (differs); of 1 step 1 differs, 0 the same" in out


def test_json_writes_a_non_finite_override_as_spec_section_5_does() -> None:
    # `--set-b title=.nan` is accepted (a title is text); the override's value, a float NaN,
    # reached json.dumps(allow_nan=False): internal error (exit 3).
    result = runner.invoke(app, ["diff", "hello", "--set-b", "title=.nan", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["b"]["overrides"] == {"title": "nan"} and data["a"]["overrides"] == {}
    assert data["identical"] is True


def test_json_value_rewrites_non_finite_numbers_inside_mappings() -> None:
    value = {"a": [1.0, math.inf], "b": {"c": -math.inf, "d": math.nan}, "e": "x"}
    assert render.json_value(value) == {"a": [1.0, "inf"], "b": {"c": "-inf", "d": "nan"}, "e": "x"}


# ---------------------------------------------------------------------------
# the weights that differ
# ---------------------------------------------------------------------------

ENCODER = """\
model: {d_model: 2, n_heads: 1, d_ff: 3, encoder_layers: 1, decoder_layers: 0}
vocab: [a, b, c]
source: [a, b]
embeddings:
  a: [1, 2]
weights:
  encoder:
    - ffn:
        W_1: [[1, 2, 3], [4, 5, W16]]
"""
DECODER = """\
model: {d_model: 2, n_heads: 1, d_ff: 3, encoder_layers: 0, decoder_layers: 1}
vocab: [a, b, c]
target: [a, b]
"""


def drawn(seed: int, path: str, shape: tuple[int, ...]) -> np.ndarray:
    """SPEC section 2's rule, written out here: each drawn array from its own generator."""
    import zlib

    return np.random.default_rng([seed, zlib.crc32(path.encode())]).standard_normal(shape)


def weights_of(*args: str) -> dict[str, dict[str, Any]]:
    """`diff --format json`'s weights, by key path (in their order)."""
    return {w["path"]: w for w in diff_json(*args)["weights"]}


def table_of(*args: str, columns: int = 200) -> str:
    result = runner.invoke(app, ["diff", *args, "--brief"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_weight_entry_that_differs_is_listed_with_its_cell_and_sources(tmp_yaml: Any) -> None:
    a = tmp_yaml(ENCODER.replace("W16", "6"), "a.yaml")
    b = tmp_yaml(ENCODER.replace("W16", "6.5"), "b.yaml")
    weights = weights_of(a, b)
    # 3 embeddings; W_q, W_k, W_v, W_o, γ, β of the attention; W_1, W_2, γ, β of the
    # FFN; the output W (an encoder-only model has logits too)
    assert len(weights) == 3 + 6 + 4 + 1
    differing = {k: w for k, w in weights.items() if w["status"] != SAME}
    w1 = differing.pop("weights.encoder.0.ffn.W_1")
    assert differing == {}
    assert w1["status"] == DIFFERS and w1["shape_a"] == w1["shape_b"] == [2, 3]
    assert (w1["at"], w1["a_at"], w1["b_at"]) == ([1, 2], 6.0, 6.5)
    assert w1["max_abs_diff"] == 0.5 and (w1["cells_differing"], w1["cells"]) == (1, 6)
    # typed in each file, on line 9
    for side, file in (("source_a", a), ("source_b", b)):
        src = w1[side]
        assert (src["kind"], src["file"], src["line"]) == ("file", file, 9)
    same = weights["embeddings.a"]
    assert same["max_abs_diff"] == 0.0 and "at" not in same and same["cells"] == 2
    # the table: that one weight, before the steps, with --brief too
    out = table_of(a, b)
    assert "weights that differ: 1 of 14 read by A or B (atol 1e-12)" in out
    row = next(x for x in out.splitlines() if x.startswith("weights.encoder.0.ffn.W_1"))
    assert row.split()[:11] == [
        "weights.encoder.0.ffn.W_1", "2", "×", "3", "1/6", "0.5", "[1,2]",
        "6.0000", "→", "6.5000", a,
    ]  # fmt: skip
    assert row.rstrip().endswith("line 9 →") and f"{b}".rsplit("/", 1)[-1] in out
    assert out.index("weights that differ") < out.index("steps, in A's order")
    # --atol as for steps: the cell is 0.5 apart
    assert "no weight differs: all 14 weights agree within atol 0.5" in table_of(
        a, b, "--atol", "0.5"
    )
    assert weights_of(a, b, "--atol", "0.4")["weights.encoder.0.ffn.W_1"]["status"] == DIFFERS


def test_no_weight_differing_is_one_line(tmp_yaml: Any) -> None:
    a = tmp_yaml(ENCODER.replace("W16", "6"))
    out = table_of(a, "--set-b", "model.scale=30")
    assert "no weight differs: all 14 weights agree within atol 1e-12" in out
    assert "weights that differ" not in out
    assert all(w["status"] == SAME for w in weights_of(a, "--set-b", "model.scale=30").values())


def test_a_drawn_seed_changes_every_drawn_weight_and_not_the_given(tmp_yaml: Any) -> None:
    a = tmp_yaml(ENCODER.replace("W16", "6"))
    weights = weights_of(a, "--set-b", "model.seed=1")
    differing = [k for k, w in weights.items() if w["status"] != SAME]
    assert differing == [
        "embeddings.b",
        "embeddings.c",
        *(f"weights.encoder.0.self_attn.{w}" for w in ("heads.0.W_q", "heads.0.W_k")),
        *(f"weights.encoder.0.self_attn.{w}" for w in ("heads.0.W_v", "W_o")),
        "weights.encoder.0.ffn.W_2",
        "weights.output.W",
    ]
    for key, draw, shape in [
        ("embeddings.c", "embeddings.c", (2,)),
        ("weights.encoder.0.ffn.W_2", "encoder.0.ffn.W_2", (3, 2)),
        ("weights.encoder.0.self_attn.W_o", "encoder.0.self_attn.W_o", (2, 2)),
    ]:
        old, new = drawn(0, draw, shape), drawn(1, draw, shape)
        w = weights[key]
        at = np.unravel_index(int(np.argmax(np.abs(new - old))), shape)
        assert w["at"] == list(at) and w["max_abs_diff"] == np.abs(new - old).max()
        assert (w["a_at"], w["b_at"]) == (old[at], new[at])
        assert w["cells_differing"] == w["cells"] == old.size
        assert (w["source_a"]["seed"], w["source_b"]["seed"]) == (0, 1)
        assert w["source_a"]["text"] == "drawn: seed 0, N(0, 1²)"
    out = table_of(a, "--set-b", "model.seed=1")
    assert "drawn: seed 0, N(0, 1²) → drawn: seed 1, N(0, 1²)" in out


def test_tied_embeddings_replace_the_output_weight(tmp_yaml: Any) -> None:
    a = tmp_yaml(DECODER)
    weights = weights_of(a, "--set-b", "model.tie_embeddings=true")
    differing = {k: w for k, w in weights.items() if w["status"] != SAME}
    assert list(differing) == ["weights.output.W", "embeddings (tied, transposed)"]
    only_a, only_b = differing.values()
    assert (only_a["status"], only_a["shape_a"], only_a["shape_b"]) == ("only in A", [2, 3], None)
    assert only_a["source_a"]["kind"] == "drawn" and only_a["source_b"] is None
    assert (only_b["status"], only_b["shape_a"], only_b["shape_b"]) == ("only in B", None, [2, 3])
    assert only_b["source_a"] is None and only_b["source_b"]["kind"] == "tied"
    assert "max_abs_diff" in only_b and only_b["max_abs_diff"] is None
    out = table_of(a, "--set-b", "model.tie_embeddings=true")
    assert "weights that differ: 2 of 15 read by A or B" in out
    assert "only in A" in out and "only in B" in out and "tied: the embeddings transposed" in out


def test_a_wider_ffn_changes_the_shapes_of_its_weights(tmp_yaml: Any) -> None:
    a = tmp_yaml(DECODER)
    weights = weights_of(a, "--set-b", "model.d_ff=5")
    differing = {k: w for k, w in weights.items() if w["status"] != SAME}
    assert {k: (w["status"], w["shape_a"], w["shape_b"]) for k, w in differing.items()} == {
        "weights.decoder.0.ffn.W_1": (SHAPE, [2, 3], [2, 5]),
        "weights.decoder.0.ffn.W_2": (SHAPE, [3, 2], [5, 2]),
    }
    assert all(w["max_abs_diff"] is None and "cells" not in w for w in differing.values())
    out = table_of(a, "--set-b", "model.d_ff=5")
    row = next(x for x in out.splitlines() if x.startswith("weights.decoder.0.ffn.W_2"))
    assert row.split()[1:9] == ["3", "×", "2", "→", "5", "×", "2", "shape"]


def test_a_vocabulary_change_lists_the_embeddings_of_each_side(tmp_yaml: Any) -> None:
    a = tmp_yaml(DECODER)
    weights = weights_of(a, "--set-b", "vocab=[a, b, d, e]")
    differing = {k: w["status"] for k, w in weights.items() if w["status"] != SAME}
    # the output weight is d_model x vocab: 2 x 3, then 2 x 4
    assert differing == {
        "embeddings.c": "only in A",
        "weights.output.W": SHAPE,
        "embeddings.d": "only in B",
        "embeddings.e": "only in B",
    }
    assert weights["embeddings.d"]["source_b"]["draw_path"] == "embeddings.d"
    assert (weights["weights.output.W"]["shape_a"], weights["weights.output.W"]["shape_b"]) == (
        [2, 3],
        [2, 4],
    )


def test_a_long_vocabulary_is_elided_unless_full(tmp_yaml: Any) -> None:
    def vocab(prefix: str, n: int) -> str:
        tokens = [f"{prefix}{i}" for i in range(n)]
        return DECODER.replace("[a, b, c]", f"[{', '.join(tokens)}]").replace(
            "target: [a, b]", f"target: [{tokens[0]}]"
        )

    a, b = tmp_yaml(vocab("w", 20), "a.yaml"), tmp_yaml(vocab("x", 20), "b.yaml")
    out = table_of(a, "--set-b", "model.seed=1")
    shown = [x.split()[0] for x in out.splitlines() if x.startswith("embeddings.")]
    assert shown == [f"embeddings.w{i}" for i in (0, 1, 2, 3, 16, 17, 18, 19)]
    assert "… 12 more embeddings (--full shows them)" in out
    assert "weights.decoder.0.ffn.W_1" in out  # the layers' weights are all shown
    full = table_of(a, "--set-b", "model.seed=1", "--full")
    assert [x.split()[0] for x in full.splitlines() if x.startswith("embeddings.")] == [
        f"embeddings.w{i}" for i in range(20)
    ]
    # A's own embeddings first, B's own last (after the layers', drawn anew): each run
    # left out counted on its own
    out = table_of(a, b, "--set-b", "model.seed=1")
    shown = [x.split()[0] for x in out.splitlines() if x.startswith("embeddings.")]
    assert shown == [f"embeddings.w{i}" for i in range(4)] + [
        f"embeddings.x{i}" for i in range(16, 20)
    ]
    assert out.count("… 16 more embeddings (--full shows them)") == 2
    assert len(weights_of(a, b)) == 20 + 20 + 11  # JSON lists every one


def test_a_single_operation_file_has_no_weights() -> None:
    data = diff_json(str(FIXTURES / "002_database_query.yaml"), "--variant-b", "cold")
    assert data["weights"] == []
    out = table_of(str(FIXTURES / "002_database_query.yaml"), "--variant-b", "cold")
    assert "weights that differ" not in out and "no weight differs" not in out


def test_weights_are_compared_in_batches_as_one_at_a_time(
    tmp_yaml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Weights of one shape are compared stacked, a batch at a time: the same results,
    in the same order, whatever the size of a batch."""
    from trace_tf import diff

    tokens = ", ".join(f"w{i}" for i in range(9))
    a = tmp_yaml(DECODER.replace("[a, b, c]", f"[{tokens}]").replace("[a, b]", "[w0]"))
    args = (a, "--set-b", "embeddings.w4=[0.5, 0.25]", "--set-b", "model.d_ff=4")
    whole = weights_of(*args)
    for cells in (1, 5, 8):
        monkeypatch.setattr(diff, "_BATCH_CELLS", cells)
        assert weights_of(*args) == whole
    w4 = whole["embeddings.w4"]
    old = drawn(0, "embeddings.w4", (2,))
    new = np.array([0.5, 0.25])
    at = int(np.argmax(np.abs(new - old)))
    assert (w4["at"], w4["a_at"], w4["b_at"]) == ([at], old[at], new[at])
    assert [k for k, w in whole.items() if w["status"] == DIFFERS] == ["embeddings.w4"]


@pytest.mark.parametrize("columns", [80, 120])
def test_the_weights_table_fits_the_terminal(columns: int) -> None:
    from rich.cells import cell_len

    out = table_of(
        "hello",
        "--set-b",
        "weights.encoder.0.ffn.W_1.0.1=5",
        "--set-b",
        "model.tie_embeddings=true",
        columns=columns,
    )
    assert max(cell_len(x) for x in out.splitlines()) <= columns
    assert "weights that differ: 3 of 47" in out


def test_the_weights_table_fits_where_its_words_do(tmp_yaml: Any) -> None:
    """At 60 columns each column can keep its widest word ("transposed)" of the tied
    weight's path, "tie_embeddings" of its source) and the table still fit: 11 + 5 + 9
    + 9 + 2 + 14 cells and 2 between each of the 6 columns is 60. It was printed 63
    wide: rich narrows the wrapping columns to one common width, that of the widest
    word of either (14)."""
    from rich.cells import cell_len

    a = tmp_yaml(ENCODER.replace("W16", "6").replace("d_model: 2", "d_model: 4")
                 .replace("[1, 2]", "[1, 2, 3, 4]")
                 .replace("[[1, 2, 3], [4, 5, 6]]", "[[1, 2, 3], [4, 5, 6], [1, 2, 3], [4, 5, 6]]"))  # fmt: skip
    out = table_of(a, "--set-b", "model.tie_embeddings=true", columns=60)
    lines = out.splitlines()
    assert max(cell_len(x) for x in lines) <= 60, out
    # nothing cut inside a word: each word of the rows is whole on one line
    words = {w for x in lines for w in x.split()}
    assert {"transposed)", "tie_embeddings", "only", "×"} <= words
    assert sum("only in A" in x for x in lines) == 1 and sum("only in B" in x for x in lines) == 1


def test_weights_compared_keep_no_b_minus_a() -> None:
    """B − A is kept for steps (--delta shows it), not for weights: a model's weights may
    hold millions of cells, and nothing shows their B − A."""
    from trace_tf.config import Config
    from trace_tf.diff import compare_weights

    a, b = load(None), load(None, ["model.seed=1"])
    assert isinstance(a, Config) and isinstance(b, Config)
    differing = [d for d in compare_weights(a, b) if d.status == DIFFERS]
    assert differing and all(d.cells.delta is None for d in differing)
    assert all(d.cells.differing is not None for d in differing)
    steps = [d for d in compare(run(a), run(b)) if d.status == DIFFERS]
    assert steps and all(d.delta is not None for d in steps)


def test_a_variant_that_changes_a_weight_names_it_as_the_source() -> None:
    path = str(FIXTURES / "000_relative_bias.yaml")
    weights = weights_of(path, "--variant-b", "no_bias")
    [(key, w)] = [(k, w) for k, w in weights.items() if w["status"] != SAME]
    # rel_bias [-1, 0.5, 0, 1, 2] (line 29) against the variant's zeros (line 31)
    old, new = np.array([-1, 0.5, 0, 1, 2]), np.zeros(5)
    assert key == "weights.encoder.0.self_attn.heads.0.rel_bias"
    assert (w["cells_differing"], w["cells"]) == (int((old != new).sum()), 5) == (4, 5)
    assert (w["max_abs_diff"], w["at"], w["a_at"], w["b_at"]) == (2.0, [4], 2.0, 0.0)
    assert (w["source_a"]["kind"], w["source_a"]["line"]) == ("file", 29)
    assert (w["source_b"]["kind"], w["source_b"]["line"]) == ("variant", 31)
    assert "line 29 → variant 'no_bias'," in table_of(path, "--variant-b", "no_bias")


@pytest.mark.parametrize(
    ("args", "first"),
    [
        # B pads 'world': B's run computes encoder.mask right after encoder.input, before
        # any step the two share differs (softmax is the first of those, in layer 0)
        (("--set-b", "tokens.pad=world"), "encoder.mask"),
        # A with RoPE has no encoder.pe; B, sinusoidal, computes it where A computes
        # encoder.input: the step only one side computes is where they part, as the other
        # way round (A sinusoidal, B RoPE: encoder.pe, only in A)
        (
            ("--set", "model.positional=rope", "--set-b", "model.positional=sinusoidal"),
            "encoder.pe",
        ),
        (("--set-b", "model.positional=rope"), "encoder.pe"),
        # B's bilinear score adds q_b after v, where A computes scores
        (("--set-b", "model.score=bilinear"), "encoder.0.self_attn.h0.q_b"),
        (
            ("--set", "model.score=bilinear", "--set-b", "model.score=scaled_dot"),
            "encoder.0.self_attn.h0.q_b",
        ),
        # no step only in B: the earliest in A's order, as before
        (("--set-b", "model.scale=30"), "encoder.0.self_attn.h0.scaled"),
        (("--set-b", "model.norm_position=pre"), "encoder.0.self_attn.h0.q"),
    ],
)
def test_first_difference_is_where_the_runs_part_also_at_a_step_only_b_computes(
    args: tuple[str, ...], first: str
) -> None:
    assert diff_json("hello", *args)["first_difference"] == first


def test_the_table_options_leave_the_json_as_it_is() -> None:
    # README (diff): --brief, --all, --delta, --full and --precision shape the tables only
    args = ["diff", "--set-b", "model.scale=30", "--format", "json"]
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0 and json.loads(plain.stdout)["steps"], plain.stderr
    for extra in (["--brief"], ["--all"], ["--delta"], ["--full"], ["--precision", "2"]):
        shaped = runner.invoke(app, [*args, *extra])
        assert shaped.exit_code == 0 and shaped.stdout == plain.stdout, extra
