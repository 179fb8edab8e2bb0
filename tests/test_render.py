"""Matrix grids (render.Grid): laid out by trace-tf, measured as they are drawn."""

from __future__ import annotations

import io
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.panel import Panel

from trace_tf import render

CASES = [
    (np.arange(12.0).reshape(3, 4), None, None),
    (np.arange(600.0).reshape(20, 30), None, None),  # elided both ways
    (np.array(2.5), None, None),
    (np.arange(5.0), None, None),
    (np.ones((2, 3)), ["你好", "a"], ["é", "𝑥", "wörld"]),  # wide and accented labels
    (np.array([[-np.inf, np.nan], [1e-9, 3e12]]), ["a", "b"], None),
]


@pytest.mark.parametrize("value, rows, cols", CASES)
def test_a_grid_is_as_wide_as_each_of_its_lines(
    value: np.ndarray, rows: list[str] | None, cols: list[str] | None
) -> None:
    grid = render.matrix_table(value, rows=rows, cols=cols)
    assert {sum(cell_len(s.text) for s in line) for line in grid.lines} == {grid.width}


@pytest.mark.parametrize("value, rows, cols", CASES)
def test_a_grid_in_a_panel_fits_the_panel(
    value: np.ndarray, rows: list[str] | None, cols: list[str] | None
) -> None:
    grid = render.matrix_table(value, rows=rows, cols=cols)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(Panel(grid, expand=False))
    lines = out.getvalue().splitlines()
    # the panel is measured from the grid: its border just encloses every line
    assert {cell_len(line) for line in lines} == {grid.width + 4}


def _row(grid: render.Grid, k: int) -> list[str]:
    """The cells of body row k, label first."""
    text = "".join(s.text for s in grid.lines[3 + k])
    return [c.strip() for c in text.strip("│").split("│")]


@pytest.mark.parametrize("width", [200, 120, 90, 70, 60])
def test_columns_are_elided_until_the_grid_fits_the_width(width: int) -> None:
    value = np.arange(40.0).reshape(2, 20) / 7  # 0/7 ... 39/7
    view = render.View(precision=8, max_cols=10, col_edge=4, width=width)
    grid = render.matrix_table(value, rows=["incomprehensibilities", "a"], view=view)
    assert grid.width <= width
    first, last = _row(grid, 0), _row(grid, 1)
    assert first[0] == "incomprehensibilities" and last[0] == "a"
    # always the first and the last columns, around an ellipsis
    assert first[1] == "0.00000000" and first[-1] == f"{19 / 7:.8f}" and "…" in first
    assert last[-1] == f"{39 / 7:.8f}"
    shown = len(first) - 2  # numbers and the ellipsis
    wider = render.matrix_table(
        value, rows=["incomprehensibilities", "a"], view=replace(view, width=width + 14)
    )
    assert len(_row(wider, 0)) - 2 >= shown  # more room never shows fewer columns


@pytest.mark.parametrize("seed", range(40))
def test_the_most_columns_that_fit_are_shown(seed: int) -> None:
    """As many columns from each edge as fit the width, found by trying every count
    (matrix_table measures each count without laying its grid out)."""
    rng = np.random.default_rng(seed)
    value = rng.normal(size=(3, 60)) * 10.0 ** rng.integers(-2, 6, size=60)
    view = render.View(
        precision=int(rng.integers(1, 9)),
        max_cols=80,
        col_edge=39,
        width=int(rng.integers(60, 400)),
    )
    grid = render.matrix_table(value, view=view)
    fits = [
        e
        for e in range(1, 40)
        if render._layout(
            value, 2, [0, 1, 2], render._edges(60, e), None, None, False, None, view
        ).width
        <= view.width
    ]
    assert len(_row(grid, 0)) - 2 == 2 * max(fits)  # the label and "…" apart


def _by_laying_out_each(
    value: np.ndarray,
    *,
    rows: list[str] | None,
    cols: list[str] | None,
    heatmap: bool,
    view: render.View,
    highlight: np.ndarray | None,
) -> render.Grid:
    """matrix_table the straightforward way, the oracle of its measuring: lay the grid
    out with the view's columns, then with one fewer from each edge, until it fits;
    where none fits, again with tokens as labels a cell shorter each time."""
    m = np.atleast_2d(value) if value.ndim < 2 else value
    marked = None if highlight is None else highlight.reshape(m.shape)
    row_idx = render._keep(m.shape[0], view.max_rows, view.row_edge, view.full)
    first = render._keep(m.shape[1], view.max_cols, view.col_edge, view.full)
    shown = len(first) - (None in first)
    choices = [first] + [render._edges(m.shape[1], e) for e in range((shown - 1) // 2, 0, -1)]
    for cells in range(render.LABEL_CELLS, render.LABEL_LEAST - 1, -1):
        for col_idx in choices:
            grid = render._layout(
                m, value.ndim, row_idx, col_idx, rows, cols, heatmap, marked, view, None, cells
            )
            if view.full or view.width is None or grid.width <= view.width:
                return grid
    return grid


_TOKENS = ["a", "the", "", " ", "a\nb", "é", "你好", "你" * 40, "start" + "x" * 290 + "end", "w999"]
_ODD = [0.0, -0.0, np.nan, np.inf, -np.inf, 0.5, -0.5, 5e-7, 1e8, 99999999.99995, 1e-300, 9.99995]


def _random_matrix(
    rng: np.random.Generator,
) -> tuple[np.ndarray, list[str] | None, list[str] | None]:
    """A 0-, 1- or 2-D array whose numbers span many magnitudes (each column its own, or
    each number), with zeros, NaN, infinities and numbers at the edge of a notation
    sprinkled in; and tokens for its rows and columns, or none."""
    ndim = int(rng.choice([0, 1, 2, 2, 2]))
    shape = tuple(int(rng.choice([0, 1, 2, 3, 7, 13, 30, 61, 150])) for _ in range(ndim))
    value = np.asarray(rng.normal(size=shape))
    if rng.random() < 0.5:  # each number its own magnitude
        value *= 10.0 ** rng.integers(-12, 13, size=shape)
    elif ndim == 2:  # each column its own, or a few columns far from the rest
        far = 10.0 ** rng.choice([-12, -9, -5, 8, 9, 12], size=shape[1])
        value *= np.where(rng.random(size=shape[1]) < 0.1, far, 10.0 ** rng.integers(-3, 5))
    if value.size and rng.random() < 0.7:
        odd = rng.random(size=shape) < rng.choice([0.01, 0.1, 0.5])
        value[odd] = rng.choice(_ODD, size=int(odd.sum()))
    if rng.random() < 0.2:
        value = value.astype(np.float32)
    labels: list[list[str] | None] = [None, None]
    if ndim == 2 and rng.random() < 0.6:
        labels[0] = [str(rng.choice(_TOKENS)) for _ in range(shape[0])]
    if ndim >= 1 and rng.random() < 0.6:
        labels[1] = [str(rng.choice(_TOKENS)) for _ in range(shape[-1])]
    return value, labels[0], labels[1]


@pytest.mark.parametrize("seed", range(500))
def test_the_measured_columns_give_the_grid_laying_out_each_count_gives(seed: int) -> None:
    """matrix_table measures each count of columns instead of laying each out: the
    same grid, segment for segment and style for style, for any matrix and view."""
    rng = np.random.default_rng(seed)
    value, rows, cols = _random_matrix(rng)
    max_rows, max_cols = int(rng.integers(1, 16)), int(rng.integers(1, 120))
    view = render.View(
        precision=int(rng.integers(0, 9)),
        max_rows=max_rows,
        row_edge=int(rng.integers(1, max_rows // 2 + 2)),
        max_cols=max_cols,
        col_edge=int(rng.integers(1, max_cols // 2 + 2)),
        full=bool(rng.random() < 0.05),
        width=None if rng.random() < 0.05 else int(40 * 25 ** rng.random()),  # 40 to 1000
    )
    heatmap = bool(rng.random() < 0.3)
    highlight = rng.random(size=value.shape) < 0.2 if rng.random() < 0.3 else None
    args = dict(rows=rows, cols=cols, heatmap=heatmap, view=view, highlight=highlight)
    got, want = render.matrix_table(value, **args), _by_laying_out_each(value, **args)
    assert (got.width, got.lines) == (want.width, want.lines)


def test_a_table_is_laid_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a wide terminal a large model's tables were laid out again and again, a
    # column fewer a side each time, until one fitted: `encode` of d_model 512 at
    # 1000 columns laid its 418 tables out 2638 times; this one, 6 times.
    laid_out, grid = [], render._grid
    monkeypatch.setattr(render, "_grid", lambda *a: laid_out.append(a) or grid(*a))
    value = np.random.default_rng(0).normal(size=(128, 512))
    view = render.View(max_cols=110, col_edge=54, width=1000)  # as `COLUMNS=1000` has it
    render.matrix_table(value, view=view)
    assert len(laid_out) == 1


def test_fewer_columns_can_change_the_notation_and_so_every_width() -> None:
    # One column of 1e9 puts the whole grid in scientific notation, 10 cells a number;
    # once it is dropped the numbers are 6 cells ("1.0000"), and more of them fit.
    value = np.ones((1, 60))
    value[0, 30] = 1e9
    view = render.View(max_cols=80, width=200)
    cells = _row(render.matrix_table(value, view=view), 0)[1:]
    # label "0" and "…" (1 + 3 cells each), e numbers a side (6 + 3 each), the last "│":
    # 4 + 18 e + 4 + 1 <= 200 at e = 10
    assert cells == ["1.0000"] * 10 + ["…"] + ["1.0000"] * 10


def test_when_nothing_fits_the_narrowest_grid_is_given() -> None:
    value = np.arange(40.0).reshape(2, 20)
    view = render.View(precision=8, width=20)
    grid = render.matrix_table(value, rows=["incomprehensibilities", "a"], view=view)
    # and its tokens as labels at their shortest (LABEL_LEAST cells), start and end kept
    assert _row(grid, 0) == ["in…es", "0.00000000", "…", "19.00000000"]


def test_full_ignores_the_width() -> None:
    value = np.arange(40.0).reshape(2, 20)
    grid = render.matrix_table(value, view=render.View(full=True, width=30))
    assert len(_row(grid, 0)) == 21


def test_control_characters_in_labels_are_escaped() -> None:
    # a newline token, a tab: each label stays on its row, written as an escape
    grid = render.matrix_table(np.eye(2), rows=["a\nb", "c\td"], cols=["\x00", "é"])
    assert [_row(grid, k)[0] for k in (0, 1)] == ["'a\\nb'", "'c\\td'"]
    header = "".join(s.text for s in grid.lines[1])
    assert "\\x00" in header and "é" in header
    assert all("\n" not in s.text and "\t" not in s.text for line in grid.lines for s in line)
    assert render.printable("你好 world") == "你好 world"


def test_an_empty_or_all_space_token_is_quoted() -> None:
    grid = render.matrix_table(np.eye(3), rows=["", " ", "a"], cols=["", "  ", "b"])
    assert [_row(grid, k)[0] for k in (0, 1, 2)] == ["''", "' '", "a"]  # (cells stripped)
    assert _header(grid)[1:] == ["''", "'  '", "b"]


@pytest.mark.parametrize(
    ("token", "shown"),
    [
        ("''", "\"''\""),  # the two-apostrophe token, not the empty one
        ("'", '"\'"'),
        ('"', "'\"'"),
        ("'a'", "\"'a'\""),
        ("…", "'…'"),  # not the mark of an elided axis
        (" a ", "' a '"),  # its spaces, lost in a cell's padding, kept in quotes
        ("a\nb", "'a\\nb'"),  # the newline token ...
        ("a\\nb", "'a\\\\nb'"),  # ... and the four characters a, backslash, n, b
        ("it's", "it's"),  # a quote inside: nothing to confuse, as it is
        ("a…b", "a…b"),
        ("New York", "New York"),
        ("你好", "你好"),
    ],
)
def test_a_token_that_could_be_misread_is_quoted_as_python_writes_it(
    token: str, shown: str
) -> None:
    assert render.shown_token(token) == shown
    grid = render.matrix_table(np.eye(2), rows=[token, "x"], cols=[token, "x"])
    assert _row(grid, 0)[0] == shown and _header(grid)[1] == shown


def test_every_shown_token_tells_the_tokens_apart() -> None:
    tokens = ["", "''", " ", "' '", "…", "'…'", "a\nb", "a\\nb", "a", " a", "a ", '"', "'"]
    assert len({render.shown_token(t) for t in tokens}) == len(tokens)
    # and the elision mark of an axis is never taken for a token
    words = ["…", "a"] * 10
    grid = render.matrix_table(np.zeros((20, 2)), rows=words, view=render.View(width=200))
    labels = [_row(grid, k)[0] for k in range(len(grid.lines) - 4)]
    assert labels.count("…") == 1 and "[0] '…'" in labels


def test_a_long_token_keeps_both_its_quotes_when_shortened() -> None:
    shown = render.shown_token("'" + "x" * 300)
    assert shown.startswith("\"'x") and shown.endswith('x"') and "…" in shown
    assert cell_len(shown) == render.LABEL_CELLS


def _header(grid: render.Grid) -> list[str]:
    text = "".join(s.text for s in grid.lines[1])
    return [c.strip() for c in text.strip("┃").split("┃")]


def test_an_elided_axis_labels_each_token_with_its_position() -> None:
    # 30 tokens of 3 repeating words: after the ellipsis, "the" alone would not say which
    words = ["the", "cat", "sat"] * 10
    value = np.arange(900.0).reshape(30, 30)
    grid = render.matrix_table(value, rows=words, cols=words, view=render.View(width=200))
    assert _header(grid)[1:4] == ["[0] the", "[1] cat", "[2] sat"]
    assert _header(grid)[-2:] == ["[28] cat", "[29] sat"]
    labels = [_row(grid, k)[0] for k in range(len(grid.lines) - 4)]  # less 4 borders
    assert labels[:2] == ["[0] the", "[1] cat"] and labels[-1] == "[29] sat"
    assert _row(grid, len(labels) - 1)[-1] == f"{899.0:.4f}"  # row 29, column 29
    # shown in full, the order says the position: the token alone
    small = render.matrix_table(value[:3, :3], rows=words[:3], cols=words[:3])
    assert _header(small)[1:] == ["the", "cat", "sat"]
    assert [_row(small, k)[0] for k in range(3)] == ["the", "cat", "sat"]


def test_a_long_token_is_shortened_in_its_middle_so_the_numbers_show() -> None:
    long = "start" + "x" * 290 + "end"
    wide = "你" * 40  # two cells a character
    grid = render.matrix_table(
        np.ones((3, 2)), rows=[long, wide, "a"], cols=[long, "b"], view=render.View(width=120)
    )
    assert grid.width <= 120
    labels = [_row(grid, k)[0] for k in range(3)]
    assert labels[0].startswith("start") and labels[0].endswith("end") and "…" in labels[0]
    assert cell_len(labels[0]) == render.LABEL_CELLS  # 31 letters and "…"
    assert render.LABEL_CELLS - 1 <= cell_len(labels[1]) <= render.LABEL_CELLS  # 2-cell letters
    assert labels[1].startswith("你") and labels[2] == "a"
    assert _header(grid)[1].startswith("start") and _row(grid, 0)[1:] == ["1.0000", "1.0000"]
    assert render.shortened("x" * render.LABEL_CELLS) == "x" * render.LABEL_CELLS  # fits: kept


def test_a_name_cut_to_fit_keeps_its_end_and_where_there_is_room_its_start() -> None:
    # Names give way in check's table (a config's file name, a variant); step paths
    # are never cut, they wrap after their dots.
    from trace_tf.render import _cut

    name = "enc_dec.post_norm.yaml"  # 22 characters
    assert _cut(name, 22) == name
    assert _cut(name, 18) == "enc…post_norm.yaml"  # its last two parts whole
    assert _cut(name, 15) == "enc_dec.po…yaml"  # its last part whole
    assert _cut(name, 5) == "…yaml"  # no room for any start: its end
    assert _cut("document_scale30", 10) == "…t_scale30"  # no dot: its end


def test_a_name_cut_twice_is_cut_from_its_whole_text_once() -> None:
    # A column that gives way is narrowed twice (to its least, then to _LEAST_TEXT);
    # cutting the already cut text again read "…oder_sel…yaml" (its dot was gone).
    name = "encoder_self_attention.yaml"  # 27 characters
    rows = [[name, "1"]]
    render._fitted(["config", "n"], rows, 19, [("config", 16)])  # cuts `rows` in place
    # 19 cells: the config column gives 11 (to 16), then 2 more (to 14): 14 + 2 + 1 + 2
    assert rows[0][0] == "encoder_s…yaml"


def test_a_cut_text_fits_its_cells_when_its_letters_are_wide() -> None:
    # A config name in CJK takes two cells a letter: cut by letters, it overran its
    # column, and rich cropped what was left of its end ("注意力机 …").
    name = "注意力机制配置文件测试.yaml"
    for cells in (6, 9, 10, 11, 14):
        cut = render._cut(name, cells)
        assert cell_len(cut) <= cells and cut.endswith("yaml"), (cells, cut)
    assert render._cut(name, 10) == "注意…yaml"  # 4 + 1 + 4 cells: the end whole
    assert render._cut(name, 5) == "…yaml"  # no room for any start: its end
    assert render._cut("你好世界", 5) == "…世界"  # not a path: its end, whole letters


@pytest.mark.parametrize(
    "precision, small",
    [(0, 0.5), (0, -0.5), (0, 0.25), (6, 5e-7), (7, 5e-8), (12, 5e-13), (16, 5e-17)],
)
def test_a_nonzero_number_is_never_shown_as_zero(precision: int, small: float) -> None:
    # Fixed notation rounds `small` to zero (0.5 to "0" at --precision 0: a softmax of
    # two equal scores read "0 0"; 5e-07, a double just below 5e-7, to "0.000000"); the
    # table takes scientific notation instead, every cell Python's own formatting.
    value = np.array([[small, 1.0]])
    cells = _row(render.matrix_table(value, view=render.View(precision=precision)), 0)[1:]
    assert cells == [f"{x:.{precision}e}" for x in value[0]]
    assert float(cells[0]) == float(f"{small:.{precision}e}") != 0
    # while a number that fixed notation shows as nonzero keeps it
    shown = 1.5 * 10.0**-precision  # rounds to 1 or 2 units of the last place
    cells = _row(
        render.matrix_table(np.array([[shown, 1.0]]), view=render.View(precision=precision)), 0
    )[1:]
    assert cells == [f"{shown:.{precision}f}", f"{1.0:.{precision}f}"]


def _body_labels(text: str, title: str) -> list[str]:
    """The row labels of the table under the title line that starts with `title`."""
    lines = text.splitlines()
    start = next(k for k, x in enumerate(lines) if x.startswith(title + " "))
    labels = []
    for line in lines[start + 4 :]:  # the title, the top rule, the header, its rule
        if not line.startswith("│"):
            break
        labels.append(line.split("│")[1].strip())
    return labels


def test_the_rows_of_k_a_are_the_keys_in_cross_attention() -> None:
    # K W_a_k has one row per key, a source token in cross-attention; when the target was
    # as long as the source, its rows were labelled with the target's tokens (the
    # queries'), in the tables and in --format csv.
    from typer.testing import CliRunner

    from trace_tf.cli import app

    sets = ["--set", "model.score=additive", "--set", "target=[SOS, how]"]  # source: hello world
    path = "decoder.0.cross_attn.h0.k_a"
    out = CliRunner().invoke(app, ["decode", *sets], env={"COLUMNS": "120"})
    assert out.exit_code == 0, out.output
    assert _body_labels(out.stdout, path) == ["hello", "world"]
    assert _body_labels(out.stdout, "decoder.0.cross_attn.h0.q_a") == ["SOS", "how"]
    assert _body_labels(out.stdout, "encoder.0.self_attn.h0.k_a") == ["hello", "world"]
    csv = CliRunner().invoke(app, ["step", *sets, "--stage", path, "--format", "csv"])
    assert [row.split(",")[0] for row in csv.stdout.splitlines()[1:]] == ["hello", "world"]


def test_the_conventions_header_folds_a_long_word_rather_than_cut_it() -> None:
    # At 40 columns the sampling convention read "numpy.random.default_rn…".
    from typer.testing import CliRunner

    from trace_tf.cli import app

    args = ["generate", "--sample", "--max-tokens", "1"]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "40"})
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    panel = lines[: lines.index(next(x for x in lines if x.startswith("╰"))) + 1]
    assert all(cell_len(x) == 40 for x in panel)
    inner = "".join(x[1:-1].strip() for x in panel[1:-1])  # the lines of the panel, joined
    assert "numpy.random.default_rng(0)," in inner
    assert "…" not in inner


@pytest.mark.parametrize("width", [40, 60, 80, 83, 84, 120])
def test_a_step_title_never_splits_its_shape(width: int) -> None:
    # "encoder.0.self_attn.h0.masked   S / scale + M  (...)   [3 × 3]" at 80 columns
    # wrapped inside its shape: "[3 ×" ended one line and "3]" began the next.
    path, formula = "encoder.0.self_attn.h0.masked", "S / scale + M  (M additive: −inf masks)"
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    console.print(render.titled(path, formula, (3, 3), render.matrix_table(np.eye(3))))
    lines = [x.rstrip() for x in out.getvalue().splitlines()]
    heading = lines[: lines.index(next(x for x in lines if x.startswith("┏")))]
    assert sum("[3 × 3]" in x for x in heading) == 1
    assert " ".join(heading).split() == f"{path} {formula} [3 × 3]".split()
    assert all(cell_len(x) <= width for x in heading)


def test_the_total_of_the_rows_left_out_is_their_exact_sum_rounded() -> None:
    # The "… N more" row summed in numpy's order: 0.1 then ten 1e-17 read 0.1, each
    # 1e-17 lost in turn; their sum is 0.1 + 1e-16, and that is what 17 decimals show.
    from fractions import Fraction

    from rich.table import Table

    p = np.array([0.2] * 10 + [0.1] + [1e-17] * 10)
    vocab = [f"t{i}" for i in range(len(p))]
    table = render.distribution_table(
        [("p", p)], vocab, "t0", show=10, view=render.View(precision=17)
    )
    assert isinstance(table, Table)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(table)
    last = out.getvalue().splitlines()[-1].split()
    exact = float(sum(Fraction(x) for x in p[10:]))
    assert exact != 0.1 and f"{exact:.17f}" != f"{0.1:.17f}"
    assert last[:3] == ["…", "11", "more"] and last[3] == f"{exact:.17f}"


def _printed(renderable: Any, width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [40, 41, 42, 60])
def test_a_panel_title_too_long_for_the_border_is_shown_whole_inside(width: int) -> None:
    # rich cut a title to the border silently: at 40 columns "Hello World (The Random
    # Transformer)" lost its ")", and a longer one whole words, with no mark
    title = "Hello World (The Random Transformer)"  # 36 cells: the border holds 34 at 40
    lines = _printed(render.header(title, [("model", "d_model 4")]), width)
    assert all(cell_len(x) <= width for x in lines)
    if len(title) + 6 <= width:  # "╭─ " title " ─╮": on the border, as before
        assert lines[0].startswith(f"╭─ {title} ─")
    else:
        assert set(lines[0]) <= set("╭─╮") and lines[1].strip("│ ") == title
    long = "a step title " * 6  # wraps inside, every word kept
    text = " ".join(x.strip("│ ╭╮─") for x in _printed(render.titled_panel("body", long), width))
    assert " ".join(long.split()) in " ".join(text.split())


def test_the_diff_header_folds_a_long_path_rather_than_cut_it() -> None:
    # At 40 columns the verdict's first differing step read "encoder.0.self_attn.h0.soft…"
    side = {"config": "hello (packaged example)", "overrides": {}}
    verdict = "first difference: encoder.0.self_attn.h0.softmax (differs)"
    lines = _printed(render.diff_header(side, side, verdict), 40)
    assert all(cell_len(x) <= 40 for x in lines)
    text = "".join("".join(x.strip("│╭╮╰╯─ ").split()) for x in lines)
    assert "…" not in text and "encoder.0.self_attn.h0.softmax(differs)" in text


@pytest.mark.parametrize("width", [40, 50, 60, 80])
def test_long_tokens_are_shortened_further_where_the_grid_would_not_fit(width: int) -> None:
    # At 40 columns a 32-cell token as the row label and as a column label made the
    # fewest columns (first, "…", last) 60 cells wide; the labels now give way.
    long, wide = "start" + "x" * 60 + "end", "你" * 30
    value = np.arange(12 * 12, dtype=float).reshape(12, 12) - 70.5
    tokens = [long, wide, *"abcdefghij"]
    view = render.View(max_cols=8, col_edge=3, width=width)
    grid = render.matrix_table(value, rows=tokens, cols=tokens, view=view)
    lines = Console(file=io.StringIO(), width=1000, color_system=None)
    lines.print(grid)
    text = lines.file.getvalue()  # type: ignore[attr-defined]
    assert grid.width <= width
    assert all(cell_len(line) <= width for line in text.splitlines())
    label = _row(grid, 0)[0]
    assert label.startswith("st") and label.endswith("d") and "…" in label
    assert _header(grid)[1].startswith("[0] st")  # its place kept whole
    assert _row(grid, 0)[1] == "-70.5000" and _row(grid, 0)[-1] == "-59.5000"  # (by hand)


def test_labels_that_fit_keep_their_32_cells() -> None:
    long = "start" + "x" * 60 + "end"
    grid = render.matrix_table(
        np.ones((2, 2)), rows=[long, "a"], cols=["b", "c"], view=render.View(width=80)
    )
    assert cell_len(_row(grid, 0)[0]) == render.LABEL_CELLS


# Wrapped cells are measured off their plain text, and printed without dividing them
# where they fit (a table over a real vocabulary holds 50,000 of them): each must
# agree with what rich makes of the same text.
TRICKY = [
    "日本語のトークン",  # wide: two cells a character
    "cafe\u0301 e\u0301te\u0301",  # combining marks: none
    "-inf  nan",
    "ｆｕｌｌ 😀 t\u0308\u0308",
    "الكلمة שלום",
    "two\nlines 世界",
    "",
]


@pytest.mark.parametrize("text", TRICKY)
def test_a_wrapped_cell_measures_as_rich_measures_its_words(text: str) -> None:
    # Broken at its spaces, its least width is its widest word and its most its widest
    # line, as rich measures a Text: cells counted by rich, not characters.
    console = Console(width=200, file=io.StringIO())
    wrapped = render.Wrapped(text)
    assert render.Measurement.get(console, console.options, wrapped) == (
        render.Measurement.get(console, console.options, render.Text(text))
    )
    words = text.split()
    assert wrapped.least() == max((cell_len(w) for w in words), default=0)


@pytest.mark.parametrize(
    "text, breaks, within, least, most",
    [
        ("a.日本語のトークン", render.PATH_BREAKS, None, 16, 18),
        ("embeddings.cafe\u0301", render.PATH_BREAKS, None, 11, 15),
        ("x.-inf → y.e\u0301\u0301", " +", render.PATH_BREAKS, 4, 12),
    ],
)
def test_a_wrapped_cell_measures_its_widest_piece_in_cells(
    text: str, breaks: str, within: str | None, least: int, most: int
) -> None:
    console = Console(width=200, file=io.StringIO())
    got = render.Measurement.get(console, console.options, render.Wrapped(text, breaks, within))
    assert (got.minimum, got.maximum) == (least, most)


@pytest.mark.parametrize("width", [60, 12])
def test_a_wrapped_cell_that_fits_prints_as_its_text_does(width: int) -> None:
    # Where a line fits, it is printed as is; where not, broken after its dots: the
    # same lines, and in a terminal the same escape codes, as rich gives a column of text.
    def printed(cell: Any) -> str:
        out = io.StringIO()
        console = Console(width=80, file=out, force_terminal=True, color_system="truecolor")
        table = render.Table()
        table.add_column("weight", style="bold cyan", width=width)
        table.add_row(cell)
        console.print(table)
        return out.getvalue()

    for text in ["embeddings.日本語", "a.cafe\u0301.-inf", "two\nlines.x", "x\n", "a  \nb"]:
        expected = "\n".join(
            line.rstrip().replace(".", ".\n") if cell_len(line) > width else line.rstrip()
            for line in text.split("\n")
        )
        if text.endswith("\n"):
            expected = expected[:-1]
        assert printed(render.Wrapped(text, render.PATH_BREAKS)) == printed(expected)
