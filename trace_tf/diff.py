"""Two traces side by side: where, and by how much, they differ, step by step.

Pure: traces in, `StepDiff`s out. Cells are compared as `check` compares them
(runner.abs_difference): equal infinities and NaN against NaN are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trace_tf.runner import abs_difference
from trace_tf.text import counted, exact
from trace_tf.trace import Step, Trace

SAME, DIFFERS, SHAPE, ONLY_A, ONLY_B = "same", "differs", "shape", "only in A", "only in B"


@dataclass(frozen=True)
class StepDiff:
    """One step compared: its status, and for a difference, the largest and where."""

    path: str
    status: str  # SAME | DIFFERS | SHAPE | ONLY_A | ONLY_B
    a: Step | None
    b: Step | None
    max_abs: float | None = None  # largest |B − A| (same shape only)
    where: tuple[int, ...] | None = None  # the cell of the largest difference
    differing: np.ndarray | None = None  # bool per cell: |B − A| > atol
    delta: np.ndarray | None = None  # B − A

    @property
    def n_differing(self) -> int:
        return int(self.differing.sum()) if self.differing is not None else 0

    @property
    def size(self) -> int:
        step = self.a or self.b
        assert step is not None
        return int(step.value.size)


def compare_steps(a: Step, b: Step, atol: float) -> StepDiff:
    """Compare one step present on both sides."""
    if a.shape != b.shape:
        return StepDiff(a.path, SHAPE, a, b)
    diff = abs_difference(b.value, a.value)
    differing = diff > atol
    if not differing.any():
        return StepDiff(a.path, SAME, a, b, float(diff.max()) if diff.size else 0.0)
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    with np.errstate(invalid="ignore", over="ignore"):
        delta = b.value - a.value
    return StepDiff(a.path, DIFFERS, a, b, float(diff.max()), where, differing, delta)


def compare(
    a: Trace, b: Trace, atol: float = 0.0, keep: Callable[[str], bool] | None = None
) -> list[StepDiff]:
    """Every step of A in order (compared with B's step of the same path), then B's own."""
    out: list[StepDiff] = []
    for step in a:
        if keep is not None and not keep(step.path):
            continue
        other = b.steps.get(step.path)
        out.append(
            compare_steps(step, other, atol) if other else StepDiff(step.path, ONLY_A, step, None)
        )
    for step in b:
        if step.path not in a.steps and (keep is None or keep(step.path)):
            out.append(StepDiff(step.path, ONLY_B, None, step))
    return out


def first_difference(diffs: list[StepDiff]) -> StepDiff | None:
    """The earliest step (in A's order) where the runs part ways."""
    return next((d for d in diffs if d.status != SAME), None)


def verdict(diffs: list[StepDiff], atol: float, listed_same: bool = False) -> str:
    """One line: identical, or where the runs part and how many steps are in each state."""
    first = first_difference(diffs)
    if first is None:
        every = "the 1 step agrees" if len(diffs) == 1 else f"all {len(diffs)} steps agree"
        return f"identical: {every} within atol {exact(atol)}"
    words = {DIFFERS: "differ", SHAPE: "change shape", ONLY_A: "only in A", ONLY_B: "only in B"}
    one = {DIFFERS: "differs", SHAPE: "changes shape"}  # the verb of a count of 1
    counts = [
        (n, one.get(s, w) if n == 1 else w)
        for s, w in words.items()
        if (n := sum(d.status == s for d in diffs))
    ]
    n_same = sum(d.status == SAME for d in diffs)
    same = f"{n_same} the same" + ("" if listed_same else " (list them with --all)")
    return (
        f"first difference: {first.path} ({first.status}); of {counted(len(diffs), 'step')} "
        + ", ".join([*(f"{n} {w}" for n, w in counts), same])
        + f" (atol {exact(atol)})"
    )
