"""The calculator commands attend, norm and pe through the command line, against PyTorch's
norms (LayerNorm, BatchNorm1d in training mode, InstanceNorm1d, RMSNorm) and hand
computations; inline matrices and their errors."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch
from conftest import FIXTURES
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import parse_matrix
from trace_tf.errors import InputError

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def steps_of(*args: str) -> dict[str, np.ndarray]:
    code, out, err = invoke(*args, "--format", "json")
    assert code == 0, err
    return {s["path"]: np.array(s["value"], dtype=float) for s in json.loads(out)["steps"]}


X = [[3.2897, 0.7432, -1.1652], [0.7432, 1.3647, -1.1707], [-1.1652, -1.1707, 5.6380]]
X_TEXT = "3.2897 0.7432 -1.1652; 0.7432, 1.3647, -1.1707; -1.1652 -1.1707 5.6380"


# ---------------------------------------------------------------------------
# inline matrices
# ---------------------------------------------------------------------------


def test_parse_matrix_rows_columns_and_vectors() -> None:
    assert parse_matrix("1 0 0; 1,2,0", "--k") == [[1, 0, 0], [1, 2, 0]]
    assert parse_matrix("18;20;22;19", "--v") == [[18], [20], [22], [19]]
    assert parse_matrix("1.5", "--q") == [[1.5]]
    assert parse_matrix("[[1, 2], [3, 4]]", "--x") == [[1, 2], [3, 4]]
    assert parse_matrix("1 2; 3 4 | 5 6; 7 8", "--x") == [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]
    assert parse_matrix("0 -inf", "--mask", allow_inf=True) == [[0, -math.inf]]
    assert parse_matrix("0 -.inf", "--mask", allow_inf=True) == [[0, -math.inf]]


def test_inline_numbers_follow_the_files_yaml_1_2_rules() -> None:
    # As the README says of the file, --set and inline matrices: 0o17 and 0x1F were
    # refused inline, though a file reads them as 15 and 31.
    assert parse_matrix("0x1F 0o17 010 1e-5 .5 1. −2 +3", "--q") == [
        [31, 15, 10, 1e-5, 0.5, 1.0, -2, 3]
    ]
    for text in ("1_000", "0b101", "1:30", "Infinity", "0x", "-0x1F"):  # (the file: text)
        with pytest.raises(InputError, match="not a number"):
            parse_matrix(text, "--q")
    with pytest.raises(InputError, match="not a finite number"):
        parse_matrix("1" + "0" * 400, "--q")  # beyond float64


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1 2 3; 4 5", "--k: ragged matrix: row 1 has 2 numbers, row 0 has 3"),
        ("1 two", "--k: row 0: not a number"),
        ("1 1_000", "--k: row 0: not a number"),  # YAML 1.2 text, as in a file (not 1000)
        ("1 nan", "--k: row 0: not a finite number"),
        ("1 -inf", "--k: row 0: not a finite number"),
        ("1 2;;3 4", "--k: row 1 is empty"),
        ("1 2 | 3", "--k: the matrices separated by '|' differ in shape"),
    ],
)
def test_parse_matrix_refuses_bad_text_naming_the_option(text: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        parse_matrix(text, "--k")


@pytest.mark.parametrize("text", ["1 2; 3 4;", "1 2;;3 4", "; 1 2"])
def test_an_empty_row_is_found_in_the_whole_text_given(text: str) -> None:
    # "found" is what the user typed, not a number of a row read before the empty one
    with pytest.raises(InputError) as exc:
        parse_matrix(text, "--k")
    assert exc.value.found == repr(text.strip())


# ---------------------------------------------------------------------------
# attend
# ---------------------------------------------------------------------------


def test_attend_inline_replays_the_002_database_query() -> None:
    steps = steps_of(
        "attend", "--q", "1 0 0", "--k", "1 2 0; 1,2,0; 0 0 2; 1 4 0", "--v", "18;20;22;19",
        "--scale", "1",
    )  # fmt: skip
    e = math.e
    np.testing.assert_array_equal(steps["attn.scores"], [[1, 1, 0, 1]])
    np.testing.assert_allclose(
        steps["attn.softmax"], np.array([[e, e, 1, e]]) / (3 * e + 1), atol=1e-15
    )
    assert steps["attn.context"][0, 0] == pytest.approx((57 * e + 22) / (3 * e + 1), abs=1e-12)


def test_attend_temperature_approaches_the_hardmax() -> None:
    args = ("attend", "--q", "1 0 0", "--k", "1 2 0; 1 2 0; 0 0 2; 1 4 0", "--v", "18;20;22;19")
    steps = steps_of(*args, "--scale", "1", "--temperature", "0.01")
    np.testing.assert_allclose(steps["attn.softmax"], [[1 / 3, 1 / 3, 0, 1 / 3]], atol=1e-40)
    assert steps["attn.context"][0, 0] == pytest.approx(19, abs=1e-12)
    np.testing.assert_array_equal(steps["attn.scaled"], [[1, 1, 0, 1]])  # T only inside softmax


def test_attend_default_scale_is_sqrt_dk_and_row_vectors_work() -> None:
    steps = steps_of("attend", "--q", "1 1", "--k", "2 0; 0 2", "--v", "1 0; 0 1")
    np.testing.assert_allclose(steps["attn.scaled"], [[2 / math.sqrt(2)] * 2], atol=1e-15)
    np.testing.assert_allclose(steps["attn.context"], [[0.5, 0.5]], atol=1e-15)


def test_attend_options_override_the_file() -> None:
    path = str(FIXTURES / "002_database_query.yaml")
    steps = steps_of("attend", path, "--v", "0;0;1;0")  # V replaced, Q, K and scale 1 kept
    e = math.e
    assert steps["attn.context"][0, 0] == pytest.approx(1 / (3 * e + 1), abs=1e-15)
    steps = steps_of("attend", path, "--variant", "cold", "--temperature", "1")
    assert steps["attn.context"][0, 0] == pytest.approx((57 * e + 22) / (3 * e + 1), abs=1e-12)


def test_attend_mask_and_gaussian_score() -> None:
    steps = steps_of(
        "attend", "--q", "1.5", "--k", "0;1;2;3", "--v", "0;1;4;9", "--score", "gaussian",
        "--w", "2", "--mask", "0 0 0 -inf",
    )  # fmt: skip
    kern = [math.exp(-0.5 * ((1.5 - x) * 2) ** 2) for x in (0, 1, 2)]
    want = sum(k * y for k, y in zip(kern, (0, 1, 4), strict=True)) / sum(kern)
    assert steps["attn.context"][0, 0] == pytest.approx(want, abs=1e-12)
    assert steps["attn.masked"][0, 3] == -math.inf and steps["attn.softmax"][0, 3] == 0


def test_attend_mask_with_a_finite_bias_adds_it() -> None:
    """A finite mask entry is an additive bias (000's relative-position B): scores
    [1, 0] / √1, plus [ln 3, 0], give softmax weights [3e, 1] / (3e + 1)."""
    steps = steps_of(
        "attend", "--q", "1", "--k", "1;0", "--v", "1;0", "--mask", f"{math.log(3)!r} 0"
    )
    assert steps["attn.masked"][0].tolist() == pytest.approx([1 + math.log(3), 0], abs=1e-15)
    e = math.e
    assert steps["attn.context"][0, 0] == pytest.approx(3 * e / (3 * e + 1), abs=1e-15)


def test_attend_additive_from_the_fixture_shows_the_given_matrices() -> None:
    code, out, err = invoke("attend", str(FIXTURES / "003_additive_attention.yaml"))
    assert code == 0, err
    for text in ("W_a_q", "W_a_k", "v_a", "attn.tanh", "additive", "21.6124"):
        assert text in out


@pytest.mark.parametrize(("text", "scale"), [("0x10", 16.0), ("1e1", 10.0), (" 4 ", 4.0)])
def test_attend_scale_reads_numbers_as_the_file_and_set_do(text: str, scale: float) -> None:
    # --scale was read by Python's float(): 0x10 refused, though --set attention.scale=0x10
    # and the file read it as 16 (YAML 1.2), and 1_000 accepted, which the file reads as text.
    args = ("attend", "--q", "1 2", "--k", "3 4; 5 6", "--v", "1;2")
    scaled = steps_of(*args, "--scale", text)["attn.scaled"]
    np.testing.assert_allclose(scaled, [[11 / scale, 17 / scale]], rtol=1e-15)
    by_set = steps_of(*args, "--set", f"attention.scale={text.strip()}")["attn.scaled"]
    np.testing.assert_array_equal(scaled, by_set)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--q", "1", "--k", "1", "--v", "1", "--scale", "1_000"), "--scale must be a number"),
        (("--q", "1 0", "--k", "1 2 0; 1 2", "--v", "1;2"), "--k: ragged matrix"),
        (("--q", "1 x", "--k", "1", "--v", "1"), "--q: row 0: not a number"),
        (("--q", "1 0", "--k", "1 2 0", "--v", "1"), "attention.K: wrong shape (set by --k)"),
        (("--q", "1"), "attend needs --q, --k and --v"),
        (("--q", "1", "--k", "1", "--v", "1", "--scale", "big"), "--scale must be a number"),
        (("--q", "1", "--k", "1", "--v", "1", "--score", "additive"), "missing W_a_q"),
        (("--q", "1", "--k", "1", "--v", "1;2"), "attention.V: wrong shape (set by --v)"),
        (("--q", "1", "--k", "1", "--v", "1", "--temperature", "0"), "must be positive"),
        (("hello",), "attend needs a single attention operation"),
        ((str(FIXTURES / "004_layer_batch_norm.yaml"),), "found 'norm:'"),
    ],
)
def test_attend_bad_input_exits_2(args: tuple[str, ...], message: str) -> None:
    code, _, err = invoke("attend", *args)
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("text", ["nan", "1_000", "big"])
def test_attend_scale_that_is_no_number_says_what_was_expected_and_found(text: str) -> None:
    # "--scale must be a number or sqrt_dk, not 'nan'": the one input message without the
    # expected and found every other bad value states (README, exit code 2).
    code, out, err = invoke("attend", "--q", "1", "--k", "1", "--v", "1", "--scale", text)
    assert (code, out) == (2, "")
    assert err == (
        "trace-tf: error: --scale must be a number or sqrt_dk; expected a positive number "
        f"or sqrt_dk, found '{text}'\n"
    )


# ---------------------------------------------------------------------------
# norm, against PyTorch
# ---------------------------------------------------------------------------


def _t(x: Any) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def _torch_layer_norm(gamma: list[float], beta: list[float]) -> np.ndarray:
    """torch's LayerNorm of X with γ and β (ε 1e-5), the value the norm calculator's must be."""
    ln = torch.nn.LayerNorm(3, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        ln.weight.copy_(_t(gamma))
        ln.bias.copy_(_t(beta))
        out: np.ndarray = ln(_t(X)).numpy()
    return out


def test_norm_layer_matches_torch_layer_norm() -> None:
    gamma, beta = [1.5, -0.5, 2.0], [0.1, 0.2, -0.3]
    steps = steps_of(
        "norm", "--x", X_TEXT, "--kind", "layer", "--gamma", "1.5 -0.5 2", "--beta", "0.1 0.2 -0.3"
    )
    want = _torch_layer_norm(gamma, beta)
    np.testing.assert_allclose(steps["norm.out"], want, rtol=0, atol=1e-14)
    xs = np.array(X)
    np.testing.assert_allclose(steps["norm.mean"], xs.mean(1, keepdims=True), atol=1e-15)
    np.testing.assert_allclose(steps["norm.var"], xs.var(1, keepdims=True), atol=1e-14)


def test_norm_gamma_and_beta_given_as_yaml_lists_are_the_vectors() -> None:
    # `--gamma [1.5, -0.5, 2]` was read as three rows of one number each: exit 3.
    gamma, beta = [1.5, -0.5, 2.0], [0.1, 0.2, -0.3]
    steps = steps_of(
        "norm", "--x", X_TEXT, "--gamma", "[1.5, -0.5, 2]", "--beta", "[0.1, 0.2, -0.3]"
    )
    want = _torch_layer_norm(gamma, beta)
    np.testing.assert_allclose(steps["norm.out"], want, rtol=0, atol=1e-14)


def test_attend_gaussian_w_given_as_a_yaml_list_weights_each_feature() -> None:
    # q = (1, 2), k = (0, 0), w = (2, 3): S = -1/2 ((1*2)^2 + (2*3)^2) = -20
    steps = steps_of(
        "attend", "--q", "1 2", "--k", "0 0", "--v", "5", "--score", "gaussian", "--w", "[2, 3]"
    )
    assert steps["attn.scores"].tolist() == [[-20.0]]


def test_norm_batch_matches_torch_batch_norm_in_training_mode() -> None:
    steps = steps_of(
        "norm", "--x", "1 2 3; 4 5 7; -1 0 2; 3 3 3", "--kind", "batch", "--eps", "0.1"
    )
    x = _t([[1, 2, 3], [4, 5, 7], [-1, 0, 2], [3, 3, 3]])
    bn = torch.nn.BatchNorm1d(3, eps=0.1, dtype=torch.float64)
    bn.train()
    with torch.no_grad():
        want = bn(x).numpy()
    np.testing.assert_allclose(steps["norm.out"], want, rtol=0, atol=1e-14)
    assert steps["norm.mean"].shape == (1, 3)  # one statistic per column, kept as a row


def test_norm_instance_matches_torch_instance_norm() -> None:
    x = [[[1, 2, 3, 4], [5, 6, 7, 9]], [[0, 0, 1, 1], [2, 2, 2, 3]]]
    steps = steps_of(
        "norm", "--x", "1 2 3 4; 5 6 7 9 | 0 0 1 1; 2 2 2 3", "--kind", "instance",
        "--gamma", "2 0.5", "--beta", "1 -1",
    )  # fmt: skip
    inorm = torch.nn.InstanceNorm1d(2, eps=1e-5, affine=True, dtype=torch.float64)
    with torch.no_grad():
        inorm.weight.copy_(_t([2, 0.5]))
        inorm.bias.copy_(_t([1, -1]))
        want = inorm(_t(x)).numpy()
    np.testing.assert_allclose(steps["norm.out"], want, rtol=0, atol=1e-14)
    assert steps["norm.mean"].shape == (2, 2, 1)


def test_norm_rms_matches_torch_rms_norm() -> None:
    steps = steps_of("norm", "--x", X_TEXT, "--kind", "rms", "--gamma", "1 2 3", "--eps", "1e-6")
    rms = torch.nn.RMSNorm(3, eps=1e-6, dtype=torch.float64)
    with torch.no_grad():
        rms.weight.copy_(_t([1, 2, 3]))
        want = rms(_t(X)).numpy()
    np.testing.assert_allclose(steps["norm.out"], want, rtol=0, atol=1e-14)
    assert "norm.mean" not in steps and steps["norm.rms"].shape == (3, 1)


def test_norm_states_its_axes() -> None:
    for kind, words in (
        ("layer", "over axis 1 (the 3 features of each row), kept as a 3 × 1 column"),
        ("batch", "over axis 0 (the 3 samples of each feature column), kept as a 1 × 3 row"),
    ):
        code, out, _ = invoke("norm", "--x", X_TEXT, "--kind", kind)
        assert code == 0 and " ".join(words.split()) in " ".join(out.replace("│", " ").split())
    code, out, _ = invoke(
        "norm", "--x", "1 2; 3 4 | 5 6; 7 9", "--kind", "instance", "--format", "json"
    )
    assert "over axis 2" in json.loads(out)["conventions"]["axes"]


def test_norm_file_with_kind_override_is_the_004_batch_variant() -> None:
    a = steps_of("norm", str(FIXTURES / "004_layer_batch_norm.yaml"), "--kind", "batch")
    b = steps_of("norm", str(FIXTURES / "004_layer_batch_norm.yaml"), "--variant", "batch")
    np.testing.assert_array_equal(a["norm.out"], b["norm.out"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "norm needs --x"),
        (("--x", "1 2 3", "--kind", "instance"), "separate the B samples"),
        (("--x", "1 2; 3", "--kind", "layer"), "--x: ragged matrix"),
        (("--x", "1 2", "--kind", "group"), "norm.kind: not a valid choice"),
        (("--x", "1 2", "--gamma", "1 2 3"), "norm.gamma: wrong shape (set by --gamma)"),
        (("--x", "1 2", "--eps", "-1"), "norm.eps"),
    ],
)
def test_norm_bad_input_exits_2(args: tuple[str, ...], message: str) -> None:
    code, _, err = invoke("norm", *args)
    assert code == 2 and message in err


def test_norm_file_against_an_option_names_the_option(tmp_yaml: Any) -> None:
    """An option that makes the file's own γ, β or x wrong is named, as `attend --q` over a
    file is (`attention.K: wrong shape (attention.Q set by --q)`): `--x "1 2"` over a file
    with three γ said `norm.gamma: wrong shape; expected shape 2`, naming nothing the user
    typed. Nothing is run (exit 2, nothing on stdout)."""
    flat = tmp_yaml("norm: {x: [[1, 2, 3]], gamma: [1, 2, 3], beta: [0, 0, 0]}\n")
    cube = tmp_yaml("norm: {kind: instance, x: [[[1, 2], [3, 4]]]}\n", "cube.yaml")
    for path, args, message in (
        (flat, ("--x", "1 2"), "norm.gamma: wrong shape (norm.x set by --x); expected shape 2 "
         "(one number per feature of norm.x), found shape 3"),
        (flat, ("--beta", "1 2"), "norm.beta: wrong shape (set by --beta); expected shape 3"),
        (cube, ("--kind", "layer"), "norm.x: wrong shape for layer norm (norm.kind set by "
         "--kind); expected a non-empty matrix, found shape 1 x 2 x 2"),
        (cube, ("--gamma", "1"), "norm.gamma: wrong shape (set by --gamma); expected shape 2 "
         "(one number per channel of norm.x), found shape 1"),
    ):  # fmt: skip
        code, out, err = invoke("norm", path, *args)
        assert code == 2 and out == "" and message in err, err
        assert len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------
# pe
# ---------------------------------------------------------------------------


def test_pe_sinusoidal_by_the_formula() -> None:
    pe = steps_of("pe", "--length", "3", "--d-model", "5", "--base", "100")["pe"]
    for pos in range(3):
        for j in range(5):
            angle = pos / 100 ** (2 * (j // 2) / 5)
            want = math.sin(angle) if j % 2 == 0 else math.cos(angle)
            assert pe[pos, j] == pytest.approx(want, abs=1e-15)


def test_pe_rope_angles_by_the_formula() -> None:
    pe = steps_of("pe", "--length", "4", "--d-model", "6", "--kind", "rope")["pe"]
    assert pe.shape == (4, 3)
    assert pe[3, 1] == pytest.approx(3 * 10000 ** (-2 / 6), abs=1e-15)
    assert pe[2, 0] == 2.0


def test_pe_file_and_overrides() -> None:
    pe = steps_of("pe", str(FIXTURES / "004_positional_encoding.yaml"), "--length", "2")["pe"]
    assert pe.shape == (2, 10) and pe[1, 2] == pytest.approx(math.sin(10000**-0.2), abs=1e-15)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--length", "3"), "pe needs --length and --d-model"),
        (("--length", "3", "--d-model", "4", "--kind", "cosine"), "pe.kind: not a valid choice"),
        (("--length", "3", "--d-model", "4", "--base", "0"), "pe.base: must be positive"),
        # RoPE's angle table has a column per pair: none for one column
        (("--length", "2", "--d-model", "1", "--kind", "rope"), "pe.d_model: RoPE turns pairs"),
        (("--length", "100000", "--d-model", "100000"), "over the limit"),
    ],
)
def test_pe_bad_input_exits_2(args: tuple[str, ...], message: str) -> None:
    code, _, err = invoke("pe", *args)
    assert code == 2 and message in err


ADDITIVE_3x4 = """attention:
  score: additive
  Q: [[1, 0], [0, 1], [1, 1]]
  K: [[1, 0], [0, 1], [1, 1], [2, 2]]
  V: [[1], [2], [3], [4]]
  W_a_q: [[1, 0, 1], [0, 1, 1]]
  W_a_k: [[1, 0, 1], [0, 1, 1]]
  v_a: [1, 2, 3]
  mask: [[0, 0, 0, -.inf], [0, 0, 0, 0], [0, 0, 0, 0]]
"""


def test_attend_size_limit_is_an_upper_bound_of_what_its_steps_hold(tmp_yaml: Any) -> None:
    # By hand: q_a 3x3, k_a 4x3, tanh 3x4x3, scores/scaled/masked/softmax 3x4 each,
    # context 3x1: 9 + 12 + 36 + 48 + 3 = 108 numbers. The estimate left out q_a and k_a
    # (99), so --max-elements 100 let 108 through.
    path = tmp_yaml(ADDITIVE_3x4)
    code, out, err = invoke("attend", path, "--format", "json")
    assert code == 0, err
    assert sum(int(np.prod(s["shape"])) for s in json.loads(out)["steps"]) == 108
    code, _, err = invoke("attend", path, "--max-elements", "107")
    assert code == 2 and "too large" in err, err


CONTEXT_13 = [[(math.e + 2 * math.e**3) / (math.e + math.e**3)]]  # softmax([1, 3]) @ [[1], [2]]


@pytest.mark.parametrize(
    ("args", "path", "want"),
    [
        (
            ["attend", "--set", "attention={Q: [[1]], K: [[1], [3]], V: [[1], [2]], scale: 1}"],
            "attn.context",
            CONTEXT_13,
        ),
        (
            [
                "attend",
                "--q",
                "1",
                "--k",
                "1; 3",
                "--set",
                "attention.V=[[1], [2]]",
                "--scale",
                "1",
            ],
            "attn.context",
            CONTEXT_13,
        ),
        (["norm", "--set", "norm.x=[[1, 3]]", "--set", "norm.eps=0"], "norm.out", [[-1, 1]]),
        (["pe", "--set", "pe.length=2", "--set", "pe.d_model=1"], "pe", [[0], [math.sin(1)]]),
    ],
)
def test_set_can_give_a_calculators_inputs(args: list[str], path: str, want: Any) -> None:
    # SPEC section 4: every running command takes --set; with no FILE it writes into the
    # command line's own section, so it can give what --q/--x/--length would. (Refused as
    # "attend needs --q, --k and --v" before.)
    np.testing.assert_allclose(steps_of(*args)[path], want, rtol=1e-15, atol=0)


def test_set_giving_part_of_a_calculators_inputs_names_the_one_missing() -> None:
    code, _, err = invoke("attend", "--set", "attention.Q=[[1]]", "--k", "1")
    assert code == 2 and "attention.V: missing V" in err


@pytest.mark.parametrize(
    ("args", "runs"),
    [
        (("attend", "004_layer_batch_norm"), "trace-tf norm runs this file"),
        (("norm", "003_sinusoidal_p"), "trace-tf pe runs this file"),
        (("pe", "002_database_query"), "trace-tf attend runs this file"),
        (("attend", "hello"), "trace-tf encode runs this file"),
        (("encode", "002_database_query"), "trace-tf attend runs this file"),
        (("generate", "004_layer_batch_norm", "--greedy"), "trace-tf norm runs this file"),
    ],
)
def test_a_file_given_to_the_wrong_command_names_the_one_that_runs_it(
    args: tuple[str, ...], runs: str
) -> None:
    # With 14 packaged examples, three kinds of single operation and models among them,
    # the refusal said only what the command needs, not which command runs the file.
    code, out, err = invoke(*args)
    assert (code, out) == (2, "")
    assert f"({runs});" in err and "Traceback" not in err
