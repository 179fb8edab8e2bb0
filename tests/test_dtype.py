"""--dtype float32: weights and every computation in float32, within float32's
precision of the float64 run (issue 6)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import reference_torch
import torch
import yaml
from conftest import config_from
from random_configs import random_config
from test_engine_reference import SHAPES as REFERENCE_SHAPES
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import run

runner = CliRunner()

SHAPES = [
    dict(d_model=8, n_heads=2, decoder_layers=1, pad=True, src_len=5, tgt_len=4),
    dict(
        d_model=6, n_heads=2, decoder_layers=1, activation="gelu", norm="rms", norm_position="pre"
    ),
    dict(d_model=6, n_heads=3, positional="rope", activation="gelu_tanh"),
    dict(d_model=4, n_heads=2, decoder_layers=1, positional="learned", tie_embeddings=True),
    # gated FFNs: the up projection and the gate's product in float32 too
    dict(
        d_model=6, n_heads=2, decoder_layers=1, activation="swiglu", norm="rms", norm_position="pre"
    ),
    dict(d_model=4, n_heads=2, d_ff=5, activation="geglu"),
]


def test_float32_is_float32_everywhere_and_close_to_float64() -> None:
    for i, shape in enumerate(SHAPES):
        raw = random_config(np.random.default_rng(i), **shape)  # type: ignore[arg-type]
        c64, c32 = config_from(raw), config_from(raw, dtype="float32")
        assert isinstance(c64, Config) and isinstance(c32, Config)
        assert c32.model.dtype == "float32" and c64.model.dtype == "float64"
        assert all(a.dtype == np.float32 for a in c32.named_arrays().values())
        t64, t32 = run(c64, "full"), run(c32, "full")
        assert list(t32.steps) == list(t64.steps)
        for path in t64.steps:
            v32, v64 = t32.value(path), t64.value(path)
            assert v32.dtype == np.float32, (shape, path)
            assert v64.dtype == np.float64, (shape, path)
            # float32 keeps ~7 digits; a few layers of rounding stay well under 1e-4
            np.testing.assert_allclose(v32, v64, rtol=1e-4, atol=1e-5, err_msg=path)
        assert not np.array_equal(t32.value(path), t64.value(path))  # really computed in float32


@pytest.mark.parametrize("i", range(len(REFERENCE_SHAPES)))
def test_float32_rounds_like_torch_float32_not_like_float64_cast_at_the_end(
    i: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A float32 dtype on every array could still hide a float64 computation cast at the
    # end: its logits would then be within one float32 rounding (`cast`) of float64's.
    # Computed in float32, the error is a few roundings per step, the size of the
    # independent torch reference's when it runs in float32.
    raw = random_config(np.random.default_rng(100 + i), **REFERENCE_SHAPES[i])  # type: ignore[arg-type]
    t64, t32 = run(config_from(raw), "full"), run(config_from(raw, dtype="float32"), "full")
    monkeypatch.setattr(reference_torch, "DTYPE", torch.float32)
    torch32 = reference_torch.reference_forward(raw)
    last = "logits" if "logits" in t64.steps else list(t64.steps)[-1]
    v64 = t64.value(last)
    size = np.abs(v64).max()
    engine, torch_err, cast = (
        np.abs(v - v64).max() / size
        for v in (t32.value(last), torch32[last], v64.astype(np.float32))
    )
    assert torch32[last].dtype == np.float32
    assert engine < 4 * torch_err, (engine, torch_err)  # no worse than float32 should be
    if torch_err <= 2 * cast:  # (the yardstick: a small model may round little on the way)
        pytest.skip(
            f"torch's own float32 error here, {torch_err:.3g}, is within two float32 roundings "
            f"({2 * cast:.3g}): this config cannot tell a float32 computation from a cast"
        )
    assert engine > 2 * cast, (engine, cast)  # rounded along the way, not once at the end


def test_dtype_option_on_the_command_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["decode", "--dtype", "float32", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["conventions"]["numbers"].startswith("float32")
    p32 = np.array(next(s for s in data["steps"] if s["path"] == "probs")["value"])
    assert p32.astype(np.float32).astype(np.float64).tolist() == p32.tolist()  # float32 values
    d64 = json.loads(runner.invoke(app, ["decode", "--format", "json"]).stdout)
    p64 = np.array(next(s for s in d64["steps"] if s["path"] == "probs")["value"])
    np.testing.assert_allclose(p32, p64, rtol=1e-5, atol=1e-7)
    assert "float32" in runner.invoke(app, ["encode", "--dtype", "float32"]).stdout
    help_text = runner.invoke(app, ["encode", "--help"], env={"COLUMNS": "200"}).stdout
    assert "7 significant" in help_text and "1e-6" in help_text and "check" in help_text


def test_dtype_refusals(tmp_path: Path) -> None:
    result = runner.invoke(app, ["encode", "--dtype", "float16"])
    assert result.exit_code == 2 and "float32" in result.stderr
    op = tmp_path / "op.yaml"
    op.write_text(yaml.safe_dump({"attention": {"Q": [[1.0]], "K": [[1.0]], "V": [[1.0]]}}))
    result = runner.invoke(app, ["step", str(op), "--stage", "softmax", "--dtype", "float32"])
    assert result.exit_code == 2 and "single operation" in result.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {d_model: 2, dtype: float16}\nvocab: [a]\nsource: [a]\n")
    result = runner.invoke(app, ["encode", str(bad)])
    assert result.exit_code == 2 and "model.dtype" in result.stderr


def test_a_drawn_weight_beyond_float32_is_an_overflow_warning_not_numpys(tmp_path: Path) -> None:
    # init_std 1e39: every drawn number is beyond float32. Rounded, they are infinities,
    # which the run reports with the step; numpy's own RuntimeWarning (two lines naming
    # config.py) used to come first.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as a process's stderr would show it
        result = runner.invoke(
            app, ["encode", "--dtype", "float32", "--set", "model.init_std=1e39"]
        )
    assert result.exit_code == 0, result.stderr
    assert result.stderr.startswith("trace-tf: warning: hello (packaged example): ")
    assert result.stderr.count("\n") == 1 and "RuntimeWarning" not in result.stderr


def test_a_drawn_weight_beyond_float64_is_an_overflow_warning_not_numpys() -> None:
    # init_std 1e308: a draw of |z| > 1.8 is beyond float64. The product was numpy's
    # "RuntimeWarning: overflow encountered in multiply" (two lines naming config.py)
    # before the run's own warning (found by tests/fuzz_configs.py).
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as a process's stderr would show it
        result = runner.invoke(app, ["encode", "--set", "model.init_std=1e308"])
    assert result.exit_code == 0, result.stderr
    # (the infinities meet in encoder.0.ffn.hidden, a NaN: the run's warning names it)
    assert result.stderr.startswith("trace-tf: warning: hello (packaged example): NaN first")
    assert result.stderr.count("\n") == 1 and "RuntimeWarning" not in result.stderr


def test_a_given_model_number_beyond_float32_is_refused_with_its_key() -> None:
    # model.scale 1e39 became an infinity in float32: every scaled score a silent 0
    for key in ("scale", "embed_scale", "temperature", "norm_eps"):
        result = runner.invoke(app, ["encode", "--dtype", "float32", "--set", f"model.{key}=1e39"])
        assert result.exit_code == 2, (key, result.stdout[-300:])
        assert f"model.{key}: beyond the range of float32" in result.stderr
    ok = runner.invoke(app, ["encode", "--dtype", "float32", "--set", "model.scale=3e38"])
    assert ok.exit_code == 0 and ok.stderr == ""


def test_a_pe_base_beyond_float32_is_taken_its_angles_are_float64() -> None:
    # pe_base 1e39 was refused in float32 "as it would become an infinity", but the
    # positional angles pos / base^(2i/d) are computed in float64 (ops.sinusoidal_pe,
    # ops.rope_angles): only the sines and cosines are stored in float32.
    args = ["step", "--dtype", "float32", "--set", "model.pe_base=1e39", "--format", "json"]
    result = runner.invoke(app, [*args, "--stage", "encoder.pe"])
    assert result.exit_code == 0, result.output
    pe = np.array(json.loads(result.stdout)["steps"][0]["value"])
    pos, two_i = np.arange(2.0)[:, None], np.arange(0, 4, 2.0)
    angles = pos / 1e39 ** (two_i / 4)  # hello: 2 tokens, d_model 4
    expected = np.empty((2, 4))
    expected[:, 0::2], expected[:, 1::2] = np.sin(angles), np.cos(angles)
    assert np.array_equal(pe, expected.astype(np.float32))
    rope = ["--set", "model.positional=rope", "--stage", "encoder.0.self_attn.h0.q"]
    assert runner.invoke(app, [*args, *rope]).exit_code == 0


def test_a_divisor_float32_would_round_to_0_is_refused_with_its_key() -> None:
    # temperature 1e-46 is a near-argmax softmax in float64 (the row max is subtracted
    # first); float32 rounded it to 0, and 0 / 0 gave NaN, reported as "a fully masked
    # row has no softmax". scale 1e-46 likewise divided every score by 0.
    for key in ("temperature", "scale"):
        args = ["encode", "--set", f"model.{key}=1e-46"]
        assert runner.invoke(app, args).exit_code == 0
        result = runner.invoke(app, [*args, "--dtype", "float32"])
        assert result.exit_code == 2, (key, result.stdout[-300:])
        assert f"model.{key}: below the range of float32" in result.stderr
        assert "found the number 1e-46" in result.stderr
    ok = runner.invoke(app, ["encode", "--dtype", "float32", "--set", "model.temperature=1e-45"])
    assert ok.exit_code == 0  # (stored as 2^-149, 1.4e-45: noted, one digit)
    assert ok.stderr.endswith(
        f"stored as {float(np.float32(1e-45)):.6g} (fewer significant digits)\n"
    )


def test_the_float32_divisor_message_states_the_bound_it_enforces() -> None:
    # It said "expected a number of at least 1e-45", yet 8e-46 ran: float32 rounds
    # anything above half its smallest number, 2^-149 / 2 = 2^-150, up to 2^-149.
    # Then "a number above 7.0065e-46", rounded: the next number above 2^-150 ran
    # though below that bound. Now the bound is exact: refused at or below, run above.
    half = 2.0**-150  # 7.0064923e-46, itself rounded to 0 (ties to even)
    above = float(np.nextafter(half, 1.0))
    assert np.float32(half) == 0 and np.float32(above) == 2.0**-149
    args = ["encode", "--dtype", "float32", "--set"]
    for key in ("temperature", "scale"):
        for value in (float(np.nextafter(half, 0.0)), half, 7.00649e-46):
            refused = runner.invoke(app, [*args, f"model.{key}={value!r}"])
            assert refused.exit_code == 2, refused.stdout[-300:]
            found = re.search(r"expected a number above ([0-9.e+-]+)", refused.stderr)
            assert found is not None, refused.stderr
            bound = float(found[1])
            assert value <= bound, refused.stderr  # the refused number visibly not above
        for taken in (above, 7.0064924e-46, 7.0065e-46, 8e-46):
            assert runner.invoke(app, [*args, f"model.{key}={taken!r}"]).exit_code == 0
            assert taken > bound


def test_the_float32_range_message_states_the_bound_it_enforces() -> None:
    # It said "a number of magnitude at most 3.40282e+38", rounded down: float32's
    # largest, 3.4028234663852886e+38, ran though above it. Now the bound is exact.
    largest = float(np.finfo(np.float32).max)
    beyond = float(np.nextafter(largest, math.inf))
    args = ["encode", "--dtype", "float32", "--set"]
    refused = runner.invoke(app, [*args, f"model.scale={beyond!r}"])
    assert refused.exit_code == 2, refused.stdout[-300:]
    found = re.search(r"expected a number of magnitude at most ([0-9.e+-]+)", refused.stderr)
    assert found is not None, refused.stderr
    bound = float(found[1])
    assert beyond > bound  # the refused number visibly above
    assert runner.invoke(app, [*args, f"model.scale={largest!r}"]).exit_code == 0
    assert largest <= bound


def test_diff_runs_both_sides_in_the_dtype_it_is_given(tmp_path: Path) -> None:
    # diff took --dtype and validated it, then built both runs in float64: A float64
    # against B float32 differed in 79 steps where both were asked for in float32
    args = ["diff", "--set-b", "model.dtype=float32", "--dtype", "float32", "--format", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["identical"] is True
    result = runner.invoke(app, ["diff", "--set-b", "model.scale=30", "--dtype", "float32"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(
        runner.invoke(
            app, ["diff", "--set-b", "model.scale=30", "--dtype", "float32", "--format", "json"]
        ).stdout
    )
    differing = [s for s in data["steps"] if s["status"] == "differs"]
    assert differing
    for s in differing:  # both sides' numbers are float32 numbers
        for x in (s["a_at"], s["b_at"]):
            assert float(np.float32(x)) == x, (s["path"], x)
    # a single operation runs in float64, and says so, as every other command does
    path = tmp_path / "att.yaml"
    path.write_text("attention:\n  Q: [[1, 0]]\n  K: [[1, 0], [0, 1]]\n  V: [[1, 2], [3, 4]]\n")
    args = ["diff", str(path), "--set-b", "attention.temperature=2", "--dtype", "float32"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--dtype float32 applies to a model config" in result.stderr
    assert result.stderr.count("\n") == 1


def test_float32_json_and_csv_hold_the_npz_numbers_exactly(tmp_path: Path) -> None:
    # README: JSON and CSV write a float32 number as the float64 it converts to exactly
    sets = ["--set", "embeddings.hello=[0.1, 2, 3, 4]", "--dtype", "float32"]
    npz = tmp_path / "s.npz"
    assert (
        runner.invoke(app, ["decode", *sets, "--format", "npz", "--output", str(npz)]).exit_code
        == 0
    )
    arrays = np.load(npz)
    data = json.loads(runner.invoke(app, ["decode", *sets, "--format", "json"]).stdout)
    for s in data["steps"]:
        got = np.array(s["value"], dtype=np.float64)  # "-inf" strings read by numpy too
        want = arrays[s["path"]]
        assert want.dtype == np.float32
        assert np.array_equal(got, want.astype(np.float64), equal_nan=True), s["path"]
    assert data["steps"][0]["value"][0][0] == float(np.float32(0.1)) == 0.10000000149011612
    args = ["step", *sets, "--stage", "encoder.embed", "--format", "csv"]
    row = runner.invoke(app, args).stdout.splitlines()[1]
    assert row.startswith("hello,0.10000000149011612,2.0,")


@pytest.mark.parametrize("option, setting", [("float32", "float64"), ("float64", "float32")])
def test_the_dtype_option_wins_over_the_files_and_a_set(option: str, setting: str) -> None:
    # README (config keys, model.dtype): the option, where given, wins
    args = ["encode", "--set", f"model.dtype={setting}", "--dtype", option, "--format", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["conventions"]["numbers"].startswith(option)
    pe = np.array(next(s["value"] for s in data["steps"] if s["path"] == "encoder.pe"))
    assert (pe.astype(np.float32).astype(np.float64) == pe).all() == (option == "float32")


# float32's smallest normal number, its smallest subnormal, and half that: literal powers
# of two, not numpy's finfo, which the code reads
F32_NORMAL, F32_LEAST, F32_HALF_LEAST = 2.0**-126, 2.0**-149, 2.0**-150


def test_a_given_nonzero_number_float32_would_round_to_0_is_refused_with_its_key(
    tmp_path: Path,
) -> None:
    # 1e-46 became a silent 0 in float32, where float64 refuses 1e-400 alike
    assert float(np.float32(1e-46)) == 0 and F32_HALF_LEAST > 1e-46
    cases = [
        (["--set", "embeddings.hello=[1e-46, 2, 3, 4]"], "embeddings.hello.0"),
        (["--set", "embeddings.hello.2=-1e-46"], "embeddings.hello.2"),
        (["--set", "model.norm_eps=1e-46"], "model.norm_eps"),
        (["--set", "model.embed_scale=-1e-46"], "model.embed_scale"),
    ]
    for args, key in cases:
        result = runner.invoke(app, ["encode", "--dtype", "float32", *args])
        assert result.exit_code == 2, (args, result.stdout[-300:])
        assert f"{key}: below the range of float32, the model's dtype (it would be 0)" in (
            result.stderr
        ), result.stderr
        assert "found the number " in result.stderr and "e-46" in result.stderr
        assert "expected 0, or a number of magnitude above 7.006492321624085e-46" in (result.stderr)
        assert "Traceback" not in result.stderr
        # float64 holds it: a number, not an error
        assert runner.invoke(app, ["encode", *args]).exit_code == 0
    # the file's own number, and a variant's, are refused alike; 0 and just above the
    # bound are taken
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {d_model: 4, dtype: float32}\nsource: [[1, 2, 3, 4]]\n"
        "variants: {tiny: {source: [[1, 2, 1e-46, 4]]}}\n",
        encoding="utf-8",
    )
    assert runner.invoke(app, ["encode", str(path)]).exit_code == 0
    result = runner.invoke(app, ["encode", str(path), "--variant", "tiny"])
    assert result.exit_code == 2 and "source.0.2: below the range of float32" in result.stderr
    above = float(np.nextafter(F32_HALF_LEAST, 1))  # rounds to 2^-149, not 0
    for value in ("0", "-0.0", repr(above)):
        result = runner.invoke(app, ["encode", str(path), "--set", f"source=[[1, 2, {value}, 4]]"])
        assert result.exit_code == 0, (value, result.stderr)
    result = runner.invoke(
        app, ["encode", str(path), "--set", f"source=[[1, 2, {F32_HALF_LEAST!r}, 4]]"]
    )
    assert result.exit_code == 2, "2^-150 is a tie, to even: 0"


def test_a_given_number_stored_with_fewer_digits_is_a_warning_not_strict(
    tmp_path: Path,
) -> None:
    # 1e-40 is stored in float32 as a subnormal, 71362 times 2^-149: 9.99995e-41, five
    # digits where the header says about 7; nothing said so
    stored = round(1e-40 / F32_LEAST) * F32_LEAST
    assert stored == float(np.float32(1e-40)) and f"{stored:.6g}" == "9.99995e-41"
    args = ["--dtype", "float32", "--set", "embeddings.hello=[1e-40, 2, -1e-39, 4]"]
    result = runner.invoke(app, ["encode", *args])
    assert result.exit_code == 0, result.stderr
    note = (
        "embeddings.hello.0: 1e-40 is below float32's smallest normal number 1.17549e-38; "
        "stored as 9.99995e-41 (fewer significant digits); 1 more number stored with fewer digits"
    )
    assert f"{F32_NORMAL:.6g}" == "1.17549e-38"
    assert result.stderr == f"trace-tf: warning: hello (packaged example): {note}\n"
    assert "warning: embeddings.hello.0: 1e-40 is below" in result.stdout  # the header
    out = runner.invoke(app, ["encode", *args, "--format", "json"])
    assert json.loads(out.stdout)["warnings"] == [note]
    # --strict is about the run (NaN, overflow): the input is used as float32 holds it
    assert runner.invoke(app, ["encode", *args, "--strict"]).exit_code == 0
    # a number float32 holds exactly (2^-149 itself), and a normal one, are no warning
    exact_args = ["--dtype", "float32", "--set", f"embeddings.hello=[{F32_LEAST!r}, 2, 1e-30, 4]"]
    assert runner.invoke(app, ["encode", *exact_args]).stderr == ""
    assert runner.invoke(app, ["encode", "--set", "embeddings.hello=[1e-40, 2, 3, 4]"]).stderr == ""
    # float64 alike below its smallest normal 2^-1022: 1e-310 keeps 13 or 14 digits
    result = runner.invoke(app, ["encode", "--set", "embeddings.hello=[1e-310, 2, 3, 4]"])
    assert result.exit_code == 0
    f64 = round(1e-310 / 2.0**-1074) * 2.0**-1074
    assert f"stored as {f64:.17g} (fewer" in result.stderr and f"{2.0**-1022:.6g}" in result.stderr
    # diff says it of each run, and --strict there leaves it a warning too
    diff = runner.invoke(app, ["diff", *args, "--set-b", "model.scale=3", "--strict"])
    assert diff.exit_code == 0, diff.stderr
    assert f"{note} (in run A)" in diff.stderr and f"{note} (in run B)" in diff.stderr
    # generate says it too
    gen = runner.invoke(app, ["generate", *args, "--max-tokens", "2"])
    assert gen.exit_code == 0 and note in gen.stderr
    # a float32 weights_file's subnormal is the number as stored: no digits lost
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights_file: w.npz\n", encoding="utf-8"
    )
    b_1 = np.zeros(16, dtype=np.float32)
    b_1[5] = np.float32(1e-40)
    np.savez(tmp_path / "w.npz", **{"encoder.0.ffn.b_1": b_1})
    result = runner.invoke(app, ["encode", str(tmp_path / "c.yaml"), "--dtype", "float32"])
    assert result.exit_code == 0 and result.stderr == ""


def test_generate_names_the_runs_nan_not_a_note_on_a_given_number() -> None:
    # the note on 1e-40 came first in the warnings, and was quoted as the NaN's cause
    result = runner.invoke(
        app,
        [
            "generate",
            "--dtype",
            "float32",
            "--set",
            "model.init_std=1e39",
            "--set",
            "embeddings.hello=[1e-40, 2, 3, 4]",
            "--max-tokens",
            "2",
        ],
    )
    assert result.exit_code == 2
    error = result.stderr.splitlines()[-1]
    assert "is not finite (NaN first appears in step " in error, result.stderr
    assert "smallest normal" not in error
    # the note is said, as a warning before the error, as encode says it beside the NaN
    assert result.stderr.startswith("trace-tf: warning: hello (packaged example): ")
    assert "embeddings.hello.0: 1e-40 is below float32's smallest normal" in result.stderr


def test_generate_says_the_note_before_stopping_on_the_nan_a_tiny_scale_made() -> None:
    # scale 1e-40: the scores over it overflow float32, the distribution is not finite;
    # the error named the overflow, and the tiny number the user gave went unsaid
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(1.0) / np.float32(1e-40))
    stored = f"{float(np.float32(1e-40)):.6g}"
    args = ["generate", "--dtype", "float32", "--set", "model.scale=1e-40", "--max-tokens", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    note, error = result.stderr.splitlines()
    assert note == (
        "trace-tf: warning: hello (packaged example): model.scale: 1e-40 is below float32's "
        f"smallest normal number {F32_NORMAL:.6g}; stored as {stored} (fewer significant digits)"
    )
    assert error.startswith("trace-tf: error: hello (packaged example): the next-token")
    assert "overflow: an infinity first appears in step encoder.0.self_attn.h0.scaled" in error
    # an error of the config, not of the run, is not preceded by it
    result = runner.invoke(app, [*args, "--set", "tokens.eos=nothing"])
    assert result.exit_code == 2 and "smallest normal" not in result.stderr, result.stderr


def test_single_numbers_the_model_computes_with_are_noted_as_arrays_are(tmp_path: Path) -> None:
    # model.norm_eps 1e-40 under float32 is added to var as float32 holds it, 9.99995e-41;
    # only the arrays' numbers were noted, never norm_eps, embed_scale, scale, temperature
    stored = float(np.float32(1e-40))
    assert stored != 1e-40 and f"{stored:.6g}" == "9.99995e-41"
    for key, value in [
        ("norm_eps", "1e-40"),
        ("embed_scale", "-1e-40"),
        ("scale", "1e-40"),
        ("temperature", "1e-40"),
    ]:
        result = runner.invoke(
            app, ["encode", "--dtype", "float32", "--set", f"model.{key}={value}"]
        )
        assert result.exit_code == 0, result.stderr
        sign = "-" if value.startswith("-") else ""
        assert (
            f"warning: hello (packaged example): model.{key}: {value} is below float32's "
            f"smallest normal number {F32_NORMAL:.6g}; stored as {sign}9.99995e-41 "
            "(fewer significant digits)\n"
        ) in result.stderr, (key, result.stderr)
    # one warning for the run: the first named, the rest counted with the arrays' numbers
    args = ["--dtype", "float32", "--set", "model.norm_eps=1e-40", "--set", "model.scale=1e-39"]
    args += ["--set", "embeddings.hello=[1e-40, 2, 3, 4]"]
    result = runner.invoke(app, ["encode", *args, "--format", "json"])
    assert json.loads(result.stdout)["warnings"][0].startswith("model.norm_eps: 1e-40 is below")
    assert result.stderr.count("smallest normal") == 1  # (then the overflow scale 1e-39 makes)
    assert result.stderr.splitlines()[0].endswith("; 2 more numbers stored with fewer digits"), (
        result.stderr
    )
    # float64: a number typed below 2^-1022 has lost digits already, pe_base and init_std too
    f64 = round(1e-310 / 2.0**-1074) * 2.0**-1074
    for key in ("norm_eps", "pe_base", "init_std", "temperature"):
        result = runner.invoke(app, ["encode", "--set", f"model.{key}=1e-310"])
        assert f"model.{key}: 1e-310 is below float64's smallest normal number" in result.stderr
        assert f"stored as {f64:.17g} (fewer" in result.stderr
    # under float32, pe_base and init_std stay float64 (angles, draws): nothing lost, no note;
    # nor for a normal float32 number
    for key, value in (("pe_base", "1e-40"), ("init_std", "1e-40"), ("norm_eps", "1e-30")):
        result = runner.invoke(
            app, ["encode", "--dtype", "float32", "--set", f"model.{key}={value}"]
        )
        assert result.exit_code == 0 and "smallest normal" not in result.stderr, result.stderr


def test_a_single_operations_given_numbers_are_noted(tmp_path: Path) -> None:
    # a single operation runs in float64: its 1e-310 (Q's, scale's, eps's) was never noted
    f64 = f"{round(1e-310 / 2.0**-1074) * 2.0**-1074:.17g}"
    assert f64 == f"{float(np.float64(1e-310)):.17g}" and f64 != "1e-310"
    one = ["--q", "1 1", "--k", "1 1", "--v", "1 1"]
    for args, key in [
        (["--q", "1e-310 1", "--k", "1 1", "--v", "1 1"], "attention.Q.0.0"),
        ([*one, "--scale", "1e-310"], "attention.scale"),
        ([*one, "--temperature", "1e-310"], "attention.temperature"),
        ([*one, "--mask", "1e-310"], "attention.mask.0.0"),
    ]:
        result = runner.invoke(app, ["attend", *args, "--format", "json"])
        assert result.exit_code == 0, (args, result.stderr)
        note = f"{key}: 1e-310 is below float64's smallest normal number {2.0**-1022:.6g}"
        assert f"warning: command line: {note}; stored as {f64}" in result.stderr, result.stderr
        assert json.loads(result.stdout)["warnings"][0].startswith(note)
    path = tmp_path / "n.yaml"
    path.write_text("norm:\n  x: [[1, 2]]\n  eps: 1e-310\n", encoding="utf-8")
    result = runner.invoke(app, ["norm", str(path)])
    assert "norm.eps: 1e-310 is below float64's smallest normal" in result.stderr
    path.write_text("pe: {length: 2, d_model: 2, base: 1e-310}\n", encoding="utf-8")
    result = runner.invoke(app, ["pe", str(path)])
    assert "pe.base: 1e-310 is below float64's smallest normal" in result.stderr
    assert runner.invoke(app, ["attend", *one, "--scale", "1e-300"]).stderr == ""


def test_weights_says_the_note_on_stderr_and_in_its_json() -> None:
    # `weights` shows where each number came from, and said nothing of one stored as 9.99995e-41
    args = ["weights", "--dtype", "float32", "--set", "embeddings.hello=[1e-40, 2, 3, 4]"]
    note = (
        "embeddings.hello.0: 1e-40 is below float32's smallest normal number "
        f"{F32_NORMAL:.6g}; stored as {float(np.float32(1e-40)):.6g} (fewer significant digits)"
    )
    result = runner.invoke(app, args)
    assert result.exit_code == 0
    assert result.stderr == f"trace-tf: warning: hello (packaged example): {note}\n"
    result = runner.invoke(app, [*args, "--format", "json"])
    assert json.loads(result.stdout)["warnings"] == [note]
    result = runner.invoke(app, ["weights", "--format", "json"])
    assert result.stderr == "" and json.loads(result.stdout)["warnings"] == []


def test_a_float64_weights_file_is_held_to_float32_as_given_numbers_are(tmp_path: Path) -> None:
    # its 1e39 was refused already; its 1e-46 became a silent 0, its 1e-40 a silent subnormal
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights_file: w.npz\n", encoding="utf-8"
    )
    for value, code, said in (
        (1e-46, 2, "weights.encoder.0.ffn.b_1.5: below the range of float32"),
        (1e-40, 0, "weights.encoder.0.ffn.b_1.5: 1e-40 is below float32's smallest normal"),
    ):
        b_1 = np.zeros(16)
        b_1[5] = value
        np.savez(tmp_path / "w.npz", **{"encoder.0.ffn.b_1": b_1})
        result = runner.invoke(app, ["encode", str(tmp_path / "c.yaml"), "--dtype", "float32"])
        assert result.exit_code == code and said in result.stderr, result.stderr
        if code == 2:
            assert "array 'encoder.0.ffn.b_1'" in result.stderr
        # float64 holds it as stored: no error, no warning
        result = runner.invoke(app, ["encode", str(tmp_path / "c.yaml")])
        assert result.exit_code == 0 and result.stderr == ""


def test_a_row_set_over_a_weights_file_is_counted_once(tmp_path: Path) -> None:
    # the row is read on its own and again in its whole array: two numbers, not four
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 4}\nsource: [[1, 2, 3, 4]]\nweights_file: w.npz\n", encoding="utf-8"
    )
    np.savez(tmp_path / "w.npz", **{"encoder.0.ffn.W_1": np.ones((4, 16))})
    row = "[" + ", ".join(["1e-40", "1e-40"] + ["0"] * 14) + "]"
    result = runner.invoke(
        app,
        [
            "encode",
            str(tmp_path / "c.yaml"),
            "--dtype",
            "float32",
            "--set",
            f"weights.encoder.0.ffn.W_1.1={row}",
        ],
    )
    assert result.exit_code == 0
    assert "weights.encoder.0.ffn.W_1.1.0: 1e-40 is below" in result.stderr
    assert result.stderr.endswith(
        "(fewer significant digits); 1 more number stored with fewer digits\n"
    ), result.stderr


def test_drawn_numbers_around_an_entry_set_are_not_held_to_float32_as_given() -> None:
    # an entry set in a drawn weight made every drawn number of it "given": a drawn
    # 2.1e39 (init_std 1e39) was refused as beyond float32, and a drawn 2.1e-50 as below
    # it, naming an entry nobody gave; drawn, they are an overflow (and a 0) of the run
    entry = ["--set", "weights.encoder.0.ffn.W_1.0.0=5"]
    result = runner.invoke(
        app, ["encode", "--dtype", "float32", "--set", "model.init_std=1e39", *entry]
    )
    assert result.exit_code == 0, result.stderr
    assert "NaN first appears in step encoder.0.ffn.hidden" in result.stderr
    result = runner.invoke(
        app, ["encode", "--dtype", "float32", "--set", "model.init_std=1e-50", *entry]
    )
    assert result.exit_code == 0 and result.stderr == "", result.stderr
    # the entry itself is still held to float32, and noted below its normal numbers
    for value, code, said in (
        ("1e39", 2, "W_1.0.0: beyond the range of float32"),
        ("1e-46", 2, "W_1.0.0: below the range of float32"),
        ("1e-40", 0, "W_1.0.0: 1e-40 is below float32's smallest normal number"),
    ):
        result = runner.invoke(
            app, ["encode", "--dtype", "float32", "--set", f"weights.encoder.0.ffn.W_1.0.0={value}"]
        )
        assert result.exit_code == code and said in result.stderr, (value, result.stderr)
    # and so in float64 (an entry typed below 2^-1022)
    result = runner.invoke(app, ["encode", "--set", "weights.encoder.0.ffn.W_1.0.0=1e-310"])
    assert "W_1.0.0: 1e-310 is below float64's smallest normal number" in result.stderr


def test_pe_base_and_init_std_under_float32_are_noted_against_float64() -> None:
    # they are used in float64 under either dtype (the angles, the draws; then stored in
    # float32): 1e-310 loses digits in float64, and was noted only under --dtype float64
    f64_normal = float(np.finfo(np.float64).smallest_normal)
    stored = round(1e-310 / 2.0**-1074) * 2.0**-1074  # float64's subnormals: multiples of 2^-1074
    assert f64_normal > 1e-310 and stored == float(np.float64(1e-310))
    assert f"{stored:.17g}" == "9.9999999999999694e-311"  # (1e-310 to 13 digits only)
    for key in ("pe_base", "init_std"):
        result = runner.invoke(
            app,
            ["encode", "--dtype", "float32", "--set", f"model.{key}=1e-310", "--format", "json"],
        )
        note = (
            f"model.{key}: 1e-310 is below float64's smallest normal number {f64_normal:.6g}; "
            f"stored as {stored:.17g} (fewer significant digits)"
        )
        assert f"warning: hello (packaged example): {note}\n" in result.stderr, result.stderr
        assert json.loads(result.stdout)["warnings"][0] == note
    # counted with the float32 numbers in the one warning, the first (float32's) named
    args = ["--dtype", "float32", "--set", "model.norm_eps=1e-40", "--set", "model.pe_base=1e-310"]
    result = runner.invoke(app, ["encode", *args])
    assert result.stderr.count("smallest normal") == 1
    assert "model.norm_eps: 1e-40 is below float32's" in result.stderr
    assert result.stderr.splitlines()[0].endswith("; 1 more number stored with fewer digits"), (
        result.stderr
    )


def test_generates_sampling_options_are_noted_or_refused_in_the_dtype_they_are_used_in() -> None:
    # --temperature divides the logits in the model's dtype: 1e-40 under float32 was used
    # as 9.99995e-41 unnoted, and 1e-46 became 0, a NaN distribution sampled from
    gen = ["generate", "--sample", "--max-tokens", "2", "--format", "json"]
    f32 = [*gen, "--dtype", "float32"]
    stored = float(np.float32(1e-40))
    assert stored != 1e-40 and f"{stored:.6g}" == "9.99995e-41"
    note = (
        f"--temperature: 1e-40 is below float32's smallest normal number {F32_NORMAL:.6g}; "
        f"stored as {stored:.6g} (fewer significant digits)"
    )
    result = runner.invoke(app, [*f32, "--temperature", "1e-40"])
    assert result.exit_code == 0, result.stderr
    assert f"warning: hello (packaged example): {note}\n" in result.stderr
    assert json.loads(result.stdout)["warnings"] == [note]
    # one warning for the run with the config's, the config's first
    result = runner.invoke(app, [*f32, "--temperature", "1e-40", "--set", "model.norm_eps=1e-40"])
    assert result.stderr.count("smallest normal") == 1, result.stderr
    assert "model.norm_eps: 1e-40 is below" in result.stderr
    assert result.stderr.rstrip().endswith("; 1 more number stored with fewer digits"), (
        result.stderr
    )
    # float32 makes 1e-46 (at most 2^-150) 0, and 1e39 an infinity: refused, as the config's
    for value, problem in (("1e-46", "below"), ("1e39", "beyond")):
        result = runner.invoke(app, [*f32, "--temperature", value])
        assert result.exit_code == 2 and not result.stdout, (value, result.stdout[-300:])
        assert f"--temperature: {problem} the range of float32, the model's dtype" in result.stderr
        assert result.stderr.rstrip().endswith(f"found {value}") and "NaN" not in result.stderr
    assert 1e-46 <= 2.0**-150 and float(np.float32(1e-46)) == 0.0
    assert float(np.finfo(np.float32).max) < 1e39
    assert runner.invoke(app, [*gen, "--temperature", "1e-46"]).exit_code == 0  # (float64)
    # float64: below 2^-1022; --top-p is used in float64 (1 - p) under either dtype
    f64 = f"{float(np.float64(1e-310)):.17g}"
    assert f64 == f"{round(1e-310 / 2.0**-1074) * 2.0**-1074:.17g}" != "1e-310"
    for args, option in (
        ([*gen, "--temperature", "1e-310"], "--temperature"),
        ([*gen, "--top-p", "1e-310"], "--top-p"),
        ([*f32, "--top-p", "1e-310"], "--top-p"),
        (["generate", *f32[2:], "--beam", "2", "--length-penalty", "-1e-310"], "--length-penalty"),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.stderr
        assert (
            f"{option}: {'-' if option == '--length-penalty' else ''}1e-310 is below "
            f"float64's smallest normal number "
            f"{float(np.finfo(np.float64).smallest_normal):.6g}; stored as "
            f"{'-' if option == '--length-penalty' else ''}{f64} "
        ) in result.stderr, (args, result.stderr)
    result = runner.invoke(app, [*f32, "--top-p", "1e-40"])  # a normal float64: nothing lost
    assert result.exit_code == 0 and "smallest normal" not in result.stderr, result.stderr
    # an option another strategy leaves unused is stored nowhere: said unused, no more
    result = runner.invoke(
        app, ["generate", "--greedy", "--dtype", "float32", "--temperature", "1e-46"]
    )
    assert result.exit_code == 0 and "smallest normal" not in result.stderr, result.stderr
    assert "--temperature applies to --sample only" in result.stderr
