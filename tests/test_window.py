"""Sliding-window attention (model.window, Mistral): query i sees the W keys
i − W < j <= i, itself included. Masks written out by hand, the conventions header,
`explain`, and the values refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import config_from
from test_bad_inputs import Bad, _run_bad
from typer.testing import CliRunner

from trace_tf import ops
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import conventions, run

runner = CliRunner()
X = -np.inf

DECODER = """\
model: {d_model: 4, n_heads: 2, encoder_layers: 0, decoder_layers: 1, window: 3}
vocab: [a, b, c, d, e, P]
tokens: {pad: P}
target: [a, b, c, d, e, P]
"""


def test_the_window_mask_by_hand() -> None:
    # window 2: row i sees keys i − 1 and i
    assert ops.causal_mask(4, window=2).tolist() == [
        [0, X, X, X],
        [0, 0, X, X],
        [X, 0, 0, X],
        [X, X, 0, 0],
    ]
    # window 1: the diagonal only; a window as long as the sequence: the causal mask
    assert ops.causal_mask(3, window=1).tolist() == [[0, X, X], [X, 0, X], [X, X, 0]]
    assert np.array_equal(ops.causal_mask(3, window=3), ops.causal_mask(3))
    # KV cache: rows at positions 3 and 4 over keys 0..4, window 3 (keys 1..3 and 2..4)
    assert ops.causal_mask(2, 3, window=3).tolist() == [[X, 0, 0, 0, X], [X, X, 0, 0, 0]]


def _decoder(window: int | None, pad: bool = False) -> Config:
    vocab = ["a", "b", "c", "d", "e", "P"]
    data: dict[str, Any] = {
        "model": {"d_model": 4, "n_heads": 2, "encoder_layers": 0, "decoder_layers": 1},
        "vocab": vocab,
        "target": vocab if pad else vocab[:5],
    }
    if pad:
        data["tokens"] = {"pad": "P"}
    if window is not None:
        data["model"]["window"] = window
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    return cfg


def test_the_decoder_mask_is_causal_and_windowed_with_pads() -> None:
    trace = run(_decoder(3, pad=True), "full")
    step = trace["decoder.mask"]
    assert step.formula == "M[i,j] = −inf for j > i or j ≤ i − 3 (causal, window 3) or key j a pad"
    want = [[0.0 if i - 3 < j <= i and j != 5 else X for j in range(6)] for i in range(6)]
    assert trace.value("decoder.mask").tolist() == want
    # the softmax of each row spreads over the visible keys only
    probs = trace.value("decoder.0.self_attn.h0.softmax")
    assert np.array_equal(probs == 0, np.isneginf(np.array(want)))


def test_no_window_is_the_causal_mask_unchanged() -> None:
    for window in (None, 5, 9):  # absent, or as long as the target or longer
        trace = run(_decoder(window), "full")
        assert trace.value("decoder.mask").tolist() == ops.causal_mask(5).tolist()
    assert run(_decoder(None), "full")["decoder.mask"].formula == "M[i,j] = −inf for j > i (causal)"


def test_the_header_states_the_convention() -> None:
    rows = dict(conventions(_decoder(3)))
    assert "sliding window 3: query i sees keys i − 3 < j ≤ i" in rows["masks"]
    assert "window" not in dict(conventions(_decoder(None)))["masks"]


def test_explain_says_why_a_key_is_outside_the_window(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(DECODER, encoding="utf-8")

    def note(cell: str) -> str:
        result = runner.invoke(app, ["explain", "decoder.mask", str(f), "--cell", cell])
        assert result.exit_code == 0, result.stderr
        return " ".join(result.stdout.split())

    assert (
        "= -inf (key 0 is 3 positions before query 3, not within its window of 3 (j ≤ 3 − 3))"
        in note("3,0")
    )
    assert "= 0 (query 3 may look at key 1 (i − 3 < j ≤ i, not a pad))" in note("3,1")
    assert "key 4 comes after query 1 (causal)" in note("1,4")
    assert "key 5 is the pad token" in note("5,5")


def _bad(window: str, layers: str = "encoder_layers: 0, ") -> str:
    return f"model:\n  {{d_model: 4, {layers}decoder_layers: 1,\n  window: {window}}}\nvocab: [a]\n"


BAD = [
    Bad(
        _bad("0"),
        "model.window",
        3,
        ("must be at least 1", "a whole number >= 1", "found the number 0"),
    ),
    Bad(_bad("-2"), "model.window", 3, ("a whole number >= 1",)),
    Bad(_bad("2.5"), "model.window", 3, ("not a whole number",)),
    Bad(_bad("true"), "model.window", 3, ("not a whole number",)),
    Bad(_bad("all"), "model.window", 3, ("not a whole number",)),
    # an encoder (encoder_layers defaults to 1): its self-attention is not causal
    Bad(
        _bad("2", ""),
        "model.window",
        3,
        ("decoder-only model", "and encoder_layers is 1", "model.encoder_layers: 0", "found 2"),
    ),
    Bad(
        _bad("2", "encoder_layers: 2, "),
        "model.window",
        3,
        ("encoder_layers is 2",),
        args=("decode", "{file}"),
    ),
]


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_window_is_refused(bad: Bad, tmp_path: Path) -> None:
    _run_bad(bad, tmp_path)


def test_window_set_on_the_command_line_is_refused_by_its_key(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(DECODER, encoding="utf-8")
    result = runner.invoke(app, ["decode", str(f), "--set", "model.window=0"])
    assert result.exit_code == 2 and "model.window" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_window_of_pads_only_is_a_fully_masked_row(tmp_path: Path) -> None:
    # row 2 (a pad) sees keys 1 and 2, both pads: no key left, NaN as SPEC says, warned
    f = tmp_path / "w.yaml"
    f.write_text(
        "model: {d_model: 4, encoder_layers: 0, decoder_layers: 1, window: 2}\n"
        "vocab: [a, P]\ntokens: {pad: P}\ntarget: [a, P, P]\n",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["decode", str(f), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert "NaN first appears in step decoder.0.self_attn.h0.softmax, row(s) [2]" in result.stderr
