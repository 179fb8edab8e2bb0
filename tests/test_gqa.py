"""Grouped-query attention (model.n_kv_heads): query head h reads K/V head h // (H / H_kv),
whose K and V are computed once. Numbers against the same model with the K/V weights
duplicated into every query head (multi-head attention, as before n_kv_heads), and
against counts made here; the torch reference (repeat_kv) is in test_engine_reference."""

from __future__ import annotations

import copy
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import config_from, shape_id
from random_configs import LLAMA, random_config, to_per_head
from typer.testing import CliRunner

from trace_tf import cost, model
from trace_tf.cli import app
from trace_tf.config import Config, ModelConfig
from trace_tf.explain import explain
from trace_tf.runner import heads_text, run

runner = CliRunner()

GROUPED = [
    # multi-query: one K/V head, decoder-only, pre-norm RMSNorm, RoPE by halves, SwiGLU
    dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=1,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        tgt_len=4,
    ),
    # 2 K/V heads of 4, encoder-decoder (cross-attention shares too), fused, padded
    dict(d_model=8, n_heads=4, n_kv_heads=2, decoder_layers=1, fused=True, pad=True, src_len=5),
    # 3 query heads on one K/V head, relative biases per query head, d_k != d_v
    dict(d_model=6, n_heads=3, n_kv_heads=1, d_k=4, d_v=3, positional="relative"),
]


def duplicated(raw: dict[str, Any]) -> dict[str, Any]:
    """The same model as multi-head attention: per head, each query head given its K/V
    head's W_k, W_v, b_k, b_v (the recipe before n_kv_heads), n_kv_heads removed."""
    out = to_per_head(copy.deepcopy(raw))
    m = out["model"]
    group = m["n_heads"] // m.pop("n_kv_heads")
    for stack in ("encoder", "decoder"):
        for layer in out["weights"].get(stack, []):
            for block in (layer.get("self_attn"), layer.get("cross_attn")):
                if block is None:
                    continue
                kv = block.pop("kv_heads")
                for h, head in enumerate(block["heads"]):
                    head.update(copy.deepcopy(kv[h // group]))
    return out


def grouped_cfg(shape: dict[str, Any], seed: int = 5) -> Config:
    cfg = config_from(random_config(np.random.default_rng(seed), **shape))
    assert isinstance(cfg, Config)
    return cfg


@pytest.mark.parametrize("shape", GROUPED, ids=shape_id)
def test_native_gqa_equals_the_model_with_duplicated_kv_weights_bit_for_bit(
    shape: dict[str, Any],
) -> None:
    raw = random_config(np.random.default_rng(5), **shape)  # type: ignore[arg-type]
    a, b = run(config_from(raw), "full"), run(config_from(duplicated(raw)), "full")
    assert list(a.steps) == list(b.steps)  # the same step names, in the same order
    for path in a.steps:
        assert np.array_equal(a.value(path), b.value(path), equal_nan=True), path
    assert any(".h3." in p or ".h2." in p for p in a.steps)


def test_k_and_v_are_computed_once_per_kv_head(monkeypatch: pytest.MonkeyPatch) -> None:
    # decoder-only, 2 layers of 4 query heads on 1 K/V head: per layer 4 Q projections
    # and one K and one V, 12 in all (24 if K and V were computed per query head)
    cfg = grouped_cfg(GROUPED[0])
    calls: list[tuple[int, ...]] = []
    project = model.project

    def spy(x: np.ndarray, W: np.ndarray, b: np.ndarray | None) -> np.ndarray:
        calls.append(W.shape)
        return project(x, W, b)

    monkeypatch.setattr(model, "project", spy)
    model.run_full(cfg)
    assert len(calls) == 2 * (4 + 2)
    calls.clear()
    run(cfg, "full")  # traced too
    assert len(calls) == 2 * (4 + 2)
    # encoder-decoder, 2 K/V heads: self (enc), self (dec), cross: each 4 + 2·2
    calls.clear()
    model.run_full(grouped_cfg(GROUPED[1]))
    assert len(calls) == 3 * (4 + 2 * 2)


def test_the_shared_k_is_recorded_in_each_query_head_once_in_memory() -> None:
    cfg = grouped_cfg(GROUPED[1])
    trace = run(cfg, "full")
    base = "encoder.0.self_attn"
    for name in ("k", "v"):
        assert trace[f"{base}.h2.{name}"].value is trace[f"{base}.h3.{name}"].value
        assert trace[f"{base}.h1.{name}"].value is not trace[f"{base}.h2.{name}"].value
    formula = trace[f"{base}.h3.k"].formula
    assert formula == "K = X W_k + b_k, K/V head 1 (shared by h2, h3)"
    assert trace["decoder.0.cross_attn.h0.v"].formula.endswith("K/V head 0 (shared by h0, h1)")
    # the weight each query head's K names is its K/V head's
    assert trace[f"{base}.h3.k"].inputs[1:] == (
        f"weights.{base}.kv_heads.1.W_k",
        f"weights.{base}.kv_heads.1.b_k",
    )


def test_explain_of_a_shared_k_names_the_kv_heads_weight() -> None:
    raw = random_config(np.random.default_rng(5), **GROUPED[1])  # type: ignore[arg-type]
    cfg = config_from(raw)  # fused: W_k is 8 x 2·2, K/V head 1 its columns 2..3
    trace = run(cfg, "full")
    e = explain(cfg, trace, trace["encoder.0.self_attn.h3.k"], (1, 1))
    assert e.agrees
    where = "\n".join(e.where)
    assert "column 3 of weights.encoder.0.self_attn.W_k (K/V head 1's 2..3;" in where
    assert "b_k[1] = entry 3 of weights.encoder.0.self_attn.b_k (K/V head 1's 2..3;" in where
    block = raw["weights"]["encoder"][0]["self_attn"]
    x = trace.value("encoder.input")[1]
    assert e.value == pytest.approx(x @ np.array(block["W_k"])[:, 3] + block["b_k"][3], rel=1e-14)


def test_cost_counts_k_and_v_once_per_kv_head() -> None:
    cfg = grouped_cfg(GROUPED[0])  # L = 4, d = 8, d_k = d_v = 2, 2 layers, 1 K/V head
    t = cost.totals(cost.ledger(cfg))
    assert t.by_stage["k_raw"] == 2 * 1 * (4 * 8 * 2)
    assert t.by_stage["v"] == 2 * 1 * (4 * 8 * 2)
    assert t.by_stage["q_raw"] == 2 * 4 * (4 * 8 * 2)


def _invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _write(tmp_path: Path, data: dict[str, Any]) -> str:
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(p)


SMALL = {
    "model": {"d_model": 4, "n_heads": 4, "n_kv_heads": 2, "d_k": 1, "encoder_layers": 0,
              "decoder_layers": 1},
    "vocab": ["a", "b", "SOS"],
    "tokens": {"bos": "SOS"},
    "target": ["SOS", "a"],
}  # fmt: skip


def test_the_header_says_which_kv_head_each_query_head_reads(tmp_path: Path) -> None:
    code, out, err = _invoke("decode", _write(tmp_path, SMALL))
    assert code == 0, err
    assert "4 heads, 2 K/V heads (grouped: h0,h1 → kv0; h2,h3 → kv1)" in " ".join(out.split())


def test_the_header_of_many_heads_states_the_rule() -> None:
    assert heads_text(ModelConfig(d_model=64, n_heads=32, n_kv_heads=8)) == (
        "32 heads, 8 K/V heads (grouped: head h → K/V head h // 4)"
    )
    assert heads_text(ModelConfig(d_model=8, n_heads=4, n_kv_heads=1)) == (
        "4 heads, 1 K/V head (grouped: h0,h1,h2,h3 → kv0)"
    )
    assert heads_text(ModelConfig(d_model=8, n_heads=4)) == "4 head(s)"


def test_weights_lists_each_kv_weight_once_and_set_writes_over_a_copy(tmp_path: Path) -> None:
    path = _write(tmp_path, SMALL)
    key = "weights.decoder.0.self_attn.kv_heads.1.W_k"
    code, out, err = _invoke("weights", path, "--set", f"{key}.2.0=5", "--format", "json")
    assert code == 0, err
    rows = {r["path"]: r for r in json.loads(out)["weights"]}
    assert [k for k in rows if "W_k" in k] == [
        "weights.decoder.0.self_attn.kv_heads.0.W_k",
        key,
    ]
    assert not any(".heads." in k and ("W_k" in k or "W_v" in k) for k in rows)
    assert "entries set by --set " + key + ".2.0" in rows[key]["text"]
    # drawn under the K/V head's path (SPEC's rule), the entry set over it
    drawn = np.random.default_rng([0, zlib.crc32(b"decoder.0.self_attn.kv_heads.1.W_k")])
    expected = drawn.standard_normal((4, 1))
    expected[2, 0] = 5
    cfg = config_from({**SMALL, "weights": {"decoder": [{"self_attn": {"kv_heads": [
        {}, {"W_k": expected.tolist()}]}}]}})  # fmt: skip
    assert isinstance(cfg, Config)
    code, out, err = _invoke("step", path, "--set", f"{key}.2.0=5", "--stage", "k",
                             "--head", "3", "--format", "json")  # fmt: skip
    assert code == 0, err
    got = next(s for s in json.loads(out)["steps"] if s["path"].endswith("h3.k"))
    want = run(cfg, "full").value("decoder.0.self_attn.h3.k")
    assert np.array_equal(np.array(got["value"]), want)


def test_a_weights_file_array_of_a_kv_head(tmp_path: Path) -> None:
    np.savez(tmp_path / "w.npz", **{"decoder.0.self_attn.kv_heads.1.W_v": np.arange(4.0)[:, None]})
    path = _write(tmp_path, {**SMALL, "weights_file": "w.npz"})
    code, out, err = _invoke("step", path, "--stage", "v", "--head", "2", "--format", "json")
    assert code == 0, err
    v = next(s for s in json.loads(out)["steps"] if s["path"] == "decoder.0.self_attn.h2.v")
    code, out, err = _invoke("step", path, "--stage", "input", "--format", "json")
    x = np.array(json.loads(out)["steps"][-1]["value"])
    assert np.allclose(np.array(v["value"]), x @ np.arange(4.0)[:, None], rtol=1e-15)
    assert v["formula"] == "V = X W_v, K/V head 1 (shared by h2, h3)"


def test_diff_against_multi_head_attention(tmp_path: Path) -> None:
    code, out, err = _invoke("diff", _write(tmp_path, SMALL), "--set-b", "model.n_kv_heads=4")
    assert code == 0, err
    assert "kv_heads.0.W_k" in out and "only in A" in out


def _bad(tmp_path: Path, data: dict[str, Any], *needles: str) -> None:
    code, out, err = _invoke("decode", _write(tmp_path, data))
    assert code == 2, (out, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    for needle in needles:
        assert needle in " ".join(err.split()), err


@pytest.mark.parametrize(
    ("value", "needles"),
    [
        (0, ("model.n_kv_heads", "at least 1", "found the number 0")),
        (3, ("model.n_kv_heads", "does not divide n_heads 4", "from 1 to 4 dividing", "found 3")),
        (5, ("model.n_kv_heads", "does not divide n_heads 4", "found 5")),
        (1.5, ("model.n_kv_heads", "not a whole number")),
        ("two", ("model.n_kv_heads", "not a whole number")),
    ],
)
def test_bad_n_kv_heads(tmp_path: Path, value: Any, needles: tuple[str, ...]) -> None:
    _bad(tmp_path, {**SMALL, "model": {**SMALL["model"], "n_kv_heads": value}}, *needles)


def test_kv_heads_without_grouped_query_attention(tmp_path: Path) -> None:
    data = {**SMALL, "model": {**SMALL["model"], "n_kv_heads": 4},
            "weights": {"decoder": [{"self_attn": {"kv_heads": [{}]}}]}}  # fmt: skip
    _bad(tmp_path, data, "weights.decoder.0.self_attn.kv_heads", "grouped-query attention")


def test_w_k_in_a_query_head_under_grouped_query_attention(tmp_path: Path) -> None:
    data = {**SMALL, "weights": {"decoder": [{"self_attn": {"heads": [
        {}, {}, {}, {"W_k": [[1], [2], [3], [4]]}]}}]}}  # fmt: skip
    _bad(tmp_path, data, "weights.decoder.0.self_attn.heads.3.W_k", "kv_heads.1", "K/V heads")


def test_a_fused_w_k_must_be_n_kv_heads_heads_wide(tmp_path: Path) -> None:
    data = {**SMALL, "weights": {"decoder": [{"self_attn": {"W_k": [[1] * 4] * 4}}]}}
    _bad(tmp_path, data, "weights.decoder.0.self_attn.W_k", "n_kv_heads·d_k", "4 x 2")


def test_fused_kv_beside_kv_heads_is_one_form_per_block(tmp_path: Path) -> None:
    data = {**SMALL, "weights": {"decoder": [{"self_attn": {
        "W_v": [[1, 2]] * 4, "kv_heads": [{"W_k": [[1], [2], [3], [4]]}]}}]}}  # fmt: skip
    _bad(tmp_path, data, "kv_heads.0.W_k", "one form per block")


def test_more_kv_heads_than_n_kv_heads(tmp_path: Path) -> None:
    data = {**SMALL, "weights": {"decoder": [{"self_attn": {"kv_heads": [{}, {}, {}]}}]}}
    _bad(tmp_path, data, "kv_heads.2", "more K/V heads than model.n_kv_heads (2)")


def test_generate_explain_of_a_cached_row_of_a_shared_k(tmp_path: Path) -> None:
    """h3 reads K/V head 1, computed (and cached) in h2's scope: row 0 of t2's h3.k
    was computed at t0 in h2, from K/V head 1's W_k."""
    path = _write(tmp_path, SMALL)
    code, out, err = _invoke(
        "generate", path, "--max-tokens", "3", "--explain", "t2.decoder.0.self_attn.h3.k",
        "--cell", "0,0", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    where = data["where"]
    assert "row 0 is cached: computed at t0.decoder.0.self_attn.h2.k and kept since" in where
    assert "weights.decoder.0.self_attn.kv_heads.1.W_k" in " ".join(where)
    x, w = np.array(data["operands"]["x0"]), np.array(data["operands"]["W_k[:,0]"])
    assert data["agrees"] and data["value"] == pytest.approx(float(x @ w), rel=1e-12)


def test_under_float32_the_query_heads_of_a_group_still_share_one_w_k() -> None:
    """float32 converts every weight; a K/V head's W_k, held by each query head of its
    group, must stay one array (once converted), named by its K/V head."""
    raw = random_config(np.random.default_rng(5), **GROUPED[1])  # type: ignore[arg-type]
    cfg = config_from(raw, dtype="float32")
    assert isinstance(cfg, Config)
    heads = cfg.encoder[0].self_attn.heads
    assert heads[2].W_k is heads[3].W_k and heads[2].W_k.dtype == np.float32
    assert heads[1].W_k is not heads[2].W_k
    trace = run(cfg, "full")
    assert (
        trace["encoder.0.self_attn.h3.k"].inputs[1] == "weights.encoder.0.self_attn.kv_heads.1.W_k"
    )
    e = explain(cfg, trace, trace["encoder.0.self_attn.h3.v"], (0, 1))
    assert e.agrees and "K/V head 1's" in "\n".join(e.where)


def test_generate_explain_of_a_new_row_of_a_shared_k_is_not_called_cached(
    tmp_path: Path,
) -> None:
    """Row 3 of t2's h3.k is the row t2 itself computes, in h2 (K/V head 1's first query
    head): computed just now, not kept from an earlier iteration."""
    path = _write(tmp_path, SMALL)
    code, out, err = _invoke(
        "generate", path, "--max-tokens", "3", "--explain", "t2.decoder.0.self_attn.h3.k",
        "--cell", "3,0", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["where"][0] == "row 3 is its K/V head's, computed at t2.decoder.0.self_attn.h2.k"
    assert not any("cached" in w for w in data["where"]), data["where"]
    x, w = np.array(data["operands"]["x0"]), np.array(data["operands"]["W_k[:,0]"])
    assert data["agrees"] and data["value"] == pytest.approx(float(x @ w), rel=1e-12)
    code, out, err = _invoke(
        "generate", path, "--max-tokens", "3", "--explain", "t2.decoder.0.self_attn.h3.scores",
        "--cell", "0,3", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    where = json.loads(out)["where"]
    assert "(computed at t2.decoder.0.self_attn.h2.k, row 3)" in where[1], where
    code, out, err = _invoke(
        "generate", path, "--max-tokens", "3", "--explain", "t2.decoder.0.self_attn.h3.scores",
        "--cell", "0,2", "--format", "json",
    )  # fmt: skip
    assert "(cached: computed at t1.decoder.0.self_attn.h2.k, row 2)" in json.loads(out)["where"][1]


def test_n_kv_heads_not_dividing_an_n_heads_set_by_set_says_so(tmp_path: Path) -> None:
    # the file's n_kv_heads 2 was right for its n_heads 4; --set made n_heads 3
    code, _, err = _invoke("decode", _write(tmp_path, SMALL), "--set", "model.n_heads=3")
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "does not divide n_heads 3" in err and "(model.n_heads set by --set)" in err, err


def test_per_head_w_k_refused_under_an_n_kv_heads_set_by_set_says_so() -> None:
    # hello gives W_k per head (multi-head attention); --set turns on grouped-query attention
    code, _, err = _invoke("decode", "hello", "--set", "model.n_kv_heads=1")
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "heads.0.W_k" in err and "(model.n_kv_heads set by --set)" in err, err


def test_generate_explain_of_a_context_names_a_shared_v_row_of_this_iteration_apart(
    tmp_path: Path,
) -> None:
    """The V of t2's h3.context: rows 0..2 kept from t0 and t1 (cached), row 3 computed
    at t2 itself, in h2 (K/V head 1's first query head): not cached."""
    code, out, err = _invoke(
        "generate", _write(tmp_path, SMALL), "--max-tokens", "3", "--explain",
        "t2.decoder.0.self_attn.h3.context", "--cell", "0,0", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    v_line = next(w for w in json.loads(out)["where"] if w.startswith("V[:,0]"))
    cached, _, now = v_line.partition("; row 3 its K/V head's, computed at ")
    assert "rows 0..2 cached: row 0 at t0.decoder.0.self_attn.h2.v" in cached, v_line
    assert "t2" not in cached.partition("cached:")[2], v_line  # no row of t2 called cached
    assert now.startswith("t2.decoder.0.self_attn.h2.v = ["), v_line
