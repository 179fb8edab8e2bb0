"""`model.rope_scaling` by hand and at the command line: one rotated entry of each type
worked out here with the math module, the header and `explain` stating the scaling, the
key set by --set, a variant and diff, and every refusal (exit 2, one line naming the key
path, what was expected and what was found). (Against Hugging Face's rope init functions
and LlamaForCausalLM: tests/test_hf_rope_scaling.py; against the torch reference:
tests/test_engine_reference.py.)"""

from __future__ import annotations

import copy
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

from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.errors import InputError
from trace_tf.runner import run

runner = CliRunner()

# d_k 8 by halves, base 100: pair i turns by 100^(−i/4) per position (1, 0.316, 0.1, 0.0316)
BASE: dict[str, Any] = {
    "model": {
        "d_model": 8, "n_heads": 1, "encoder_layers": 0, "decoder_layers": 1,
        "positional": "rope", "rope_pairs": "halves", "pe_base": 100,
        "norm_position": "pre", "norm": "rms",
    },
    "vocab": ["a", "b", "c"],
    "target": ["a", "b", "c", "a", "b", "c"],
}  # fmt: skip
LLAMA3 = {"type": "llama3", "factor": 4, "low_freq_factor": 0.25, "high_freq_factor": 1.25,
          "original_max_len": 8}  # fmt: skip
YARN = {"type": "yarn", "factor": 4, "original_max_len": 8, "beta_fast": 2, "beta_slow": 0.125}


def scaled(scaling: dict[str, Any] | None) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    raw["model"]["rope_scaling"] = scaling
    return raw


def q_of(raw: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    trace = run(cfg, "decode")
    return trace.value("decoder.0.self_attn.h0.q_raw"), trace.value("decoder.0.self_attn.h0.q")


# --------------------------------------------------------------------- (c) by hand


def test_linear_by_hand() -> None:
    """Pair 1 (columns 1 and 5) at position 3: θ = 3 · 100^(−1/4) / 2.5."""
    raw, q = q_of(scaled({"type": "linear", "factor": 2.5}))
    angle = 3 * 100 ** (-2 / 8) / 2.5
    a, b = raw[3, 1], raw[3, 5]
    assert q[3, 1] == pytest.approx(a * math.cos(angle) - b * math.sin(angle), rel=1e-13)
    assert q[3, 5] == pytest.approx(a * math.sin(angle) + b * math.cos(angle), rel=1e-13)


def test_llama3_by_hand_in_each_band() -> None:
    """LLaMA 3.1's rule for the four pairs of d_k 8 at position 5: wavelengths 2π/θ of
    6.28, 19.9, 62.8 and 199 against original_max_len / high = 6.4 and / low = 32: pair 0
    kept, pair 1 smoothed with k = (8 / 19.87 − 0.25) / (1.25 − 0.25), pairs 2 and 3 ÷ 4."""
    raw, q = q_of(scaled(LLAMA3))
    theta = [100 ** (-2 * i / 8) for i in range(4)]
    k = (8 / (2 * math.pi / theta[1]) - 0.25) / 1.0
    assert 0 < k < 1
    used = [theta[0], (1 - k) * theta[1] / 4 + k * theta[1], theta[2] / 4, theta[3] / 4]
    for i, frequency in enumerate(used):
        angle = 5 * frequency
        a, b = raw[5, i], raw[5, i + 4]
        assert q[5, i] == pytest.approx(a * math.cos(angle) - b * math.sin(angle), rel=1e-12)
        assert q[5, i + 4] == pytest.approx(a * math.sin(angle) + b * math.cos(angle), rel=1e-12)


def test_yarn_by_hand() -> None:
    """The pair turning beta_fast = 2 times in 8 positions is 8 ln(8 / 4π) / (2 ln 100) =
    −0.39, floored and held at 0; beta_slow 0.125's is 2.02, ceiled to 3: pair i's ramp is
    i / 3, its frequency θ/4 · r + θ (1 − r); cos and sin × (0.1 ln 4 + 1)."""
    raw, q = q_of(scaled(YARN))
    s = 0.1 * math.log(4) + 1
    for i in range(4):
        theta, r = 100 ** (-2 * i / 8), i / 3
        angle = 2 * (theta / 4 * r + theta * (1 - r))
        a, b = raw[2, i], raw[2, i + 4]
        want = a * s * math.cos(angle) - b * s * math.sin(angle)
        assert q[2, i] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    ("betas", "band"),
    [((1e308, 1.0), (0, 1)), ((32.0, 1e-308), (0, 7)), ((1e308, 1e-308), (0, 7))],
)
def test_yarn_betas_beyond_float64_give_the_limiting_band(
    betas: tuple[float, float], band: tuple[int, int], tmp_path: Path
) -> None:
    """beta_fast 1e308 (2π·β overflows: L / ∞ = 0, ln 0) and beta_slow 1e-308 (L / 2πβ
    overflows: ceil(∞)) were internal errors (exit 3). The band's bounds are then those of
    the logarithms, d ln(L / 2πβ) / (2 ln base) computed as ln L − ln β − ln 2π: pair
    −∞ held at 0, +∞ at d − 1 = 7 here (d_k 8; Hugging Face's bound, though pairs end at
    3), and a finite beta's as by hand."""
    fast, slow = betas
    L, d, base = 8, 8, 100.0

    def pair_of(beta: float) -> float:
        return d * (math.log(L) - math.log(beta) - math.log(2 * math.pi)) / (2 * math.log(base))

    assert (max(math.floor(pair_of(fast)), 0), min(math.ceil(pair_of(slow)), d - 1)) == band
    raw = scaled({**YARN, "beta_fast": fast, "beta_slow": slow})
    file = write(tmp_path, raw)
    result = runner.invoke(app, ["decode", file])
    assert result.exit_code == 0, result.output
    low, high = band
    assert f"r = clip((i − {low}) / ({high} − {low}), 0, 1)" in " ".join(result.output.split())
    q_raw, q = q_of(raw)
    s = 0.1 * math.log(4) + 1
    for i in range(4):
        theta, r = 100 ** (-2 * i / 8), min(max((i - low) / (high - low), 0), 1)
        angle = 3 * (theta / 4 * r + theta * (1 - r))
        a, b = q_raw[3, i], q_raw[3, i + 4]
        assert q[3, i] == pytest.approx(
            a * s * math.cos(angle) - b * s * math.sin(angle), rel=1e-12
        )


def test_position_0_is_not_turned_and_no_scaling_differs_at_every_later_one() -> None:
    raw, q = q_of(scaled(LLAMA3))
    _, plain = q_of(scaled(None))
    assert np.array_equal(q[0], raw[0]) and np.array_equal(plain[0], raw[0])
    assert all(not np.allclose(q[p], plain[p], rtol=1e-6) for p in range(1, 6))


# ------------------------------------------------ the conventions stated, and the CLI


def write(tmp_path: Path, raw: dict[str, Any], name: str = "r.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return str(path)


def json_of(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


@pytest.mark.parametrize(
    ("scaling", "said"),
    [
        ({"type": "linear", "factor": 2.5}, ["linear (position interpolation): θ_i ÷ factor 2.5"]),
        (LLAMA3, ["llama3: factor 4, low_freq_factor 0.25, high_freq_factor 1.25, original_max_len 8",
                  "λ_i < 6.4", "λ_i > 32"]),
        (YARN, ["yarn: factor 4, original_max_len 8, beta_fast 2, beta_slow 0.125, truncate",
                "clip((i − 0) / (3 − 0), 0, 1)", "attention factor 1.138629436111989"]),
    ],
)  # fmt: skip
def test_the_header_states_the_scaling(
    scaling: dict[str, Any], said: list[str], tmp_path: Path
) -> None:
    out = json_of("decode", write(tmp_path, scaled(scaling)))
    positions = out["conventions"]["positions"]
    assert "turned by pos · θ_i radians" in positions
    for text in said:
        assert text in positions
    formula = next(s["formula"] for s in out["steps"] if s["path"] == "decoder.0.self_attn.h0.q")
    assert formula.endswith(f"{scaling['type']}-scaled frequencies")


def test_the_header_without_scaling_is_unchanged(tmp_path: Path) -> None:
    positions = json_of("decode", write(tmp_path, scaled(None)))["conventions"]["positions"]
    assert "turned by pos · 100^(−2i/d_k) radians" in positions and "scaled" not in positions


@pytest.mark.parametrize(
    ("scaling", "cell", "said"),
    [
        ({"type": "linear", "factor": 2.5}, "3,1", ["θ_p = 100^(−2/8)", "÷ factor 2.5 (linear)"]),
        (LLAMA3, "5,1", ["between 6.4 and 32", "(1 − k) θ_p / 4 + k θ_p"]),
        (LLAMA3, "5,2", ["> 32 (original_max_len / low_freq_factor): ÷ 4"]),
        (LLAMA3, "5,4", ["< 6.4 (original_max_len / high_freq_factor): kept"]),
        (YARN, "2,6", ["r = clip((2 − 0) / (3 − 0), 0, 1)", "s = 1.138629436111989", "s·cos θ"]),
    ],
)  # fmt: skip
def test_explain_writes_the_scaled_frequency(
    scaling: dict[str, Any], cell: str, said: list[str], tmp_path: Path
) -> None:
    """explain of a rotated q entry: the pair's frequency unscaled and scaled, and how;
    its written arithmetic agrees with the recorded value."""
    path = write(tmp_path, scaled(scaling))
    result = runner.invoke(app, ["explain", "decoder.0.self_attn.h0.q", path, "--cell", cell])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    for s in said:
        assert s in text
    assert "the arithmetic above agrees" in text


def test_explain_names_the_llama3_band_the_engine_used(tmp_path: Path) -> None:
    """A wavelength on a band's edge: pair 2 of d_k 6, base 3, has θ = 3^(−4/6), and
    Hugging Face's wavelength (1/θ)·2π (torch's number ÷ tensor) is exactly
    original_max_len / high_freq_factor = 8 / 0.6121097287642295, so the pair is smoothed
    (not below the edge), while 2π/θ is one unit below it. explain wrote "kept" from 2π/θ
    beside the smoothed frequency the engine turned by; it names the band used."""
    theta = 3.0 ** (-4 / 6)
    edge = 8 / 0.6121097287642295
    assert (1 / theta) * (2 * math.pi) == edge and 2 * math.pi / theta < edge  # the trap
    raw = scaled({"type": "llama3", "factor": 4, "low_freq_factor": 0.1,
                  "high_freq_factor": 0.6121097287642295, "original_max_len": 8})  # fmt: skip
    raw["model"].update(d_model=6, d_k=6, pe_base=3, rope_pairs="adjacent")
    path = write(tmp_path, raw)
    args = ["explain", "decoder.0.self_attn.h0.q", path, "--cell", "2,4", "--precision", "17"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert "kept" not in text and "(1 − k) θ_p / 4 + k θ_p" in text
    assert "the arithmetic above agrees" in text


def test_set_variant_and_diff_reach_the_scaling(tmp_path: Path) -> None:
    """--set of one parameter, a variant, and diff against no scaling: q and what follows
    differ, q_raw does not."""
    raw = scaled(LLAMA3)
    raw["variants"] = {
        "longer": {"model.rope_scaling.factor": 8},
        "off": {"model.rope_scaling": None},
    }
    path = write(tmp_path, raw)
    q = lambda out: np.array(  # noqa: E731
        next(s["value"] for s in out["steps"] if s["path"] == "decoder.0.self_attn.h0.q")
    )
    base = q(json_of("decode", path))
    by_set = q(json_of("decode", path, "--set", "model.rope_scaling.factor=8"))
    by_variant = q(json_of("decode", path, "--variant", "longer"))
    assert np.array_equal(by_set, by_variant) and not np.allclose(by_set, base)
    assert (
        json_of("decode", path, "--variant", "off")["conventions"]["positions"].count("scaled") == 0
    )
    out = json_of("diff", path, "--set-b", "model.rope_scaling=null")
    status = {s["path"]: s["status"] for s in out["steps"]}
    assert status["decoder.0.self_attn.h0.q_raw"] == "same"
    assert status["decoder.0.self_attn.h0.q"] == status["logits"] == "differs"


def test_generate_turns_the_new_tokens_with_the_same_frequencies(tmp_path: Path) -> None:
    """With the KV cache, iteration t's new q row is decode's row at its position."""
    raw = scaled(LLAMA3)
    path = write(tmp_path, raw)
    out = json_of("generate", path, "--greedy", "--max-tokens", "3", "--trace")
    steps = {s["path"]: np.array(s["value"]) for s in out["steps"]}
    full = copy.deepcopy(raw)
    full["target"] = raw["target"] + out["generated"][:2]
    _, q = q_of(full)
    last = max(int(p.split(".")[0][1:]) for p in steps if p.startswith("t"))
    np.testing.assert_allclose(steps[f"t{last}.decoder.0.self_attn.h0.q"][-1], q[-1], rtol=1e-12)


# --------------------------------------------------------------------- (d) refusals

BAD: list[tuple[Any, str, str]] = [
    ("3", "model.rope_scaling", "not a mapping"),
    ({"factor": 2}, "model.rope_scaling.type", "missing required key type"),
    ({"type": "yran", "factor": 2}, "model.rope_scaling.type", "did you mean 'yarn'"),
    ({"type": "dynamic", "factor": 2}, "model.rope_scaling.type", "dynamic NTK"),
    ({"type": "longrope", "factor": 2}, "model.rope_scaling.type", "not supported"),
    ({"type": "default"}, "model.rope_scaling.type", "leave model.rope_scaling out"),
    ({"type": "linear"}, "model.rope_scaling.factor", "missing required key factor"),
    ({"type": "linear", "factor": 0}, "model.rope_scaling.factor", "must be positive"),
    ({"type": "linear", "factor": -2}, "model.rope_scaling.factor", "must be positive"),
    ({"type": "linear", "factor": "big"}, "model.rope_scaling.factor", "not a number"),
    ({"type": "linear", "factor": 2, "beta_fast": 3}, "model.rope_scaling.beta_fast",
     "type linear does not read beta_fast"),
    ({"type": "linear", "factor": 2, "fcator": 3}, "model.rope_scaling.fcator", "did you mean 'factor'"),
    ({"type": "linear", "factor": 2, "rope_type": "linear"}, "model.rope_scaling.rope_type",
     "trace-tf's is type"),
    ({"type": "linear", "factor": 2, "rope_theta": 1e4}, "model.rope_scaling.rope_theta", "model.pe_base"),
    ({**LLAMA3, "original_max_position_embeddings": 8}, "original_max_position_embeddings",
     "trace-tf's is original_max_len"),
    ({"type": "linear", "factor": 2, "partial_rotary_factor": 0.5}, "partial_rotary_factor",
     "model.rope_dims"),
    ({k: v for k, v in LLAMA3.items() if k != "original_max_len"}, "model.rope_scaling.original_max_len",
     "missing required key original_max_len"),
    ({k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}, "model.rope_scaling.low_freq_factor",
     "missing required key low_freq_factor"),
    ({**LLAMA3, "low_freq_factor": 2, "high_freq_factor": 2}, "model.rope_scaling.high_freq_factor",
     "low_freq_factor < high_freq_factor"),
    ({**LLAMA3, "low_freq_factor": 0}, "model.rope_scaling.low_freq_factor", "must be positive"),
    ({**LLAMA3, "original_max_len": 0}, "model.rope_scaling.original_max_len", "must be at least 1"),
    ({**LLAMA3, "original_max_len": 8.5}, "model.rope_scaling.original_max_len", "not a whole number"),
    ({"type": "yarn", "factor": 2}, "model.rope_scaling.original_max_len", "missing required key"),
    ({**YARN, "beta_fast": 0.1}, "model.rope_scaling.beta_fast", "beta_fast >= beta_slow"),
    ({**YARN, "beta_slow": 0}, "model.rope_scaling.beta_slow", "must be positive"),
    ({**YARN, "truncate": "yes"}, "model.rope_scaling.truncate", "not a boolean"),
    ({**YARN, "mscale": 1}, "model.rope_scaling.mscale", "mscale without mscale_all_dim"),
    ({**YARN, "mscale_all_dim": 1}, "model.rope_scaling.mscale_all_dim", "without mscale"),
    ({**YARN, "attention_factor": 1.2, "mscale": 1, "mscale_all_dim": 1}, "model.rope_scaling.mscale",
     "not both"),
    ({**YARN, "attention_factor": 0}, "model.rope_scaling.attention_factor", "must be positive"),
    ({**YARN, "low_freq_factor": 1}, "model.rope_scaling.low_freq_factor", "type yarn does not read"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "path", "needle"), BAD, ids=[f"{b[1]}:{b[2]}" for b in BAD])
def test_every_refusal_is_one_clear_line(
    value: Any, path: str, needle: str, tmp_path: Path
) -> None:
    raw = copy.deepcopy(BASE)
    raw["model"]["rope_scaling"] = value
    file = write(tmp_path, raw)
    before = Path(file).read_bytes()
    result = runner.invoke(app, ["decode", file])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "\n" not in message and "Traceback" not in message
    assert path in message and needle in message and "expected" in message
    assert Path(file).read_bytes() == before  # the user's file untouched


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "relative", "none"])
def test_rope_scaling_needs_positional_rope(positional: str) -> None:
    raw = scaled(LLAMA3)
    raw["model"]["positional"] = positional
    with pytest.raises(InputError, match=f"model.positional is {positional}") as err:
        config_from(raw)
    assert err.value.path == "model.rope_scaling"
    assert "model.rope_scaling: null" in str(err.value.expected)


def test_null_is_no_scaling(tmp_path: Path) -> None:
    """rope_scaling: null is the same run as none, bit for bit, with any positional."""
    _, a = q_of(scaled(None))
    _, b = q_of(BASE)
    assert np.array_equal(a, b)
    raw = scaled(None)
    raw["model"]["positional"] = "sinusoidal"
    assert isinstance(config_from(raw), Config)


# ------------------------------------------------------------ the pe calculator


@pytest.mark.parametrize("scaling", [{"type": "linear", "factor": 2.5}, LLAMA3, YARN])
def test_the_pe_calculator_scales_as_the_model_does(
    scaling: dict[str, Any], tmp_path: Path
) -> None:
    """`pe --kind rope` with pe.rope_scaling: the angles the model's q rows turn by (one
    row of each pair checked through q: atan2 of the turned pair against the raw one);
    explain of its cells agrees; and the header states the scaling."""
    file = write(tmp_path, {"pe": {"kind": "rope", "length": 6, "d_model": 8, "base": 100,
                                   "rope_scaling": scaling}})  # fmt: skip
    out = json_of("pe", file)
    angles = np.array(out["steps"][0]["value"])
    assert scaling["type"] in out["conventions"]["rope scaling"]
    raw, q = q_of(scaled(scaling))
    s = 0.1 * math.log(4) + 1 if scaling["type"] == "yarn" else 1.0
    for pos in range(1, 6):
        for i in range(4):  # q's pair (i, i + 4) is raw's turned by the angle, times s
            z = (
                complex(raw[pos, i], raw[pos, i + 4])
                * s
                * complex(math.cos(angles[pos, i]), math.sin(angles[pos, i]))
            )
            assert z.real == pytest.approx(q[pos, i], rel=1e-10, abs=1e-12)
            assert z.imag == pytest.approx(q[pos, i + 4], rel=1e-10, abs=1e-12)
    for cell in ("3,1", "5,3"):
        result = runner.invoke(app, ["explain", "pe", file, "--cell", cell])
        assert result.exit_code == 0 and "the arithmetic above agrees" in result.output, (
            result.output
        )


def test_the_pe_calculator_refuses_scaling_of_sinusoids(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "pe",
            "--length",
            "3",
            "--d-model",
            "4",
            "--set",
            "pe.rope_scaling={type: linear, factor: 2}",
        ],
    )
    assert result.exit_code == 2
    assert "pe.rope_scaling" in result.output and "pe.kind is sinusoidal" in result.output


def test_yarn_refuses_a_base_of_1() -> None:
    """yarn's band is d ln(L / 2πβ) / (2 ln base): no band with base 1 (as in HF, a
    division by zero), refused in a model and in the pe calculator."""
    raw = scaled(YARN)
    raw["model"]["pe_base"] = 1
    with pytest.raises(InputError, match=r"ln\(model.pe_base\)") as err:
        config_from(raw)
    assert err.value.path == "model.rope_scaling"
    op = {"pe": {"kind": "rope", "length": 3, "d_model": 4, "base": 1, "rope_scaling": YARN}}
    with pytest.raises(InputError, match=r"ln\(pe.base\)"):
        config_from(op)
    raw["model"]["rope_scaling"] = LLAMA3  # the others have no such division
    assert isinstance(config_from(raw), Config)


@pytest.mark.parametrize(
    ("text", "where", "ours"),
    [
        ("model: {d_model: 4, positional: rope, RS}\nvocab: [a]\nsource: [a]\n", "model", "model.pe_base"),
        ("pe: {length: 2, d_model: 4, kind: rope, RS}\n", "pe", "pe.base"),
    ],
    ids=["model", "pe"],
)  # fmt: skip
def test_hf_rope_theta_names_the_base_of_its_own_block(
    text: str, where: str, ours: str, tmp_path: Path
) -> None:
    """rope_theta under pe.rope_scaling is the calculator's pe.base, not model.pe_base."""
    text = text.replace("RS", "rope_scaling: {type: linear, factor: 2, rope_theta: 3}")
    command = "encode" if where == "model" else "pe"
    says = (f"Hugging Face's name in rope_parameters; trace-tf's is {ours};",)
    _run_bad(
        Bad(text, f"{where}.rope_scaling.rope_theta", None, says, (command, "{file}")), tmp_path
    )
