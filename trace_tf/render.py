"""Trace -> rich renderables and JSON. Never computes model math, never prints."""

from __future__ import annotations

import functools
import io
import itertools
import math
import re
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from copy import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.cells import cell_len
from rich.color import Color
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.panel import Panel
from rich.rule import Rule
from rich.segment import Segment
from rich.style import Style
from rich.table import Column, Table
from rich.text import Text

from trace_tf import __version__
from trace_tf.text import Each, exact, printable, shape_text
from trace_tf.trace import Shown, Step

if TYPE_CHECKING:
    from trace_tf.config import Source
    from trace_tf.cost import Cost, Totals, VaryRow
    from trace_tf.diff import StepDiff, WeightDiff
    from trace_tf.generate import Generation, Hypothesis, Iteration
    from trace_tf.runner import CheckResult
    from trace_tf.stages import Stage

HEATMAP_STAGES = {"softmax", "probs", "attn.softmax"}
ELLIPSIS = "…"
CHOSEN = "  ◀ chosen"  # beside the bar of the token a decoding step chose
HIGHLIGHT = Style(bold=True, color="black", bgcolor="yellow")


@dataclass(frozen=True)
class View:
    """How to show numbers: digits after the point, and how much of a matrix."""

    precision: int = 4
    max_rows: int = 12  # beyond this, the first and last `row_edge` rows around an ellipsis
    row_edge: int = 4  # (whatever the terminal's width)
    max_cols: int = 10  # beyond this, the first and last `col_edge` columns around it
    col_edge: int = 4
    full: bool = False  # show whole matrices, however large
    width: int | None = None  # cells a matrix may take: as many columns as fit (_fitting)

    def kept(self, shape: Sequence[int]) -> list[list[int | None]]:
        """The indices a table shows along each axis of an array of `shape` (None: the
        ellipsis): the last axis's are columns, the others' rows (a 3-D array's first
        axis: its slices, each a table); the width then shows fewer columns (_fitting)."""
        last = len(shape) - 1
        return [
            _keep(n, self.max_cols, self.col_edge, self.full)
            if axis == last
            else _keep(n, self.max_rows, self.row_edge, self.full)
            for axis, n in enumerate(shape)
        ]

    def part(self, value: np.ndarray) -> np.ndarray | Shown:
        """All that a table of `value` shows: `value` where it is shown whole, else the
        numbers at the indices shown (Tracer.part stores this of each step)."""
        at = _shown_at(self, value.shape)
        if at is None:
            return value
        kept, index = at
        return Shown(value.shape, kept, value[index])


@functools.lru_cache(maxsize=256)
def _shown_at(view: View, shape: tuple[int, ...]) -> tuple[tuple[np.ndarray, ...], Any] | None:
    """The indices `view` shows along each axis of an array of `shape`, and their
    np.ix_; None where it shows them all. (Kept for each shape: a trace records
    thousands of steps of a few shapes, and np.ix_ is most of a part's cost.)"""
    kept = [[i for i in axis if i is not None] for axis in view.kept(shape)]
    if all(len(k) == n for k, n in zip(kept, shape, strict=True)):
        return None
    at = tuple(np.asarray(k, dtype=np.intp) for k in kept)
    for a in at:
        a.flags.writeable = False  # (shared by every part of this shape)
    return at, np.ix_(*at)


def _magnitudes(values: np.ndarray, axis: int | None = None) -> tuple[Any, Any]:
    """The largest and the smallest nonzero finite |x| of `values` (or of each column,
    axis 0): 0 and inf where there is none. All that decides a notation (_scientific)."""
    size = np.abs(np.asarray(values, dtype=np.float64))  # (exact for any float or int)
    counted = np.isfinite(size) & (size != 0)
    return (
        np.max(size, axis=axis, where=counted, initial=0.0),
        np.min(size, axis=axis, where=counted, initial=np.inf),
    )


def _scientific(largest: float, smallest: float, precision: int) -> bool:
    """Whether numbers whose nonzero magnitudes run from `smallest` to `largest` (0 when
    there is none) are written in scientific notation, like numpy: when fixed would hide
    them (one at 1e8 or more, or one that fixed notation rounds to zero: 0.5 at precision 0)."""
    # Asked of the formatting itself: a threshold (x < 0.5·10^-p) misses a double just
    # below a half, 5e-07 at precision 6, and the halves that round to even, 0.5 to "0".
    return largest > 0 and (largest >= 1e8 or float(f"{smallest:.{precision}f}") == 0)


def _format_cells(values: np.ndarray, precision: int, sci: bool | None = None) -> list[str]:
    """Numbers of one matrix in one notation: scientific if `sci`, by default where
    _scientific says so of these numbers."""
    if sci is None:
        sci = _scientific(*_magnitudes(values), precision)
    out = []
    for x in values.ravel().tolist():
        if math.isnan(x):
            out.append("nan")
        elif math.isinf(x):
            out.append("-inf" if x < 0 else "inf")
        elif sci:
            out.append(f"{x:.{precision}e}")
        else:
            out.append(f"{x:.{precision}f}")
    return out


def _keep(n: int, limit: int, edge: int, full: bool) -> list[int | None]:
    """Indices to show along an axis of length n; None marks the ellipsis."""
    if full or n <= limit:
        return list(range(n))
    return _edges(n, edge)


def _heat(value: float) -> Style:
    """A background for a probability in [0, 1]: white to deep blue."""
    if not math.isfinite(value):
        return Style()
    t = min(max(value, 0.0), 1.0)
    r, g, b = (int(255 - t * (255 - c)) for c in (33, 102, 172))
    return Style(bgcolor=Color.from_rgb(r, g, b), color="white" if t > 0.55 else "black")


LABEL_CELLS = 32  # the most cells a token takes as a row or column label
LABEL_LEAST = 5  # ... and the fewest, where the grid would not fit the width otherwise


def matrix_table(
    value: np.ndarray | Shown,
    *,
    rows: Sequence[str] | None = None,
    cols: Sequence[str] | None = None,
    heatmap: bool = False,
    view: View = View(),
    highlight: np.ndarray | None = None,
) -> Grid:
    """One 0-, 1- or 2-D array as a table: labelled rows and columns, elided when large.

    Columns are elided to the view's count, then, where the table would be wider than
    `view.width` (long labels, many digits), to the most that fit, measured before the
    grid is laid out once (see _fitting): a row is never cut at the edge of the screen.
    `highlight` (bool, the array's shape) marks cells to stand out, e.g. where two runs
    differ.
    """
    m = value.as_matrix() if isinstance(value, Shown) else np.atleast_2d(value)
    marked = None if highlight is None else highlight.reshape(m.shape)
    row_idx, col_idx = view.kept(m.shape)
    cells = None
    label_cells = LABEL_CELLS
    if not view.full and view.width is not None:
        choices = _narrowing(m.shape[1], col_idx)
        # Where even the fewest columns do not fit (long tokens on a narrow terminal),
        # the tokens are shortened further, to the longest that lets the grid fit.
        longest: int | None = None
        while True:
            labels = _row_labels(rows, row_idx, value.ndim, label_cells)
            fit = _fitting(
                m, row_idx, choices, labels, cols, view.precision, view.width, label_cells
            )
            if fit[2] or (rows is None and cols is None):  # (index labels cannot shorten)
                break
            if longest is None:  # (no token as long: those cells would shorten none)
                shown = [
                    *(rows[i] for i in row_idx if i is not None and rows and value.ndim >= 2),
                    *(cols[j] for j in choices[0] if j is not None and cols),
                ]
                longest = max((_cells(shown_token(t, cells=10**9)) for t in shown), default=0)
            if min(label_cells, longest) - 1 < LABEL_LEAST:
                break
            label_cells = min(label_cells, longest) - 1
        col_idx, cells, _ = fit
    return _layout(
        m, value.ndim, row_idx, col_idx, rows, cols, heatmap, marked, view, cells, label_cells
    )


def _edges(n: int, edge: int) -> list[int | None]:
    return [*range(edge), None, *range(n - edge, n)]


def _narrowing(n: int, first: list[int | None]) -> list[list[int | None]]:
    """The columns `first` of n, then fewer and fewer: one fewer from each edge each
    time, down to one a side around the ellipsis."""
    shown = len(first) - (None in first)
    return [first] + [_edges(n, e) for e in range((shown - 1) // 2, 0, -1)]


def _fitting(
    m: np.ndarray | Shown,
    row_idx: list[int | None],
    choices: list[list[int | None]],
    row_labels: list[str],
    cols: Sequence[str] | None,
    precision: int,
    width: int,
    label_cells: int = LABEL_CELLS,
) -> tuple[list[int | None], list[str], bool]:
    """The first of `choices` (columns, each among the first's) whose grid is at most
    `width` wide, else the last, with the texts of its numbers (_layout's `cells`)
    and whether it fits; tokens as labels take at most `label_cells`.

    Each grid's width is summed from its columns' widest texts, as _grid measures
    them, without laying one out: the numbers are formatted once in each notation
    they are needed in, and a choice's notation follows from the largest and the
    smallest magnitude of its columns (_magnitudes, _scientific). Dropping columns
    can change the notation, so every number's width; each choice is measured in its own."""
    first = [j for j in choices[0] if j is not None]
    at = {j: k for k, j in enumerate(first)}  # a column's place among the first's
    shown = m[np.ix_([i for i in row_idx if i is not None], first)]
    largest, smallest = _magnitudes(shown, axis=0)
    texts: dict[bool, np.ndarray] = {}  # in each notation, the numbers' texts
    widths: dict[bool, np.ndarray] = {}  # and each column's widest
    labels: dict[bool, np.ndarray] = {}  # each column's label's width, without and with "…"
    label_width = max(map(_cells, row_labels), default=0)
    for col_idx in choices:
        ks = [at[j] for j in col_idx if j is not None]
        sci = _scientific(largest[ks].max(initial=0.0), smallest[ks].min(initial=np.inf), precision)
        elided = None in col_idx
        if sci not in texts:
            formatted = _format_cells(shown, precision, sci)
            texts[sci] = np.array(formatted, dtype=object).reshape(shown.shape)
            widths[sci] = (
                np.fromiter(map(len, formatted), int, len(formatted))
                .reshape(shown.shape)
                .max(axis=0, initial=0)
            )
        if elided not in labels:
            labels[elided] = np.array(
                [_cells(_label(cols, j, col_idx, label_cells)) for j in first], dtype=int
            )
        # a column as wide as its widest number or its label (a "…" row's is no wider),
        # between the rows' labels and the ellipsis's column
        columns = np.maximum(widths[sci][ks], labels[elided][ks]).tolist()
        fits = _grid_width([label_width, *columns, *[1] * elided]) <= width
        if fits:
            break
    return col_idx, texts[sci][:, ks].ravel().tolist(), fits  # (none fits: the last, narrowest)


def _row_labels(
    rows: Sequence[str] | None, row_idx: list[int | None], ndim: int, cells: int = LABEL_CELLS
) -> list[str]:
    """The first column's text on each row shown: its label (none for a 1-D array), or "…"."""
    return [
        ELLIPSIS if i is None else _label(rows, i, row_idx, cells) if ndim >= 2 else ""
        for i in row_idx
    ]


def _label(
    labels: Sequence[str] | None, i: int, shown: list[int | None], cells: int = LABEL_CELLS
) -> str:
    """Row or column i's label: its token, or its index; with the token, the index too
    ("[12] the") when the axis is elided, where a repeated token's place cannot be
    counted. A token longer than `cells` is shortened in its middle."""
    if labels is None:
        return str(i)
    token = shown_token(labels[i], cells=cells)
    return f"[{i}] {token}" if None in shown else token


def shortened(text: str, cells: int = LABEL_CELLS) -> str:
    """`text`, or its start and end around `…` in `cells` cells: a 300-letter token
    would otherwise push every number of its table off the screen."""
    if _cells(text) <= cells:
        return text
    head = _start(text, (cells - 1) * 2 // 3)  # two thirds from the start, the rest from the end
    return f"{head}{ELLIPSIS}{_end(text, cells - 1 - _cells(head))}"


def _start(text: str, cells: int) -> str:
    """The longest start of `text` that takes at most `cells` terminal cells."""
    if text.isascii():
        return text[: max(cells, 0)]
    head = ""
    for c in text:
        if _cells(head + c) > cells:
            break
        head += c
    return head


def _end(text: str, cells: int) -> str:
    """The longest end of `text` that takes at most `cells` terminal cells."""
    return _start(text[::-1], cells)[::-1]


def _layout(
    m: np.ndarray | Shown,
    ndim: int,
    row_idx: list[int | None],
    col_idx: list[int | None],
    rows: Sequence[str] | None,
    cols: Sequence[str] | None,
    heatmap: bool,
    marked: np.ndarray | None,
    view: View,
    cells: list[str] | None = None,
    label_cells: int = LABEL_CELLS,
) -> Grid:
    """The grid of the chosen rows and columns of a 2-D array (None: an ellipsis);
    `cells`, the shown numbers' texts when already formatted; tokens as labels take
    at most `label_cells`."""
    shown = m[np.ix_([i for i in row_idx if i is not None], [j for j in col_idx if j is not None])]
    if cells is None:
        cells = _format_cells(shown, view.precision)
    width = shown.shape[1]
    header = [""] + [
        ELLIPSIS if j is None else _label(cols, j, col_idx, label_cells) for j in col_idx
    ]
    body: list[list[tuple[str, Style | None]]] = []
    r = 0
    for i, label in zip(row_idx, _row_labels(rows, row_idx, ndim, label_cells), strict=True):
        if i is None:
            body.append([(ELLIPSIS, None)] * (len(col_idx) + 1))
            continue
        line: list[tuple[str, Style | None]] = [(label, None)]
        c = 0
        for j in col_idx:
            if j is None:
                line.append((ELLIPSIS, None))
                continue
            style = None
            if marked is not None and marked[i, j]:
                style = HIGHLIGHT
            elif heatmap:
                style = _heat(float(shown[r, c]))
            line.append((cells[r * width + c], style))
            c += 1
        body.append(line)
        r += 1
    return _grid(header, body)


BOLD = Style(bold=True)


class Grid:
    """A table laid out by trace-tf: lines of (text, style) segments that rich prints as
    they are. Rich's Table, and even one Text, measure, wrap and divide their contents,
    which was most of a short run's time; a matrix's layout is known in advance."""

    def __init__(self, lines: list[list[Segment]], width: int) -> None:
        self.lines = lines
        self.width = width  # of every line, in terminal cells

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        newline = Segment.line()
        for line in self.lines:
            yield from line
            yield newline

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(self.width, self.width)


def _grid(header: list[str], body: list[list[tuple[str, Style | None]]]) -> Grid:
    """Rich's default table look (heavy head), first column left and bold, numbers right."""
    widths = [_cells(h) for h in header]
    for row in body:
        for k, (text, _) in enumerate(row):
            widths[k] = max(widths[k], _cells(text))

    def pad(text: str, k: int) -> str:
        fill = " " * (widths[k] - _cells(text))
        return f" {text}{fill} " if k == 0 else f" {fill}{text} "

    def rule(left: str, mid: str, right: str, fill: str) -> list[Segment]:
        return [Segment(left + mid.join(fill * (w + 2) for w in widths) + right)]

    lines = [rule("┏", "┳", "┓", "━")]
    head = [Segment("┃")]
    for k, h in enumerate(header):
        head += [Segment(pad(h, k), BOLD), Segment("┃")]
    lines += [head, rule("┡", "╇", "┩", "━")]
    for row in body:
        line = [Segment("│")]
        for k, (text, style) in enumerate(row):
            if k == 0:
                line.append(Segment(pad(text, k), BOLD))
            elif style is None:
                line.append(Segment(pad(text, k)))
            else:
                fill = " " * (widths[k] - _cells(text))
                line += [Segment(" " + fill), Segment(text, style), Segment(" ")]
            line.append(Segment("│"))
        lines.append(line)
    lines.append(rule("└", "┴", "┘", "─"))
    return Grid(lines, _grid_width(widths))


def _grid_width(widths: Sequence[int]) -> int:
    """Cells a grid whose columns' texts are `widths` wide takes: "│ text " per column, then "│"."""
    return sum(widths) + 3 * len(widths) + 1


PANEL_CELLS = 4  # what a panel adds to its contents' width: two borders, a space inside each


def _through_panels(renderable: RenderableType, width: Callable[[RenderableType], int]) -> int:
    """The largest `width` of the pieces of `renderable`, looking through its groups and
    panels (a panel adds its borders and padding); 0 where no piece has one."""
    if isinstance(renderable, Group):
        return max((_through_panels(r, width) for r in renderable.renderables), default=0)
    if isinstance(renderable, Panel):
        inner = _through_panels(renderable.renderable, width)
        return inner + PANEL_CELLS if inner else 0
    return width(renderable)


def shown_token(token: str, among_others: bool = False, cells: int = LABEL_CELLS) -> str:
    """A token as every table and line shows it: as it is, unless it could be misread
    as another (README, "how a token is shown"); then as Python's repr writes it, in
    quotes. Shortened in its middle when longer than a label (JSON keeps it whole).

    `among_others`: one of a sequence written on a line, space between tokens (a
    prefix, a hypothesis), where a space inside a token would read as two tokens
    ("New York"), and the token "(none)" as no token: those are quoted too. `cells`:
    the most cells it takes (a matrix's labels on a narrow terminal take fewer)."""
    misread = _misreadable(token) or (among_others and (" " in token or token == NO_TOKENS))
    return shortened(repr(token) if misread else token, cells)


def _misreadable(token: str) -> bool:
    """Whether `token`, printed as it is, could be taken for another token or for
    nothing: empty, or beginning or ending with a space (lost in a cell's padding)
    or a quote mark (the token `''` would read as the empty one); `…` (an elided
    axis's mark); holding a character that cannot be printed (a newline, written
    as the escape backslash-n) or a backslash (quoted, the two differ: 'a\\nb' is
    the newline token, 'a\\\\nb' the four characters)."""
    return (
        token == ""
        or token[0] in " '\""
        or token[-1] in " '\""
        or token == ELLIPSIS
        or "\\" in token
        or not token.isprintable()
    )


def _cells(text: str) -> int:
    """Terminal cells `text` takes: its length when ASCII (numbers always are), else
    rich's count (wide characters in a token take two)."""
    return len(text) if text.isascii() else cell_len(text)


def titled(title: str, formula: str, shape: Sequence[int], body: RenderableType) -> Group:
    """A table under a one-line title: path, formula and shape (plain text, never markup)."""
    return Group(_Heading(title, formula, f"[{shape_text(shape)}]"), body)


class _Heading:
    """A step's title line, `path   formula   [shape]`; where it does not fit, the shape
    goes whole onto a line of its own (wrapped with the rest, it split at its spaces:
    "[3 ×" ending one line and "3]" beginning the next)."""

    def __init__(self, title: str, formula: str, shape: str) -> None:
        self.head = Text.assemble((title, "bold cyan"), "   ", (formula, "italic"))
        self.shape = Text(shape, style="dim")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.head.cell_len + 3 + self.shape.cell_len <= options.max_width:
            yield Text.assemble(self.head, "   ", self.shape)
        else:
            yield self.head
            yield self.shape

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        whole = self.head.cell_len + 3 + self.shape.cell_len
        return Measurement(min(self.shape.cell_len, whole), whole)


def step_table(step: Step, view: View = View()) -> RenderableType:
    """A step as a table titled with its path, formula and shape (3-D: one table per slice)."""
    heat = step.stage in HEATMAP_STAGES or step.path in HEATMAP_STAGES
    body = array_view(step.data, step.rows, step.cols, view, heatmap=heat)
    return titled(step.path, step.formula, step.shape, body)


def array_view(
    value: np.ndarray | Shown,
    rows: Sequence[str] | None,
    cols: Sequence[str] | None,
    view: View,
    *,
    heatmap: bool = False,
    highlight: np.ndarray | None = None,
) -> RenderableType:
    """An array of any number of axes up to 3 as tables: a matrix as one, a 3-D array as
    one per slice along its first axis, headed by its index and its row's token."""
    if value.ndim <= 2:
        return matrix_table(
            value, rows=rows, cols=cols, heatmap=heatmap, view=view, highlight=highlight
        )
    parts: list[RenderableType] = []
    for i in view.kept(value.shape)[0]:
        if i is None:
            parts.append(Text(ELLIPSIS))
            continue
        label = f"  ({shown_token(rows[i])})" if rows is not None else ""
        parts.append(Text(f"[{i}]{label}", style="bold"))
        marked = None if highlight is None else highlight[i]
        parts.append(matrix_table(value[i], heatmap=heatmap, view=view, highlight=marked))
    return Group(*parts)


def trace_view(steps: Iterable[Step], view: View = View()) -> Group:
    return Group(*(step_table(s, view) for s in steps))


def step_with_inputs(
    step: Step,
    lookup: Mapping[str, Step],
    weights: Mapping[str, Step],
    view: View = View(),
) -> RenderableType:
    """A step preceded by the inputs it was computed from (steps, or weights and given
    arrays: runner.input_steps) and its formula."""
    if view.width is not None:  # inside a panel
        view = replace(view, width=view.width - PANEL_CELLS)
    names = ", ".join(step.inputs) if step.inputs else "the configuration"
    parts: list[RenderableType] = [Text(f"computed from: {names}", style="dim")]
    for name in step.inputs:
        given = lookup.get(name) or weights.get(name)
        if given is not None:
            parts.append(step_table(given, view))
        elif name != "?":
            parts.append(Text(f"input {name}"))
    parts.append(step_table(step, view))
    return titled_panel(Group(*parts), step.path)


class _TitledPanel(Panel):
    """A panel titled on its top border, left; where the title does not fit there
    (rich would cut it, unmarked: "(The Random Transformer" for "... Transformer)"),
    it goes whole into the panel instead, its first line, wrapped."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        title = self.title
        assert isinstance(title, Text)
        # (rich's room for a title: the width less its corners, dashes and spaces)
        if title.cell_len + 6 <= options.max_width:
            yield from super().__rich_console__(console, options)
            return
        inside = copy(self)
        inside.title = None
        inside.renderable = Group(Text(title.plain, style=title.style or "bold"), self.renderable)
        yield from Panel.__rich_console__(inside, console, options)


def titled_panel(body: RenderableType, title: str | Text) -> Panel:
    """A panel with `title` (plain text, never markup), kept whole on a narrow terminal."""
    text = title if isinstance(title, Text) else Text(title)
    return _TitledPanel(body, title=text, title_align="left")


def header(
    title: str, conventions: Sequence[tuple[str, str]], warnings: Sequence[str] = ()
) -> Panel:
    """The conventions in force, so no number is a guess."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")  # a word wider than the column goes on, not "…"
    for key, value in conventions:
        table.add_row(key, value)
    body: list[RenderableType] = [table]
    for w in warnings:
        body.append(Text(f"warning: {w}", style="bold red"))
    return titled_panel(Group(*body), printable(title or "trace-tf"))


# ---------------------------------------------------------------------------
# JSON (SPEC section 5)
# ---------------------------------------------------------------------------


def json_value(value: Any) -> Any:
    """Nested lists (and mappings: a --set value) with the non-finite numbers JSON lacks
    written as strings."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind != "f" or np.isfinite(value).all():
            return value.tolist()  # nothing to rewrite: skip the walk over every number
        value = value.tolist()
    if isinstance(value, list):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def step_json(step: Step) -> dict[str, Any]:
    return {
        "path": step.path,
        "stage": step.stage,
        "formula": step.formula,
        "shape": list(step.shape),
        "inputs": list(step.inputs),
        "value": json_value(step.value),
    }


def inputs_json(
    inputs: Sequence[Step], weights: Mapping[str, Step], sources: Mapping[str, Source]
) -> list[dict[str, Any]]:
    """The inputs `step --inputs` writes (runner.inputs_of): an earlier step as
    `step_json` writes it; a weight or given array (in `weights`) by its key path, shape
    and numbers, and where a model's came from (Config.sources)."""
    out = []
    for s in inputs:
        if s.path not in weights:
            out.append(step_json(s))
            continue
        given = {"path": s.path, "shape": list(s.shape), "value": json_value(s.value)}
        source = sources.get(s.path)
        out.append(given | ({"source": source.json()} if source is not None else {}))
    return out


def trace_json(
    title: str,
    tokens: Mapping[str, Sequence[str | int] | None],
    steps: Iterable[Step],
    **extra: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "trace_tf": __version__,
        "title": title,
        "tokens": {k: list(v) for k, v in tokens.items() if v is not None},
        "steps": Each(step_json(s) for s in steps),  # (each made as it is written)
    }
    out.update(extra)
    return out


# ---------------------------------------------------------------------------
# CSV of one step (issue 6)
# ---------------------------------------------------------------------------


def step_csv(step: Step) -> str:
    """One matrix step as CSV: a header of column labels, each row led by its token.

    Values are full precision (shortest round-trip repr); -inf, inf and nan as words.
    """
    import csv
    import io

    if step.value.ndim > 2:
        from trace_tf.errors import InputError

        raise InputError(
            f"--format csv writes a matrix, and step {step.path} has {step.value.ndim} axes",
            expected="a step of at most 2 axes (or --format npz)",
            found=f"shape {shape_text(step.shape)}",
        )
    m = np.atleast_2d(step.value)
    cols = step.cols if step.cols is not None else [str(j) for j in range(m.shape[1])]
    rows = step.rows if step.rows is not None and step.value.ndim == 2 else None
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([step.path, *cols])
    for i, values in enumerate(m.tolist()):
        writer.writerow([rows[i] if rows is not None else str(i), *map(repr, values)])
    return out.getvalue()


# ---------------------------------------------------------------------------
# The cost ledger (issue 6)
# ---------------------------------------------------------------------------


def _count(n: int) -> str:
    return f"{n:,}" if n else "—"


_LEAST_TEXT = 8  # the fewest cells a name column that gives way is cut to ("…scale30")


PATH_BREAKS, FORMULA_BREAKS = r"\.", r" +|·(?!\d)"
# A source's text: a path in it after its dots, never a number after its point
# ("N(0, 1." / "2345e-200²)" would read as two numbers).
SOURCE_BREAKS = r"(?<!\d)\.|\.(?!\d)"
# A formula's call, in a piece wider than its column: after its "(" ("sublayer(" /
# "Norm(x)))"), as after a product's "·": never inside a name.
CALL_BREAKS = r"(?<=\w)\("
# A status, a few words: at its spaces, a shape's kept whole ("shape" / "2 × 8 →" / "2 × 6").
WORD_BREAKS = r"(?<!×) (?!×)"


def _runs(text: str, pattern: str) -> list[tuple[int, int]]:
    """The runs of `text` between its break opportunities, after each match of `pattern`
    (a run keeps the character it breaks after), as (start, end); the whole text, one
    run, where it has none. Wrapped divides by them both to print and to measure."""
    cuts = [0, *(m.end() for m in re.finditer(pattern, text)), len(text)]
    return [(a, b) for a, b in itertools.pairwise(cuts) if a < b] or [(0, len(text))]


class Wrapped:
    """A cell's text that goes onto more lines only where it may break: at its newlines,
    and after each match of `breaks` (PATH_BREAKS: a path after its dots, "encoder.0." /
    "self_attn.h0." / "softmax"; FORMULA_BREAKS: a formula at its spaces and after a
    product's "·" between symbols, never inside "2·4·3"), never inside a word; and,
    in a piece wider than the column, after each match of `within` (paths set apart
    by spaces, each kept on one line where it fits, and broken after its dots where not).
    Nothing is added to the text (no zero-width marks to end up in copied text): a line
    is a run of it. Its least width is its widest piece, which `keep_whole` gives the
    column; only where a table is printed narrower still is a piece folded."""

    def __init__(self, text: str | Text, breaks: str = " +", within: str | None = None) -> None:
        self.text = text if isinstance(text, Text) else Text(text)
        self.breaks, self.within = breaks, within  # (regular expressions)
        # _pieces by width (a table measures each cell several times; never mutated)
        self._divided: dict[int, list[list[Text]]] = {}
        self._measured: Measurement | None = None

    def _pieces(self, width: int = 0) -> list[list[Text]]:
        """Each line of the text, as the pieces between its break opportunities (a
        piece keeps the character it breaks after); those wider than `width` divided
        at `within`."""
        key = width if self.within is not None else 0  # (without `within`, one answer)
        if key not in self._divided:
            self._divided[key] = self._divide(width)
        return self._divided[key]

    def _divide(self, width: int) -> list[list[Text]]:

        def divide(text: Text, pattern: str) -> list[Text]:
            return list(text.divide([a for a, _ in _runs(text.plain, pattern)[1:]]))

        out: list[list[Text]] = []
        for line in self.text.split("\n"):
            pieces = divide(line, self.breaks)
            if self.within is not None:
                within = self.within
                pieces = [
                    q
                    for p in pieces
                    for q in (divide(p, within) if _cells(p.plain.rstrip(" ")) > width else [p])
                ]
            out.append(pieces)
        return out

    def least(self) -> int:
        """The cells its widest piece takes: the fewest it is printed in unfolded."""
        return self._measure().minimum

    def _measure(self) -> Measurement:
        """Its widest piece (`_pieces()`'s, every piece divided at `within`) and its
        widest line, in cells: read off its plain text, as a table measures each of
        thousands of cells several times (no Text is made to be measured)."""
        if self._measured is None:  # (the same whatever the console: cells of its text)

            def divide(text: str, pattern: str) -> list[str]:
                return [text[a:b] for a, b in _runs(text, pattern)]

            least = most = 0
            for line in self.text.plain.split("\n"):
                pieces = divide(line, self.breaks)
                if self.within is not None:
                    pieces = [q for p in pieces for q in divide(p, self.within)]
                least = max(least, *(_cells(p.rstrip(" ")) for p in pieces))
                most = max(most, _cells(line.rstrip(" ")))
            self._measured = Measurement(least, most)
        return self._measured

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return self._measure()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines: list[Text] = []
        fits = self._measure().maximum <= options.max_width
        if fits and not self.text.style and not self.text.spans:
            # Every line fits: each is its pieces joined whole, with no style of its own
            # (a table's rows of one cell each, thousands of them, go this way).
            plain = self.text.plain
            lines = [Text(line.rstrip()) for line in plain.split("\n")]
            if plain.endswith("\n"):
                lines.pop()  # (as Text.split: no blank line after the last newline)
        for pieces in self._pieces(options.max_width) if not lines else []:
            line = Text()
            for piece in pieces:
                if (
                    line.plain
                    and _cells((line.plain + piece.plain).rstrip(" ")) > options.max_width
                ):
                    line.rstrip()
                    lines.append(line)
                    line = Text()
                line.append_text(piece)
            line.rstrip()
            lines.append(line)
        text = Text("\n").join(lines)
        text.overflow = "fold"  # (a piece wider than the column: only when printed narrower)
        yield text


def keep_whole(table: Table) -> Table:
    """Raise the min_width of every column that is never wrapped and has one (numbers,
    short codes) to its widest cell, so that rich narrows only the text columns: a
    number is never cut; and that of every column that wraps to its widest word (a
    `Wrapped` cell's widest piece, a header's widest word: "multiply-adds"), so that
    no word is split across lines. Where even so the table cannot fit, `least_width`
    says how wide it must be printed."""
    console = _measuring_console()
    for column in table.columns:
        if not column.no_wrap and column.width is None:
            words = max(
                # (a Wrapped cell's least, as rich would measure it, without its calls)
                min(c.least(), console.options.max_width)
                if isinstance(c, Wrapped)
                else Measurement.get(console, console.options, c).minimum
                for c in (column.header, *column.cells)
            )
            if words:
                column.min_width = max(column.min_width or 0, words)
        if column.no_wrap and column.min_width is not None:
            cells = [column.header, *column.cells]
            widest = max(
                (
                    cell_len(c.plain if isinstance(c, Text) else c)
                    for c in cells
                    if isinstance(c, (str, Text))
                ),
                default=0,
            )
            column.min_width = max(column.min_width, widest)
    return table


def _measuring_console() -> Console:
    """A console that measures as printed (every string is text, not markup; see
    cli.console), wide enough never to wrap."""
    return Console(width=10**5, file=io.StringIO(), markup=False, emoji=False, highlight=False)


def _natural_width(renderable: RenderableType) -> int:
    """The cells `renderable` takes when nothing has to wrap."""
    console = _measuring_console()
    return Measurement.get(console, console.options, renderable).maximum


@dataclass(frozen=True)
class _ColumnWidths:
    """A table's columns measured as rich lays them out, in terminal cells (its private
    `_measure_column`, `_get_padding_width` and `_extra_width`, read here only)."""

    widest: list[int]  # each column's widest cell, its padding included
    least: list[int]  # its min_width (else 1 cell), its padding included
    pad: list[int]  # its padding
    wrap: list[bool]  # whether rich may narrow it (it wraps, with no fixed width)
    extra: int  # the table's edges and the rules between its columns

    @staticmethod
    def of(table: Table) -> _ColumnWidths:
        console = _measuring_console()
        columns = table.columns
        pad = [table._get_padding_width(c._index) for c in columns]
        return _ColumnWidths(
            widest=[_widest(table, c, console) for c in columns],
            least=[(c.min_width or 1) + p for c, p in zip(columns, pad, strict=True)],
            pad=pad,
            wrap=[not c.no_wrap and c.width is None for c in columns],
            extra=table._extra_width,
        )

    def spare(self, width: int) -> int:
        """The cells left in `width` once every column has its least width (a column
        never wrapped: its widest cell); negative where even those do not fit."""
        kept = sum(w for w, f in zip(self.widest, self.wrap, strict=True) if not f)
        least = sum(x for x, f in zip(self.least, self.wrap, strict=True) if f)
        return width - self.extra - kept - least


# Each column's widest cell as last measured, and what it was measured under: a table
# is measured several times (to lay it out, to shorten its tokens, to share out its
# width, to print it wide enough) and over a real vocabulary holds 50,000 rows.
_MEASURED: weakref.WeakKeyDictionary[Table, dict[int, tuple[tuple[Any, ...], int]]] = (
    weakref.WeakKeyDictionary()
)


def _widest(table: Table, column: Column, console: Console) -> int:
    """rich's measure of `column`'s widest cell, its padding included; remeasured only
    where the column's widths, padding, header or number of cells changed since (a
    cell is never replaced)."""
    key = (
        column.width,
        column.min_width,
        column.max_width,
        len(column._cells),
        table._get_padding_width(column._index),  # (collapse_padding may change it)
        table.padding,
        table.show_header,
        table.show_footer,
        column.header,
        column.footer,
    )
    known = _MEASURED.setdefault(table, {}).get(column._index)
    if known is None or known[0] != key:
        known = key, table._measure_column(console, console.options, column).maximum
        _MEASURED[table][column._index] = known
    return known[1]


def least_width(renderable: RenderableType) -> int:
    """The fewest terminal cells `renderable` can be printed in without cutting a column
    kept whole (never wrapped, with a min_width: numbers, short codes) or splitting a
    word of one that wraps (its min_width or width: its widest word, see keep_whole);
    0 when it has no such column. A line may be wider than the terminal rather than
    cut a number or a word.

    This follows how rich narrows a table that is too wide: the wrapable columns only,
    the widest first, down to a common width; that width must leave each of them its
    min_width (else 1 cell), or rich would cut the others too.

    A matrix grid is as narrow as it can be: it was elided to fit the width it was
    laid out for, or to its first and last column around `…` where even that does not
    fit (or shown whole, with --full)."""
    if isinstance(renderable, Grid):
        return renderable.width
    if isinstance(renderable, Table):
        return _least_of(renderable, _ColumnWidths.of(renderable))
    return _through_panels(renderable, least_width) if isinstance(renderable, Group | Panel) else 0


def unpadded(renderable: RenderableType, width: int) -> RenderableType:
    """`renderable`, or, where it is a boxed table whose least_width is more than `width`
    (`cost`, `stages` at 40 columns), the table without the space either side of each
    cell: its rules set the cells apart, and it then fits where its words and numbers do."""
    if (
        isinstance(renderable, Table)
        and renderable.box is not None
        and renderable.padding != (0, 0, 0, 0)
        and least_width(renderable) > width
    ):
        renderable.padding = (0, 0, 0, 0)
        return _shared_out(renderable, width)  # (rich would narrow them all alike)
    return renderable


def _least_of(table: Table, m: _ColumnWidths) -> int:
    """least_width of `table`, whose columns measure `m`."""
    if not any(c.min_width is not None or c.width is not None for c in table.columns):
        return 0
    level = max((x for x, w in zip(m.least, m.wrap, strict=True) if w), default=0)
    cells = sum(min(x, level) if w else x for x, w in zip(m.widest, m.wrap, strict=True))
    return cells + m.extra


def _shared_out(table: Table, width: int) -> Table:
    """`table` (after keep_whole) with its wrapping columns given widths of their own
    that fit `width` where their least widths (min_width) do: rich would narrow them
    all to one common width, no less than the largest of those least widths, and so
    print the table wider than it need be (see least_width). Each gets its least, and
    the room left is shared out in proportion to how much wider each would be. Where
    even their least widths do not fit, or the table fits as it is, it is left as is."""
    m = _ColumnWidths.of(table)
    if _least_of(table, m) <= width or sum(m.widest) + m.extra <= width:
        return table
    spare = m.spare(width)
    if spare < 0:
        return table
    chosen = [i for i, f in enumerate(m.wrap) if f]
    gaps = [max(m.widest[i] - m.least[i], 0) for i in chosen]
    shares = [spare * g // (sum(gaps) or 1) for g in gaps]
    for i, share in zip(chosen, shares, strict=True):
        table.columns[i].width = m.least[i] + share - m.pad[i]
    return table


def _cut(text: str, cells: int) -> str:
    """`text` (a name that gives way in `_fitted`: a variant's, in `check`) in
    `cells` terminal cells, cut in the middle: its last two dot-separated parts kept
    whole where it has more ("run.v2.yaml" -> "r…v2.yaml"), else its last ("long_na…yaml"),
    with as much of its start as there is room for; where no start fits besides, only
    its end ("…yaml"). Cut `text` whole: a cut text cut again would keep its first
    "…" ("long……yaml"). (Step paths are never cut: they wrap, see `_add_rows`.)"""
    if _cells(text) <= cells:
        return text
    parts = text.split(".")
    for tail in (".".join(parts[-2:]), parts[-1]):
        room = cells - 1 - _cells(tail)
        if len(tail) < len(text) and room > 0:
            return _start(text, room) + ELLIPSIS + tail
    return ELLIPSIS + _end(text, cells - 1)


def _fitted(
    names: list[str],
    rows: list[list[str]],
    width: int,
    give_way: Sequence[tuple[str, int]],
    wrap: str | None = None,
    words: str | None = None,
    **table: Any,
) -> tuple[Table, int]:
    """A plain table (no borders, two spaces between columns) of `rows` fitted to
    `width` (see _fit), and the room left of `width` for one more column."""
    widths, room, gap = _fit(names, rows, width, give_way, wrap, words)
    return _plain_table(names, widths, gap, **table), room


def _fit(
    names: list[str],
    rows: list[list[str]],
    width: int,
    give_way: Sequence[tuple[str, int]],
    wrap: str | None = None,
    words: str | None = None,
) -> tuple[list[int], int, int]:
    """The widths of the columns of `rows`, as wide as their texts, and the room left
    of `width` for one more column. When they do not fit, the `wrap` column (of step
    paths) narrows first, to its widest part, its paths going onto lines after their
    dots (the caller adds the rows with `_add_rows`); then the `give_way` columns
    (names) in turn, each to its least, their texts cut in the middle in `rows` (see
    _cut); the others (verdicts, numbers) keep their width. Last, the `words` column
    (a status) goes over lines at its spaces (the caller adds its cells as `Wrapped`,
    WORD_BREAKS, see `_add_rows`)."""
    widths = (
        [
            max(cell_len(x) for x in (name, *column))
            for name, column in zip(names, zip(*rows, strict=True), strict=True)
        ]
        if rows
        else [cell_len(name) for name in names]
    )
    room = width - sum(widths) - 2 * len(widths)
    whole = [list(row) for row in rows]  # each cut is made from the whole text

    def narrow(i: int, least: int, need: int, cut_texts: bool = True) -> None:
        """Column i narrower by up to `need` cells, not below `least`; its texts cut."""
        nonlocal room
        cut = min(need, max(0, widths[i] - least))
        widths[i] -= cut
        room += cut
        for row, text in zip(rows, whole, strict=True) if cut_texts else ():
            row[i] = _cut(text[i], widths[i])

    def wrap_column(name: str, breaks: str, need: int) -> None:
        """Column `name` narrower by up to `need` cells, to its header's width or its
        texts' widest piece between `breaks`: they go over lines instead of being cut."""
        i = names.index(name)
        least = max([cell_len(name), *(Wrapped(r[i], breaks).least() for r in rows)])
        narrow(i, least, need, cut_texts=False)

    if wrap is not None and room < 0:
        wrap_column(wrap, PATH_BREAKS, -room)
    # Each in turn to its least; when that is not enough, each further, to _LEAST_TEXT.
    for name, least in [*give_way, *((name, _LEAST_TEXT) for name, _ in give_way)]:
        if room < 0 and name in names:
            narrow(names.index(name), least, -room)
    # Still wider than `width` (a 40-column terminal; `room` keeps a gap for one more
    # column): the headers go over lines at their spaces ("max" / "|error|", see
    # _plain_table), one space between columns instead of two, and the `give_way`
    # columns down to their header's width ("variant").
    gap = 2
    for i, name in enumerate(names):
        if room + gap < 0 and name != wrap:
            least = max(cell_len(x) for x in [*name.split(), *(row[i] for row in rows)])
            narrow(i, least, -room - gap, cut_texts=False)  # (no text is wider than least)
    if room + gap < 0:
        gap = 1
        room += len(widths)
    for name, _ in give_way:  # (only where that lets it fit: never cut for nothing)
        i = names.index(name) if name in names else -1
        if room + gap < 0 and i >= 0 and widths[i] - cell_len(name) >= -room - gap:
            narrow(i, cell_len(name), -room - gap)
    if words in names and room + gap < 0:
        wrap_column(words, WORD_BREAKS, -room - gap)
    return widths, room, gap


def _plain_table(names: list[str], widths: list[int], gap: int = 2, **table: Any) -> Table:
    """An empty plain table of the columns `names`, each as wide as `widths` says, `gap`
    spaces apart; a name wider than its column goes over lines at its spaces; columns
    of numbers (a name with `|`, `atol`, `tolerance`, `cells`) right-aligned."""
    pad = (0, 1) if gap == 2 else (0, gap, 0, 0)  # (between columns only: no pad_edge)
    out = Table(title_justify="left", box=None, pad_edge=False, padding=pad, **table)
    for name, w in zip(names, widths, strict=True):
        right = "|" in name or name in ("atol", "tolerance", "cells")
        header = name if cell_len(name) <= w else re.sub(" +", "\n", name)
        out.add_column(
            header, justify="right" if right else "left", no_wrap=True, max_width=w, min_width=w
        )
    return out


def _words(cell: RenderableType) -> RenderableType:
    """A cell of a shape or a status that goes over lines at its spaces (WORD_BREAKS)."""
    return Wrapped(cell, WORD_BREAKS) if isinstance(cell, str | Text) else cell


def _add_rows(
    table: Table, rows: Sequence[Sequence[RenderableType]], paths: int, words: int = -1
) -> None:
    """Add `rows` to a `_fitted` table, column `paths` (its `wrap`) going over lines
    after the dots of its paths where the column is narrower than they are, and so
    column `words` (its `words`, if any) at its spaces; a cell over lines would read
    as several rows, so blank lines then set the rows apart."""

    def over(row: Sequence[RenderableType], i: int) -> bool:
        cell = row[i]
        text = cell.plain if isinstance(cell, Text) else str(cell)
        return cell_len(text) > (table.columns[i].max_width or 0)

    spaced = any(over(row, paths) or (words >= 0 and over(row, words)) for row in rows)
    for k, row in enumerate(rows):
        if spaced and k:
            table.add_row()
        cells = list(row)
        cells[paths] = Wrapped(str(row[paths]), PATH_BREAKS)
        if words >= 0 and over(row, words):
            cells[words] = _words(row[words])
        table.add_row(*cells)


def _tolerance(atol: float, rtol: float) -> str:
    """An entry's tolerance in one cell: "5e-09", or with a relative part
    "5e-09·|v|" (v the expected value), "1e-08+5e-09·|v|"."""
    if not rtol:
        return exact(atol)
    return (f"{exact(atol)}+" if atol else "") + f"{exact(rtol)}·|v|"


def _config_names(results: Sequence[CheckResult]) -> dict[str, str]:
    """Each checked config's name as shown, printable so that it stays on its line: its
    file name, or, where two configs share one (a/x.yaml, b/x.yaml), the path as given."""
    names = {r.config: Path(r.config).name for r in results}
    shared = {n for n in names.values() if list(names.values()).count(n) > 1}
    return {c: printable(c if n in shared else n) for c, n in names.items()}


def _error_text(r: CheckResult) -> str:
    """An entry's largest absolute error to 3 significant digits, or in full where those
    would tell its verdict wrong: 0.5000000000000002 failing atol 0.5 is not "0.5"."""
    if r.max_abs_error is None:
        return "—"
    text = f"{r.max_abs_error:.3g}"
    if not r.rtol and not r.problem and (float(text) <= r.atol) != r.ok:
        return exact(r.max_abs_error)
    return text


def check_view(results: Sequence[CheckResult], width: int) -> list[RenderableType]:
    """One row per `expect` entry, then why each failed one failed, in full, and each
    document error an entry records. A tolerance shared by every row goes in the title
    rather than a column (its rtol only when it is not 0); so does the config, when
    there is one; several are each named above their own rows, whole, in tables whose
    columns line up. The notes get the room that is left (cut short on their line),
    or, on a terminal too narrow for them, no column (they are in --format json)."""
    if not results:
        return [Text("trace-tf check: no `expect` entries to check", style="dim")]
    shown = _config_names(results)
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(results):
        groups.setdefault(shown[r.config], []).append(i)
    tolerances = {(r.atol, r.rtol) for r in results}
    relative = any(r.rtol for r in results)
    title = "trace-tf check"
    title += f"  {next(iter(groups))}" if len(groups) == 1 else ""
    if len(tolerances) == 1:
        atol, rtol = next(iter(tolerances))
        title += f"  (atol {exact(atol)}" + (f", rtol {exact(rtol)})" if rtol else ")")
    rows = [
        [r.step, r.variant or "", "ok" if r.ok else "FAIL"]
        + [_error_text(r)]
        + [_tolerance(r.atol, r.rtol)] * (len(tolerances) > 1)
        for r in results
    ]
    names = ["step", "variant", "ok", "max |error|"]
    names += ["tolerance" if relative else "atol"] * (len(tolerances) > 1)
    # One fit to all the rows for every group's table, so that their columns line up.
    widths, room, gap = _fit(names, rows, width, (("variant", 8),), wrap="step")
    out: list[RenderableType] = []
    if len(groups) > 1:
        out.append(Text(title, style="table.title"))
    for k, (config, group) in enumerate(groups.items()):
        table = _plain_table(
            names, widths, gap, title=title if len(groups) == 1 else None, show_header=k == 0
        )
        if room >= 12:
            table.add_column("note", max_width=min(room, 60), no_wrap=True, overflow="ellipsis")
        styled: list[list[RenderableType]] = []
        for i in group:
            r = results[i]
            styled.append([*rows[i], *([printable(r.note)] if room >= 12 else [])])
            styled[-1][names.index("ok")] = (
                Text("ok", style="green") if r.ok else Text("FAIL", style="bold red")
            )
        _add_rows(table, styled, names.index("step"))
        if len(groups) > 1:
            out.append(Text(config, style="bold"))
        out.append(table)

    def where(r: CheckResult) -> str:
        return f"{shown[r.config]}: {r.step}" + (f" (variant {r.variant})" if r.variant else "")

    for r in results:
        if r.problem:
            out.append(Text.assemble(("FAIL ", "bold red"), f"{where(r)}: {r.problem}"))
    for r in results:
        if r.document and not r.problem:
            d = r.document
            cell = f" at [{', '.join(map(str, d.at))}]" if d.at else ""
            out.append(
                Text.assemble(
                    ("document error ", "bold yellow"),
                    f"{where(r)}: the document prints {exact(d.printed)}{cell} where its "
                    f"formula gives {d.computed:.10g}: off by {d.max_abs_error:.3g}, and "
                    f"{d.cells_wrong} of {d.cells} cells beyond its printed precision "
                    f"{exact(d.atol)}",
                )
            )
    return out


def cost_ledger(costs: Iterable[Cost]) -> Table:
    """Every step with its shape and multiply-adds (formula in symbols and in numbers)."""
    table = Table(title="multiply-adds of every step", title_justify="left")
    # On a narrow terminal a path goes over lines after its dots, a formula at its
    # spaces and between its symbols (see Wrapped): never inside a word.
    table.add_column("step")
    table.add_column("shape", justify="right", no_wrap=True, min_width=0)
    table.add_column("multiply-adds")
    table.add_column("count", justify="right", no_wrap=True, min_width=0)
    for c in costs:
        terms = " = " + "·".join(str(t) for t in c.terms) if c.terms else ""
        formula = Wrapped(c.formula + terms, FORMULA_BREAKS)
        table.add_row(Wrapped(c.path, PATH_BREAKS), shape_text(c.shape), formula, _count(c.macs))
    return keep_whole(table)


def weights_json(rows: Sequence[tuple[str, Sequence[int], Source]]) -> list[dict[str, Any]]:
    """`weights`' JSON: each weight's key path, shape and the fields of its source
    (Source.json; `step --inputs` and `diff` write them under "source" keys)."""
    return [{"path": k, "shape": list(shape), **src.json()} for k, shape, src in rows]


def weights_table(rows: Sequence[tuple[str, Sequence[int], str]], view: View) -> Table:
    """Every weight: its key path, shape and where its numbers came from. Over
    `view.max_rows` embeddings (a real vocabulary has tens of thousands), the first and
    last `view.row_edge` around a row that counts the others, unless `view.full`. An
    embedding's token is shortened to a label's cells (LABEL_CELLS), and further (down
    to the cells of "embeddings.") where the table would not fit `view.width` otherwise."""
    table = _weights_table(rows, view, LABEL_CELLS)
    if view.width is None:
        return table
    m = _ColumnWidths.of(table)
    if _least_of(table, m) <= view.width:
        return table
    # The key paths' column gives up what the table is too wide (each column at its
    # least, as _shared_out would lay it out) from its widest piece, a token's where
    # that is the widest: cell for cell; never below "embeddings.", which it holds anyway.
    widest = m.least[0] - m.pad[0]
    return _weights_table(rows, view, max(widest + m.spare(view.width), len("embeddings.")))


def _weights_table(
    rows: Sequence[tuple[str, Sequence[int], str]], view: View, token_cells: int
) -> Table:
    table = Table(title="weights: where each came from", title_justify="left")
    # On a narrow terminal a path goes over lines after its dots, a source at its spaces
    # (and a long path in it after its dots): never inside a word (see Wrapped).
    table.add_column("weight", style="bold cyan")
    table.add_column("shape", justify="right", no_wrap=True, min_width=0)
    table.add_column("source")
    for i in _embeddings_elided([path for path, _, _ in rows], view):
        if isinstance(i, Text):
            table.add_row(Wrapped(i), "", "")
            continue
        path, shape, source = rows[i]
        table.add_row(
            Wrapped(_weight_path(path, token_cells), PATH_BREAKS),
            shape_text(shape),
            Wrapped(printable(source), within=SOURCE_BREAKS),
        )
    table = keep_whole(table)
    return table if view.width is None else _shared_out(table, view.width)


def _weight_path(path: str, cells: int) -> str:
    """A weight's key path as its table shows it: an embedding's token as a label shows
    it (`shown_token`: quoted where it could be misread, `embeddings.''` and
    `embeddings.' '` for the empty and the space token; shortened in its middle, as a
    300-letter token would otherwise widen the column past the terminal), the rest as
    it is (JSON keeps the whole path)."""
    embedding, dot, token = path.partition(".")
    if embedding == "embeddings" and dot:
        return f"{embedding}.{shown_token(token, cells=cells)}"
    return printable(path)


def _embeddings_elided(paths: Sequence[str], view: View) -> Iterator[int | Text]:
    """The indices of the rows of weights `paths` to show, in order: over `view.max_rows`
    embeddings (a real vocabulary has tens of thousands), only the first and last
    `view.row_edge` of them, unless `view.full`, a row that counts them (a Text) in
    place of each run of those left out."""
    embeddings = [i for i, path in enumerate(paths) if path.startswith("embeddings.")]
    shown = _keep(len(embeddings), view.max_rows, view.row_edge, view.full)  # (as a matrix's)
    hidden = set(embeddings) - {embeddings[k] for k in shown if k is not None}
    run = 0  # the embeddings left out since the last row shown
    for i in range(len(paths) + 1):
        if i in hidden:
            run += 1
            continue
        if run:
            yield Text(f"… {run:,} more embeddings (--full shows them)", style="dim")
            run = 0
        if i < len(paths):
            yield i


def cost_totals(totals: Totals, growth: Mapping[str, str]) -> Table:
    """Multiply-adds per stage and per kind, and the total."""
    table = Table(title="totals", title_justify="left")
    table.add_column("stage or kind", overflow="fold")
    table.add_column("multiply-adds", justify="right", no_wrap=True, min_width=0)
    table.add_column("share", justify="right", no_wrap=True, min_width=0)
    table.add_column("grows as", overflow="fold")
    total = totals.total or 1
    for stage, n in totals.by_stage.items():
        table.add_row(stage, f"{n:,}", f"{n / total:.1%}", "")
    table.add_section()
    for kind, n in totals.by_kind.items():
        if n:
            grows = Wrapped(growth[kind], FORMULA_BREAKS)  # ("O(L·" / "D·" / "d_ff)")
            table.add_row(Text(kind, style="bold"), f"{n:,}", f"{n / total:.1%}", grows)
    table.add_section()
    table.add_row(Text("total", style="bold"), f"{totals.total:,}", "100%", "")
    return keep_whole(table)


def vary_table(
    name: str, what: str, rows: Sequence[VaryRow], kinds: Sequence[str], width: int | None = None
) -> list[RenderableType]:
    """One row per value of L or D: multiply-adds per kind, predicted beside measured time.
    Where its columns (numbers, all kept whole) do not fit `width`, they are dealt out
    over several tables, in order, each led by the column of L or D, as many in each
    as fit; the caption under the last, or under them all."""
    short = {"projection": "proj", "attention": "attn", "ffn": "ffn", "output": "output"}
    shown = [k for k in kinds if any(r.by_kind[k] for r in rows)]
    names = [name, *(short[k] for k in shown), "total", "attn %", "pred. ms", "meas. ms"]
    cells = []
    for r in rows:
        share = r.by_kind.get("attention", 0) / r.total if r.total else 0.0
        cells.append(
            [
                str(r.value),
                *(_si(r.by_kind[k]) for k in shown),
                _si(r.total),
                f"{share:.1%}",
                f"{r.predicted * 1e3:.3f}",
                f"{r.measured * 1e3:.3f}",
            ]
        )
    widest = [max(map(len, [n, *(row[i] for row in cells)])) for i, n in enumerate(names)]
    groups: list[list[int]] = [[]]
    for i in range(1, len(names)):
        if (  # (a table's columns, padded and ruled, take what a grid's do)
            width is not None
            and groups[-1]
            and _grid_width([widest[j] for j in [0, *groups[-1], i]]) > width
        ):
            groups.append([])
        groups[-1].append(i)
    caption = (
        "Multiply-adds to 3 digits (k = 10³, M = 10⁶, G = 10⁹, T = 10¹²; exact in --format "
        "json). pred. ms: the largest row's measured time scaled by multiply-adds; meas. ms: "
        "the untraced engine, fastest of the runs. On small models Python's fixed cost per "
        "step, not arithmetic, dominates the measured time."
    )
    tables: list[RenderableType] = []
    for k, group in enumerate(groups):
        table = Table(
            title=f"multiply-adds as {name}, the {what}, grows" if k == 0 else None,
            caption=caption if len(groups) == 1 else None,
            title_justify="left",
            caption_justify="left",
        )
        for i in [0, *group]:
            table.add_column(names[i], justify="right", no_wrap=True, min_width=len(names[i]))
        for row in cells:
            table.add_row(*(row[i] for i in [0, *group]))
        tables.append(keep_whole(table))
    if len(groups) > 1:  # (under narrow tables, the caption as wide as the terminal)
        tables.append(Text(caption))
    return tables


def _si(n: int) -> str:
    """A count to 3 significant digits with k, M, G, T (exact below 10,000)."""
    if n < 10_000:
        return f"{n:,}"
    # Rounded first, the prefix then chosen for the rounded count: 999,999 is 1.00M, and
    # its 999.999k to 3 digits read "1e+03k".
    rounded = float(f"{n:.3g}")
    for power, prefix in ((12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if rounded >= 10**power:
            x = rounded / 10**power
            return f"{x:,.0f}{prefix}" if x >= 1000 else f"{x:.3g}{prefix}"
    return str(n)  # pragma: no cover


# ---------------------------------------------------------------------------
# stages: the registry
# ---------------------------------------------------------------------------


def stages_view(stages: Sequence[Stage], groups: Mapping[str, str]) -> list[RenderableType]:
    """Every stage (its name; formula, meaning and paths; shape), then the groups."""
    table = Table(
        title="stages (select with --stage NAME): formula, meaning, and the paths recorded",
        title_justify="left",
        expand=True,
    )
    table.add_column("stage", style="bold cyan", no_wrap=True, min_width=0)
    table.add_column("formula · meaning · paths", ratio=4)
    # A shape wraps between its words, never inside one ("d_mode" / "l"): its longest
    # word is the column's least width (for a ratio column rich reads that from
    # `width`, not `min_width`).
    word = max(cell_len(w) for s in stages for w in s.shape.split())
    table.add_column("shape", overflow="fold", ratio=1, width=word)
    for s in stages:
        # Text wraps between its words, a formula (too long for its line) after a
        # call's "(", a path after its dots: never inside a word (keep_whole: the
        # column's least width).
        about = Group(
            Wrapped(Text(s.formula, style="bold"), within=CALL_BREAKS),
            Wrapped(s.meaning),
            Wrapped(Text("   ".join(s.paths), style="dim"), within=PATH_BREAKS),
        )
        table.add_row(s.name, about, Text(s.shape))
    keep_whole(table)
    listed = Table(title="groups (also --stage)", title_justify="left")
    listed.add_column("group", style="bold cyan", no_wrap=True)
    listed.add_column("selects", overflow="fold")
    for name, meaning in groups.items():
        listed.add_row(name, Text(meaning))
    return [table, listed]


# ---------------------------------------------------------------------------
# generate: iterations, distributions, beams
# ---------------------------------------------------------------------------

_STOPPED = {
    "eos": "it produced tokens.eos",
    "max_tokens": "it reached --max-tokens",
    "beams_finished": "every beam slot finished (ended in tokens.eos)",
}


def _scalar(x: float, precision: int) -> str:
    """One number as a matrix's would be: never a nonzero shown as zero (5e-7 at 6
    decimals is 5.000000e-07, not 0.000000), `-inf` as a word."""
    return _format_cells(np.array([x]), precision)[0]


def distribution_table(
    columns: Sequence[tuple[str, np.ndarray]],
    vocab: Sequence[str],
    chosen: str | None,
    show: int,
    view: View = View(),
) -> Table:
    """Next-token distributions side by side (the model's, then after each sampling stage),
    sorted by the last, then by the earlier ones, then in vocabulary order; the top `show`
    rows with a bar of the last, the rest summed in one row. A token is shortened as a
    label (LABEL_CELLS), and further, to the most cells that let the table fit
    `view.width` in its panel (LABEL_LEAST at the least, as a matrix's labels), where
    it would not fit otherwise."""
    table = _distribution_table(columns, vocab, chosen, show, view, LABEL_CELLS)
    if view.width is None:
        return table
    m = _ColumnWidths.of(table)
    over = _least_of(table, m) + PANEL_CELLS - view.width  # (in its panel)
    if over <= 0:
        return table
    widest = m.widest[1] - m.pad[1]  # (the tokens' column)
    return _distribution_table(columns, vocab, chosen, show, view, max(widest - over, LABEL_LEAST))


def _distribution_table(
    columns: Sequence[tuple[str, np.ndarray]],
    vocab: Sequence[str],
    chosen: str | None,
    show: int,
    view: View,
    token_cells: int,
) -> Table:
    last = columns[-1][1]
    order = np.lexsort([-p for _, p in columns])  # the last key sorts first; stable
    shown = order if view.full else order[:show]
    rest = order[len(shown) :]
    cells = []
    for _, p in columns:
        # the rest's total correctly rounded (fsum): numpy's order of addition can be an
        # ulp off, and 17 decimals show it
        column = p[shown] if not len(rest) else np.append(p[shown], math.fsum(p[rest]))
        cells.append(_format_cells(column, view.precision))
    table = Table(box=None, padding=(0, 1), show_edge=False)
    # The ranks, tokens and numbers are kept whole (see keep_whole): on a narrow terminal
    # rich would cut every number ("0.79…") and drop the ranks and tokens altogether.
    table.add_column("#", justify="right", style="dim", no_wrap=True, min_width=0)
    table.add_column("token", no_wrap=True, min_width=0)
    for name, _ in columns:
        table.add_column(name, justify="right", no_wrap=True, min_width=0)
    # The bars: what gives way on a narrow terminal (see Bar), down to the two cells of
    # the chosen token's mark, " ◀", when one is shown: no narrower, or the mark goes too.
    marked = chosen is not None and any(vocab[i] == chosen for i in shown)
    table.add_column("", min_width=2 if marked else None)
    for r, i in enumerate(shown):
        mark = vocab[i] == chosen
        table.add_row(
            str(r + 1),
            Text(shown_token(vocab[i], cells=token_cells), style="bold green" if mark else ""),
            *[column[r] for column in cells],
            Bar(float(last[i]), 24, CHOSEN if mark else "", len(CHOSEN)),
        )
    if len(rest):
        table.add_row(
            ELLIPSIS,
            Text(f"{len(rest)} more", style="dim"),
            *[column[-1] for column in cells],
            # (one line, cut: the column may be as narrow as the mark's two cells)
            Text("(their total)", style="dim", no_wrap=True, overflow="ellipsis"),
        )
    return keep_whole(table)


def _bar_text(p: float, width: int = 24) -> Text:
    """A horizontal bar of p in [0, 1], in eighths of a character."""
    blocks = " ▏▎▍▌▋▊▉█"
    eighths = round(max(0.0, min(p, 1.0)) * width * 8) if math.isfinite(p) else 0
    full, part = divmod(eighths, 8)
    bar = "█" * full + (blocks[part] if part else "")
    return Text(bar.ljust(width), style="blue")


class Bar:
    """A table cell: the bar of p, `width` cells long at most and shorter when the
    table must give way (every bar of a column is drawn to the same scale, the
    column's width), then a mark. Its column is the one to make wrapable
    (`no_wrap=False`): rich narrows such a column first, so the tokens and the
    numbers beside it keep their room."""

    def __init__(self, p: float, width: int, mark: str = "", mark_room: int = 0) -> None:
        self.p, self.width, self.mark = p, width, mark
        self.mark_room = mark_room  # the same in every row of a column, marked or not

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(0, self.width + self.mark_room)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        room = min(options.max_width, self.width + self.mark_room)
        mark, mark_room = self.mark, self.mark_room
        if room < self.width + mark_room and mark_room > 2:  # tight: the mark is its arrow
            mark, mark_room = " ◀" if mark else "", 2
        bar = _bar_text(self.p, max(0, min(self.width, room - mark_room)))
        text = Text.assemble(bar, (mark, "bold green"))
        text.truncate(room)
        yield text


NO_TOKENS = "(none)"  # an empty sequence of tokens, as shown


def _tokens(tokens: Sequence[str]) -> str:
    return " ".join(shown_token(t, among_others=True) for t in tokens) if tokens else NO_TOKENS


PREFIX_HEAD, PREFIX_TAIL = 4, 16  # a longer prefix is shown by these ends


def _prefix(tokens: Sequence[str], view: View) -> str:
    """An iteration's prefix: whole when short or with --full, else its first and last
    tokens around how many are left out. Whole, every iteration would print the prefix
    again, and the output grow as the square of --max-tokens."""
    hidden = len(tokens) - PREFIX_HEAD - PREFIX_TAIL
    if view.full or hidden < 2:
        return _tokens(tokens)
    head, tail = _tokens(tokens[:PREFIX_HEAD]), _tokens(tokens[-PREFIX_TAIL:])
    return f"{head} {ELLIPSIS} {hidden} more {ELLIPSIS} {tail}"


def iteration_view(
    it: Iteration, gen: Generation, vocab: Sequence[str], show: int, view: View
) -> Panel:
    """One decoding iteration: the prefix, the distribution (sorted, bars), the choice.

    `it` is a generate.Iteration and `gen` a generate.Generation."""
    s = gen.settings
    parts: list[RenderableType] = []
    if s.strategy == "beam":
        parts.append(_beams_table(it, gen, vocab, show, view))
        best = it.candidates[0]
        parts.append(
            Text.assemble(
                ("best extension ", "bold"),
                f"beam {best.beam} + ",
                (shown_token(best.token), "bold green"),
                f"   (log p {_scalar(best.token_logprob, view.precision)}, "
                f"cumulative {_scalar(best.logprob, view.precision)})",
            )
        )
        title = f"iteration {it.index} · {len(it.beams)} live beam(s)"
        return titled_panel(Group(*parts), title)
    parts.append(Text.assemble(("prefix ", "bold"), _prefix(it.prefix, view)))
    if s.strategy == "sample":
        columns = [("model p", it.model_probs)]
        names = {"tempered": f"T = {exact(s.temperature)}"}  # and the filters that are on
        if s.top_k is not None:
            names["top_k"] = f"top-k {s.top_k}"
        if s.top_p is not None:
            names["top_p"] = f"top-p {exact(s.top_p)}"
        columns += [(names[n], p) for n, p in it.stages]
        parts.append(distribution_table(columns, vocab, it.next, show, view))
        assert it.u is not None  # (drawn at every sampling iteration)
        u = _scalar(it.u, max(view.precision, 6))
        parts.append(
            Text.assemble(
                ("next ", "bold"),
                (shown_token(it.next), "bold green"),
                f"   sampled: u = {u}, the first token (vocabulary order) whose cumulative p > u",
            )
        )
    else:
        parts.append(distribution_table([("p", it.probs)], vocab, it.next, show, view))
        p = float(it.probs[vocab.index(it.next)])
        parts.append(
            Text.assemble(
                ("next ", "bold"),
                (shown_token(it.next), "bold green"),
                f"   greedy: the most probable, p = {_scalar(p, view.precision)}",
            )
        )
    return titled_panel(Group(*parts), f"iteration {it.index}")


def _beams_table(
    it: Iteration, gen: Generation, vocab: Sequence[str], show: int, view: View
) -> Group:
    """The live beams, then every extension of them ranked by cumulative log-probability,
    the kept ones marked (live in the next iteration, or finished)."""
    from trace_tf.generate import extensions

    beams = Table(box=None, padding=(0, 1), show_edge=False)
    words = [shown_token(t, among_others=True) for b in it.beams for t in (*gen.start, *b.tokens)]
    beams.add_column("beam", justify="right", no_wrap=True, min_width=0)
    beams.add_column("prefix", overflow="fold", min_width=max(map(cell_len, ["prefix", *words])))
    beams.add_column("logP", justify="right", no_wrap=True, min_width=0)
    for j, b in enumerate(it.beams):
        beams.add_row(
            str(j), _prefix((*gen.start, *b.tokens), view), _scalar(b.logprob, view.precision)
        )
    keep_whole(beams)
    token_logp, totals, order = extensions(it.beams)
    V = len(vocab)
    kept = {c.beam * V + vocab.index(c.token): c for c in it.candidates}
    table = Table(box=None, padding=(0, 1), show_edge=False)
    for k, col in enumerate(("#", "beam", "+ token", "p", "log p", "logP", "", "")):
        left = col in ("+ token", "")
        if k != 6:  # numbers, tokens and statuses ("→ beam 1"), kept whole
            table.add_column(col, justify="left" if left else "right", no_wrap=True, min_width=0)
        else:  # the bars give way (see Bar)
            table.add_column(col, overflow="fold")
    shown = order if view.full else order[: max(show, len(it.candidates))]
    where = [divmod(int(f), V) for f in shown]
    # p is a column of probabilities: one notation, as the distributions' (0.0001 and
    # 4.6844e-10 in one column read as if the first had one digit)
    ps = np.array([it.beams[j].probs[i] for j, i in where])
    p_cells = _format_cells(ps, view.precision)
    live = 0
    rows = zip(shown, where, ps.tolist(), p_cells, strict=True)
    for rank, (f, (j, i), p, p_cell) in enumerate(rows, start=1):
        c = kept.get(int(f))
        if c is None:
            status = Text("dropped", style="dim")
        elif c.finished:
            status = Text(
                f"finished, score {_scalar(c.score, view.precision)}", style="bold yellow"
            )
        else:
            status = Text(f"→ beam {live}", style="bold green")
            live += 1
        table.add_row(
            str(rank),
            str(j),
            shown_token(vocab[i]),
            p_cell,
            _scalar(float(token_logp[j, i]), view.precision),
            _scalar(float(totals[j, i]), view.precision),
            Bar(p, 10),
            status,
        )
    keep_whole(table)
    if view.width is not None and least_width(table) + PANEL_CELLS > view.width:
        table.collapse_padding = True  # one space between columns, not two
    parts: list[RenderableType] = [
        Text("live beams", style="bold"),
        beams,
        Text("extensions", style="bold"),
        table,
    ]
    if len(order) > len(shown):  # (a line of its own: as a status it widened the column)
        parts.append(Text(f"{ELLIPSIS} {len(order) - len(shown)} more, dropped", style="dim"))
    return Group(*parts)


def generation_summary(gen: Generation, view: View) -> Panel:
    """What was produced, and why the loop stopped; for beam search, every hypothesis:
    the finished ones, and the live beams cut at --max-tokens."""
    s = gen.settings
    parts: list[RenderableType] = [
        Text.assemble(("start     ", "bold"), _tokens(gen.start)),
        Text.assemble(("generated ", "bold"), (_tokens(gen.generated), "bold green")),
        Text(
            f"{len(gen.generated)} token(s) in {len(gen.iterations)} iteration(s); "
            f"stopped because {_STOPPED[gen.stopped]}",
            style="dim",
        ),
    ]
    if s.strategy == "beam":
        rule = f"logP / ((5 + n) / 6)^{exact(s.length_penalty)}" if s.length_penalty else "logP"
        title = f"hypotheses (n produced tokens; score = {rule})"
        ended = [(h, "eos") for h in gen.finished] + [(h, "cut") for h in gen.unfinished]
        words = [shown_token(t, among_others=True) for h, _ in ended for t in h.tokens]
        rows = [
            (
                _tokens(h.tokens),
                str(len(h.tokens)),
                _scalar(h.logprob, view.precision),
                _scalar(h.score, view.precision),
                how,
                Text("◀ result", style="bold green") if h is gen.result else "",
            )
            for h, how in ended
        ]

        def hypotheses(spaced: bool, merged: bool = False) -> Table:
            # `merged`: logP and score in one column, "logP =" / "score" (every score
            # its logP: no length penalty)
            table = Table(title=title, title_justify="left", box=None, padding=(0, 1))
            # The token lists wrap; the numbers, the ends and the mark are kept whole.
            table.add_column(
                "tokens", overflow="fold", min_width=max(map(cell_len, ["tokens", *words]))
            )
            for col in ("n", "logP = score" if merged else "logP", "score", "ended", ""):
                if not (merged and col == "score"):
                    table.add_column(col, justify="right", no_wrap=True, min_width=0)
            if merged:  # (as wide as its numbers, its header over two lines)
                table.columns[2].width = max(cell_len(x) for x in ["score", *(r[2] for r in rows)])
                table.columns[2].header = Wrapped("logP = score")
            for i, row in enumerate(rows):
                if spaced and i:
                    table.add_row()
                table.add_row(*(row[:3] + row[4:] if merged else row))
            if gen.unfinished:
                table.caption = "cut: still live at --max-tokens"
                table.caption_justify = "left"
            keep_whole(table)
            if view.width is not None and least_width(table) + PANEL_CELLS > view.width:
                # one space between columns, as _fit's, the tokens at their least
                table.padding, table.pad_edge = (0, 1, 0, 0), False
                if not merged or least_width(table) + PANEL_CELLS > view.width:
                    table.columns[0].width = table.columns[0].min_width
            return table

        # A row whose tokens wrap would read as several rows: when the panel (with its
        # borders and padding, PANEL_CELLS) is narrower than the table, blank lines set the
        # rows apart. The panel is as wide as the terminal, or wider where the numbers
        # need it (cli.emit prints it at least_width). Where it would be wider and every
        # score is its logP, the two are one column.
        plain = hypotheses(False)
        merged = (
            view.width is not None
            and least_width(plain) + PANEL_CELLS > view.width
            and all(h.score == h.logprob for h, _ in ended)  # (exactly: not as printed)
        )
        plain = hypotheses(False, merged) if merged else plain
        # (tokens at their least: the table measures as wide as they let it be)
        least = plain.columns[0].width
        wraps = view.width is not None and (
            _natural_width(plain) > max(view.width - PANEL_CELLS, least_width(plain))
            or (least is not None and any(cell_len(r[0]) > least for r in rows))
        )
        parts.append(hypotheses(spaced=True, merged=merged) if wraps else plain)
    return titled_panel(Group(*parts), "generated")


def generation_view(
    gen: Generation,
    vocab: Sequence[str],
    steps: Sequence[Step],
    show: int,
    view: View = View(),
) -> list[RenderableType]:
    """Each iteration (its traced steps first, when there are any), then the summary;
    `show`: the rows of each next-token distribution's table."""
    by_iteration: dict[int, list[Step]] = {}
    before: list[Step] = []
    for st in steps:
        head, _, _ = st.path.partition(".")
        if head[:1] == "t" and head[1:].isdigit():
            by_iteration.setdefault(int(head[1:]), []).append(st)
        else:
            before.append(st)
    out: list[RenderableType] = []
    if before:
        out.append(trace_view(before, view))
    for it in gen.iterations:
        if it.index in by_iteration:
            out.append(Rule(Text(f"iteration {it.index}: the steps (paths t{it.index}.…)")))
            out.append(trace_view(by_iteration[it.index], view))
        out.append(iteration_view(it, gen, vocab, show, view))
    out.append(generation_summary(gen, view))
    return out


def generation_json(gen: Generation, vocab: Sequence[str]) -> dict[str, Any]:
    """SPEC section 5's `generated` and `iterations`, plus the strategy and, for beam
    search, the live beams and kept extensions of each iteration and the finished ones."""
    s = gen.settings

    def dist(p: np.ndarray) -> dict[str, Any]:
        return {tok: json_value(float(x)) for tok, x in zip(vocab, p, strict=True)}

    strategy: dict[str, Any] = {"name": s.strategy, "max_tokens": s.max_tokens, "cache": s.cache}
    if s.strategy == "sample":
        strategy.update(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed)
    if s.strategy == "beam":
        strategy.update(width=s.width, length_penalty=s.length_penalty)
    iterations = []
    for it in gen.iterations:
        item: dict[str, Any] = {
            "index": it.index,
            "prefix": list(it.prefix),
            "probs": dist(it.probs),
            "next": it.next,
        }
        if s.strategy == "sample":
            item["model_probs"] = dist(it.model_probs)
            item["u"] = it.u
        if s.strategy == "beam":
            item["beams"] = [
                {
                    "prefix": [*gen.start, *b.tokens],
                    "logprob": json_value(b.logprob),
                    "probs": dist(b.probs),
                }
                for b in it.beams
            ]
            item["candidates"] = [
                {
                    "beam": c.beam,
                    "token": c.token,
                    "token_logprob": json_value(c.token_logprob),
                    "logprob": json_value(c.logprob),
                    "finished": c.finished,
                    "score": json_value(c.score),
                }
                for c in it.candidates
            ]
        iterations.append(item)
    out: dict[str, Any] = {
        "strategy": strategy,
        "generated": list(gen.generated),
        "stopped": gen.stopped,
        "iterations": iterations,
    }
    if s.strategy == "beam" and gen.result is not None:

        def hyp(h: Hypothesis) -> dict[str, Any]:
            return {
                "tokens": list(h.tokens),
                "length": len(h.tokens),
                "logprob": json_value(h.logprob),
                "score": json_value(h.score),
            }

        out["finished"] = [hyp(h) for h in gen.finished]
        out["unfinished"] = [hyp(h) for h in gen.unfinished]
        out["result"] = hyp(gen.result)
    return out


# ---------------------------------------------------------------------------
# diff: two runs compared step by step
# ---------------------------------------------------------------------------


def _cell(where: Sequence[int] | None) -> str:
    return "" if where is None else "[" + ",".join(str(i) for i in where) + "]"


def _apart(a: float, b: float, precision: int) -> tuple[str, str]:
    """Two values as `_p` writes them, with as many more digits as it takes to tell
    them apart when they differ but would be written the same (0.5403 → 0.5403 for
    0.54030231 and 0.54030228); in full (repr) when even 17 decimals cannot."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return _scalar(a, precision), _scalar(b, precision)
    for digits in range(precision, 18):
        texts = _scalar(a, digits), _scalar(b, digits)
        if texts[0] != texts[1]:
            return texts
    return repr(a), repr(b)


def diff_summary(diffs: Sequence[StepDiff], view: View = View()) -> Table:
    """One row per step: its status, the largest |B − A|, where, the two values there,
    and how many cells differ. On a narrow terminal the values there are left out
    and step paths go over lines after their dots (see `_add_rows`)."""
    from trace_tf.diff import DIFFERS, SAME, SHAPE

    rows, changes = [], []
    for d in diffs:
        status = d.status
        if d.status == SHAPE:
            assert d.a is not None and d.b is not None
            status = f"shape {shape_text(d.a.shape)} → {shape_text(d.b.shape)}"
        changes.append(_change_there(d, view.precision))
        rows.append(
            [
                d.path,
                status,
                "" if d.max_abs is None or d.status == SAME else f"{d.max_abs:.3g}",
                _cell(d.where),
                f"{d.n_differing}/{d.size}" if d.status == DIFFERS else "",
            ]
        )
    names = ["step", "status", "max |B−A|", "at", "cells"]
    width = view.width if view.width is not None else 10**6
    table, room = _fitted(
        names, rows, width, (), "step", "status", title="steps, in A's order (then B's own)"
    )
    there = max((cell_len(c) for c in ["A → B there", *changes]), default=0)
    if room >= there:
        table.add_column("A → B there", no_wrap=True)
    style = {SAME: "green", DIFFERS: "bold yellow", SHAPE: "bold red"}
    styled: list[list[RenderableType]] = []
    for d, row, change in zip(diffs, rows, changes, strict=True):
        styled.append([*row, *([change] if room >= there else [])])
        styled[-1][1] = Text(row[1], style=style.get(d.status, "magenta"))
    _add_rows(table, styled, 0, 1)
    return table


def diff_detail(d: StepDiff, view: View = View(), delta: bool = False) -> RenderableType:
    """B's values (or B − A) with the differing cells highlighted."""
    assert d.b is not None and d.differing is not None and d.delta is not None
    value = d.delta if delta else d.b.value
    what = "B − A" if delta else "B"
    heading = Text.assemble(
        (d.path, "bold cyan"),
        "   ",
        (f"{what}; highlighted: {d.n_differing} of {d.size} cells differ", "italic"),
        "   ",
        (f"max |B − A| = {d.max_abs:.3g} at {_cell(d.where)}", "dim"),
    )
    return Group(heading, array_view(value, d.b.rows, d.b.cols, view, highlight=d.differing))


def diff_json(d: StepDiff, indices: bool = True) -> dict[str, Any]:
    """A step compared; `indices`: with the index of every differing cell."""
    step = d.a or d.b
    assert step is not None
    out: dict[str, Any] = {
        "path": d.path,
        "stage": step.stage,
        "status": d.status,
        "shape_a": list(d.a.shape) if d.a is not None else None,
        "shape_b": list(d.b.shape) if d.b is not None else None,
        "max_abs_diff": json_value(d.max_abs) if d.max_abs is not None else None,
    }
    if d.where is not None and d.a is not None and d.b is not None:
        out["at"] = list(d.where)
        out["a_at"] = json_value(float(d.a.value[d.where]))
        out["b_at"] = json_value(float(d.b.value[d.where]))
        out["cells_differing"] = d.n_differing
        assert d.differing is not None
        if indices:
            out["differing"] = [list(map(int, ix)) for ix in np.argwhere(d.differing)]
    return out


def _change_there(d: StepDiff, precision: int) -> str:
    """`A → B` at the cell of the largest difference ("" when there is none)."""
    if d.where is None or d.a is None or d.b is None:
        return ""
    a, b = _apart(float(d.a.value[d.where]), float(d.b.value[d.where]), precision)
    return f"{a} → {b}"


def weights_diff(diffs: Sequence[WeightDiff], title: str, view: View = View()) -> RenderableType:
    """`diff`'s weights (diff.compare_weights): the table of those that differ under
    `title` (diff.weights_verdict), or `title` alone where none does."""
    from trace_tf.diff import SAME

    differing = [d for d in diffs if d.status != SAME]
    return weights_diff_table(differing, title, view) if differing else Text(title)


def weights_diff_table(diffs: Sequence[WeightDiff], title: str, view: View = View()) -> Table:
    """The weights that differ, in A's order (then B's own), under `title` (their
    count, diff.weights_verdict): key path, shape (A's → B's where it changed), cells
    differing of all (or: shape, only in A, only in B), the largest |B − A|, where, the
    two values there, and where the numbers came from (`weights`' text; A's → B's where
    they differ). Embeddings elided as in `weights_table`, unless `view.full`; where the
    table would not fit `view.width` otherwise, an embedding's token shortened as there."""
    from trace_tf.diff import DIFFERS, SHAPE

    style = {DIFFERS: "bold yellow", SHAPE: "bold red"}

    def rows_of(token_cells: int | None) -> list[list[RenderableType]]:
        """The rows, an embedding's token shortened to `token_cells` (None: whole)."""
        rows: list[list[RenderableType]] = []
        for i in _embeddings_elided([d.path for d in diffs], view):
            if isinstance(i, Text):
                rows.append([Wrapped(i), *[""] * 6])
                continue
            d, c = diffs[i], diffs[i].cells
            path = _weight_path(d.path, 10**9 if token_cells is None else token_cells)
            shapes = [shape_text(s.shape) for s in (c.a, c.b) if s is not None]
            sources = [s.text for s in (d.source_a, d.source_b) if s is not None]
            cells = f"{c.n_differing}/{c.size}" if d.status == DIFFERS else d.status
            rows.append(
                [
                    Wrapped(path, PATH_BREAKS, within=" +"),  # (within: TIED_OUTPUT's spaces)
                    " → ".join(dict.fromkeys(shapes)),
                    Text(cells, style=style.get(d.status, "magenta")),
                    "" if c.max_abs is None else f"{c.max_abs:.3g}",
                    _cell(c.where),
                    Wrapped(_change_there(c, view.precision)),
                    Wrapped(printable(" → ".join(dict.fromkeys(sources))), within=SOURCE_BREAKS),
                ]
            )
        return rows

    def table(
        rows: Sequence[Sequence[RenderableType]],
        spaced: bool,
        there: bool = True,
        tight: bool = False,
        stacked: bool = False,
    ) -> Table:
        # Paths go over lines after their dots, sources at their spaces (and a long path
        # in one after its dots), the values at " → ": never inside a word (see
        # Wrapped); rows that go over lines would run together, so blank lines then
        # set them apart. Where even so the table cannot fit, the values there are
        # left out, as in diff_summary; then (`tight`) its columns go one space apart,
        # as _fit's, the header "max" / "|B−A|" and a shape or a status over lines at
        # their spaces, a shape's kept whole ("4 × 8 →" / "4 × 6", "only in" / "A");
        # last (`stacked`), where each difference is under its largest |B − A|.
        pad = (0, 1, 0, 0) if tight else (0, 1)
        out = Table(title=title, title_justify="left", box=None, pad_edge=False, padding=pad)
        out.add_column("weight", style="bold cyan")
        names = ("shape", "cells", "max |B−A| at" if stacked else "max |B−A|", "at")
        for k, name in enumerate(names[: 3 if stacked else 4]):
            words = tight and k < 2  # (shape, cells)
            out.add_column(name, justify="right", no_wrap=not words, min_width=0)
        if tight:  # (as wide as its numbers, its header over lines: "max" / "|B−A|")
            numbers = max(cell_len(str(row[k])) for row in rows for k in (3, 4)[: 1 + stacked])
            out.columns[3].width = max(numbers, cell_len("|B−A|"))
            out.columns[3].header = Wrapped(names[2])
        if there:
            out.add_column("A → B there")
        out.add_column("source (A → B)")
        for k, row in enumerate(rows):
            if spaced and k:
                out.add_row()
            cells = row if there else [*row[:5], row[6]]
            if stacked:  # (a row with no largest difference has no cell of it either)
                cells = [*row[:3], "\n".join(str(x) for x in row[3:5] if x), row[6]]
            if tight:
                cells = [cells[0], *(_words(c) for c in cells[1:3]), *cells[3:]]
            out.add_row(*cells)
        return keep_whole(out)

    rows = rows_of(None)  # (each token whole)
    whole = table(rows, spaced=False)
    m = _ColumnWidths.of(whole)  # (its natural width: each column at its widest)
    if view.width is None or sum(m.widest) + m.extra <= view.width:
        return whole
    spaced = _shared_out(table(rows, spaced=True), view.width)
    if least_width(spaced) <= view.width:
        return spaced
    narrowed = _shared_out(table(rows, spaced=True, there=False), view.width)
    if least_width(narrowed) <= view.width:
        return narrowed
    # A token's path gives up what the table is too wide, as in weights_table; where
    # even so it does not fit, the table `tight`, its tokens so shortened to fit it.
    # Last, each largest difference's cell under it, in its column.
    for tight, stacked in ((False, False), (True, False), (True, True)):
        m = _ColumnWidths.of(table(rows, True, False, tight, stacked))
        cells = min(LABEL_CELLS, m.least[0] - m.pad[0] + m.spare(view.width))
        shortened_rows = rows_of(max(cells, len("embeddings.")))
        narrowed = _shared_out(table(shortened_rows, True, False, tight, stacked), view.width)
        if least_width(narrowed) <= view.width:
            return narrowed
    # Wider than the terminal even so: as narrow as it can be, each column that
    # wraps at its least (rich would widen them all to the widest one's).
    m = _ColumnWidths.of(narrowed)
    for column, least, pad, wraps in zip(narrowed.columns, m.least, m.pad, m.wrap, strict=True):
        column.width = least - pad if wraps else column.width
    return narrowed


def weights_diff_json(d: WeightDiff) -> dict[str, Any]:
    """A weight compared: as a step (without the index of each differing cell: a weight
    may hold millions), with its cells and A's and B's sources."""
    from trace_tf.diff import DIFFERS, SAME

    out = diff_json(d.cells, indices=False)
    del out["stage"]  # (a weight's last part, W_1, is no stage)
    if d.status in (SAME, DIFFERS):
        out["cells"] = d.cells.size
    for side, src in (("source_a", d.source_a), ("source_b", d.source_b)):
        out[side] = src.json() if src is not None else None
    return out


def diff_header(a: Mapping[str, Any], b: Mapping[str, Any], verdict: str) -> Panel:
    """Which two runs are compared (file, variant, overrides), and the verdict."""
    import json

    def side(s: Mapping[str, Any]) -> str:
        parts = [printable(str(s["config"]))]
        if s.get("variant") is not None:
            parts.append(f"variant {s['variant']}")
        parts.extend(f"{k}={json.dumps(v)}" for k, v in s.get("overrides", {}).items())
        return ", ".join(parts)

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")  # a path wider than the column goes on, not "…"
    grid.add_row("A", Text(side(a)))
    grid.add_row("B", Text(side(b)))
    grid.add_row("result", Wrapped(verdict, within=PATH_BREAKS))  # (its first differing step)
    return titled_panel(grid, "trace-tf diff")
