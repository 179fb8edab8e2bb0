"""Attention sinks (model.attn_sinks: GPT-OSS's learned sink logit s_h per self-attention
head, A[i,j] = e^S[i,j] / (Σ_k e^S[i,k] + e^s_h)): worked by hand (masked rows, a sink
that takes most of the weight, a fully masked row, the temperature), against Hugging
Face's gpt_oss eager_attention_forward, the weights' forms and provenance, the KV cache,
the header, `explain`, the other commands, float32, the size bound. (The refusals are in
tests/test_bad_inputs.py's corpus, SINKS.)"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import config_from
from random_configs import LLAMA, random_config, to_per_head
from typer.testing import CliRunner

from trace_tf import generate as gen
from trace_tf import model, ops
from trace_tf.cli import app
from trace_tf.config import OBJECT_COST, Config, load, trace_size
from trace_tf.runner import conventions, run
from trace_tf.trace import Tracer

runner = CliRunner()
X = -math.inf


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def model_of(raw: dict[str, Any]) -> Config:
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    return cfg


def gpt_oss(seed: int = 4, **over: Any) -> dict[str, Any]:
    """GPT-OSS's shape, small: decoder-only, LLaMA's conventions, grouped-query, layer 0
    sliding over 2 keys and layer 1 full, fused sinks, every array given."""
    shape: dict[str, Any] = dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        fused=True,
        tgt_len=5,
        window=[2, None],
        attn_sinks=True,
    )
    shape.update(over)
    return random_config(np.random.default_rng(seed), **shape)


def write(tmp_path: Path, raw: dict[str, Any], name: str = "g.yaml") -> str:
    f = tmp_path / name
    f.write_text(json.dumps(raw), encoding="utf-8")  # (JSON is YAML)
    return str(f)


def hand(row: list[float], s: float, T: float = 1.0) -> tuple[list[float], float]:
    """A row's weights and its sink's, by the definition: e^(x/T) over Σ e^(x/T) + e^(s/T)
    (math.exp of numbers small enough not to overflow; −inf gives 0)."""
    e = [math.exp(x / T) if x != X else 0.0 for x in row]
    total = math.fsum([*e, math.exp(s / T)])
    return [v / total for v in e], math.exp(s / T) / total


# ---------------------------------------------------------------------------
# By hand
# ---------------------------------------------------------------------------


def test_the_softmax_with_a_sink_by_hand() -> None:
    rows = [[1.0, 2.0, 0.5], [0.3, X, -1.0], [0.0, 1.0, X]]  # no mask, a masked key, ...
    for s in (0.5, -2.0, 5.0):  # ... and a sink of 5 that takes most of each row
        A, sink = ops.softmax_with_sink(np.array(rows), np.array(s))
        assert A.shape == (3, 3) and sink.shape == (3, 1)
        for i, row in enumerate(rows):
            weights, taken = hand(row, s)
            np.testing.assert_allclose(A[i], weights, rtol=1e-15, atol=0)
            assert sink[i, 0] == pytest.approx(taken, rel=1e-15)
            assert math.fsum(A[i]) + sink[i, 0] == pytest.approx(1.0, abs=1e-15)
        if s == 5.0:
            assert (sink > 0.9).all()  # e^5 / (e^5 + e^1 + e^2 + e^0.5) = 0.93…
    # the sink lowers every weight in the same ratio: the plain softmax's, times 1 − sink
    A, sink = ops.softmax_with_sink(np.array(rows), np.array(0.5))
    np.testing.assert_allclose(A, ops.softmax(np.array(rows)) * (1 - sink), rtol=1e-14)


def test_a_fully_masked_row_gives_zeros_and_all_to_the_sink() -> None:
    x = np.array([[X, X, X], [0.0, X, X]])
    A, sink = ops.softmax_with_sink(x, np.array(-3.0))
    assert np.array_equal(A[0], [0.0, 0.0, 0.0]) and sink[0, 0] == 1.0  # no NaN
    assert A[1, 0] == pytest.approx(1 / (1 + math.exp(-3)), rel=1e-15)
    assert not np.isnan(ops.softmax_with_sink(x, np.array(2.0), 0.5)[0]).any()
    # without a sink the same row has no softmax (SPEC: NaN), as before
    assert np.isnan(ops.softmax(x)[0]).all()


def test_the_sink_is_stable_where_a_naive_sum_overflows() -> None:
    x = np.array([[1000.0, 999.0], [-1000.0, -1001.0]])
    A, sink = ops.softmax_with_sink(x, np.array(1001.0))
    # m = max(row, s) = 1001: e^−1, e^−2 over e^−1 + e^−2 + e^0
    total = math.exp(-1) + math.exp(-2) + 1
    np.testing.assert_allclose(A[0], [math.exp(-1) / total, math.exp(-2) / total], rtol=1e-15)
    assert sink[0, 0] == pytest.approx(1 / total, rel=1e-15)
    assert A[1].max() < 1e-300 and sink[1, 0] == 1.0  # the sink 2001 above: all of it


def test_the_temperature_divides_the_sink_as_it_divides_the_row() -> None:
    row, s, T = [1.0, 2.0, X], 1.5, 2.0
    A, sink = ops.softmax_with_sink(np.array([row]), np.array(s), T)
    weights, taken = hand(row, s, T)
    np.testing.assert_allclose(A[0], weights, rtol=1e-15)
    assert sink[0, 0] == pytest.approx(taken, rel=1e-15)
    # the other reading, the sink not divided by T, gives other weights
    e = [math.exp(1 / T), math.exp(2 / T)]
    undivided = e[0] / (sum(e) + math.exp(s))
    assert abs(A[0, 0] - undivided) > 1e-2


def test_attend_records_the_weights_and_the_sink_taken() -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    mask = np.array([[0.0, X, X], [0.0, 0.0, X], [X, X, X]])  # row 2 sees nothing
    tr = Tracer()
    out = model.attend(q, k, v, mask, math.sqrt(2), "sqrt(d_k)", 1.0, tr, sink=np.array(0.7))
    A, taken = tr.trace.value("softmax"), tr.trace.value("sink")
    S = q @ k.T / math.sqrt(2) + mask
    for i in range(3):
        weights, t = hand(list(S[i]), 0.7)
        np.testing.assert_allclose(A[i], weights, rtol=1e-14, atol=0)
        assert taken[i, 0] == pytest.approx(t, rel=1e-14)
    np.testing.assert_allclose(taken[:, 0], 1 - A.sum(axis=1), rtol=0, atol=1e-15)
    assert np.array_equal(out[2], [0.0, 0.0])  # all to the sink: no value
    np.testing.assert_allclose(out, A @ v, rtol=1e-15)
    assert "s_h = 0.7 (the head's sink)" in tr.trace.steps["softmax"].formula
    assert tr.trace.steps["sink"].cols == ("sink",)


# ---------------------------------------------------------------------------
# Hugging Face's GPT-OSS eager attention
# ---------------------------------------------------------------------------


def test_hugging_face_gpt_oss_eager_attention_weights_and_outputs() -> None:
    """transformers' gpt_oss eager_attention_forward (float64; its sinks a last column of
    Q Kᵀ · scaling + mask, the max subtracted, softmax, the column dropped) on 3 heads
    with their own sinks, one of which takes most of the weight, a causal mask with a
    padded key and a fully masked row: each head's weights and output are the engine's
    to 1e-12; without the sinks they are not."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    H, L, d = 3, 5, 4
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((H, L, d)) for _ in range(3))
    sinks = np.array([0.3, -1.2, 4.0])
    mask = np.triu(np.full((L, L), X), 1)
    mask[:, 1] = X  # key 1 a pad
    mask[0] = X  # row 0 sees nothing
    module = SimpleNamespace(num_key_value_groups=1, training=False, sinks=torch.tensor(sinks))
    out, weights = eager_attention_forward(
        module,  # type: ignore[arg-type]
        torch.tensor(q)[None],
        torch.tensor(k)[None],
        torch.tensor(v)[None],
        torch.tensor(mask)[None, None],
        scaling=d**-0.5,
    )
    for h in range(H):
        tr = Tracer()
        ours = model.attend(q[h], k[h], v[h], mask, 2.0, "sqrt(d_k)", 1.0, tr, sink=sinks[h])
        np.testing.assert_allclose(tr.trace.value("softmax"), weights[0, h].numpy(), atol=1e-12)
        np.testing.assert_allclose(ours, out[0, :, h].numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(
            tr.trace.value("sink")[:, 0], 1 - weights[0, h].numpy().sum(axis=1), atol=1e-12
        )
        plain = model.attend(q[h], k[h], v[h], mask, 2.0, "sqrt(d_k)")
        assert np.abs(plain[1:] - out[0, 1:, h].numpy()).max() > 1e-3
    assert weights[0, 2].numpy().sum(axis=1).max() < 0.5  # the sink of 4 took most


# ---------------------------------------------------------------------------
# The weights: per head, fused, drawn, set, from a weights_file
# ---------------------------------------------------------------------------


def test_fused_and_per_head_sinks_give_identical_traces() -> None:
    raw = gpt_oss()
    a = run(model_of(raw), "full")
    b = run(model_of(to_per_head(raw)), "full")
    assert list(a.steps) == list(b.steps)
    for path in a.steps:
        assert np.array_equal(a.value(path), b.value(path)), path
    sinks = raw["weights"]["decoder"][1]["self_attn"]["sinks"]
    cfg = model_of(raw)
    assert [float(hw.sink) for hw in cfg.decoder[1].self_attn.heads] == sinks  # type: ignore[arg-type]


def test_a_sink_not_given_is_drawn_by_its_key_path() -> None:
    raw = gpt_oss(seed=2)
    del raw["weights"]["decoder"][0]["self_attn"]["sinks"]
    raw["model"]["init_std"] = 0.5
    cfg = model_of(raw)
    for h in range(4):
        path = f"decoder.0.self_attn.heads.{h}.sink"
        rng = np.random.default_rng([0, zlib.crc32(path.encode())])  # SPEC's rule
        assert float(cfg.decoder[0].self_attn.heads[h].sink) == rng.standard_normal(()) * 0.5  # type: ignore[arg-type]
        assert cfg.sources[f"weights.{path}"].text == "drawn: seed 0, N(0, 0.5²)"
    fused = cfg.sources["weights.decoder.1.self_attn.heads.2.sink"]
    assert fused.text.startswith("entry 2 of weights.decoder.1.self_attn.sinks (")


def test_a_sink_set_on_the_command_line_and_from_a_weights_file(tmp_path: Path) -> None:
    path = write(tmp_path, gpt_oss())
    code, out, err = invoke(
        "weights", path, "--set", "weights.decoder.0.self_attn.sinks.1=0.5", "--format", "json"
    )
    assert code == 0, err
    text = json.dumps(json.loads(out))
    assert "entries set by --set weights.decoder.0.self_attn.sinks.1" in text
    set_raw = gpt_oss()
    set_raw["weights"]["decoder"][0]["self_attn"]["sinks"][1] = 0.5
    expected = run(model_of(set_raw), "full").value("probs")
    code, out, err = invoke(
        "decode", path, "--set", "weights.decoder.0.self_attn.sinks.1=0.5", "--format", "json"
    )
    assert code == 0, err
    assert json.loads(out)["steps"][-1]["value"] == expected.tolist()
    # a weights_file's fused sinks; and in per-head form, one head's own
    raw = gpt_oss()
    fused = raw["weights"]["decoder"][1]["self_attn"].pop("sinks")
    np.savez(tmp_path / "w.npz", **{"decoder.1.self_attn.sinks": np.array(fused)})
    raw["weights_file"] = "w.npz"
    cfg = load(write(tmp_path, raw, "f.yaml"))
    assert isinstance(cfg, Config)
    assert [float(hw.sink) for hw in cfg.decoder[1].self_attn.heads] == fused  # type: ignore[arg-type]
    assert "entry 1 of weights.decoder.1.self_attn.sinks (" in (
        cfg.sources["weights.decoder.1.self_attn.heads.1.sink"].text
    )
    raw = to_per_head(gpt_oss())
    del raw["weights"]["decoder"][0]["self_attn"]["heads"][3]["sink"]
    np.savez(tmp_path / "h.npz", **{"decoder.0.self_attn.heads.3.sink": 9.0})
    raw["weights_file"] = "h.npz"
    cfg = load(write(tmp_path, raw, "h.yaml"))
    assert isinstance(cfg, Config)
    assert float(cfg.decoder[0].self_attn.heads[3].sink) == 9.0  # type: ignore[arg-type]
    assert "h.npz, array 'decoder.0.self_attn.heads.3.sink'" in (
        cfg.sources["weights.decoder.0.self_attn.heads.3.sink"].text
    )


def test_sinks_only_in_self_attention_and_off_unchanged() -> None:
    raw = random_config(
        np.random.default_rng(3), d_model=6, n_heads=2, decoder_layers=1, attn_sinks=True
    )
    trace = run(model_of(raw), "full")
    assert "encoder.0.self_attn.h1.sink" in trace and "decoder.0.self_attn.h1.sink" in trace
    assert not any(
        p.startswith("decoder.0.cross_attn") and p.endswith(".sink") for p in trace.steps
    )
    # sinks far below every score take nothing: the model without sinks, to rounding
    low = gpt_oss()
    for layer in low["weights"]["decoder"]:
        layer["self_attn"]["sinks"] = [-1000.0] * 4
    off = gpt_oss()
    off["model"]["attn_sinks"] = False
    for layer in off["weights"]["decoder"]:
        del layer["self_attn"]["sinks"]
    a, b = run(model_of(low), "full"), run(model_of(off), "full")
    assert not any(p.endswith(".sink") for p in b.steps)
    for path in b.steps:
        np.testing.assert_allclose(a.value(path), b.value(path), rtol=1e-13, atol=1e-15)


# ---------------------------------------------------------------------------
# generate: the KV cache against recomputation
# ---------------------------------------------------------------------------


def test_generate_with_the_cache_equals_recomputation() -> None:
    raw = gpt_oss(tgt_len=2)
    raw["weights"]["output"]["b"][1] = -1000.0  # EOS (t1) never: every iteration runs
    cfg = model_of(raw)
    cached, full = Tracer(), Tracer()
    s = dict(greedy=True, max_tokens=5)
    a = gen.run(cfg, gen.settings(**s), cached)  # type: ignore[arg-type]
    b = gen.run(cfg, gen.settings(cache=False, **s), full)  # type: ignore[arg-type]
    assert a.generated == b.generated and len(a.generated) == 5
    for i, (x, y) in enumerate(zip(a.iterations, b.iterations, strict=True)):
        assert np.abs(x.model_probs - y.model_probs).max() <= 1e-12
        for l in range(2):
            for h in range(4):
                step = f"t{i}.decoder.{l}.self_attn.h{h}"
                for name in ("softmax", "sink"):
                    row = cached.trace.value(f"{step}.{name}")[-1]
                    again = full.trace.value(f"{step}.{name}")[-1]
                    np.testing.assert_allclose(row, again, rtol=0, atol=1e-13)
    # the sinks matter here: with every sink far below the scores, the distributions differ
    for layer in raw["weights"]["decoder"]:
        layer["self_attn"]["sinks"] = [-1000.0] * 4
    c = gen.run(model_of(raw), gen.settings(**s))  # type: ignore[arg-type]
    diffs = [
        np.abs(x.model_probs - z.model_probs).max()
        for x, z in zip(a.iterations, c.iterations, strict=True)
    ]
    assert max(diffs) > 1e-3


# ---------------------------------------------------------------------------
# The header, explain, and the other commands
# ---------------------------------------------------------------------------


def test_the_header_states_the_sinks() -> None:
    rows = dict(conventions(model_of(gpt_oss())))
    assert "sink logit s_h joins every softmax row's denominator" in rows["sinks"]
    assert "e^(S[i,j]/T) / (Σ_k e^(S[i,k]/T) + e^(s_h/T))" in rows["sinks"]
    assert "not in cross-attention" in rows["sinks"]
    off = gpt_oss()
    off["model"]["attn_sinks"] = False
    for layer in off["weights"]["decoder"]:
        del layer["self_attn"]["sinks"]
    assert "sinks" not in dict(conventions(model_of(off)))


def test_explain_writes_the_sink_into_the_denominator(tmp_path: Path) -> None:
    raw = gpt_oss()
    path = write(tmp_path, raw)
    trace = run(model_of(raw), "full")
    s = raw["weights"]["decoder"][1]["self_attn"]["sinks"][2]

    def explained(step: str, cell: str, *more: str) -> dict[str, Any]:
        code, out, err = invoke("explain", step, path, "--cell", cell, "--format", "json", *more)
        assert code == 0, err
        data: dict[str, Any] = json.loads(out)
        assert data["agrees"] is True
        return data

    row = list(trace.value("decoder.1.self_attn.h2.masked")[3])
    weights, taken = hand(row, s)
    data = explained("decoder.1.self_attn.h2.softmax", "3,1")
    assert data["result"] == pytest.approx(weights[1], rel=1e-12)
    assert "+ e^(s_h − m))" in data["lines"][0]
    assert data["lines"][1].count("e^(") == 1 + len(row) + 1  # the entry's, the row's, s_h's
    assert any(
        "s_h = weights.decoder.1.self_attn.heads.2.sink (entry 2 of" in w for w in data["where"]
    )
    data = explained("decoder.1.self_attn.h2.sink", "3,0")
    assert data["result"] == pytest.approx(taken, rel=1e-12)
    assert data["lines"][0].endswith("= e^(s_h − m) / (Σ_k e^(masked[3,k] − m) + e^(s_h − m))")
    # with a temperature, s_h divided by T too
    T = 2.5
    hot = run(model_of({**raw, "model": {**raw["model"], "temperature": T}}), "full")
    row = list(hot.value("decoder.1.self_attn.h2.masked")[3])
    data = explained("decoder.1.self_attn.h2.sink", "3,0", "--set", f"model.temperature={T}")
    assert data["result"] == pytest.approx(hand(row, s, T)[1], rel=1e-12)
    assert any("(s_h divided by T as the row is)" in w for w in data["where"])


def test_generate_explains_a_cached_rows_sink(tmp_path: Path) -> None:
    path = write(tmp_path, gpt_oss(tgt_len=2))
    args = ["generate", path, "--greedy", "--max-tokens", "3", "--set", "tokens.eos=null"]
    code, out, err = invoke(*args, "--explain", "t2.decoder.1.self_attn.h0.sink", "--cell", "0,0")
    assert code == 0, err
    text = " ".join(out.replace("│", " ").split())
    assert "+ e^(s_h − m))" in text and "the arithmetic above agrees" in text


def test_stages_cost_step_head_diff_and_formats(tmp_path: Path) -> None:
    path = write(tmp_path, gpt_oss())
    code, out, _ = invoke("stages", "--format", "json")
    stages = {s["stage"]: s for s in json.loads(out)["stages"]}
    assert "1 − Σ_j A[i,j]" in stages["sink"]["formula"]
    assert "e^((s_h − m)/T) in the denominator" in stages["softmax"]["formula"]
    code, out, err = invoke("cost", path, "--format", "json")
    assert code == 0, err
    code, out, err = invoke("step", path, "--stage", "sink", "--format", "json")
    assert code == 0, err
    steps = json.loads(out)["steps"]
    assert [s["path"] for s in steps] == [
        f"decoder.{l}.self_attn.h{h}.sink" for l in range(2) for h in range(4)
    ]
    code, out, err = invoke("step", path, "--stage", "sink", "--head", "1", "--format", "json")
    assert code == 0, err
    assert [s["path"] for s in json.loads(out)["steps"]] == [
        "decoder.0.self_attn.h1.sink",
        "decoder.1.self_attn.h1.sink",
    ]
    code, out, err = invoke("step", path, "--stage", "sink", "--layer", "0", "--head", "3")
    assert code == 0 and "decoder.0.self_attn.h3.sink" in out and "sink" in out, err
    npz = tmp_path / "s.npz"
    code, _, err = invoke("decode", path, "--format", "npz", "--output", str(npz))
    assert code == 0, err
    trace = run(model_of(gpt_oss()), "full")
    with np.load(npz) as arrays:
        assert np.array_equal(
            arrays["decoder.1.self_attn.h2.sink"], trace.value("decoder.1.self_attn.h2.sink")
        )
    code, out, err = invoke(
        "step", path, "--stage", "decoder.0.self_attn.h0.sink", "--format", "csv"
    )
    assert code == 0 and out.count("\n") >= 5, err
    # diff: head 1's sink changed first changes head 1's softmax of layer 0; off, no sink
    s = "weights.decoder.0.self_attn.sinks.1=3"
    code, out, err = invoke("diff", path, "--set-b", s, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["first_difference"] == "decoder.0.self_attn.h1.softmax"
    code, out, err = invoke(
        "diff", path, "--set-b", "model.attn_sinks=false", "--set-b", "weights.decoder.0.self_attn.sinks=null",
        "--set-b", "weights.decoder.1.self_attn.sinks=null", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    assert "decoder.0.self_attn.h0.sink" in json.loads(out)["only_a"]


def test_float32_sinks_in_float32() -> None:
    raw = gpt_oss()
    raw["model"]["dtype"] = "float32"
    trace = run(model_of(raw), "full")
    wide = run(model_of(gpt_oss()), "full")
    for step in ("decoder.1.self_attn.h2.softmax", "decoder.1.self_attn.h2.sink", "probs"):
        assert trace.value(step).dtype == np.float32
        np.testing.assert_allclose(trace.value(step), wide.value(step), rtol=0, atol=1e-5)


def test_the_size_bound_counts_the_sink_steps() -> None:
    cfg = model_of(gpt_oss())
    trace = run(cfg, "full")
    recorded = sum(trace.value(p).size for p in trace.steps)
    bound = trace_size(cfg.model, 5, len(cfg.vocab))
    assert recorded + OBJECT_COST * len(trace.steps) <= bound
    off = gpt_oss()
    off["model"]["attn_sinks"] = False
    for layer in off["weights"]["decoder"]:
        del layer["self_attn"]["sinks"]
    plain = model_of(off)
    new = [p for p in trace.steps if p.endswith(".sink")]
    grown = bound - trace_size(plain.model, 5, len(plain.vocab))
    assert grown >= sum(trace.value(p).size + OBJECT_COST for p in new)
