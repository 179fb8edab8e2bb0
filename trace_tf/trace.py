"""Recording intermediate values: Step, Trace (ordered path -> step) and Tracer.

The engine calls `tr.rec(name, value, formula, *inputs)`, which stores the value
under the current dotted scope and returns it unchanged (TransformerLens'
HookPoint idea, without global state). `NULL_TRACER` records nothing, so the same
functions run untraced. Inputs are named by identity: every array the tracer has
recorded, and every weight it was told about, is known by its path.
"""

from __future__ import annotations

import fnmatch
import math
import re
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from trace_tf.errors import InputError

Labels = Sequence[str] | None


@dataclass(frozen=True)
class Step:
    """One recorded intermediate: where it is, what made it, and its value."""

    path: str
    formula: str
    value: np.ndarray
    inputs: tuple[str, ...] = ()
    rows: tuple[str, ...] | None = None  # a label per row (tokens), when known
    cols: tuple[str, ...] | None = None  # a label per column (key tokens, vocab), when known

    @property
    def stage(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


# Groups of stage names (SPEC section 3), each a predicate on a path.
GROUPS: dict[str, Callable[[str], bool]] = {
    "qkv": lambda p: p.rsplit(".", 1)[-1] in {"q", "k", "v", "q_raw", "k_raw"},
    "add_norm": lambda p: bool(
        re.search(r"(^|\.)(residual|norm|final_norm)(\.(mean|var|rms))?$", p)
    ),
    "ffn": lambda p: ".ffn." in f".{p}.",
    "cross": lambda p: (
        # t<i>. (and b<j>.): a step of generate's iteration i (live beam j)
        bool(re.match(r"^(t\d+\.)?(b\d+\.)?decoder\.\d+\.cross_attn\.", p))
        or p.endswith("cross_mask")
    ),
    "attention": lambda p: (
        bool(re.search(r"(^|\.)(self_attn|cross_attn|attn)\.", p))
        or p.rsplit(".", 1)[-1] in {"mask", "cross_mask"}
    ),
}


class Trace:
    """Every recorded step, in execution order, selectable by stage name or pattern."""

    def __init__(self) -> None:
        self.steps: dict[str, Step] = {}
        self.warnings: list[str] = []
        self.seen: set[str] = set()  # the path of every step recorded, stored or not

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps.values())

    def __len__(self) -> int:
        return len(self.steps)

    def __contains__(self, path: object) -> bool:
        return path in self.steps

    def __getitem__(self, path: str) -> Step:
        return self.steps[path]

    def value(self, path: str) -> np.ndarray:
        return self.steps[path].value

    def stages(self) -> set[str]:
        """The stage names this run has (also those a `keep` filter did not store)."""
        return {s.stage for s in self} | {p.rsplit(".", 1)[-1] for p in self.seen}

    def paths(self) -> set[str]:
        """The path of every step this run recorded, stored or not."""
        return set(self.steps) | self.seen

    def select(
        self, stage: str | None = None, layer: int | None = None, head: int | None = None
    ) -> list[Step]:
        """Steps matching a stage name, a group, or a `*` pattern, and a layer and head."""
        return [s for s in self if matches(s.path, stage, layer, head)]


def matches(path: str, stage: str | None, layer: int | None, head: int | None) -> bool:
    """Whether a step path is selected by a stage (name, group or glob), layer and head."""
    parts = path.split(".")
    if stage is not None:
        if "*" in stage or "?" in stage:
            if not fnmatch.fnmatchcase(path, stage):
                return False
        elif stage in GROUPS:
            if not GROUPS[stage](path):
                return False
        elif parts[-1] != stage and path != stage:
            return False
    if layer is not None and str(layer) not in parts:
        return False
    return head is None or f"h{head}" in parts


def check_stage(stage: str, known: set[str]) -> None:
    """Refuse a stage name that can select nothing, suggesting the nearest."""
    import difflib

    if "*" in stage or "?" in stage or stage in GROUPS or stage in known:
        return
    names = sorted(known | set(GROUPS))
    near = difflib.get_close_matches(stage, names, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise InputError(
        f"unknown stage {stage!r}{hint}",
        expected="a stage name, a group (" + ", ".join(GROUPS) + ") or a pattern with *",
        found=repr(stage),
    )


class _Recorded(NamedTuple):
    """What the tracer remembers of every step, stored or not: where and how it was
    made, and a weak reference that tells whether an array is still that step's.
    (A tuple: one is made per step, and tuples are made fast.)"""

    ref: weakref.ref[np.ndarray]
    path: str
    formula: str
    inputs: tuple[str, ...]
    rows: tuple[str, ...] | None
    cols: tuple[str, ...] | None

    def step(self, value: np.ndarray) -> Step:
        return Step(self.path, self.formula, value, self.inputs, self.rows, self.cols)


@dataclass
class Tracer:
    """Records steps under a dotted scope; `rec` returns its value unchanged.

    With `keep`, only the steps it accepts are stored; with `with_inputs` too,
    the steps they were computed from (so each can be shown with its inputs): an
    input is still alive when a step made from it is recorded, so it is stored
    then. Nothing else is held, and nothing is copied.
    """

    trace: Trace = field(default_factory=Trace)
    names: dict[int, str] = field(default_factory=dict)  # id(weight) -> path, for inputs
    keep: Callable[[str], bool] | None = None  # store only the steps this accepts
    with_inputs: bool = False  # ... and, with `keep`, the steps those were computed from
    _recorded: dict[int, _Recorded] = field(default_factory=dict)  # id(value) -> its step
    _scope: list[str] = field(default_factory=list)
    _rows: list[Labels] = field(default_factory=list)
    _keys: list[Labels] = field(default_factory=list)
    _nonfinite_seen: bool = False

    enabled = True

    def name(self, array: np.ndarray, path: str) -> None:
        """Let steps computed from `array` (a weight, say) name it as an input."""
        self.names[id(array)] = path

    def name_all(self, arrays: Mapping[str, np.ndarray]) -> None:
        for path, array in arrays.items():
            self.name(array, path)

    @contextmanager
    def scope(
        self, name: str | int | None, rows: Labels = None, keys: Labels = None
    ) -> Iterator[None]:
        """Enter a part of the model (`name` None: no path part); `rows`/`keys` label
        the query and key positions inside it."""
        if name is not None:
            self._scope.append(str(name))
        self._rows.append(rows)
        self._keys.append(keys)
        try:
            yield
        finally:
            if name is not None:
                self._scope.pop()
            self._rows.pop()
            self._keys.pop()

    def path(self, name: str) -> str:
        return ".".join([*self._scope, name])

    def _current(self, stack: list[Labels]) -> tuple[str, ...] | None:
        for labels in reversed(stack):
            if labels is not None:
                return tuple(labels)
        return None

    def _step_of(self, array: Any) -> _Recorded | None:
        """The recorded step `array` is, if any (an id alone may be a dead array's)."""
        rec = self._recorded.get(id(array))
        return rec if rec is not None and rec.ref() is array else None

    def rec(
        self,
        name: str,
        value: np.ndarray,
        formula: str,
        *inputs: Any,
        cols: Labels | str = None,
        rows: Labels | str = None,
    ) -> np.ndarray:
        """Record `value` as step `name` in the current scope and return it unchanged.

        `cols="keys"` labels the columns with the key tokens of the current scope;
        `rows="keys"` the rows (K and V: one row per key).
        """
        path = self.path(name)
        value.flags.writeable = False  # the engine never writes in place; make sure of it
        if not self._nonfinite_seen and value.dtype.kind == "f" and not _all_finite(value):
            self._check_nonfinite(name, path, value)
        if rows is None or isinstance(rows, str):
            row_labels = self._current(self._keys if rows == "keys" else self._rows)
        else:
            row_labels = tuple(rows)
        col_labels = self._current(self._keys) if cols == "keys" else cols
        if row_labels is not None and (value.ndim < 1 or len(row_labels) != value.shape[0]):
            row_labels = None
        if col_labels is not None and (value.ndim < 2 or len(col_labels) != value.shape[-1]):
            col_labels = None
        made = [self._step_of(x) for x in inputs]  # before `value` is registered: it may be one
        names = [
            m.path if m is not None else self.names.get(id(x), "?")
            for m, x in zip(made, inputs, strict=True)
        ]
        rec = _Recorded(
            weakref.ref(value),
            path,
            formula,
            tuple(names),
            row_labels,
            tuple(col_labels) if col_labels is not None else None,
        )
        self._recorded[id(value)] = rec
        self.trace.seen.add(path)
        if self.keep is None:
            self.trace.steps[path] = rec.step(value)
        elif self.keep(path):
            for m, x in zip(made, inputs, strict=True):  # shown beside it: store them while alive
                if self.with_inputs and m is not None and m.path not in self.trace.steps:
                    self.trace.steps[m.path] = m.step(x)
            self.trace.steps[path] = rec.step(value)
        return value

    def _check_nonfinite(self, name: str, path: str, value: np.ndarray) -> None:
        """Report the first step where a NaN, or an infinity that is not a mask, appears."""
        if np.isnan(value).any():
            rows = sorted({int(i) for i in np.argwhere(np.isnan(value))[:, 0]})
            why = " (a fully masked row has no softmax)" if name == "softmax" else ""
            self._nonfinite_seen = True
            self.warn(f"NaN first appears in step {path}, row(s) {rows}{why}")
        elif name not in {"mask", "cross_mask", "masked"}:
            self._nonfinite_seen = True
            self.warn(f"overflow: an infinity first appears in step {path}")

    def warn(self, message: str) -> None:
        self.trace.warnings.append(message)


def _all_finite(value: np.ndarray) -> bool:
    """No NaN or infinity in `value`. The sum is one quick pass with no temporary
    array: it is finite unless something is not (or the finite numbers overflow it)."""
    return math.isfinite(value.sum()) or bool(np.isfinite(value).all())


class NullTracer(Tracer):
    """Records nothing: the engine runs at full speed, untraced."""

    enabled = False

    def rec(
        self,
        name: str,
        value: np.ndarray,
        formula: str,
        *inputs: Any,
        cols: Labels | str = None,
        rows: Labels | str = None,
    ) -> np.ndarray:
        return value

    @contextmanager
    def scope(
        self, name: str | int | None, rows: Labels = None, keys: Labels = None
    ) -> Iterator[None]:
        yield

    def name(self, array: np.ndarray, path: str) -> None:
        return None


NULL_TRACER = NullTracer()
