"""Numerical honesty (SPEC section 1, issue 5): a fully masked row, an overflow or a NaN
arising inside the engine is reported with the step where it first appears: a warning
on stderr and in the JSON, an error (exit 2) with --strict; never a silent nan.

Where each non-finite value first appears is worked out by hand from the config."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trace_tf.cli import app

runner = CliRunner()

PADS = "model: {d_model: 2}\nvocab: [a, P]\ntokens: {pad: P}\nsource: [P, P]\n"
# Decoder-only, causal: query 0 sees only key 0, a pad; query 1 also sees key 1, a real token.
CAUSAL_PAD = (
    "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1}\n"
    "vocab: [a, P]\ntokens: {pad: P}\ntarget: [P, a]\n"
)
# 1e200 * 1e200 = 1e400 > 1.8e308: Q and K are finite, their product is not.
OVERFLOW_SCORES = """\
model: {d_model: 2, positional: none}
vocab: [a]
embeddings: {a: [1, 1]}
source: [a, a]
weights:
  encoder:
    - self_attn:
        heads:
          - {W_q: [[1.0e200, 0], [0, 1.0e200]], W_k: [[1.0e200, 0], [0, 1.0e200]]}
"""
# Here Q itself overflows: 1e200 * 1e200 in x W_q.
OVERFLOW_Q = OVERFLOW_SCORES.replace("embeddings: {a: [1, 1]}", "embeddings: {a: [1.0e200, 0]}")
# W_o = 0, so the residual is the input row [1, 1]: mean 1, variance 0, and with eps 0
# LayerNorm divides 0 by 0.
NORM_NAN = """\
model: {d_model: 2, positional: none, norm_eps: 0}
source: [[1, 1]]
weights:
  encoder:
    - self_attn: {W_o: [[0, 0], [0, 0]]}
"""
MASKED_OP = (
    "attention: {Q: [[1], [1]], K: [[1], [2]], V: [[1], [2]], mask: [[0, 0], [-.inf, -.inf]]}\n"
)

CASES = [
    pytest.param(
        PADS,
        ("encode",),
        "NaN first appears in step encoder.0.self_attn.h0.softmax, row(s) [0, 1] "
        "(a fully masked row has no softmax)",
        id="fully-masked-encoder-rows",
    ),
    pytest.param(
        CAUSAL_PAD,
        ("decode",),
        "NaN first appears in step decoder.0.self_attn.h0.softmax, row(s) [0] "
        "(a fully masked row has no softmax)",
        id="causal-and-pad-mask-one-row",
    ),
    pytest.param(
        OVERFLOW_SCORES,
        ("encode",),
        "overflow: an infinity first appears in step encoder.0.self_attn.h0.scores",
        id="overflow-in-scores",
    ),
    pytest.param(
        OVERFLOW_Q,
        ("encode",),
        "overflow: an infinity first appears in step encoder.0.self_attn.h0.q",
        id="overflow-in-q",
    ),
    pytest.param(
        NORM_NAN,
        ("encode",),
        "NaN first appears in step encoder.0.self_attn.norm, row(s) [0]",
        id="zero-variance-layernorm",
    ),
    pytest.param(
        MASKED_OP,
        ("step", "--stage", "softmax"),
        "NaN first appears in step attn.softmax, row(s) [1] (a fully masked row has no softmax)",
        id="calculator-masked-row",
    ),
]


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def _args(command: tuple[str, ...], path: str, *more: str) -> list[str]:
    return [command[0], path, *command[1:], *more]


@pytest.mark.parametrize("text, command, warning", CASES)
def test_warning_names_the_first_step_once(
    text: str, command: tuple[str, ...], warning: str, tmp_path: Path
) -> None:
    path = _write(tmp_path, text)
    result = runner.invoke(app, _args(command, path))
    assert result.exit_code == 0, result.stderr
    # One line, this one, and no numpy RuntimeWarning with a source line around it.
    assert result.stderr == f"trace-tf: warning: {path}: {warning}\n"

    # The table output carries it too (in its header panel, maybe wrapped), not only stderr.
    def squeeze(text: str) -> str:
        return "".join(c for c in text if c not in "│ \n")

    assert squeeze(f"warning: {warning}") in squeeze(result.stdout)


@pytest.mark.parametrize("text, command, warning", CASES)
def test_json_output_carries_the_warning_and_stays_valid_json(
    text: str, command: tuple[str, ...], warning: str, tmp_path: Path
) -> None:
    path = _write(tmp_path, text)
    result = runner.invoke(app, _args(command, path, "--format", "json"))
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)  # strict JSON: non-finite numbers are strings
    assert data["warnings"] == [warning]
    step = warning.split("in step ")[1].split(",")[0]
    value = next(s["value"] for s in data["steps"] if s["path"] == step)
    flat = json.dumps(value)
    assert ('"nan"' if warning.startswith("NaN") else '"inf"') in flat


@pytest.mark.parametrize("text, command, warning", CASES)
def test_strict_makes_it_an_error(
    text: str, command: tuple[str, ...], warning: str, tmp_path: Path
) -> None:
    path = _write(tmp_path, text)
    result = runner.invoke(app, _args(command, path, "--strict"))
    assert result.exit_code == 2
    assert result.stderr == f"trace-tf: error: {path}: {warning} (--strict)\n"
    assert result.stdout == ""


def test_inf_only_in_a_mask_is_no_warning(tmp_path: Path) -> None:
    # The causal mask holds -inf by design, and so does the masked score; neither is an overflow.
    path = _write(tmp_path, CAUSAL_PAD.replace("[P, a]", "[a, a]"))
    result = runner.invoke(app, ["decode", path, "--strict"])
    assert result.exit_code == 0 and result.stderr == ""


CHECKED = NORM_NAN + "expect:\n  - {step: encoder.0.self_attn.norm, value: [[.nan, .nan]]}\n"


def test_check_reports_the_warning_even_when_the_nan_was_expected(tmp_path: Path) -> None:
    path = _write(tmp_path, CHECKED)
    result = runner.invoke(app, ["check", path])
    assert result.exit_code == 0, result.stdout
    assert result.stderr == (
        f"trace-tf: warning: {path}: NaN first appears in step encoder.0.self_attn.norm, row(s) [0]\n"
    )
    result = runner.invoke(app, ["check", path, "--strict"])
    assert result.exit_code == 2 and "(--strict)" in result.stderr


def test_check_json_writes_an_infinite_error_as_a_string(tmp_path: Path) -> None:
    # NaN against a number: the error is infinite, which strict JSON cannot hold as a number.
    path = _write(tmp_path, CHECKED.replace("[[.nan, .nan]]", "[[0, 0]]"))
    result = runner.invoke(app, ["check", path, "--format", "json"])
    assert result.exit_code == 1, result.stderr
    entry = json.loads(result.stdout)["results"][0]
    assert entry["ok"] is False and entry["max_abs_error"] == "inf"
    assert entry["warnings"] == ["NaN first appears in step encoder.0.self_attn.norm, row(s) [0]"]


GENERATE_OVERFLOW = """\
model: {d_model: 2, positional: none, encoder_layers: 0, decoder_layers: 1}
vocab: [a, E]
tokens: {bos: a, eos: E}
embeddings: {a: [1, 1], E: [0, 1]}
weights:
  decoder:
    - self_attn:
        heads:
          - {W_q: [[1.0e200, 0], [0, 1.0e200]], W_k: [[1.0e200, 0], [0, 1.0e200]]}
"""


def test_generate_names_the_first_overflow_and_stops(tmp_path: Path) -> None:
    # No token can be chosen from a distribution that is not finite: an error, even
    # without --strict, naming the step where the infinity first appeared.
    path = _write(tmp_path, GENERATE_OVERFLOW)
    result = runner.invoke(app, ["generate", path, "--max-tokens", "2"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(f"trace-tf: error: {path}: the next-token distribution")
    assert "overflow: an infinity first appears in step t0.decoder.0.self_attn.h0.scores" in (
        result.stderr
    )
    assert "RuntimeWarning" not in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize("text", [PADS, CAUSAL_PAD, OVERFLOW_SCORES, OVERFLOW_Q, NORM_NAN])
def test_checking_tracer_warns_as_the_recording_one_and_stores_nothing(
    tmp_path: Path, text: str
) -> None:
    import numpy as np

    from trace_tf import model
    from trace_tf.config import Config, load
    from trace_tf.trace import CheckingTracer, Tracer

    cfg = load(_write(tmp_path, text))
    assert isinstance(cfg, Config)
    recording, checking = Tracer(), CheckingTracer()
    with np.errstate(all="ignore"):
        model.run_full(cfg, recording)
        model.run_full(cfg, checking)
    assert recording.trace.warnings and checking.trace.warnings == recording.trace.warnings
    assert len(checking.trace) == 0 and not checking.trace.paths()


# LayerNorm / RMSNorm of rows whose variance (or mean square) float64 cannot hold while
# the normalised row is an ordinary number. Worked by hand: x = [1e200, −1e200, 3e200]
# has mean 1e200 and var 8e400/3 (beyond 1.8e308), so (x − mean)/√var = [0, −√1.5, √1.5];
# rms = √(11e400/3) = 1.9149e200, x/rms = [1, −1, 3]/√(11/3). x = [1e-300, −1e-300,
# 3e-300] with eps 0: var 8e-600/3 underflows to 0, yet the quotient is again [0, ∓√1.5].
HUGE_PRE = """\
model: {d_model: 3, positional: none, norm_position: pre, norm: NORM, norm_eps: EPS}
vocab: [a]
embeddings: {a: ROW}
source: [a]
"""
R = math.sqrt(1.5)
HUGE_NORM_CASES = [
    ("layer", "1.0e-5", "[1.0e200, -1.0e200, 3.0e200]", [0.0, -R, R], "var"),
    ("layer", "0", "[1.0e-300, -1.0e-300, 3.0e-300]", [0.0, -R, R], None),
    (
        "rms",
        "1.0e-5",
        "[1.0e200, -1.0e200, 3.0e200]",
        [v / math.sqrt(11 / 3) for v in (1, -1, 3)],
        None,
    ),
]


@pytest.mark.parametrize("norm, eps, row, want, overflow", HUGE_NORM_CASES)
def test_norm_of_huge_or_tiny_rows_is_right_and_explained(
    norm: str, eps: str, row: str, want: list[float], overflow: str | None, tmp_path: Path
) -> None:
    text = HUGE_PRE.replace("NORM", norm).replace("EPS", eps).replace("ROW", row)
    path = _write(tmp_path, text)
    result = runner.invoke(app, ["encode", path, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    step = "encoder.0.self_attn.norm"
    got = next(s["value"] for s in data["steps"] if s["path"] == step)
    assert got[0] == pytest.approx(want, rel=1e-14, abs=1e-15)
    # The variance itself is beyond float64 (an honest inf, reported); the rms is not.
    assert data["warnings"] == (
        [f"overflow: an infinity first appears in step {step}.var"] if overflow else []
    )
    for j in range(3):
        ex = runner.invoke(app, ["explain", step, path, "--cell", f"0,{j}", "--format", "json"])
        assert ex.exit_code == 0, ex.stderr
        e = json.loads(ex.stdout)
        assert e["agrees"] and e["result"] == pytest.approx(want[j], rel=1e-14, abs=1e-15)
    if norm == "rms":
        ex = runner.invoke(app, ["explain", f"{step}.rms", path, "--format", "json"])
        e = json.loads(ex.stdout)
        assert e["agrees"] and e["result"] == pytest.approx(math.sqrt(11 / 3) * 1e200, rel=1e-14)
        assert "beyond float64" in e["lines"][-1]


def test_norm_calculator_on_a_row_near_the_largest_float(tmp_path: Path) -> None:
    # x = [a, a, −a], a = 1.7e308: mean a/3 (though the sum overflows), x − mean =
    # [2a/3, 2a/3, −4a/3], var 8a²/9; the normalised row is [1, 1, −2]/√2.
    path = _write(tmp_path, "norm: {kind: layer, x: [[1.7e308, 1.7e308, -1.7e308]]}\n")
    result = runner.invoke(app, ["norm", path, "--format", "json"])
    steps = {s["path"]: s["value"] for s in json.loads(result.stdout)["steps"]}
    assert steps["norm.mean"][0][0] == pytest.approx(1.7e308 / 3, rel=1e-15)
    assert steps["norm.var"] == [["inf"]]
    assert steps["norm.out"][0] == pytest.approx([2**-0.5, 2**-0.5, -(2**0.5)], rel=1e-15)
    for what, cell in [("norm.mean", "0,0"), ("norm.out", "0,2")]:
        ex = runner.invoke(app, ["explain", what, path, "--cell", cell, "--format", "json"])
        assert json.loads(ex.stdout)["agrees"], ex.stdout


def test_attend_with_a_huge_temperature_over_a_row_spanning_float64(tmp_path: Path) -> None:
    # softmax([1e308, −1e308] / 1e308) = softmax([1, −1]): [1, e^−2] / (1 + e^−2); it was
    # [1, 0], (−1e308 − 1e308) overflowing to −inf before the division by T, silently.
    path = _write(
        tmp_path,
        "attention: {Q: [[1]], K: [[1.0e308], [-1.0e308]], V: [[1], [0]], scale: 1,"
        " temperature: 1.0e308}\n",
    )
    want = [1 / (1 + math.exp(-2)), math.exp(-2) / (1 + math.exp(-2))]
    result = runner.invoke(app, ["attend", path, "--format", "json"])
    steps = {s["path"]: s["value"] for s in json.loads(result.stdout)["steps"]}
    assert steps["attn.softmax"][0] == pytest.approx(want, rel=1e-15)
    ex = runner.invoke(app, ["explain", "attn.softmax", path, "--cell", "0,1", "--format", "json"])
    e = json.loads(ex.stdout)
    assert e["agrees"] and e["result"] == pytest.approx(want[1], rel=1e-15)


@pytest.mark.parametrize(
    "mask, k",
    [
        # 1e308 + 1e308 = inf in the masked row, then inf − inf = NaN in its softmax:
        # the row is not masked at all, and the overflow was said nowhere
        ("[[1.0e308, 0]]", "[[1.0e308], [0]]"),
        # −1e308 + −1e308 = −inf at both keys: the softmax of [−2e308, −2e308] is
        # [½, ½], no masked row, though every entry became −inf
        ("[[-1.0e308, -1.0e308]]", "[[-1.0e308], [-1.0e308]]"),
    ],
)
def test_an_overflow_in_the_masked_scores_is_no_mask(mask: str, k: str, tmp_path: Path) -> None:
    path = _write(
        tmp_path, f"attention: {{Q: [[1]], K: {k}, V: [[1], [0]], scale: 1, mask: {mask}}}\n"
    )
    result = runner.invoke(app, ["attend", path, "--format", "json"])
    warning = "overflow: an infinity first appears in step attn.masked"
    assert result.stderr == f"trace-tf: warning: {path}: {warning}\n"
    strict = runner.invoke(app, ["attend", path, "--strict"])
    assert strict.exit_code == 2
    assert strict.stderr == f"trace-tf: error: {path}: {warning} (--strict)\n"


def test_a_given_mask_of_minus_inf_is_still_no_overflow(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "attention: {Q: [[1]], K: [[1], [2]], V: [[1], [0]], mask: [[-.inf, 0]]}\n"
    )
    result = runner.invoke(app, ["attend", path, "--strict", "--format", "json"])
    assert result.exit_code == 0 and result.stderr == ""


@pytest.mark.parametrize(
    "kind, x", [("layer", "[[1.0e200, 1.0e200], [3, 3]]"), ("batch", "[[1.0e200], [1.0e200]]")]
)
def test_norm_of_an_equal_group_with_a_subnormal_eps_is_zero(
    kind: str, x: str, tmp_path: Path
) -> None:
    # Every x of a group equal: x − mean = 0 and var = 0, so with ε = 1e-320 > 0 each
    # entry is 0 / √1e-320 = 0. var + ε (subnormal) sends the group down the scaled path,
    # where √ε / s (s = 2^664) rounded to 0 and gave 0/0 = NaN, reported as a NaN.
    path = _write(tmp_path, f"norm: {{kind: {kind}, eps: 1.0e-320, x: {x}}}\n")
    result = runner.invoke(app, ["norm", path, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    out = next(s["value"] for s in data["steps"] if s["path"] == "norm.out")
    assert all(v == 0.0 for row in out for v in row)
    # no NaN: only the note that ε, typed 1e-320, is stored with fewer digits (a float64
    # subnormal: 1e-320 == 9.9998886718268301e-321)
    assert [w.split(":")[0] for w in data["warnings"]] == ["norm.eps"], data["warnings"]
    assert "stored as 9.9998886718268301e-321" in data["warnings"][0]
    ex = runner.invoke(app, ["explain", "norm.out", path, "--format", "json"])
    assert ex.exit_code == 0 and json.loads(ex.stdout)["agrees"], ex.stdout


@pytest.mark.parametrize(
    "eps, row", [("0", "[1.0e-22, -1.0e-22, 3.0e-22]"), ("1.0e-5", "[1.0e30, -1.0e30, 3.0e30]")]
)
def test_float32_norm_beyond_float32_is_explained_as_float32(
    eps: str, row: str, tmp_path: Path
) -> None:
    # Under --dtype float32, var = 8/3 · 1e-44 is a float32 subnormal of a few bits (and
    # 8/3 · 1e60 a float32 infinity), though float64 holds both: the engine computes the
    # row scaled, [0, −√1.5, √1.5]. explain judged var + ε by float64's range, so for the
    # subnormal it divided by the few-bit var (1.2257, 'recorded 1.2247 but the
    # arithmetic gives 1.2257'), and for the infinity it said 'beyond float64'.
    text = HUGE_PRE.replace("NORM", "layer").replace("EPS", eps).replace("ROW", row)
    path = _write(tmp_path, text)
    step = "encoder.0.self_attn.norm"
    result = runner.invoke(app, ["encode", path, "--dtype", "float32", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    got = next(s["value"] for s in json.loads(result.stdout)["steps"] if s["path"] == step)
    assert got[0] == pytest.approx([0.0, -R, R], rel=1e-6, abs=1e-6)
    for j in (1, 2):
        ex = runner.invoke(
            app,
            ["explain", step, path, "--dtype", "float32", "--cell", f"0,{j}", "--format", "json"],
        )
        assert ex.exit_code == 0, ex.stderr
        e = json.loads(ex.stdout)
        assert e["agrees"] and e["result"] == pytest.approx(got[0][j], rel=1e-6)
        assert "var + ε is beyond float32" in " ".join(e["lines"])


def test_rms_norm_of_a_row_whose_rms_is_subnormal(tmp_path: Path) -> None:
    # x = [5e-324, 0], ε = 0: rms = 5e-324 / √2 = 3.5e-324, which float64 holds only as
    # 5e-324 (a subnormal of one bit), so x / rms gave 1, silently, for x / rms = √2.
    # By hand: x / rms = √2 · x / |x_0| = [√2, 0], and the same for the calculator.
    path = _write(tmp_path, "norm: {kind: rms, eps: 0, x: [[5.0e-324, 0]]}\n")
    result = runner.invoke(app, ["norm", path, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    out = next(s["value"] for s in data["steps"] if s["path"] == "norm.out")
    assert out[0] == pytest.approx([math.sqrt(2), 0.0], rel=1e-15)
    ex = runner.invoke(app, ["explain", "norm.out", path, "--format", "json"])
    e = json.loads(ex.stdout)
    assert e["agrees"] and e["result"] == pytest.approx(math.sqrt(2), rel=1e-15), ex.stdout
    assert "rms is below float64's normal numbers" in " ".join(e["lines"])
    model = HUGE_PRE.replace("NORM", "rms").replace("EPS", "0").replace("d_model: 3", "d_model: 2")
    path = _write(tmp_path, model.replace("ROW", "[5.0e-324, 0]"))
    result = runner.invoke(app, ["encode", path, "--format", "json"])
    step = "encoder.0.self_attn.norm"
    got = next(s["value"] for s in json.loads(result.stdout)["steps"] if s["path"] == step)
    assert got[0] == pytest.approx([math.sqrt(2), 0.0], rel=1e-15)
    ex = runner.invoke(app, ["explain", step, path, "--format", "json"])
    assert json.loads(ex.stdout)["agrees"], ex.stdout
