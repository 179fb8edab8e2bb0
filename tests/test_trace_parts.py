"""A run shown only as tables stores, of each step, only the numbers its table shows
(issue 6: avoid storing what will not be shown): render.View.part, Tracer.part.

The tables are the same, byte for byte, as those of a run that stores every array
whole, for any elision (rows, columns, the width, 3-D slices); what is stored is
those numbers and no more; and asking such a step for its whole array is an error,
never a wrong number."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import config_from
from typer.testing import CliRunner

from trace_tf.cli import app, console
from trace_tf.config import load
from trace_tf.render import View, trace_view
from trace_tf.runner import check, run
from trace_tf.trace import Shown, Trace

LONG = "a_token_much_longer_than_any_label_may_be_shown_whole"


def _model(**model: object) -> dict[str, object]:
    words = [f"w{i}" for i in range(28)] + [LONG]
    rng = np.random.default_rng(5)
    return {
        "model": {"d_model": 24, "n_heads": 3, "encoder_layers": 1, "decoder_layers": 1, **model},
        "vocab": words,
        "tokens": {"bos": "w0", "eos": "w1"},
        "source": [LONG, *(words[i] for i in rng.integers(2, 28, 18))],
        "target": ["w0", *(words[i] for i in rng.integers(2, 28, 14)), LONG],
    }


CONFIGS = {
    "post-norm": lambda: config_from(_model()),
    "pre-norm, RoPE, RMSNorm": lambda: config_from(
        _model(norm_position="pre", positional="rope", norm="rms")
    ),
    "hello": lambda: load(None),
    # a calculator whose steps have three axes (attn.tanh: one table per query)
    "additive attention": lambda: load("fixtures/003_additive_attention.yaml"),
}
VIEWS = [
    View(),
    View(precision=1, max_cols=4, col_edge=1, width=40),
    View(precision=8, max_rows=3, row_edge=1, max_cols=5, col_edge=2, width=60),
    View(max_rows=2, row_edge=1, max_cols=3, col_edge=1, width=400),
    View(precision=2, max_cols=44, col_edge=21, width=400),
]


def _text(trace: object, view: View, width: int) -> str:
    out = io.StringIO()
    console(out, width).print(trace_view(list(trace), view))  # type: ignore[call-overload]
    return out.getvalue()


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("view", VIEWS, ids=lambda v: f"w{v.width}p{v.precision}c{v.max_cols}")
def test_tables_of_the_shown_parts_are_those_of_the_whole_arrays(name: str, view: View) -> None:
    cfg = CONFIGS[name]()
    whole = run(cfg)
    parts = run(cfg, part=view.part)
    assert list(parts.steps) == list(whole.steps)
    assert parts.warnings == whole.warnings
    # a part exactly where the table elides an axis (the tiny views elide in every config)
    for s in whole:
        last = s.value.ndim - 1
        limits = [view.max_cols if axis == last else view.max_rows for axis in range(last + 1)]
        beyond = any(n > limit for n, limit in zip(s.shape, limits, strict=True))
        assert isinstance(parts[s.path].data, Shown) == beyond, s.path
    width = view.width or 80
    assert _text(parts, view, width) == _text(whole, view, width)


def test_only_the_shown_numbers_are_stored() -> None:
    cfg = config_from(_model())
    view = View(max_cols=5, col_edge=2, width=80)
    whole = run(cfg)
    parts = run(cfg, part=view.part)
    for s in parts:
        a = whole[s.path].value
        if not isinstance(s.data, Shown):
            # shown whole: at most 12 rows and 5 columns
            assert (a.ndim < 2 or a.shape[-2] <= 12) and (a.ndim < 1 or a.shape[-1] <= 5)
            np.testing.assert_array_equal(s.data, a)
            continue
        assert s.shape == a.shape
        rows = list(range(4)) + list(range(a.shape[0] - 4, a.shape[0]))
        cols = [0, 1, a.shape[1] - 2, a.shape[1] - 1]
        rows = rows if a.shape[0] > 12 else list(range(a.shape[0]))
        cols = cols if a.shape[1] > 5 else list(range(a.shape[1]))
        np.testing.assert_array_equal(s.data.values, a[np.ix_(rows, cols)])
        assert s.data.values.size <= 8 * 5
    stored = sum(
        s.data.values.nbytes if isinstance(s.data, Shown) else s.data.nbytes for s in parts
    )
    assert stored * 10 < sum(s.value.nbytes for s in whole)


def _shown(whole: np.ndarray, kept: list[list[int]]) -> Shown:
    at = tuple(np.array(k, dtype=np.intp) for k in kept)
    return Shown(whole.shape, at, whole[np.ix_(*at)])


def test_a_shown_part_gives_the_numbers_it_kept_and_refuses_the_others() -> None:
    whole = np.arange(5 * 7 * 9, dtype=np.float64).reshape(5, 7, 9)
    part = _shown(whole, [[0, 4], [1, 2, 6], [0, 8]])
    assert part.shape == (5, 7, 9) and part.ndim == 3
    np.testing.assert_array_equal(part[4][np.ix_([2, 6], [8])], whole[4][np.ix_([2, 6], [8])])
    assert part[0].shape == (7, 9)
    with pytest.raises(IndexError):
        part[1]  # (not kept)
    with pytest.raises(IndexError):
        part[0][np.ix_([3], [0])]
    with pytest.raises(IndexError):
        part[0][np.ix_([2], [9])]  # beyond every kept index
    row = _shown(np.arange(30.0), [[0, 1, 28, 29]]).as_matrix()
    assert row.shape == (1, 30)
    np.testing.assert_array_equal(row[np.ix_([0], [1, 28])], [[1.0, 28.0]])


def test_the_whole_array_of_a_step_stored_as_its_part_is_an_error() -> None:
    parts = run(config_from(_model()), part=View(max_cols=4, col_edge=1).part)
    step = next(s for s in parts if isinstance(s.data, Shown))
    with pytest.raises(TypeError, match="part its table shows"):
        step.value  # noqa: B018


def _runs(monkeypatch: pytest.MonkeyPatch) -> list[Trace]:
    """The trace of every runner.run from now on (the CLI's, check's), as it returns them."""
    import trace_tf.runner

    traces: list[Trace] = []
    real = trace_tf.runner.run

    def recording_run(*a: Any, **kw: Any) -> Trace:
        traces.append(real(*a, **kw))
        return traces[-1]

    monkeypatch.setattr(trace_tf.runner, "run", recording_run)
    return traces


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        ((), True),  # tables: the shown parts
        (("--full",), False),  # whole matrices shown: whole arrays
        (("--format", "json"), False),
        (("--format", "npz", "--output", "{tmp}/t.npz"), False),
    ],
)
@pytest.mark.parametrize("command", ["encode", "decode", "step --stage qkv"])
def test_only_tables_store_the_shown_parts(
    command: str,
    args: tuple[str, ...],
    parts: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    traces = _runs(monkeypatch)
    path = tmp_path / "wide.yaml"
    path.write_text(json.dumps(_model()))
    name, *options = command.split()
    argv = [name, str(path), *options, *(a.format(tmp=tmp_path) for a in args)]
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    (trace,) = traces
    assert any(isinstance(s.data, Shown) for s in trace) == parts


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        ((), True),
        (("--stage", "probs"), True),
        (("--full",), False),
        (("--format", "json"), False),
        (("--explain", "t1.probs"), False),  # explain reads each input whole
    ],
)
def test_generate_trace_tables_store_the_shown_parts(
    args: tuple[str, ...], parts: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trace_tf.generate

    traces: list[Trace] = []

    def recording_run(cfg: Any, settings: Any, tr: Any) -> Any:
        traces.append(tr.trace)
        return real(cfg, settings, tr)

    real = trace_tf.generate.run
    monkeypatch.setattr(trace_tf.generate, "run", recording_run)
    path = tmp_path / "wide.yaml"
    path.write_text(json.dumps(_model()))
    argv = ["generate", str(path), "--greedy", "--trace", "--max-tokens", "2", *args]
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    (trace,) = traces
    assert any(isinstance(s.data, Shown) for s in trace) == parts


def test_check_stores_only_the_steps_its_entries_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from trace_tf.config import read_document

    traces = _runs(monkeypatch)
    doc = read_document("fixtures/hello.yaml")
    results = check(doc)
    assert results and all(r.ok for r in results)
    assert traces  # one run per variant the entries name
    for trace in traces:
        assert set(trace.steps) <= {r.step for r in results}
        assert len(trace.paths()) > len(trace.steps)  # every step still computed, recorded


def test_check_runs_once_more_for_all_its_misspelt_steps(
    monkeypatch: pytest.MonkeyPatch, tmp_yaml: Any
) -> None:
    # Each misspelt step's suggestion is from every step of its variant's run, in order:
    # one more run, storing none, serves every such entry (30 of them ran the model 31
    # times, each storing every step).
    from trace_tf.config import read_document

    traces = _runs(monkeypatch)
    misspelt = ["encoder.0.self_attn.h0.scroes", "encoder.0.self_attn.h0.sclaed", "encoder.inptu"]
    entries = "".join(f"  - {{step: {s}, value: [[0]]}}\n" for s in misspelt * 2)
    model = "model: {d_model: 4}\nvocab: [a, b]\nsource: [a, b]\n"
    doc = read_document(tmp_yaml(f"{model}expect:\n{entries}"))
    results = check(doc)
    assert [r.problem for r in results] == [
        f"no such step (did you mean '{s}'?)"
        for s in ["encoder.0.self_attn.h0.scores", "encoder.0.self_attn.h0.scaled", "encoder.input"]
        * 2
    ]
    assert len(traces) == 2  # the run of the entries' steps, then one of every step
    assert not traces[1].steps and len(traces[1].unstored) > 20


@pytest.mark.parametrize("command", ["encode", "decode", "step --stage qkv", "generate --trace"])
def test_a_terminal_resized_during_a_run_is_no_error(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parts a run stores are those its view shows; the tables were laid out for
    the terminal's width read again after the run, so a terminal widened meanwhile
    asked for numbers never kept (an IndexError). One view serves both."""
    import trace_tf.cli

    widths = iter([60, *[400] * 100])  # the first read narrow, every later one wide
    monkeypatch.setattr(trace_tf.cli, "screen_width", lambda: next(widths))
    path = tmp_path / "wide.yaml"
    path.write_text(json.dumps(_model()))
    name, *options = command.split()
    result = CliRunner().invoke(app, [name, str(path), *options])
    assert result.exit_code == 0, result.stderr or result.exception
    assert "…" in result.stdout  # elided, as the first width asked
