"""Trace -> rich renderables and JSON. Never computes model math, never prints."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.color import Color
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.style import Style
from rich.table import Table
from rich.text import Text

from trace_tf import __version__
from trace_tf.trace import Step

if TYPE_CHECKING:
    from trace_tf.diff import StepDiff

HEATMAP_STAGES = {"softmax", "probs", "attn.softmax"}
ELLIPSIS = "…"
HIGHLIGHT = Style(bold=True, color="black", bgcolor="yellow")


@dataclass(frozen=True)
class View:
    """How to show numbers: digits after the point, and how much of a matrix."""

    precision: int = 4
    max_rows: int = 12  # beyond this, show the first and last `edge` rows around an ellipsis
    max_cols: int = 10
    edge: int = 4
    full: bool = False  # show whole matrices, however large


def _format_cells(values: np.ndarray, precision: int) -> list[str]:
    """Numbers of one matrix in one notation, like numpy: scientific when fixed would hide them."""
    flat = values.ravel()
    finite = flat[np.isfinite(flat)]
    nonzero = np.abs(finite[finite != 0])
    sci = bool(nonzero.size) and (
        nonzero.max() >= 1e8 or nonzero.min() < 0.5 * 10.0 ** (-precision)
    )
    out = []
    for x in flat.tolist():
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
    return [*range(edge), None, *range(n - edge, n)]


def _heat(value: float) -> Style:
    """A background for a probability in [0, 1]: white to deep blue."""
    if not math.isfinite(value):
        return Style()
    t = min(max(value, 0.0), 1.0)
    r, g, b = (int(255 - t * (255 - c)) for c in (33, 102, 172))
    return Style(bgcolor=Color.from_rgb(r, g, b), color="white" if t > 0.55 else "black")


def matrix_table(
    value: np.ndarray,
    *,
    rows: Sequence[str] | None = None,
    cols: Sequence[str] | None = None,
    heatmap: bool = False,
    view: View = View(),
    highlight: np.ndarray | None = None,
) -> Table:
    """One 0-, 1- or 2-D array as a table: labelled rows and columns, elided when large.

    `highlight` (bool, the array's shape) marks cells to stand out, e.g. where two runs differ.
    """
    m = np.atleast_2d(value) if value.ndim < 2 else value
    marked = None if highlight is None else highlight.reshape(m.shape)
    n_rows, n_cols = m.shape
    row_idx = _keep(n_rows, view.max_rows, view.edge, view.full)
    col_idx = _keep(n_cols, view.max_cols, view.edge, view.full)
    shown = m[np.ix_([i for i in row_idx if i is not None], [j for j in col_idx if j is not None])]
    cells = _format_cells(shown, view.precision)
    width = shown.shape[1]
    table = Table()
    table.add_column("", style="bold", no_wrap=True)
    for j in col_idx:
        header = ELLIPSIS if j is None else (cols[j] if cols is not None else str(j))
        table.add_column(header, justify="right", no_wrap=True)
    r = 0
    for i in row_idx:
        if i is None:
            table.add_row(ELLIPSIS, *([ELLIPSIS] * len(col_idx)))
            continue
        label = (
            rows[i] if rows is not None and value.ndim >= 2 else (str(i) if value.ndim >= 2 else "")
        )
        row_cells: list[Text | str] = []
        c = 0
        for j in col_idx:
            if j is None:
                row_cells.append(ELLIPSIS)
                continue
            text = cells[r * width + c]
            if marked is not None and marked[i, j]:
                row_cells.append(Text(text, style=HIGHLIGHT))
            else:
                row_cells.append(Text(text, style=_heat(float(shown[r, c]))) if heatmap else text)
            c += 1
        table.add_row(label, *row_cells)
        r += 1
    return table


def shape_text(shape: Sequence[int]) -> str:
    return " × ".join(str(s) for s in shape) if shape else "scalar"


def titled(title: str, formula: str, shape: Sequence[int], body: RenderableType) -> Group:
    """A table under a one-line title: path, formula and shape (plain text, never markup)."""
    heading = Text.assemble(
        (title, "bold cyan"), "   ", (formula, "italic"), "   ", (f"[{shape_text(shape)}]", "dim")
    )
    return Group(heading, body)


def step_table(step: Step, view: View = View()) -> RenderableType:
    """A step as a table titled with its path, formula and shape (3-D: one table per slice)."""
    heat = step.stage in HEATMAP_STAGES or step.path in HEATMAP_STAGES
    if step.value.ndim <= 2:
        body: RenderableType = matrix_table(
            step.value, rows=step.rows, cols=step.cols, heatmap=heat, view=view
        )
    else:
        parts: list[RenderableType] = []
        for i in _keep(step.value.shape[0], view.max_rows, view.edge, view.full):
            if i is None:
                parts.append(Text(ELLIPSIS))
                continue
            label = f"  ({step.rows[i]})" if step.rows is not None else ""
            parts.append(Text(f"[{i}]{label}", style="bold"))
            parts.append(matrix_table(step.value[i], heatmap=heat, view=view))
        body = Group(*parts)
    return titled(step.path, step.formula, step.shape, body)


def trace_view(steps: Iterable[Step], view: View = View()) -> Group:
    return Group(*(step_table(s, view) for s in steps))


def step_with_inputs(
    step: Step,
    lookup: Mapping[str, Step],
    weights: Mapping[str, np.ndarray],
    view: View = View(),
) -> RenderableType:
    """A step preceded by the inputs it was computed from (steps or weights) and its formula."""
    names = ", ".join(step.inputs) if step.inputs else "the configuration"
    parts: list[RenderableType] = [Text(f"computed from: {names}", style="dim")]
    for name in step.inputs:
        if name in lookup:
            parts.append(step_table(lookup[name], view))
        elif name in weights:
            w = weights[name]
            parts.append(titled(name, "weight", w.shape, matrix_table(w, view=view)))
        elif name != "?":
            parts.append(Text(f"input {name}"))
    parts.append(step_table(step, view))
    return Panel(Group(*parts), title=Text(step.path), title_align="left")


def header(
    title: str, conventions: Sequence[tuple[str, str]], warnings: Sequence[str] = ()
) -> Panel:
    """The conventions in force, so no number is a guess."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for key, value in conventions:
        table.add_row(key, value)
    body: list[RenderableType] = [table]
    for w in warnings:
        body.append(Text(f"warning: {w}", style="bold red"))
    return Panel(Group(*body), title=Text(title or "trace-tf"), title_align="left")


# ---------------------------------------------------------------------------
# JSON (SPEC section 5)
# ---------------------------------------------------------------------------


def json_value(value: Any) -> Any:
    """Nested lists with the non-finite numbers JSON lacks written as strings."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list):
        return [json_value(v) for v in value]
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


def trace_json(
    title: str,
    tokens: Mapping[str, Sequence[str] | None],
    steps: Iterable[Step],
    **extra: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "trace_tf": __version__,
        "title": title,
        "tokens": {k: list(v) for k, v in tokens.items() if v is not None},
        "steps": [step_json(s) for s in steps],
    }
    out.update(extra)
    return out


# ---------------------------------------------------------------------------
# diff: two runs compared step by step
# ---------------------------------------------------------------------------


def _cell(where: Sequence[int] | None) -> str:
    return "" if where is None else "[" + ",".join(str(i) for i in where) + "]"


def _num(x: float, precision: int) -> str:
    return _format_cells(np.array([x]), precision)[0]


def diff_summary(diffs: Sequence[StepDiff], view: View = View()) -> Table:
    """One row per step: its status, the largest |B − A| and where, how many cells differ."""
    from trace_tf.diff import DIFFERS, SAME, SHAPE

    table = Table(title="steps, in A's order (then B's own)", title_justify="left")
    table.add_column("step", no_wrap=True)
    table.add_column("status", overflow="fold")
    table.add_column("max |B−A|", justify="right", no_wrap=True)
    table.add_column("at", no_wrap=True)
    table.add_column("A → B there", overflow="fold")
    table.add_column("cells", justify="right", no_wrap=True)
    style = {SAME: "green", DIFFERS: "bold yellow", SHAPE: "bold red"}
    for d in diffs:
        status = d.status
        if d.status == SHAPE:
            assert d.a is not None and d.b is not None
            status = f"shape {shape_text(d.a.shape)} → {shape_text(d.b.shape)}"
        change = ""
        if d.where is not None and d.a is not None and d.b is not None:
            change = (
                f"{_num(float(d.a.value[d.where]), view.precision)} → "
                f"{_num(float(d.b.value[d.where]), view.precision)}"
            )
        table.add_row(
            d.path,
            Text(status, style=style.get(d.status, "magenta")),
            "" if d.max_abs is None or d.status == SAME else f"{d.max_abs:.3g}",
            _cell(d.where),
            change,
            f"{d.n_differing}/{d.size}" if d.status == DIFFERS else "",
        )
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
    if value.ndim <= 2:
        body: RenderableType = matrix_table(
            value, rows=d.b.rows, cols=d.b.cols, view=view, highlight=d.differing
        )
    else:
        parts: list[RenderableType] = []
        for i in _keep(value.shape[0], view.max_rows, view.edge, view.full):
            if i is None:
                parts.append(Text(ELLIPSIS))
                continue
            parts.append(Text(f"[{i}]", style="bold"))
            parts.append(matrix_table(value[i], view=view, highlight=d.differing[i]))
        body = Group(*parts)
    return Group(heading, body)


def diff_json(d: StepDiff) -> dict[str, Any]:
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
        out["differing"] = [list(map(int, ix)) for ix in np.argwhere(d.differing)]
    return out


def diff_header(a: Mapping[str, Any], b: Mapping[str, Any], verdict: str) -> Panel:
    """Which two runs are compared (file, variant, overrides), and the verdict."""
    import json

    def side(s: Mapping[str, Any]) -> str:
        parts = [str(s["config"])]
        if s.get("variant") is not None:
            parts.append(f"variant {s['variant']}")
        parts.extend(f"{k}={json.dumps(v)}" for k, v in s.get("overrides", {}).items())
        return ", ".join(parts)

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("A", Text(side(a)))
    grid.add_row("B", Text(side(b)))
    grid.add_row("result", Text(verdict))
    return Panel(grid, title="trace-tf diff", title_align="left")
