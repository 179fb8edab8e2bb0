"""Two runs side by side: where, and by how much, they differ, step by step, and
which of the weights they read differ.

Pure: traces (configs) in, `StepDiff`s (`WeightDiff`s) out. Cells are compared as
`check` compares them (runner.abs_difference): equal infinities and NaN against NaN
are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from trace_tf.config import Config, Source
from trace_tf.runner import abs_difference, named_arrays
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
    b_index: int | None = None  # a step only in B: its place among B's compared steps

    @property
    def n_differing(self) -> int:
        return int(self.differing.sum()) if self.differing is not None else 0

    @property
    def size(self) -> int:
        step = self.a or self.b
        assert step is not None
        return int(step.value.size)


_BATCH_CELLS = 1 << 16  # steps or weights of one shape compared together, up to this many cells


def _compare_alike(
    pairs: Sequence[tuple[Step, Step]], atol: float, delta: bool = True
) -> list[StepDiff]:
    """Compare pairs of steps present on both sides, all of one shape, stacked: a few
    numpy calls for them all (a vocabulary's 50,000 embeddings), not a few each.
    `delta`: keep B − A of those that differ (for `--delta`'s tables)."""
    if len(pairs) == 1:  # (a large one, not copied)
        a, b = pairs[0][0].value[np.newaxis], pairs[0][1].value[np.newaxis]
    else:  # [n, *shape]
        a, b = np.stack([x.value for x, _ in pairs]), np.stack([y.value for _, y in pairs])
    shape = a.shape[1:]
    diff = abs_difference(b, a).reshape(len(pairs), -1)  # one row per pair
    if not diff.shape[1]:  # (no cells: nothing to differ)
        return [StepDiff(x.path, SAME, x, y, 0.0) for x, y in pairs]
    differing = diff > atol
    parted = np.asarray(differing.any(axis=1))
    most, at = diff.max(axis=1), diff.argmax(axis=1)
    deltas = None
    if delta and parted.any():
        with np.errstate(invalid="ignore", over="ignore"):
            deltas = b - a
    out = []
    for k, (x, y) in enumerate(pairs):
        if not parted[k]:
            out.append(StepDiff(x.path, SAME, x, y, float(most[k])))
            continue
        where = tuple(int(i) for i in np.unravel_index(int(at[k]), shape))
        cells = differing[k].reshape(shape)
        d = deltas[k] if deltas is not None else None
        out.append(StepDiff(x.path, DIFFERS, x, y, float(most[k]), where, cells, d))
    return out


def compare(
    a: Trace, b: Trace, atol: float = 0.0, keep: Callable[[str], bool] | None = None
) -> list[StepDiff]:
    """Every step of A in order (compared with B's step of the same path), then B's own."""
    return _compare(a.steps, b.steps, atol, keep)


def _compare(
    a: Mapping[str, Step],
    b: Mapping[str, Step],
    atol: float,
    keep: Callable[[str], bool] | None = None,
    delta: bool = True,
) -> list[StepDiff]:
    """`compare` of steps by path. Those of one shape are compared in batches of up to
    _BATCH_CELLS cells (see _compare_alike, and for `delta`); a larger one on its own,
    uncopied."""
    out: list[StepDiff | None] = []
    batches: dict[tuple[int, ...], list[tuple[int, Step, Step]]] = {}

    def flush(shape: tuple[int, ...]) -> None:
        batch = batches.pop(shape)
        done = _compare_alike([(x, y) for _, x, y in batch], atol, delta)
        for (i, _, _), d in zip(batch, done, strict=True):
            out[i] = d

    for path, step in a.items():
        if keep is not None and not keep(path):
            continue
        other = b.get(path)
        if other is None:
            out.append(StepDiff(path, ONLY_A, step, None))
        elif other.shape != step.shape:
            out.append(StepDiff(path, SHAPE, step, other))
        else:
            batch = batches.setdefault(step.shape, [])
            batch.append((len(out), step, other))
            out.append(None)  # (until its batch is compared)
            if len(batch) * step.value.size >= _BATCH_CELLS:
                flush(step.shape)
    for shape in list(batches):
        flush(shape)
    kept_b = (path for path in b if keep is None or keep(path))
    for j, path in enumerate(kept_b):
        if path not in a:
            out.append(StepDiff(path, ONLY_B, None, b[path], b_index=j))
    return [d for d in out if d is not None]


@dataclass(frozen=True)
class WeightDiff:
    """One weight the two runs read, compared cell by cell as a step is (`cells`), with
    where A's numbers and B's came from (Config.sources; None on the side without it)."""

    cells: StepDiff
    source_a: Source | None
    source_b: Source | None

    @property
    def path(self) -> str:
        return self.cells.path

    @property
    def status(self) -> str:
        return self.cells.status


def compare_weights(a: Config, b: Config, atol: float = 0.0) -> list[WeightDiff]:
    """Every weight A's model reads, in A's order (runner.named_arrays: embeddings,
    then the layers', the tied output weight as TIED_OUTPUT), compared with B's of the
    same key path, then those only B reads. One pass over each side: linear in the
    number of weights and of their cells (a vocabulary may hold 50,000 embeddings)."""

    def weights(cfg: Config) -> dict[str, Step]:
        return {k: Step(k, "weight", v) for k, v in named_arrays(cfg).items()}

    return [  # (without B − A: a model's weights may hold millions of cells)
        WeightDiff(
            d,
            a.sources.get(d.path) if d.a is not None else None,
            b.sources.get(d.path) if d.b is not None else None,
        )
        for d in _compare(weights(a), weights(b), atol, delta=False)
    ]


def weights_verdict(diffs: list[WeightDiff], atol: float) -> str:
    """One line: how many of the weights differ, or that none does."""
    differing = sum(d.status != SAME for d in diffs)
    if not differing:
        every = "the 1 weight agrees" if len(diffs) == 1 else f"all {len(diffs):,} weights agree"
        return f"no weight differs: {every} within atol {exact(atol)}"
    return (
        f"weights that differ: {differing:,} of {len(diffs):,} read by A or B"
        f" (atol {exact(atol)}), in A's order (then B's own)"
    )


def first_difference(diffs: list[StepDiff]) -> StepDiff | None:
    """The step where the runs part ways: the earliest of A's that differs (A's steps
    come first in `diffs`, in A's order), unless B computes a step of its own at or
    before that place in its run (a mask a pad brings, a PE that A's RoPE has not, a
    score function's extra product): that one, as A's own steps are named where A
    computes them."""
    first_a = next(((i, d) for i, d in enumerate(diffs) if d.status not in (SAME, ONLY_B)), None)
    own_b = next((d for d in diffs if d.status == ONLY_B), None)
    if own_b is None or own_b.b_index is None:
        return first_a[1] if first_a else None
    if first_a is None:
        return own_b
    i, d = first_a
    if own_b.b_index < i or (own_b.b_index == i and d.status != ONLY_A):
        return own_b
    return d


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
