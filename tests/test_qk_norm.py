"""QK-norm (model.qk_norm head; Qwen3, Gemma 3): each head's queries and each K/V head's
keys normalised over their d_k entries before RoPE, with one γ and β per block shared by
its heads. Worked by hand here; the torch reference (tests/reference_torch.py), generate
with and without the cache (tests/test_generate.py) and Hugging Face's Qwen3
(tests/test_hf_qwen3.py) check it on random models."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import config_from
from test_bad_inputs import Bad, _run_bad
from typer.testing import CliRunner

from trace_tf import cost
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import conventions, run

runner = CliRunner()

# X = I, so Q_raw = W_q and K_raw = W_k row by row; d_k = 2, ε = 0
W_Q = [[3.0, 4.0], [1.0, 2.0]]
W_K = [[1.0, 3.0], [2.0, 0.0]]
GAMMA_Q, BETA_Q = [2.0, 0.5], [0.0, 0.0]
GAMMA_K, BETA_K = [1.0, 3.0], [0.5, -1.0]


def _data(norm: str = "rms", positional: str = "none", **model: Any) -> dict[str, Any]:
    return {
        "model": {"d_model": 2, "n_heads": 1, "positional": positional, "norm": norm,
                  "norm_eps": 0, "qk_norm": "head", **model},
        "source": [[1.0, 0.0], [0.0, 1.0]],
        "weights": {"encoder": [{"self_attn": {
            "heads": [{"W_q": W_Q, "W_k": W_K}],
            "q_norm": {"gamma": GAMMA_Q, "beta": BETA_Q},
            "k_norm": {"gamma": GAMMA_K, "beta": BETA_K},
        }}]},
    }  # fmt: skip


def _run(data: dict[str, Any]) -> Any:
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    return run(cfg, "full")


H = "encoder.0.self_attn.h0"


def test_rms_qk_norm_by_hand() -> None:
    t = _run(_data("rms"))
    # Q_raw row 0 = [3, 4]: rms √((9 + 16)/2) = √12.5; row 1 = [1, 2]: √2.5
    q = [[3 / math.sqrt(12.5) * 2, 4 / math.sqrt(12.5) * 0.5],
         [1 / math.sqrt(2.5) * 2, 2 / math.sqrt(2.5) * 0.5]]  # fmt: skip
    # K_raw row 0 = [1, 3]: rms √5; row 1 = [2, 0]: rms √2; · γ [1, 3] + β [0.5, −1]
    k = [[1 / math.sqrt(5) + 0.5, 3 / math.sqrt(5) * 3 - 1], [2 / math.sqrt(2) + 0.5, -1]]
    assert t.value(f"{H}.q_raw").tolist() == W_Q and t.value(f"{H}.k_raw").tolist() == W_K
    np.testing.assert_allclose(t.value(f"{H}.q.rms")[:, 0], [math.sqrt(12.5), math.sqrt(2.5)])
    np.testing.assert_allclose(t.value(f"{H}.q"), q, rtol=1e-15)
    np.testing.assert_allclose(t.value(f"{H}.k"), k, rtol=1e-15)
    # the scores read the normalised q and k: S = Q Kᵀ, divided by √2
    np.testing.assert_allclose(t.value(f"{H}.scaled"), np.array(q) @ np.array(k).T / math.sqrt(2))
    assert f"{H}.q_norm" not in t  # no RoPE: the norm is q itself


def test_layer_qk_norm_by_hand() -> None:
    t = _run(_data("layer"))
    # every row of two entries a < b is (−1, 1) once standardised (ε 0), then · γ + β
    np.testing.assert_allclose(t.value(f"{H}.q"), [[-2.0, 0.5], [-2.0, 0.5]], rtol=1e-15)
    # K_raw [1, 3] is (−1, 1), [2, 0] is (1, −1)
    np.testing.assert_allclose(t.value(f"{H}.k"), [[-0.5, 2.0], [1.5, -4.0]], rtol=1e-15)
    assert t.value(f"{H}.q.mean").tolist() == [[3.5], [1.5]]
    assert t.value(f"{H}.k.var").tolist() == [[1.0], [1.0]]


def test_with_rope_the_norm_comes_first_and_the_rotation_after() -> None:
    t = _run(_data("rms", "rope"))
    qn = np.array([[3, 4], [1, 2]]) / np.sqrt([[12.5], [2.5]]) * GAMMA_Q
    np.testing.assert_allclose(t.value(f"{H}.q_norm"), qn, rtol=1e-15)
    # row 1 (position 1) turned by 1 radian (d_k 2: one pair, θ_0 = 1); row 0 not at all
    c, s = math.cos(1), math.sin(1)
    rotated = [qn[0], [qn[1, 0] * c - qn[1, 1] * s, qn[1, 0] * s + qn[1, 1] * c]]
    np.testing.assert_allclose(t.value(f"{H}.q"), rotated, rtol=1e-14)
    # The wrong order, the norm after RoPE, gives other numbers (γ is not 1: no symmetry)
    raw = np.array([W_Q[1][0] * c - W_Q[1][1] * s, W_Q[1][0] * s + W_Q[1][1] * c])
    wrong = raw / np.sqrt(np.mean(raw**2)) * GAMMA_Q
    assert np.abs(t.value(f"{H}.q")[1] - wrong).max() > 0.1
    assert t[f"{H}.q"].formula.startswith("Q = RoPE(Q_norm, pos)")
    assert t[f"{H}.k_norm"].inputs == (f"{H}.k_raw", *(
        f"weights.encoder.0.self_attn.k_norm.{p}" for p in ("gamma", "beta")))  # fmt: skip


def test_the_header_explain_stages_and_groups_say_it() -> None:
    cfg = config_from(_gqa())
    assert isinstance(cfg, Config)
    header = dict(conventions(cfg))["qk norm"]
    for said in ("RMSNorm", "ε = 0", "d_k = 2", "once per K/V head", "before RoPE",
                 "shared by every head"):  # fmt: skip
        assert said in header, said
    plain = config_from({"model": {"d_model": 2}, "source": [[1, 2]]})
    assert isinstance(plain, Config) and "qk norm" not in dict(conventions(plain))
    result = runner.invoke(app, ["stages", "--format", "json"])
    keys = [s["key"] for s in json.loads(result.stdout)["stages"]]
    assert keys.index("q_raw") < keys.index("q_norm") < keys.index("q")
    data = _data("rms", "rope")
    out = runner.invoke(app, ["step", "-", "--stage", "qkv", "--format", "json"],
                        input=yaml.safe_dump(data))  # fmt: skip
    paths = [s["path"] for s in json.loads(out.stdout)["steps"]]
    assert [p.removeprefix(H + ".") for p in paths] == [
        "q_raw",
        "q_norm.rms",
        "q_norm",
        "q",
        "k_raw",
        "k_norm.rms",
        "k_norm",
        "k",
        "v",
    ]
    out = runner.invoke(app, ["explain", f"{H}.q_norm", "-", "--cell", "1,0"],
                        input=yaml.safe_dump(data), env={"COLUMNS": "200"})  # fmt: skip
    assert out.exit_code == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "x[1,0] / rms1 × γ[0] + β[0]" in text and "= 1 / 1.5811 × 2 + 0" in text
    assert "the arithmetic above agrees" in text and "shared by every head" in text


def _gqa() -> dict[str, Any]:
    """Two query heads of d_k 2 (W_q: W_Q, W_K) on one K/V head, with RoPE."""
    data = _data("rms", "rope", n_heads=2, n_kv_heads=1, d_k=2)
    block = data["weights"]["encoder"][0]["self_attn"]
    block["heads"] = [{"W_q": W_Q}, {"W_q": W_K}]
    block["kv_heads"] = [{"W_k": W_K}]
    return data


def test_gqa_normalises_each_kv_heads_keys_once_with_the_blocks_gamma() -> None:
    data = _gqa()
    block = data["weights"]["encoder"][0]["self_attn"]
    t = _run(data)
    assert t[f"{H}.k_norm"].value is t["encoder.0.self_attn.h1.k_norm"].value  # one array
    # both query heads are normalised with the one q_norm γ
    k = np.array(W_K) / np.sqrt(np.mean(np.square(W_K), axis=1, keepdims=True)) * GAMMA_K
    np.testing.assert_allclose(t.value("encoder.0.self_attn.h1.q_norm"), k / GAMMA_K * GAMMA_Q)
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    ledger = {c.path: c for c in cost.ledger(cfg)}
    assert ledger["encoder.0.self_attn.h1.k_norm"].formula == cost.SHARED
    assert ledger[f"{H}.k_norm"].formula == "— (normalises k_raw, elementwise)"
    # the projections cost what they cost without QK-norm
    off = config_from({**data, "model": {**data["model"], "qk_norm": "none"},
                       "weights": {"encoder": [{"self_attn": {
                           k: v for k, v in block.items() if k not in ("q_norm", "k_norm")}}]}})  # fmt: skip
    assert isinstance(off, Config)
    assert cost.totals(cost.ledger(cfg)) == cost.totals(cost.ledger(off))


def test_weights_are_listed_set_and_read_from_an_npz(tmp_path: Path) -> None:
    data = _data("rms")
    del data["weights"]["encoder"][0]["self_attn"]["k_norm"]
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(data), encoding="utf-8")
    out = runner.invoke(app, ["weights", str(f), "--format", "json"])
    assert out.exit_code == 0, out.stderr
    listed = {w["path"]: w for w in json.loads(out.stdout)["weights"]}
    assert listed["weights.encoder.0.self_attn.k_norm.gamma"]["text"] == "default: ones"
    assert "weights.encoder.0.self_attn.q_norm.beta" in listed
    # --set one entry of γ: only k changes, by that column
    a = runner.invoke(app, ["encode", str(f), "--format", "json"])
    b = runner.invoke(app, ["encode", str(f), "--format", "json",
                            "--set", "weights.encoder.0.self_attn.k_norm.gamma.1=3"])  # fmt: skip
    steps_a = {s["path"]: np.array(s["value"]) for s in json.loads(a.stdout)["steps"]}
    steps_b = {s["path"]: np.array(s["value"]) for s in json.loads(b.stdout)["steps"]}
    assert np.array_equal(steps_b[f"{H}.k"][:, 1], 3 * steps_a[f"{H}.k"][:, 1])
    assert np.array_equal(steps_b[f"{H}.q"], steps_a[f"{H}.q"])
    # the same γ from a weights_file
    np.savez(tmp_path / "w.npz", **{"encoder.0.self_attn.k_norm.gamma": np.array([1.0, 3.0])})
    f.write_text(yaml.safe_dump({**data, "weights_file": "w.npz"}), encoding="utf-8")
    c = runner.invoke(app, ["encode", str(f), "--format", "json"])
    assert c.exit_code == 0, c.stderr
    steps_c = {s["path"]: np.array(s["value"]) for s in json.loads(c.stdout)["steps"]}
    assert np.array_equal(steps_c[f"{H}.k"], steps_b[f"{H}.k"])


def _bad(model: str = "qk_norm: head", block: str = "q_norm: {gamma: [1, 2]}") -> str:
    return (
        f"model: {{d_model: 4, n_heads: 2, {model}}}\n"
        "source: [[1, 2, 3, 4]]\n"
        "weights:\n"
        "  encoder:\n"
        "    - self_attn:\n"
        f"        {block}\n"
    )


BAD = [
    Bad(_bad(block="q_norm: {gamma: [1, 2, 3]}"), "weights.encoder.0.self_attn.q_norm.gamma",
        6, ("wrong shape", "expected shape 2 (d_k)", "found shape 3")),
    Bad(_bad(block="k_norm: {beta: [[1, 2]]}"), "weights.encoder.0.self_attn.k_norm.beta", 6,
        ("expected shape 2 (d_k)", "found shape 1 x 2")),
    Bad(_bad("qk_norm: none"), "weights.encoder.0.self_attn.q_norm", 6,
        ("model.qk_norm is none", "expected model.qk_norm: head or projection, or no q_norm",
         "found model.qk_norm: none")),
    Bad(_bad("norm: rms"), "weights.encoder.0.self_attn.q_norm", 6, ("model.qk_norm is none",)),
    Bad(_bad("qk_norm: all"), "model.qk_norm", 1, ("expected one of: none, head",)),
    Bad(_bad("qk_norm: head, score: additive"), "model.qk_norm", 1,
        ("a dot-product score", "expected model.score scaled_dot, dot or bilinear",
         "found model.score: additive")),
    Bad(_bad("qk_norm: head, score: gaussian"), "model.qk_norm", 1, ("model.score: gaussian",)),
    Bad(_bad(block="k_norm: {gamm: [1, 2]}"), "weights.encoder.0.self_attn.k_norm.gamm", 6,
        ("did you mean 'gamma'?",)),
    Bad(_bad(block="k_norm: [1, 2]"), "weights.encoder.0.self_attn.k_norm", 6, ()),
    Bad(_bad("qk_norm: none", "W_o: [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]"),
        "weights.encoder.0.self_attn.q_norm", None,
        ("model.qk_norm is none (model.qk_norm set by --set)",),
        ("encode", "{file}", "--set", "model.qk_norm=none",
         "--set", "weights.encoder.0.self_attn.q_norm.gamma=[1, 2]")),
]  # fmt: skip


@pytest.mark.parametrize("bad", BAD, ids=lambda b: str(b.says[:1]) + str(b.path))
def test_bad_qk_norm_input_is_refused(bad: Bad, tmp_path: Path) -> None:
    _run_bad(bad, tmp_path)


def test_qk_norm_runs_in_every_format(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(_data("layer", "rope")), encoding="utf-8")
    for fmt, stage in (("npz", "qkv"), ("csv", f"{H}.k_norm")):
        out = tmp_path / f"o.{fmt}"
        args = ["step", str(f), "--stage", stage, "--format", fmt, "--output", str(out)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.stderr
    with np.load(tmp_path / "o.npz") as z:
        assert f"{H}.q_norm" in z.files and f"{H}.k_norm.var" in z.files
    rows = (tmp_path / "o.csv").read_text(encoding="utf-8").splitlines()
    assert rows[1:] == ["x0,-0.5,2.0", "x1,1.5,-4.0"]  # (−1, 1) and (1, −1), · γ + β


def test_diff_and_the_layer_and_head_filters(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(_gqa()), encoding="utf-8")
    off = ["--set-b", "model.qk_norm=none"]
    out = runner.invoke(app, ["diff", str(f), *off])
    assert out.exit_code == 2 and "model.qk_norm is none" in out.stderr  # γ given: refused
    for norm in ("q_norm", "k_norm"):  # the file's norms taken out too
        off += ["--set-b", f"weights.encoder.0.self_attn.{norm}=null"]
    out = runner.invoke(app, ["diff", str(f), *off, "--format", "json"])
    assert out.exit_code == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["first_difference"] == f"{H}.q_norm.rms" and d["only_b"] == []
    assert f"{H}.k_norm" in d["only_a"] and "encoder.0.self_attn.h1.q_norm" in d["only_a"]
    status = {s["path"]: s["status"] for s in d["steps"]}
    assert status[f"{H}.q_raw"] == "same" and status[f"{H}.q"] != "same"  # q_raw X W_q in both
    only = {w["path"] for w in d["weights"] if w["status"] == "only in A"}
    assert only == {f"weights.encoder.0.self_attn.{n}.{p}" for n in ("q_norm", "k_norm")
                    for p in ("gamma", "beta")}  # fmt: skip
    out = runner.invoke(
        app,
        ["step", str(f), "--stage", "k_norm", "--head", "1", "--layer", "0", "--format", "json"],
    )
    assert out.exit_code == 0, out.stderr
    assert [s["path"] for s in json.loads(out.stdout)["steps"]] == ["encoder.0.self_attn.h1.k_norm"]
