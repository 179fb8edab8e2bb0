"""Matrix grids (render.Grid): laid out by trace-tf, measured as they are drawn."""

from __future__ import annotations

import io

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
