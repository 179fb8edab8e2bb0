"""The logits multiplied by a number (model.logit_scale: Cohere's logit_scale): worked by
hand from the last hidden state and the (tied) output weights, alone and beside a logit
soft cap (the scaled logits are capped; the other order shown to differ), the header,
the step formulas, `explain`, `stages`, `cost` and generate's sampling read the scaled
logits. (The torch reference: tests/test_engine_reference.py's Cohere shapes; the KV
cache: tests/test_generate.py's; the refusals: tests/test_bad_inputs.py's COHERE.)"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import config_from
from random_configs import random_config
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import conventions, run

runner = CliRunner()


def cohere(**over: Any) -> dict[str, Any]:
    """A small decoder-only model in Cohere's shape (one shared LayerNorm, parallel
    sublayers, RoPE by adjacent pairs, SwiGLU, tied embeddings), its logits scaled by 0.25."""
    shape: dict[str, Any] = dict(
        d_model=8,
        n_heads=2,
        encoder_layers=0,
        decoder_layers=1,
        norm_position="pre",
        positional="rope",
        activation="swiglu",
        parallel="shared",
        biases=False,
        tie_embeddings=True,
        tgt_len=4,
        logit_scale=0.25,
    )
    shape.update(over)
    return random_config(np.random.default_rng(11), **shape)


def traced(raw: dict[str, Any]) -> tuple[Config, Any]:
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    return cfg, run(cfg, "decode")


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("cap", [None, 1.5])
def test_the_logits_are_the_scaled_product_by_hand(cap: float | None) -> None:
    cfg, trace = traced(cohere(logit_softcap=cap))
    out = trace.value("decoder.output")
    E = np.array(cfg.embedding_matrix)  # tied: W = Eᵀ
    raw = out @ E.T
    np.testing.assert_allclose(trace.value("logits_raw"), raw, rtol=0, atol=1e-12)
    expected = 0.25 * raw if cap is None else cap * np.tanh(0.25 * raw / cap)
    np.testing.assert_allclose(trace.value("logits"), expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(trace.value("probs"), softmax(expected), rtol=0, atol=1e-12)
    # wrong variants differ: unscaled, and (with a cap) capped before the scale
    assert np.max(np.abs(trace.value("logits") - raw)) > 1e-3
    if cap is not None:
        wrong = 0.25 * cap * np.tanh(raw / cap)
        assert np.max(np.abs(trace.value("logits") - wrong)) > 1e-3


def test_without_a_scale_the_logits_are_the_product_as_before() -> None:
    raw = cohere()
    del raw["model"]["logit_scale"]
    _, trace = traced(raw)
    assert "logits_raw" not in trace.steps
    assert trace["logits"].formula.startswith("logits = out W")


def test_the_header_and_the_formulas_state_the_scale() -> None:
    cfg, trace = traced(cohere())
    said = dict(conventions(cfg))
    assert said["logit scale"] == (
        "logits = s · logits_raw (out W + b), s = 0.25, what probs and generate read"
    )
    assert "soft caps" not in said
    assert trace["logits"].formula == "logits = s · logits_raw,  s = 0.25 (logit scale)"
    both_cfg, both = traced(cohere(logit_softcap=1.5))
    both_said = dict(conventions(both_cfg))
    assert both_said["logit scale"].endswith("s = 0.25, then soft-capped (soft caps)")
    assert "logits = c · tanh(s · logits_raw / c), c = 1.5" in both_said["soft caps"]
    assert both["logits"].formula == (
        "logits = c · tanh(s · logits_raw / c),  s = 0.25 (logit scale), c = 1.5 (soft cap)"
    )


def write(tmp_path: Path, raw: dict[str, Any]) -> str:
    f = tmp_path / "c.yaml"
    f.write_text(json.dumps(raw), encoding="utf-8")  # (JSON is YAML)
    return str(f)


@pytest.mark.parametrize("cap", [None, 1.5])
def test_explain_writes_the_scale_out(tmp_path: Path, cap: float | None) -> None:
    raw = cohere(logit_softcap=cap)
    _, trace = traced(raw)
    result = runner.invoke(app, ["explain", "logits", write(tmp_path, raw), "--cell", "2,1"])
    assert result.exit_code == 0, result.stderr
    said = " ".join(result.stdout.split())
    assert "s = 0.25 (model.logit_scale)" in said
    assert "the arithmetic above agrees" in said
    r = float(trace.value("logits_raw")[2, 1])
    if cap is None:
        assert "logits[2,1] = s · logits_raw[2,1] = 0.25 ×" in said
    else:
        assert "c · tanh(s · logits_raw[2,1] / c)" in said
        assert f"{math.tanh(0.25 * r / cap):.4f}"[:5] in said


def test_stages_and_cost_name_the_scale(tmp_path: Path) -> None:
    stages = runner.invoke(app, ["stages", "--format", "json"])
    assert stages.exit_code == 0
    by_key = {
        s["key"]: json.dumps(s, ensure_ascii=False) for s in json.loads(stages.stdout)["stages"]
    }
    assert "scaled: s · logits_raw" in by_key["logits"]
    assert "soft cap or scale" in by_key["logits_raw"]
    cost = runner.invoke(app, ["cost", write(tmp_path, cohere())])
    assert cost.exit_code == 0, cost.stderr
    assert "caps or scales logits_raw" in " ".join(cost.stdout.split())


def test_sampling_reads_the_scaled_logits(tmp_path: Path) -> None:
    raw = cohere()
    raw["target"] = raw["target"][:2]
    result = runner.invoke(
        app,
        [
            "generate",
            write(tmp_path, raw),
            "--sample",
            "--seed",
            "3",
            "--max-tokens",
            "1",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.stderr
    probs = json.loads(result.stdout)["iterations"][0]["model_probs"]
    _, trace = traced(raw)
    last = trace.value("logits_raw")[-1]
    expected = softmax(0.25 * last)  # the scaled logits' distribution, by hand
    got = np.array([probs[w] for w in raw["vocab"]])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert np.max(np.abs(got - softmax(last))) > 1e-3  # the unscaled one differs
