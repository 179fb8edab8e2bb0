"""Gated feed-forward networks (Shazeer 2020, "GLU Variants Improve Transformer"):
SwiGLU and GeGLU (exact or tanh GELU), (act(X W_1 + b_1) ⊙ (X W_3 + b_3)) W_2 + b_2, and SiLU as a plain
activation. Numbers by hand and against torch; W_3 from every place a weight comes from.
(Every step against tests/reference_torch.py: tests/test_engine_reference.py.)"""

from __future__ import annotations

import copy
import json
import math
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import config_from
from typer.testing import CliRunner

from trace_tf import ops
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import run

runner = CliRunner()

# One token, d_model 2, d_ff 2. The attention adds nothing (W_o = 0), so the FFN reads
# the post-norm of x = [1, 3]: mean 2, variance 1, ε 0: [−1, 1], exactly.
ONE_TOKEN: dict[str, Any] = {
    "model": {
        "d_model": 2, "d_ff": 2, "activation": "swiglu", "positional": "none", "norm_eps": 0,
    },
    "source": [[1, 3]],
    "weights": {"encoder": [{
        "self_attn": {"W_o": [[0, 0], [0, 0]]},
        "ffn": {"W_1": [[1, 0], [1, 2]], "W_3": [[2, 1], [3, -1]], "b_3": [0.5, 0.25],
                "W_2": [[1, 2], [0.5, -1]], "b_2": [0.1, 0]},
    }]},
}  # fmt: skip


def _ffn_steps(data: dict[str, Any]) -> dict[str, Any]:
    trace = run(config_from(data), "encode")
    return {s.path.removeprefix("encoder.0.ffn."): s for s in trace if ".ffn." in s.path}


@pytest.mark.parametrize(
    ("activation", "name", "gate"),
    [
        # SiLU(2) = 2 σ(2) = 2 / (1 + e^−2); SiLU(0) = 0
        ("swiglu", "SiLU(H) = H σ(H)", 2 / (1 + math.exp(-2))),
        # GELU(2) = 2 Φ(2) = 2 · ½ (1 + erf(2 / √2)); GELU(0) = 0
        ("geglu", "GELU(H) (exact, erf)", 2 * 0.5 * (1 + math.erf(2 / math.sqrt(2)))),
        # GELU, tanh approximation: 2 · ½ (1 + tanh(√(2/π) (2 + 0.044715 · 2³)))
        (
            "geglu_tanh",
            "GELU(H) (tanh approx.)",
            2 * 0.5 * (1 + math.tanh(math.sqrt(2 / math.pi) * (2 + 0.044715 * 8))),
        ),
    ],
)
def test_a_gated_ffn_of_one_token_by_hand(activation: str, name: str, gate: float) -> None:
    data = copy.deepcopy(ONE_TOKEN)
    data["model"]["activation"] = activation
    steps = _ffn_steps(data)
    # x = [−1, 1]; H = x W_1 = [−1 + 1, 0 + 2] = [0, 2]
    # U = x W_3 + b_3 = [−2 + 3 + 0.5, −1 − 1 + 0.25] = [1.5, −1.75]
    # gated = [0 · 1.5, gate · (−1.75)]; out = gated W_2 + b_2 = [0.5 g + 0.1, −g]
    g = gate * -1.75
    want = {
        "hidden": ([0.0, 2.0], "H = X W_1"),
        "act": ([0.0, gate], name),
        "up": ([1.5, -1.75], "U = X W_3 + b_3"),
        "gated": ([0.0, g], "act ⊙ U"),
        "out": ([0.5 * g + 0.1, -g], "gated W_2 + b_2"),
    }
    assert list(steps)[:5] == list(want)  # in the paper's order, then residual and norm
    for key, (value, formula) in want.items():
        np.testing.assert_allclose(steps[key].value, [value], rtol=1e-15, atol=0, err_msg=key)
        assert steps[key].formula == formula
    assert steps["up"].inputs == ("encoder.0.self_attn.norm", "weights.encoder.0.ffn.W_3",
                                  "weights.encoder.0.ffn.b_3")  # fmt: skip
    assert steps["gated"].inputs == ("encoder.0.ffn.act", "encoder.0.ffn.up")


def test_a_plain_activation_keeps_its_three_steps_and_formulas() -> None:
    data = copy.deepcopy(ONE_TOKEN)
    data["model"]["activation"] = "silu"
    del data["weights"]["encoder"][0]["ffn"]["W_3"], data["weights"]["encoder"][0]["ffn"]["b_3"]
    steps = _ffn_steps(data)
    assert list(steps)[:3] == ["hidden", "act", "out"] and "up" not in steps
    silu2 = 2 / (1 + math.exp(-2))
    np.testing.assert_allclose(steps["act"].value, [[0.0, silu2]], rtol=1e-15, atol=0)
    assert steps["out"].formula == "act W_2 + b_2"
    np.testing.assert_allclose(
        steps["out"].value, [[0.5 * silu2 + 0.1, -silu2]], rtol=1e-15, atol=0
    )
    relu = run(config_from({"model": {"d_model": 2}, "source": [[1, 3]]}), "encode")
    assert [s.path for s in relu if ".ffn." in s.path][:3] == [
        "encoder.0.ffn.hidden", "encoder.0.ffn.act", "encoder.0.ffn.out",
    ]  # fmt: skip
    assert relu["encoder.0.ffn.act"].formula == "ReLU(H)"


def test_silu_is_torch_s_from_minus_1000_to_1000_without_a_warning() -> None:
    x = np.concatenate(
        [np.linspace(-1000, 1000, 40001), [-745.2, -709.8, 709.8, 5e-324, -0.0, 1e-300]]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e^1000 overflowed in 1 / (1 + e^−x)
        got = ops.silu(x)
        got32 = ops.silu(x.astype(np.float32))
    want = torch.nn.functional.silu(torch.tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-300)
    assert got32.dtype == np.float32
    want32 = torch.nn.functional.silu(torch.tensor(x.astype(np.float32))).numpy()
    # (below −87, torch's float32 x / (1 + e^−x) overflows to −0; σ's stable form keeps
    # the tiny true value, x e^x, of magnitude < 1e-36)
    np.testing.assert_allclose(got32, want32, rtol=1e-6, atol=1e-36)
    assert got[0] == 0.0 and math.copysign(1, got[0]) == -1  # −1000 σ(−1000): −0, as torch


def test_silu_of_infinities_and_nan_is_torch_s_and_the_tracer_names_where_it_appears() -> None:
    x = np.array([-np.inf, np.inf, np.nan])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ops.silu(x)
    want = torch.nn.functional.silu(torch.tensor(x)).numpy()  # −inf · σ(−inf) = −inf · 0
    np.testing.assert_array_equal(got, want)
    assert math.isnan(got[0]) and got[1] == math.inf and math.isnan(got[2])
    # H = [−inf, inf] (x = [−1, 1] against ±1e308): the overflow is named where it happens
    data = copy.deepcopy(ONE_TOKEN)
    data["weights"]["encoder"][0]["ffn"]["W_1"] = [[1e308, -1e308], [-1e308, 1e308]]
    trace = run(config_from(data), "encode")
    np.testing.assert_array_equal(trace.value("encoder.0.ffn.hidden"), [[-np.inf, np.inf]])
    np.testing.assert_array_equal(trace.value("encoder.0.ffn.act"), [[np.nan, np.inf]])
    assert trace.warnings[0] == "overflow: an infinity first appears in step encoder.0.ffn.hidden"


def _drawn(path: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """SPEC section 2's rule, written here."""
    return np.random.default_rng([seed, zlib.crc32(path.encode())]).standard_normal(shape)


def test_a_missing_W_3_is_drawn_by_its_key_path_and_changes_no_other_draw() -> None:
    base = {"model": {"d_model": 3, "d_ff": 5, "decoder_layers": 1}, "source": [[1, 2, 3]]}
    gated = copy.deepcopy(base)
    gated["model"]["activation"] = "swiglu"
    plain, cfg = config_from(base), config_from(gated)
    assert isinstance(plain, Config) and isinstance(cfg, Config)
    for stack, layer in (("encoder", cfg.encoder[0]), ("decoder", cfg.decoder[0])):
        assert layer.ffn.W_3 is not None and layer.ffn.b_3 is None
        np.testing.assert_array_equal(layer.ffn.W_3, _drawn(f"{stack}.0.ffn.W_3", (3, 5)))
    assert plain.encoder[0].ffn.W_3 is None
    np.testing.assert_array_equal(plain.encoder[0].ffn.W_1, cfg.encoder[0].ffn.W_1)
    np.testing.assert_array_equal(plain.decoder[0].ffn.W_2, cfg.decoder[0].ffn.W_2)
    assert cfg.drawn.count("encoder.0.ffn.W_3") == 1


def _invoke(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_header_states_the_gated_formula_and_counts_W_3(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(
        "model: {d_model: 2, d_ff: 2, activation: geglu}\nsource: [[1, 2]]\n", encoding="utf-8"
    )
    data = _invoke("encode", str(path), "--format", "json")
    assert data["conventions"]["activation"] == (
        "GeGLU, gated: (GELU(x W_1 + b_1) ⊙ (x W_3 + b_3)) W_2 + b_2, GELU exact (erf)"
    )
    assert "encoder.0.ffn (3)" in data["conventions"]["weights"]  # W_1, W_3, W_2
    data = _invoke("encode", str(path), "--format", "json", "--set", "model.activation=swiglu")
    assert data["conventions"]["activation"] == (
        "SwiGLU, gated: (SiLU(x W_1 + b_1) ⊙ (x W_3 + b_3)) W_2 + b_2"
    )
    data = _invoke("encode", str(path), "--format", "json", "--set", "model.activation=silu")
    assert data["conventions"]["activation"] == "SiLU, x σ(x)"
    assert "encoder.0.ffn (2)" in data["conventions"]["weights"]
    data = _invoke("encode", str(path), "--format", "json", "--set", "model.activation=geglu_tanh")
    assert data["conventions"]["activation"] == (
        "GeGLU, gated: (GELU(x W_1 + b_1) ⊙ (x W_3 + b_3)) W_2 + b_2, GELU tanh approximation"
    )
    assert "encoder.0.ffn (3)" in data["conventions"]["weights"]


def test_W_3_from_an_npz_and_from_set_with_its_source(tmp_path: Path) -> None:
    W_3 = np.array([[0.5, -2.0], [1.5, 0.25]])
    np.savez(tmp_path / "w.npz", **{"encoder.0.ffn.W_3": W_3})
    path = tmp_path / "g.yaml"
    path.write_text(
        "model: {d_model: 2, d_ff: 2, activation: swiglu}\nsource: [[1, 2]]\nweights_file: w.npz\n",
        encoding="utf-8",
    )
    data = _invoke("encode", str(path), "--format", "json")
    steps = {s["path"]: s["value"] for s in data["steps"]}
    x = np.array(steps["encoder.0.self_attn.norm"])
    np.testing.assert_allclose(steps["encoder.0.ffn.up"], x @ W_3, rtol=1e-15)
    weights = _invoke("weights", str(path), "--format", "json")["weights"]
    source = next(w for w in weights if w["path"] == "weights.encoder.0.ffn.W_3")
    assert source["kind"] == "npz" and source["shape"] == [2, 2]
    # --set over the npz: the whole matrix, then one entry of it
    data = _invoke(
        "encode", str(path), "--format", "json", "--set", "weights.encoder.0.ffn.W_3.1.0=7"
    )
    steps = {s["path"]: s["value"] for s in data["steps"]}
    W_3[1, 0] = 7
    np.testing.assert_allclose(steps["encoder.0.ffn.up"], x @ W_3, rtol=1e-15)
    weights = _invoke(
        "weights", str(path), "--format", "json", "--set", "weights.encoder.0.ffn.b_3=[1, 2]"
    )["weights"]
    assert any(w["path"] == "weights.encoder.0.ffn.b_3" for w in weights)


def test_diff_shows_W_3_with_its_source(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(
        "model: {d_model: 2, d_ff: 2, activation: swiglu}\nsource: [[1, 2]]\n", encoding="utf-8"
    )
    result = runner.invoke(
        app, ["diff", str(path), "--set-b", "weights.encoder.0.ffn.W_3.0.0=5", "--format", "json"]
    )
    assert result.exit_code in (0, 1), result.output
    row = next(w for w in json.loads(result.stdout)["weights"] if w["path"].endswith("W_3"))
    assert row["path"] == "weights.encoder.0.ffn.W_3" and row["status"] == "differs"
    assert row["source_a"]["draw_path"] == "encoder.0.ffn.W_3"
    assert row["source_b"]["partly"] == ["--set-b weights.encoder.0.ffn.W_3.0.0"]


def test_stages_lists_up_and_gated_and_step_selects_them() -> None:
    data = _invoke("stages", "--format", "json")
    keys = [s["key"] for s in data["stages"]]
    assert keys[keys.index("hidden") : keys.index("out") + 1] == [
        "hidden",
        "gate_clamp",  # swiglu_oss's (tests/test_swiglu_oss.py)
        "act",
        "up",
        "up_clamp",  # swiglu_oss's
        "gated",
        "out",
    ]
    gated = ["--set", "model.activation=swiglu"]
    data = _invoke("step", "--stage", "gated", "--layer", "0", "--format", "json", *gated)
    assert [s["path"] for s in data["steps"]] == ["encoder.0.ffn.gated", "decoder.0.ffn.gated"]
    data = _invoke("step", "--stage", "ffn", "--layer", "0", "--format", "json", *gated)
    assert [s["path"] for s in data["steps"] if s["path"].startswith("encoder.0.ffn.")][:5] == [
        f"encoder.0.ffn.{k}" for k in ("hidden", "act", "up", "gated", "out")
    ]


def test_explain_writes_out_silu_and_the_gated_product() -> None:
    gated = ["--set", "model.activation=swiglu", "--format", "json"]
    e = _invoke("explain", "encoder.0.ffn.act", "--cell", "1,2", *gated)
    h = e["operands"]["H"][0]
    assert e["lines"][0].startswith("encoder.0.ffn.act[1,2] = H[1,2] σ(H[1,2])")
    assert e["agrees"] and e["result"] == pytest.approx(h / (1 + math.exp(-h)), rel=1e-15)
    e = _invoke("explain", "encoder.0.ffn.gated", "--cell", "1,2", *gated)
    assert e["where"] == ["act = encoder.0.ffn.act", "U = encoder.0.ffn.up"]
    a, u = e["operands"]["act[1,2]"][0], e["operands"]["U[1,2]"][0]
    assert e["agrees"] and e["result"] == a * u
    e = _invoke("explain", "encoder.0.ffn.up", "--cell", "1,2", *gated)
    assert e["agrees"] and "W_3[:,2]" in e["lines"][0]


@pytest.mark.parametrize(("activation", "hidden_act"), [("swiglu", "silu"), ("geglu", "gelu")])
def test_the_ffn_is_hugging_face_s_llama_mlp_with_its_weights_transposed(
    activation: str, hidden_act: str
) -> None:
    """README: gate_proj, up_proj, down_proj are W_1, W_3, W_2, each `.weight` transposed."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    hf = transformers.LlamaConfig(
        hidden_size=4, intermediate_size=6, num_attention_heads=2, num_key_value_heads=2,
        hidden_act=hidden_act, mlp_bias=True,
    )  # fmt: skip
    torch.manual_seed(0)
    mlp = LlamaMLP(hf).double().eval()

    def linear(layer: torch.nn.Linear) -> tuple[list[Any], list[Any]]:
        return layer.weight.detach().numpy().T.tolist(), layer.bias.detach().numpy().tolist()

    (W_1, b_1), (W_3, b_3), (W_2, b_2) = map(linear, (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    data = {
        "model": {"d_model": 4, "d_ff": 6, "n_heads": 2, "encoder_layers": 0,
                  "decoder_layers": 1, "norm_position": "pre", "norm": "rms",
                  "activation": activation},
        "vocab": ["a", "b"],
        "target": [[1.0, -2.0, 0.5, 3.0], [0.25, 1.5, -1.0, 2.0]],
        "weights": {"decoder": [{"ffn": {"W_1": W_1, "b_1": b_1, "W_3": W_3, "b_3": b_3,
                                         "W_2": W_2, "b_2": b_2}}]},
    }  # fmt: skip
    trace = run(config_from(data), "decode")
    x = torch.tensor(trace.value("decoder.0.ffn.norm"))  # pre-norm: what the FFN reads
    with torch.no_grad():
        want = mlp(x).numpy()
    np.testing.assert_allclose(trace.value("decoder.0.ffn.out"), want, rtol=0, atol=1e-12)


def test_explain_writes_out_the_tanh_gelu_gate_of_geglu_tanh(tmp_path: Path) -> None:
    """One act cell of geglu_tanh by hand: ½ H (1 + tanh(√(2/π) (H + 0.044715 H³))),
    not the exact ½ H (1 + erf(H / √2)) of geglu (7e-5 apart here)."""
    data = copy.deepcopy(ONE_TOKEN)
    data["model"]["activation"] = "geglu_tanh"
    data["weights"]["encoder"][0]["ffn"]["W_1"] = [[0.5, 0], [1.25, 2]]  # H = [0.75, 2]
    path = tmp_path / "g.yaml"
    path.write_text(json.dumps(data), encoding="utf-8")  # JSON is YAML
    e = _invoke("explain", "encoder.0.ffn.act", str(path), "--cell", "0,0", "--format", "json")
    h = 0.75
    tanh_gelu = 0.5 * h * (1 + math.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    assert abs(tanh_gelu - 0.5 * h * (1 + math.erf(h / math.sqrt(2)))) > 5e-5
    assert e["operands"]["H"] == [h]
    assert e["lines"][0].startswith(
        "encoder.0.ffn.act[0,0] = ½ H (1 + tanh(√(2/π) (H + 0.044715 H³)))"
    )
    assert e["agrees"] and e["result"] == pytest.approx(tanh_gelu, rel=1e-15, abs=0)
