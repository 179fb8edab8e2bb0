"""model.norm_position sandwich (Gemma 2: x + Norm_post(F(Norm(x)))) and output (OLMo 2's
reordered norm: x + Norm(F(x))), and model.qk_norm projection (OLMo 2's QK-norm over the
whole projection, before the split into heads). Worked by hand here, with the wrong
variants beside them; the torch reference (tests/reference_torch.py), generate with and
without the cache (tests/test_generate.py) and Hugging Face's OLMo 2 (tests/test_hf_olmo2.py)
check them on random models."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import config_from
from random_configs import LLAMA, random_config
from reference_torch import reference_forward
from test_bad_inputs import Bad, _run_bad
from typer.testing import CliRunner

from trace_tf import cost
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import conventions, run

runner = CliRunner()
A = "encoder.0.self_attn"
R2 = math.sqrt(2)


# ---------------------------------------------------------------------------
# The placements by hand: one position, so softmax = 1 and the attention is x W_v W_o
# ---------------------------------------------------------------------------


def _placement(position: str, **attn: Any) -> dict[str, Any]:
    """x = [2, 0]; W_v = I and W_o swaps the columns: the attention gives [x_1, x_0]. RMSNorm,
    ε = 0. `norm` γ [1, 0.5] (sandwich: post_norm's, norm's γ left at ones)."""
    gamma = {"gamma": [1.0, 0.5]}
    block: dict[str, Any] = {
        "W_q": [[1.0, 0.0], [0.0, 1.0]],
        "W_k": [[1.0, 0.0], [0.0, 1.0]],
        "W_v": [[1.0, 0.0], [0.0, 1.0]],
        "W_o": [[0.0, 1.0], [1.0, 0.0]],
        **({"post_norm": gamma} if position == "sandwich" else {"norm": gamma}),
        **attn,
    }
    return {
        "model": {"d_model": 2, "n_heads": 1, "positional": "none", "norm": "rms",
                  "norm_eps": 0, "norm_position": position},
        "source": [[2.0, 0.0]],
        "weights": {"encoder": [{"self_attn": block}]},
    }  # fmt: skip


def _steps(data: dict[str, Any]) -> dict[str, np.ndarray]:
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    return {s.path: s.value for s in run(cfg)}


def test_output_norm_by_hand() -> None:
    # F(x) = [0, 2]; rms([0, 2]) = √2, so Norm(F(x)) = [0, √2] · γ = [0, √2/2];
    # x + Norm(F(x)) = [2, √2/2]
    s = _steps(_placement("output"))
    assert list(s)[list(s).index(f"{A}.wo") + 1 :][:3] == [f"{A}.norm.rms", f"{A}.norm",
                                                            f"{A}.residual"]  # fmt: skip
    np.testing.assert_allclose(s[f"{A}.wo"], [[0.0, 2.0]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(s[f"{A}.norm.rms"], [[R2]], rtol=1e-15)
    np.testing.assert_allclose(s[f"{A}.norm"], [[0.0, R2 / 2]], rtol=1e-15)
    np.testing.assert_allclose(s[f"{A}.residual"], [[2.0, R2 / 2]], rtol=1e-15)
    # the wrong variant, the norm on the input (pre-norm with the same γ): Norm(x) =
    # [2, 0] / √2 · γ = [√2, 0], F = [0, √2], x + F = [2, √2]
    assert not np.allclose(s[f"{A}.residual"], [[2.0, R2]])
    pre = _steps(_placement("pre"))
    np.testing.assert_allclose(pre[f"{A}.residual"], [[2.0, R2]], rtol=1e-15)


def test_sandwich_by_hand() -> None:
    # Norm(x) = [2, 0] / √2 = [√2, 0] (γ 1); F = [0, √2]; rms = 1, so post_norm = [0, √2]
    # · [1, 0.5] = [0, √2/2]; x + post_norm = [2, √2/2]
    s = _steps(_placement("sandwich"))
    order = [p for p in s if p.startswith(A)]
    assert order[:2] == [f"{A}.norm.rms", f"{A}.norm"]  # the input's norm first
    assert order[-3:] == [f"{A}.post_norm.rms", f"{A}.post_norm", f"{A}.residual"]
    np.testing.assert_allclose(s[f"{A}.norm"], [[R2, 0.0]], rtol=1e-15)
    np.testing.assert_allclose(s[f"{A}.post_norm.rms"], [[1.0]], rtol=1e-15)
    np.testing.assert_allclose(s[f"{A}.post_norm"], [[0.0, R2 / 2]], rtol=1e-15)
    np.testing.assert_allclose(s[f"{A}.residual"], [[2.0, R2 / 2]], rtol=1e-15)
    # the wrong variants: no post_norm (pre-norm), x + F = [2, √2]; and the two γ confused,
    # post_norm's on the input: Norm(x) · [1, 0.5] = [√2, 0], F = [0, √2], Norm_post (γ 1)
    # = [0, √2], x + … = [2, √2]
    assert not np.allclose(s[f"{A}.residual"], [[2.0, R2]])
    swapped = _placement("sandwich", norm={"gamma": [1.0, 0.5]}, post_norm={})
    np.testing.assert_allclose(_steps(swapped)[f"{A}.residual"], [[2.0, R2]], rtol=1e-15)


def test_the_final_norm_is_on_by_default_for_sandwich_and_output() -> None:
    for position in ("sandwich", "output"):
        s = _steps(_placement(position))
        assert "encoder.final_norm" in s
        # the last layer's output is ffn.residual, which the final norm reads
        x = s["encoder.0.ffn.residual"]
        np.testing.assert_allclose(
            s["encoder.final_norm"], x / np.sqrt(np.mean(x**2, axis=1, keepdims=True)), rtol=1e-14
        )
    assert "encoder.final_norm" not in _steps(_placement("output") | {"model": {
        **_placement("output")["model"], "final_norm": False}})  # fmt: skip


# ---------------------------------------------------------------------------
# QK-norm over the whole projection, by hand
# ---------------------------------------------------------------------------


def _projection(**model: Any) -> dict[str, Any]:
    """Two heads of d_k 1, x = [2, 0]: Q_raw = [2, 6] (head 0's column, head 1's), K_raw =
    [4, 2]. RMSNorm, ε = 0, no positions: q and k are the heads' columns of the norms."""
    return {
        "model": {"d_model": 2, "n_heads": 2, "d_k": 1, "positional": "none", "norm": "rms",
                  "norm_eps": 0, "qk_norm": "projection", **model},
        "source": [[2.0, 0.0]],
        "weights": {"encoder": [{"self_attn": {
            "heads": [{"W_q": [[1.0], [0.0]], "W_k": [[2.0], [0.0]]},
                      {"W_q": [[3.0], [0.0]], "W_k": [[1.0], [0.0]]}],
            "q_norm": {"gamma": [1.0, 2.0]},
            "k_norm": {"beta": [0.5, 0.0]},
        }}]},
    }  # fmt: skip


def test_projection_qk_norm_by_hand() -> None:
    s = _steps(_projection())
    np.testing.assert_array_equal(s[f"{A}.q_raw"], [[2.0, 6.0]])
    # rms([2, 6]) = √((4 + 36) / 2) = √20; Q_norm = [2, 6] / √20 · [1, 2] = [1/√5, 6/√5]
    np.testing.assert_allclose(s[f"{A}.q_norm.rms"], [[math.sqrt(20)]], rtol=1e-15)
    np.testing.assert_allclose(s[f"{A}.q_norm"], [[1 / math.sqrt(5), 6 / math.sqrt(5)]], rtol=1e-15)
    # rms([4, 2]) = √10; K_norm = [4, 2] / √10 + [0.5, 0]
    np.testing.assert_allclose(
        s[f"{A}.k_norm"], [[4 / math.sqrt(10) + 0.5, 2 / math.sqrt(10)]], rtol=1e-15
    )
    # each head reads its column
    np.testing.assert_allclose(s[f"{A}.h0.q"], [[1 / math.sqrt(5)]], rtol=1e-15)
    np.testing.assert_allclose(s[f"{A}.h1.q"], [[6 / math.sqrt(5)]], rtol=1e-15)
    np.testing.assert_allclose(s[f"{A}.h1.k"], [[2 / math.sqrt(10)]], rtol=1e-15)
    # the wrong variant, per head (qk_norm head): each head's one entry divided by its own
    # size, q = ±1 · γ: h1's q would be 1 · 2 = 2, not 6/√5
    assert not np.isclose(s[f"{A}.h1.q"][0, 0], 2.0)
    assert f"{A}.h0.q_raw" not in s and f"{A}.h0.q_norm" not in s  # the block's steps only


def test_projection_with_rope_turns_each_heads_columns_and_grouped_k_once() -> None:
    # 4 query heads of d_k 2 over 2 K/V heads; each q is RoPE of its columns of Q_norm
    raw = random_config(
        np.random.default_rng(5), d_model=8, n_heads=4, n_kv_heads=2, encoder_layers=0,
        decoder_layers=1, **{**LLAMA, "norm_position": "output"}, qk_norm="projection",
    )  # fmt: skip
    s = _steps(raw)
    D = "decoder.0.self_attn"
    L = len(raw["target"])
    assert s[f"{D}.q_norm"].shape == (L, 8) and s[f"{D}.k_norm"].shape == (L, 4)
    # numpy, by the formulas: the whole row's RMS, then γ, β of 8 (4 for K)
    block = raw["weights"]["decoder"][0]["self_attn"]
    q_raw = s[f"{D}.q_raw"]
    g, b = np.array(block["q_norm"]["gamma"]), np.array(block["q_norm"]["beta"])
    want = q_raw / np.sqrt(np.mean(q_raw**2, axis=1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(s[f"{D}.q_norm"], want, rtol=1e-13)
    assert np.array_equal(s[f"{D}.h2.k"], s[f"{D}.h3.k"])  # K/V head 1's, shared
    # position 0 is not turned: h3's q at row 0 is Q_norm's columns 6, 7 there
    np.testing.assert_array_equal(s[f"{D}.h3.q"][0], s[f"{D}.q_norm"][0, 6:8])
    np.testing.assert_array_equal(s[f"{D}.h3.k"][0], s[f"{D}.k_norm"][0, 2:4])


# ---------------------------------------------------------------------------
# Wrong variants against the torch reference: each fails
# ---------------------------------------------------------------------------


def _olmo2(seed: int = 3) -> dict[str, Any]:
    return random_config(
        np.random.default_rng(seed), d_model=8, n_heads=4, n_kv_heads=2, encoder_layers=0,
        decoder_layers=2, **{**LLAMA, "norm_position": "output"}, biases=False,
        qk_norm="projection",
    )  # fmt: skip


def test_the_reference_agrees_and_its_wrong_variants_do_not() -> None:
    raw = _olmo2()
    probs = _steps(raw)["probs"]
    np.testing.assert_allclose(probs, reference_forward(raw)["probs"], rtol=0, atol=1e-12)
    # the norm on each sublayer's input instead of its output (same γ)
    pre = {**raw, "model": {**raw["model"], "norm_position": "pre"}}
    assert np.abs(reference_forward(pre)["probs"] - probs).max() > 1e-3
    # head-wise QK-norm (γ 1, β 0 both ways) instead of the whole projection's
    plain = json.loads(json.dumps(raw))
    for layer in plain["weights"]["decoder"]:
        layer["self_attn"].pop("q_norm"), layer["self_attn"].pop("k_norm")
    whole = _steps(plain)["probs"]
    np.testing.assert_allclose(whole, reference_forward(plain)["probs"], rtol=0, atol=1e-12)
    head = {**plain, "model": {**plain["model"], "qk_norm": "head"}}
    assert np.abs(reference_forward(head)["probs"] - whole).max() > 1e-3


# ---------------------------------------------------------------------------
# Everything a new option reaches: header, cost, filters, formats, --set, npz, diff
# ---------------------------------------------------------------------------


def test_the_header_says_the_placement_and_the_norm_over_the_projection() -> None:
    cfg = config_from(_projection(norm_position="output"))
    assert isinstance(cfg, Config)
    rows = dict(conventions(cfg))
    assert rows["norm"].startswith("output-norm (each sublayer x + Norm(F(x)): norm on its output")
    qk = rows["qk norm"]
    assert "over the whole projection" in qk and "ε = 0" in qk
    assert "n_heads·d_k = 2 entries of Q_raw" in qk and "n_kv_heads·d_k = 2 of K_raw" in qk
    assert "γ and β of 2 (q_norm) and 2 (k_norm)" in qk
    sandwich = config_from(_placement("sandwich"))
    assert isinstance(sandwich, Config)
    assert "post_norm on its output" in dict(conventions(sandwich))["norm"]


def test_cost_counts_the_whole_projection_once() -> None:
    cfg = config_from(_projection())
    assert isinstance(cfg, Config)
    by_path = {c.path: c for c in cost.ledger(cfg)}
    q_raw = by_path[f"{A}.q_raw"]
    assert q_raw.formula == "L_q·d_model·(H·d_k)" and q_raw.terms == (1, 2, 2)
    assert by_path[f"{A}.h1.q"].macs == 0 and by_path[f"{A}.q_norm"].macs == 0


def test_filters_formats_set_and_weights_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    data = _projection()
    f.write_text(yaml.safe_dump(data), encoding="utf-8")
    # --head selects a head's steps; the whole projection's are the block's, as wo is
    out = runner.invoke(app, ["step", str(f), "--stage", "qkv", "--head", "1", "--format", "json"])
    assert out.exit_code == 0, out.stderr
    assert [s["path"] for s in json.loads(out.stdout)["steps"]] == [f"{A}.h1.{n}" for n in "qkv"]
    out = runner.invoke(app, ["step", str(f), "--stage", "qkv", "--format", "json"])
    paths = [s["path"] for s in json.loads(out.stdout)["steps"]]
    assert paths[:6] == [f"{A}.q_raw", f"{A}.q_norm.rms", f"{A}.q_norm", f"{A}.k_raw",
                         f"{A}.k_norm.rms", f"{A}.k_norm"]  # fmt: skip
    for fmt, stage in (("npz", "q_norm"), ("csv", f"{A}.q_norm")):
        o = tmp_path / f"o.{fmt}"
        r = runner.invoke(
            app, ["step", str(f), "--stage", stage, "--format", fmt, "--output", str(o)]
        )
        assert r.exit_code == 0, r.stderr
    with np.load(tmp_path / "o.npz") as z:
        assert z[f"{A}.q_norm"].shape == (1, 2)
    assert (tmp_path / "o.csv").read_text(encoding="utf-8").splitlines()[1].startswith("x0,")
    # q_norm's γ by --set, and from an npz: the same steps
    g = "weights.encoder.0.self_attn.q_norm.gamma"
    a = runner.invoke(app, ["encode", str(f), "--set", f"{g}=[3, 1]", "--format", "json"])
    assert a.exit_code == 0, a.stderr
    steps_a = {s["path"]: s["value"] for s in json.loads(a.stdout)["steps"]}
    # [2, 6] / √20 · [3, 1] = [6/√20, 6/√20]
    np.testing.assert_allclose(steps_a[f"{A}.q_norm"], [[6 / math.sqrt(20)] * 2], rtol=1e-15)
    np.savez(tmp_path / "w.npz", **{"encoder.0.self_attn.q_norm.gamma": np.array([3.0, 1.0])})
    del data["weights"]["encoder"][0]["self_attn"]["q_norm"]
    f.write_text(yaml.safe_dump({**data, "weights_file": "w.npz"}), encoding="utf-8")
    b = runner.invoke(app, ["encode", str(f), "--format", "json"])
    assert b.exit_code == 0, b.stderr
    assert {s["path"]: s["value"] for s in json.loads(b.stdout)["steps"]} == steps_a


def test_post_norm_is_listed_set_and_diffed(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(_placement("sandwich")), encoding="utf-8")
    out = runner.invoke(app, ["weights", str(f), "--format", "json"])
    assert out.exit_code == 0, out.stderr
    text = out.stdout
    for sub in ("self_attn", "ffn"):
        assert f"weights.encoder.0.{sub}.post_norm.gamma" in text
    # post_norm's γ by --set: [0, √2] · [1, 3]
    p = "weights.encoder.0.self_attn.post_norm.gamma"
    r = runner.invoke(app, ["step", str(f), "--stage", "post_norm", "--layer", "0",
                            "--set", f"{p}=[1, 3]", "--format", "json"])  # fmt: skip
    assert r.exit_code == 0, r.stderr
    got = {s["path"]: s["value"] for s in json.loads(r.stdout)["steps"]}
    np.testing.assert_allclose(got[f"{A}.post_norm"], [[0.0, 3 * R2]], rtol=1e-15)
    # diff against output: post_norm only in A; the file's post_norm nulled for B
    d = runner.invoke(app, ["diff", str(f), "--set-b", "model.norm_position=output",
                            "--set-b", f"{A.replace('encoder', 'weights.encoder')}.post_norm=null",
                            "--format", "json"])  # fmt: skip
    assert d.exit_code == 0, d.stderr
    report = json.loads(d.stdout)
    assert f"{A}.post_norm" in report["only_a"] and "encoder.0.ffn.post_norm" in report["only_a"]
    status = {s["path"]: s["status"] for s in report["steps"]}
    # A's attention reads Norm(x), B's x itself: from there on they differ
    assert status["encoder.input"] == "same" and status[f"{A}.wo"] != "same"


def test_explain_writes_the_new_steps_out() -> None:
    text = yaml.safe_dump(_projection(norm_position="output"))
    for step, cell, says in (
        (f"{A}.residual", "0,1", "Norm(sublayer(x))"),
        (f"{A}.q_raw", "0,1", "column 1 is head 1's column 0"),
        (f"{A}.q_norm", "0,1", "QK-norm over the whole projection: row 0's 2 entries"),
        (f"{A}.h1.q", "0,0", "this head's columns are 1..1"),
    ):
        result = runner.invoke(app, ["explain", step, "-", "--cell", cell], input=text)
        assert result.exit_code == 0, (step, result.stderr)
        assert says in result.stdout, (step, result.stdout)
        assert "the arithmetic above agrees" in result.stdout


# ---------------------------------------------------------------------------
# Refusals: key path, expected, found; exit 2
# ---------------------------------------------------------------------------


def _bad(model: str, block: str, sub: str = "self_attn") -> str:
    return (
        f"model: {{d_model: 4, n_heads: 2, {model}}}\n"
        "source: [[1, 2, 3, 4]]\n"
        "weights:\n"
        "  encoder:\n"
        f"    - {sub}:\n"
        f"        {block}\n"
    )


POST = "post_norm: {gamma: [1, 2, 3, 4]}"
BAD = [
    Bad(_bad("norm_position: pre", POST), "weights.encoder.0.self_attn.post_norm", 6,
        ("given but model.norm_position is pre", "expected model.norm_position: sandwich, or "
         "no post_norm", "found model.norm_position: pre")),
    Bad(_bad("norm_position: output", POST, "ffn"), "weights.encoder.0.ffn.post_norm", 6,
        ("model.norm_position is output",)),
    Bad(_bad("norm_position: post", POST), "weights.encoder.0.self_attn.post_norm", 6,
        ("model.norm_position is post",)),
    Bad(_bad("norm_position: sandwich", "post_norm: {gamma: [1, 2]}"),
        "weights.encoder.0.self_attn.post_norm.gamma", 6,
        ("expected shape 4 (d_model)", "found shape 2")),
    Bad(_bad("norm_position: middle", POST), "model.norm_position", 1,
        ("expected one of: post, pre, sandwich, output",)),
    Bad(_bad("norm_position: output, parallel: separate", POST), "model.parallel", 1,
        ("expected model.norm_position: pre beside model.parallel", "found norm_position output")),
    Bad(_bad("norm_position: sandwich, parallel: shared", POST), "model.parallel", 1,
        ("found norm_position sandwich",)),
    Bad(_bad("qk_norm: projection", "q_norm: {gamma: [1, 2]}"),
        "weights.encoder.0.self_attn.q_norm.gamma", 6,
        ("wrong shape", "expected shape 4 (n_heads·d_k (qk_norm projection))", "found shape 2")),
    Bad(_bad("n_kv_heads: 1, qk_norm: projection", "k_norm: {beta: [1, 2, 3, 4]}"),
        "weights.encoder.0.self_attn.k_norm.beta", 6,
        ("expected shape 2 (n_kv_heads·d_k (qk_norm projection))", "found shape 4")),
    Bad(_bad("qk_norm: projection, score: additive", "W_o: null"), "model.qk_norm", 1,
        ("found model.score: additive",)),
    Bad(_bad("qk_norm: none", "k_norm: {gamma: [1, 2, 3, 4]}"),
        "weights.encoder.0.self_attn.k_norm", 6,
        ("expected model.qk_norm: head or projection, or no k_norm",)),
    Bad(_bad("norm_position: pre", "W_o: null"), "weights.encoder.0.ffn.post_norm", None,
        ("model.norm_position is pre (model.norm_position set by --set)",),
        ("encode", "{file}", "--set", "model.norm_position=pre",
         "--set", "weights.encoder.0.ffn.post_norm.gamma=[1, 2, 3, 4]")),
]  # fmt: skip


@pytest.mark.parametrize("bad", BAD, ids=lambda b: str(b.says[:1]) + str(b.path))
def test_bad_input_is_refused(bad: Bad, tmp_path: Path) -> None:
    _run_bad(bad, tmp_path)
