"""Recording intermediate values: Step, Trace (ordered path -> step) and Tracer.

The engine calls `tr.rec(name, value, formula, *inputs)`, which stores the value
under the current dotted scope and returns the array to go on with, equal to it
(TransformerLens' HookPoint idea, without global state). `NULL_TRACER` records nothing, so the same
functions run untraced. Inputs are named by identity: every array the tracer has
recorded, and every weight it was told about, is known by its path.
"""

from __future__ import annotations

import fnmatch
import math
import re
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, overload

import numpy as np

from trace_tf.errors import InputError, quoted

Labels = Sequence[str] | None


@dataclass(frozen=True, eq=False)  # it holds an array: equal only if identical
class Shown:
    """Part of an array: its numbers at some indices of each axis, and the whole
    array's shape. What a table shows of a step (render.View.part), stored instead of
    the step when a run is shown only as tables (Tracer.part): the engine's array is
    then freed as in an untraced run, and a trace of 200 MiB keeps a few hundred KiB.

    Indexed as the array is, at the indices it kept: `shown[i]` (a Shown of the
    other axes) and `shown[np.ix_(rows, cols)]` (those numbers); any other index
    is an error, never a number that was not kept."""

    shape: tuple[int, ...]
    kept: tuple[np.ndarray, ...]  # along each axis, the indices kept, in order
    values: np.ndarray  # the numbers there: whole[np.ix_(*kept)]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def as_matrix(self) -> Shown:
        """A 1-D part as a matrix of one row, as np.atleast_2d makes one."""
        if self.ndim >= 2:
            return self
        return Shown((1, *self.shape), (np.zeros(1, np.intp), *self.kept), self.values[None])

    def _at(self, axis: int, index: Any) -> Any:
        """Where the array's `index` (an int or an array of them) along `axis` is kept."""
        kept = self.kept[axis]
        at = np.searchsorted(kept, index)
        if not np.all((at < kept.size) & (kept[np.minimum(at, kept.size - 1)] == index)):
            raise IndexError(f"index {index} along axis {axis} was not kept")
        return at

    @overload
    def __getitem__(self, key: int) -> Shown: ...
    @overload
    def __getitem__(self, key: tuple[np.ndarray, ...]) -> np.ndarray: ...
    def __getitem__(self, key: int | tuple[np.ndarray, ...]) -> Shown | np.ndarray:
        if isinstance(key, tuple):
            return self.values[tuple(self._at(axis, k) for axis, k in enumerate(key))]
        return Shown(self.shape[1:], self.kept[1:], self.values[self._at(0, key)])


@dataclass(frozen=True, eq=False)  # it holds an array: equal only if identical
class Step:
    """One recorded intermediate: where it is, what made it, and its value (`data`:
    the array, or, in a run shown only as tables, the part of it its table shows)."""

    path: str
    formula: str
    data: np.ndarray | Shown
    inputs: tuple[str, ...] = ()
    rows: tuple[str, ...] | None = None  # a label per row (tokens), when known
    cols: tuple[str, ...] | None = None  # a label per column (key tokens, vocab), when known

    @property
    def value(self) -> np.ndarray:
        """The whole array; an error for a step stored as the part its table shows."""
        if isinstance(self.data, Shown):
            raise TypeError(f"step {self.path} was stored as the part its table shows")
        return self.data

    @property
    def stage(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)


# Groups of stage names (SPEC section 3), each a predicate on a path.
GROUPS: dict[str, Callable[[str], bool]] = {
    "qkv": lambda p: (
        p.rsplit(".", 1)[-1] in {"q", "k", "v", "q_raw", "k_raw", "q_norm", "k_norm"}
        or bool(re.search(r"\.h\d+\.(q|k|q_norm|k_norm)\.(mean|var|rms)$", p))  # QK-norm's
        or bool(re.search(r"_attn\.(q_norm|k_norm)\.(mean|var|rms)$", p))  # projection's
    ),
    # ... and every step of the norm calculator, as `attention` holds attend's
    "add_norm": lambda p: bool(
        re.search(r"(^|\.)(residual|norm|post_norm|embed_norm|final_norm)(\.(mean|var|rms))?$", p)
        or p.startswith("norm.")
    ),
    "ffn": lambda p: ".ffn." in f".{p}.",
    # Everything under decoder.<l>.cross_attn (SPEC section 3), and only that: the mask
    # it reads, decoder.cross_mask, is the decoder's (`--stage cross_mask` selects it).
    # t<i>. (and b<j>.): a step of generate's iteration i (live beam j).
    "cross": lambda p: bool(re.match(r"^(t\d+\.)?(b\d+\.)?decoder\.\d+\.cross_attn\.", p)),
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
        # the paths of steps recorded but not stored (`keep`), in the order recorded
        self.unstored: dict[str, None] = {}
        # A KV-cached K or V (generate): by its path, the scope each row was computed in
        # ("t1.decoder.0.self_attn.h0."; its own scope for the new rows).
        self.computed_in: dict[str, tuple[str, ...]] = {}
        # generate --sample: its temperature, top_k and top_p (what t<i>.sample.* used)
        self.sampling: dict[str, float | None] = {}

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
        return {s.stage for s in self} | {p.rsplit(".", 1)[-1] for p in self.unstored}

    def paths(self) -> set[str]:
        """The path of every step this run recorded, stored or not."""
        return set(self.steps) | self.unstored.keys()

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


def check_stage(stage: str, known: set[str], config: str = "this config") -> None:
    """Refuse a stage name that can select nothing: a stage of the registry that
    `config` does not record (saying what would record it), or an unknown name
    (suggesting the nearest: one `known`, else one of the registry)."""
    import difflib

    from trace_tf.stages import STAGES

    if "*" in stage or "?" in stage or stage in GROUPS or stage in known:
        return
    registered = [s for s in STAGES if s.name == stage]
    if registered:
        appears = next((s.appears for s in registered if s.appears), "")
        raise InputError(
            f"stage {quoted(stage)} exists, but it is not recorded by {config}"
            + (f" (it appears {appears})" if appears else ""),
            expected=f"a stage recorded by {config} (`trace-tf stages` explains each)",
            found=quoted(stage),
        )
    # the nearest name this config records, else the nearest of the registry
    near = difflib.get_close_matches(stage, sorted(known | set(GROUPS)), n=1)
    near = near or difflib.get_close_matches(stage, sorted({s.name for s in STAGES}), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise InputError(
        f"unknown stage {quoted(stage)}{hint}",
        expected="a stage name, a group (" + ", ".join(GROUPS) + ") or a pattern with *",
        found=quoted(stage),
    )


_LAYER = re.compile(r"(?:^|\.)(encoder|decoder)\.(\d+)\.")
_HEAD = re.compile(r"(?:^|\.)h(\d+)(?:\.|$)")


def _layers(paths: Iterable[str]) -> dict[str, set[int]]:
    """The layers each stack has among `paths`, encoder first."""
    found: dict[str, set[int]] = {"encoder": set(), "decoder": set()}
    for p in paths:
        m = _LAYER.search(p)
        if m:
            found[m.group(1)].add(int(m.group(2)))
    return {stack: layers for stack, layers in found.items() if layers}


def _heads(paths: Iterable[str]) -> set[int]:
    return {int(m.group(1)) for p in paths if (m := _HEAD.search(p))}


def _listed(numbers: set[int]) -> str:
    return ", ".join(str(n) for n in sorted(numbers))


def check_selection(trace: Trace, stage: str | None, layer: int | None, head: int | None) -> None:
    """Refuse a selection (--stage, --layer, --head) that selects no step `trace`
    recorded, saying why: an unknown stage, or one this config does not record; a
    layer or head the model does not have; a stage with no layer or head, or none
    of that number. `step` and `generate --trace` both check with this."""
    from trace_tf.stages import STAGES

    paths = trace.paths()
    if stage is not None:
        check_stage(stage, trace.stages() | paths)  # a name, or one whole path
    if any(matches(p, stage, layer, head) for p in paths):
        return
    what = " ".join(
        f"--{option} {value}"
        for option, value in (("stage", stage), ("layer", layer), ("head", head))
        if value is not None
    )
    nothing = f"no step matches {what}"
    model_layers = _layers(paths)
    if layer is not None and not any(layer in ls for ls in model_layers.values()):
        if not model_layers:
            raise InputError(
                f"{nothing}: this config has no layers", expected="no --layer", found=str(layer)
            )
        top = max(max(ls) for ls in model_layers.values())
        counts = [f"{max(ls) + 1} {stack}" for stack, ls in model_layers.items()]
        several = any(max(ls) > 0 for ls in model_layers.values())  # "layers" then
        raise InputError(
            f"{nothing}: the model has no layer {layer}",
            expected=f"a layer from 0 to {top} ("
            + " + ".join(counts)
            + (" layers)" if several else " layer)"),
            found=str(layer),
        )
    model_heads = _heads(paths)
    if head is not None and head not in model_heads:
        if not model_heads:
            raise InputError(
                f"{nothing}: this config has no attention heads",
                expected="no --head",
                found=str(head),
            )
        n = max(model_heads) + 1
        raise InputError(
            f"{nothing}: the model has no head {head}",
            expected=f"a head from 0 to {n - 1} ({n} head{'s' if n > 1 else ''} per attention block)",
            found=str(head),
        )
    selected = [p for p in paths if matches(p, stage, None, None)]
    if stage is not None and selected and layer is not None:
        stage_layers = set().union(*_layers(selected).values())
        if not stage_layers:
            outside = [
                s.name
                for s in STAGES
                if not any("<l>" in p for p in s.paths)
                and any(not p.startswith(("attn.", "norm.")) and p != "pe" for p in s.paths)
            ]
            raise InputError(
                f"{nothing}: the steps --stage {stage} selects are outside the layers",
                expected=f"--stage {stage} without --layer ("
                + ", ".join(dict.fromkeys(outside))
                + " have no layer)",
                found=f"--layer {layer}",
            )
        if layer not in stage_layers:
            raise InputError(
                f"{nothing}: --stage {stage} is recorded in layer {_listed(stage_layers)} only",
                expected=f"a layer in which --stage {stage} is recorded",
                found=str(layer),
            )
        selected = [p for p in selected if matches(p, None, layer, None)]
    stage_heads = _heads(selected)
    if stage is not None and selected and head is not None and head not in stage_heads:
        if not stage_heads:
            per_head = [s.name for s in STAGES if any("h<n>" in p for p in s.paths)]
            raise InputError(
                f"{nothing}: the steps --stage {stage} selects are not per head",
                expected=f"--stage {stage} without --head, or a per-head stage ("
                + ", ".join(per_head)
                + ")",
                found=f"--head {head}",
            )
        raise InputError(
            f"{nothing}: --stage {stage} is recorded in head {_listed(stage_heads)} only",
            expected=f"a head in which --stage {stage} is recorded",
            found=str(head),
        )
    raise InputError(
        nothing,
        expected="a group or pattern that matches a step this model computes "
        "(`trace-tf stages` lists them)",
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

    def step(self, data: np.ndarray | Shown) -> Step:
        return Step(self.path, self.formula, data, self.inputs, self.rows, self.cols)


class _Blocks:
    """Where a tracer stores the arrays it keeps: copied, each once, into large
    blocks filled in order, instead of left in thousands of separate allocations.

    A kept array would otherwise hold its memory for the whole run, so every new
    array the engine makes would need fresh memory, page by page. Copied, the
    engine's array is freed at once and its memory reused as in an untraced run,
    and a block of 4 MiB or more is one numpy allocation that numpy asks Linux to
    back with huge pages (where transparent huge pages are on): for the large
    benchmark model, about 2,000 page faults where there were 47,000. Blocks grow
    from 4 MiB to 32 MiB, so a small trace takes little and a large one wastes
    less than one block.
    """

    FIRST, LARGEST = 4 << 20, 32 << 20
    SMALLEST_COPIED = 4096  # smaller arrays come from malloc's reused small chunks

    def __init__(self) -> None:
        self._block = np.empty(0, np.uint8)
        self._used = 0
        self._next = self.FIRST

    def store(self, value: np.ndarray) -> np.ndarray:
        """`value`, or a copy of it in a block (a view is kept as it is)."""
        n = value.nbytes
        if n < self.SMALLEST_COPIED or value.base is not None or not value.flags.c_contiguous:
            return value
        if self._used + n > self._block.size:
            self._block = np.empty(max(self._next, n) + 64, np.uint8)
            self._used = -self._block.ctypes.data % 64  # each array starts 64-byte aligned
            self._next = min(2 * self._next, self.LARGEST)
        out = np.ndarray(value.shape, value.dtype, self._block, self._used)
        self._used += -(-n // 64) * 64
        np.copyto(out, value)
        return out


@dataclass(eq=False)
class Tracer:
    """Records steps under a dotted scope; `rec` returns the value to go on with.

    With `keep`, only the steps it accepts are stored; with `with_inputs` too,
    the steps they were computed from (so each can be shown with its inputs): an
    input is still alive when a step made from it is recorded, so it is stored
    then. Nothing else is held. A stored step is copied once, into the tracer's
    blocks (see `_Blocks`), and `rec` returns that copy, equal to the value; with
    `part` (a run shown only as tables), what `part` makes of it is stored instead
    (the numbers its table shows: render.View.part), and `rec` returns the value.
    """

    trace: Trace = field(default_factory=Trace)
    names: dict[int, str] = field(default_factory=dict)  # id(weight) -> path, for inputs
    keep: Callable[[str], bool] | None = None  # store only the steps this accepts
    with_inputs: bool = False  # ... and, with `keep`, the steps those were computed from
    part: Callable[[np.ndarray], np.ndarray | Shown] | None = None  # what of a step to store
    _recorded: dict[int, _Recorded] = field(default_factory=dict)  # id(value) -> its step
    _blocks: _Blocks = field(default_factory=_Blocks)
    # The current scope: its path prefix ("encoder.0.self_attn.") and the labels of
    # its query and key positions, each a stack, innermost last.
    _prefix: list[str] = field(default_factory=lambda: [""])
    _rows: list[tuple[str, ...] | None] = field(default_factory=lambda: [None])
    _keys: list[tuple[str, ...] | None] = field(default_factory=lambda: [None])
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
        prefix = self._prefix[-1]
        self._prefix.append(prefix if name is None else f"{prefix}{name}.")
        self._rows.append(self._rows[-1] if rows is None else tuple(rows))
        self._keys.append(self._keys[-1] if keys is None else tuple(keys))
        try:
            yield
        finally:
            self._prefix.pop()
            self._rows.pop()
            self._keys.pop()

    def path(self, name: str) -> str:
        return self._prefix[-1] + name

    def row_labels(self) -> tuple[str, ...] | None:
        """The labels of the current scope's rows (its tokens), when known."""
        return self._rows[-1]

    def rec(
        self,
        name: str,
        value: np.ndarray,
        formula: str,
        *inputs: Any,
        cols: Labels | str = None,
        rows: Labels | str = None,
    ) -> np.ndarray:
        """Record `value` as step `name` in the current scope and return the array to
        go on with: `value` itself, or its stored copy (equal, read-only).

        `cols="keys"` labels the columns with the key tokens of the current scope;
        `rows="keys"` the rows (K and V: one row per key).
        """
        path = self._prefix[-1] + name
        if not self._nonfinite_seen and value.dtype.kind == "f" and not _all_finite(value):
            self._check_nonfinite(name, path, value, inputs)
        shape = value.shape
        if rows is None or isinstance(rows, str):
            row_labels = (self._keys if rows == "keys" else self._rows)[-1]
        else:
            row_labels = tuple(rows)
        if row_labels is not None and (not shape or len(row_labels) != shape[0]):
            row_labels = None
        col_labels = self._keys[-1] if cols == "keys" else cols
        if col_labels is not None:
            col_labels = (
                tuple(col_labels) if len(shape) >= 2 and len(col_labels) == shape[-1] else None
            )
        # Name the inputs (before `value` is registered: it may be one of them).
        made: list[tuple[_Recorded, Any]] = []  # the inputs that are recorded steps
        names: list[str] = []
        for x in inputs:
            m = self._recorded.get(id(x))
            if m is not None and m.ref() is x:  # (an id alone may be a dead array's)
                made.append((m, x))
                names.append(m.path)
            else:
                names.append(self.names.get(id(x), "?"))
        stored = self.keep is None or self.keep(path)
        if stored:
            if self.with_inputs and self.keep is not None:
                for m, x in made:  # shown beside it: store them while they are alive
                    if m.path not in self.trace.steps:
                        self.trace.steps[m.path] = m.step(self._kept(x))
            if self.part is None:
                value = self._blocks.store(value)
        else:
            self.trace.unstored[path] = None
        value.flags.writeable = False  # the engine never writes in place; make sure of it
        rec = _Recorded(weakref.ref(value), path, formula, tuple(names), row_labels, col_labels)
        self._recorded[id(value)] = rec
        if stored:
            self.trace.steps[path] = rec.step(self._kept(value))
        return value

    def _kept(self, value: np.ndarray) -> np.ndarray | Shown:
        """What is stored of a step: the array (already in the blocks), or its `part`."""
        return value if self.part is None else self.part(value)

    def computed_in(self, name: str, scopes: Sequence[str]) -> None:
        """Say, for the K or V just recorded as `name` from a KV cache, the scope each of
        its rows was computed in (explain names it, and explains a cached row there)."""
        path = self.path(name)
        if path in self.trace.steps:
            self.trace.computed_in[path] = tuple(scopes)

    def _check_nonfinite(
        self, name: str, path: str, value: np.ndarray, inputs: Sequence[Any] = ()
    ) -> None:
        """Report the first step where a NaN, or an infinity that is not a mask, appears.

        A mask's −inf is none; nor is the −inf of `masked` (S / scale + M) where M is
        −inf, but one where M is finite (a given mask of −1e308 over a score of −1e308)
        or a +inf is an overflow, and a NaN of the softmax after it is not a masked row's.
        """
        if np.isnan(value).any():
            rows = sorted({int(i) for i in np.argwhere(np.isnan(value))[:, 0]})
            why = " (a fully masked row has no softmax)" if name == "softmax" else ""
            self._nonfinite_seen = True
            self.warn(f"NaN first appears in step {path}, row(s) {rows}{why}")
        elif name not in {"mask", "cross_mask"} and (
            name != "masked" or _overflows_beside(value, inputs[-1])
        ):
            self._nonfinite_seen = True
            self.warn(f"overflow: an infinity first appears in step {path}")

    def warn(self, message: str) -> None:
        self.trace.warnings.append(message)


def _overflows_beside(masked: np.ndarray, mask: Any) -> bool:
    """Whether S / scale + M holds an infinity that is not a −inf of the mask M."""
    return bool((np.isinf(masked) & ~(np.isneginf(masked) & np.isneginf(mask))).any())


def _all_finite(value: np.ndarray) -> bool:
    """No NaN or infinity in `value`. First one quick pass with no temporary array:
    the sum of squares (a BLAS dot product, faster than a sum) is finite unless some
    element is not, or the squares overflow, and then every element is checked."""
    with np.errstate(over="ignore"):  # huge squares are no overflow in the model
        if value.flags.c_contiguous:
            flat = value.reshape(-1)
            quick = float(np.dot(flat, flat))
        else:
            quick = float(value.sum())
    return math.isfinite(quick) or bool(np.isfinite(value).all())


class CheckingTracer(Tracer):
    """Stores and names nothing, but watches every value for the first NaN or
    infinity: the warnings of a command that shows no steps (`generate` without
    --trace), at a fraction of a recording tracer's cost per step."""

    def rec(
        self,
        name: str,
        value: np.ndarray,
        formula: str,
        *inputs: Any,
        cols: Labels | str = None,
        rows: Labels | str = None,
    ) -> np.ndarray:
        if not self._nonfinite_seen and value.dtype.kind == "f" and not _all_finite(value):
            self._check_nonfinite(name, self._prefix[-1] + name, value, inputs)
        return value


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

    def computed_in(self, name: str, scopes: Sequence[str]) -> None:
        return None


NULL_TRACER = NullTracer()
