"""GPT-OSS's FFN: the clamped SwiGLU (model.activation swiglu_oss, swiglu_limit,
swiglu_alpha) and the router's bias (ffn.router_bias), by hand in numpy; GPT-OSS's
routing (softmax over the top-k logits) against trace-tf's (softmax, top-k, renormalised);
the defaults, the header, explain, cost and stages. (Every step against
tests/reference_torch.py: tests/test_engine_reference.py; against Hugging Face:
tests/test_hf_gpt_oss.py.)"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from conftest import config_from
from random_configs import LLAMA, random_config
from typer.testing import CliRunner

from trace_tf import cost
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.explain import explain
from trace_tf.runner import run

runner = CliRunner()


def _invoke(*args: str) -> Any:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "json" in args else result.stdout


def _dense(limit: float | None = 0.5) -> dict[str, Any]:
    """One pre-norm RMSNorm layer of the clamped SwiGLU, with biases, every array given."""
    return random_config(
        np.random.default_rng(3),
        d_model=6,
        n_heads=2,
        d_ff=5,
        encoder_layers=0,
        decoder_layers=1,
        **(LLAMA | dict(activation="swiglu_oss")),
        tgt_len=5,
        swiglu_limit=limit,
    )


def _gpt_oss(router_bias: bool = True) -> dict[str, Any]:
    """GPT-OSS's shape, small: 4 experts, top 2, a router bias, a limit that clamps."""
    return random_config(
        np.random.default_rng(4),
        d_model=6,
        n_heads=2,
        d_ff=5,
        encoder_layers=0,
        decoder_layers=1,
        **(LLAMA | dict(activation="swiglu_oss")),
        tgt_len=6,
        attn_sinks=True,
        swiglu_limit=0.5,
        experts=4,
        experts_top_k=2,
        router_bias=router_bias,
    )


def _clamped_swiglu(X: np.ndarray, fw: dict[str, Any], limit: float, alpha: float) -> Any:
    """Hugging Face's GptOssExperts._apply_gate, by hand: each entry's clamps and gate."""
    H = X @ np.array(fw["W_1"]) + np.array(fw["b_1"])
    U = X @ np.array(fw["W_3"]) + np.array(fw["b_3"])
    G = np.array([[h if h < limit else limit for h in row] for row in H])
    act = np.array([[g / (1 + np.exp(-alpha * g)) for g in row] for row in G])
    U1 = np.array([[max(-limit, min(limit, u)) + 1 for u in row] for row in U])
    gated = act * U1
    out = gated @ np.array(fw["W_2"]) + np.array(fw["b_2"])
    return {
        "hidden": H,
        "gate_clamp": G,
        "act": act,
        "up": U,
        "up_clamp": U1,
        "gated": gated,
        "out": out,
    }


def test_every_clamped_swiglu_step_by_hand() -> None:
    raw = _dense()
    trace = run(config_from(raw), "full")
    X = trace.value("decoder.0.ffn.norm")
    want = _clamped_swiglu(X, raw["weights"]["decoder"][0]["ffn"], 0.5, 1.702)
    for name, value in want.items():
        np.testing.assert_allclose(
            trace.value(f"decoder.0.ffn.{name}"), value, rtol=1e-13, atol=1e-15
        )
    # both clamps bite somewhere, and somewhere not: each branch of each is checked
    H, U = want["hidden"], want["up"]
    assert (H > 0.5).any() and (H < 0.5).any() and (U > 0.5).any() and (U < -0.5).any()
    assert (np.abs(U) < 0.5).any()
    # the plain SwiGLU differs: the clamps and the + 1 are not a no-op here
    plain = (H / (1 + np.exp(-H))) * U
    assert np.abs(plain - trace.value("decoder.0.ffn.gated")).max() > 0.1


def test_the_defaults_are_gpt_oss_and_the_header_says_them() -> None:
    raw = _dense(None)
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    assert (cfg.model.swiglu_limit, cfg.model.swiglu_alpha) == (7.0, 1.702)
    nulls = config_from(raw | {"model": raw["model"] | dict(swiglu_limit=None, swiglu_alpha=None)})
    assert isinstance(nulls, Config)  # null, as absent: the default
    assert (nulls.model.swiglu_limit, nulls.model.swiglu_alpha) == (7.0, 1.702)
    raw["model"]["swiglu_alpha"] = 1.0  # alpha 1, no clamp reached: SwiGLU's gate, U + 1
    trace = run(config_from(raw), "full")
    H, U = trace.value("decoder.0.ffn.hidden"), trace.value("decoder.0.ffn.up")
    assert np.abs(H).max() < 7 and np.abs(U).max() < 7
    np.testing.assert_allclose(
        trace.value("decoder.0.ffn.gated"), H / (1 + np.exp(-H)) * (U + 1), rtol=1e-13
    )
    assert trace["decoder.0.ffn.act"].formula == "G σ(1 G) (swiglu_alpha)"


def test_the_header_states_limit_and_alpha(tmp_path: Any) -> None:
    import yaml

    path = tmp_path / "oss.yaml"
    path.write_text(yaml.safe_dump(_gpt_oss()), encoding="utf-8")
    out = _invoke("decode", str(path))
    text = " ".join(out.split())
    assert "GPT-OSS's clamped SwiGLU" in text
    assert "swiglu_limit 0.5, swiglu_alpha 1.702" in text
    assert "(+ b_r where ffn.router_bias is given)" in text


def _gpt_oss_routing(R: np.ndarray, k: int) -> np.ndarray:
    """GptOssTopKRouter, by hand: torch.topk of the logits, a softmax over those k only."""
    W = np.zeros_like(R)
    for i, row in enumerate(R):
        top = sorted(range(len(row)), key=lambda e: (-row[e], e))[:k]
        e = np.exp(row[top] - row[top].max())
        W[i, top] = e / e.sum()
    return W


def test_router_bias_and_gpt_oss_routing_by_hand() -> None:
    """R = X W_r + b_r; and trace-tf's softmax over the E, top k, renormalised equals
    GPT-OSS's softmax over the top-k logits: p_e / Σ_chosen p_c = e^(R_e − lse) /
    Σ_chosen e^(R_c − lse), the common e^(−lse) cancelling, and softmax is monotone, so
    the k largest logits are the k largest probabilities."""
    raw = _gpt_oss()
    trace = run(config_from(raw), "full")
    ffn = raw["weights"]["decoder"][0]["ffn"]
    X = trace.value("decoder.0.ffn.norm")
    R = X @ np.array(ffn["router"]) + np.array(ffn["router_bias"])
    np.testing.assert_allclose(trace.value("decoder.0.ffn.router"), R, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(
        trace.value("decoder.0.ffn.routed"), _gpt_oss_routing(R, 2), rtol=1e-13, atol=1e-15
    )
    # the bias matters here: without it another expert is chosen somewhere
    R0 = X @ np.array(ffn["router"])
    assert (np.argsort(-R0, axis=1)[:, :2] != np.argsort(-R, axis=1)[:, :2]).any()
    # each chosen expert's FFN is the clamped SwiGLU of its rows
    out = np.zeros_like(X)
    W = _gpt_oss_routing(R, 2)
    for e, fw in enumerate(ffn["experts"]):
        rows = np.flatnonzero(W[:, e])
        if len(rows):
            y = _clamped_swiglu(X[rows], fw, 0.5, 1.702)["out"]
            np.testing.assert_allclose(trace.value(f"decoder.0.ffn.e{e}.out"), y, rtol=1e-13)
            out[rows] += W[rows, e, None] * y
    np.testing.assert_allclose(trace.value("decoder.0.ffn.out"), out, rtol=1e-13, atol=1e-15)


def test_an_absent_router_bias_is_zero_and_never_drawn() -> None:
    raw = _gpt_oss(router_bias=False)
    cfg = config_from(raw)
    assert isinstance(cfg, Config) and cfg.drawn == ()
    trace = run(cfg, "full")
    X = trace.value("decoder.0.ffn.norm")
    ffn = raw["weights"]["decoder"][0]["ffn"]
    np.testing.assert_allclose(
        trace.value("decoder.0.ffn.router"), X @ np.array(ffn["router"]), rtol=1e-13
    )
    assert trace["decoder.0.ffn.router"].formula == "R = X W_r (a logit per expert)"
    assert "weights.decoder.0.ffn.router_bias" not in cfg.named_arrays()
    with_bias = config_from(_gpt_oss())
    assert isinstance(with_bias, Config)
    assert "weights.decoder.0.ffn.router_bias" in with_bias.named_arrays()


@pytest.mark.parametrize(
    "step", ["router", "e0.gate_clamp", "e0.act", "e0.up_clamp", "e0.gated", "e1.hidden"]
)
def test_explain_agrees_with_every_entry(step: str) -> None:
    cfg = config_from(_gpt_oss())
    trace = run(cfg, "full")
    value = trace.value(f"decoder.0.ffn.{step}")
    for cell in np.ndindex(value.shape):
        e = explain(cfg, trace, trace[f"decoder.0.ffn.{step}"], cell)
        assert e.agrees, (step, cell)
        np.testing.assert_allclose(e.value, value[cell], rtol=1e-12, atol=1e-15)


def test_cost_counts_the_clamps_free() -> None:
    """The clamped SwiGLU costs what SwiGLU costs: the clamps and + 1 are elementwise."""
    oss = config_from(_dense())
    raw = _dense()
    raw["model"]["activation"] = "swiglu"
    del raw["model"]["swiglu_limit"]
    plain = config_from(raw)
    assert isinstance(oss, Config) and isinstance(plain, Config)
    a, b = cost.totals(cost.ledger(oss)), cost.totals(cost.ledger(plain))
    assert a.by_stage == b.by_stage and a.total > 0
    L, d, dff = 5, 6, 5
    assert a.by_stage["hidden"] == a.by_stage["up"] == L * d * dff
    clamps = [c for c in cost.ledger(oss) if c.stage in ("gate_clamp", "up_clamp")]
    assert len(clamps) == 2 and all(c.macs == 0 for c in clamps)
