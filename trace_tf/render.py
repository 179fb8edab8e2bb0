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
    from trace_tf.cost import Cost, Totals, VaryRow

HEATMAP_STAGES = {"softmax", "probs", "attn.softmax"}
ELLIPSIS = "…"


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
) -> Table:
    """One 0-, 1- or 2-D array as a table: labelled rows and columns, elided when large."""
    m = np.atleast_2d(value) if value.ndim < 2 else value
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
            parts.append(Text(f"[{i}]", style="bold"))
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
        if value.dtype.kind != "f" or np.isfinite(value).all():
            return value.tolist()  # nothing to rewrite: skip the walk over every number
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


def cost_ledger(costs: Iterable[Cost]) -> Table:
    """Every step with its shape and multiply-adds (formula in symbols and in numbers)."""
    table = Table(title="multiply-adds of every step", title_justify="left")
    table.add_column("step", no_wrap=True)
    table.add_column("shape", justify="right", no_wrap=True)
    table.add_column("multiply-adds")
    table.add_column("count", justify="right", no_wrap=True)
    for c in costs:
        terms = " = " + "·".join(str(t) for t in c.terms) if c.terms else ""
        table.add_row(c.path, shape_text(c.shape), c.formula + terms, _count(c.macs))
    return table


def cost_totals(totals: Totals, growth: Mapping[str, str]) -> Table:
    """Multiply-adds per stage and per kind, and the total."""
    table = Table(title="totals", title_justify="left")
    table.add_column("stage or kind")
    table.add_column("multiply-adds", justify="right")
    table.add_column("share", justify="right")
    table.add_column("grows as")
    total = totals.total or 1
    for stage, n in totals.by_stage.items():
        table.add_row(stage, f"{n:,}", f"{n / total:.1%}", "")
    table.add_section()
    for kind, n in totals.by_kind.items():
        if n:
            table.add_row(Text(kind, style="bold"), f"{n:,}", f"{n / total:.1%}", growth[kind])
    table.add_section()
    table.add_row(Text("total", style="bold"), f"{totals.total:,}", "100%", "")
    return table


def vary_table(name: str, what: str, rows: Sequence[VaryRow], kinds: Sequence[str]) -> Table:
    """One row per value of L or D: multiply-adds per kind, predicted beside measured time."""
    table = Table(
        title=f"multiply-adds as {name}, the {what}, grows",
        caption="Multiply-adds to 3 digits (k = 10³, M = 10⁶, G = 10⁹; exact in --format json). "
        "pred. ms: the largest row's measured time scaled by multiply-adds; meas. ms: "
        "the untraced engine, fastest of the runs. On small models Python's fixed cost per "
        "step, not arithmetic, dominates the measured time.",
        title_justify="left",
        caption_justify="left",
    )
    short = {"projection": "proj", "attention": "attn", "ffn": "ffn", "output": "output"}
    shown = [k for k in kinds if any(r.by_kind[k] for r in rows)]
    for col in (name, *(short[k] for k in shown), "total", "attn %", "pred. ms", "meas. ms"):
        table.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    for r in rows:
        share = r.by_kind.get("attention", 0) / r.total if r.total else 0.0
        table.add_row(
            str(r.value),
            *(_si(r.by_kind[k]) for k in shown),
            _si(r.total),
            f"{share:.1%}",
            f"{r.predicted * 1e3:.3f}",
            f"{r.measured * 1e3:.3f}",
        )
    return table


def _si(n: int) -> str:
    """A count to 3 significant digits with k, M, G, T (exact below 10,000)."""
    if n < 10_000:
        return f"{n:,}"
    for power, prefix in ((12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if n >= 10**power:
            return f"{n / 10**power:.3g}{prefix}"
    return str(n)  # pragma: no cover
