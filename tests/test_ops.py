"""Each op against numbers computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_tf import ops


def test_softmax_by_hand() -> None:
    e = math.e
    got = ops.softmax(np.array([[1.0, 1.0, 0.0, 1.0]]))
    want = np.array([[e, e, 1, e]]) / (3 * e + 1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_softmax_is_stable_for_huge_scores() -> None:
    got = ops.softmax(np.array([[1000.0, 1000.0]]))
    np.testing.assert_array_equal(got, [[0.5, 0.5]])


def test_softmax_temperature_divides_the_scores() -> None:
    got = ops.softmax(np.array([[2.0, 0.0]]), temperature=2.0)
    want = math.e / (math.e + 1)  # softmax([1, 0])
    assert got[0, 0] == pytest.approx(want, abs=1e-15)


@pytest.mark.parametrize("T", [1e-320, 1e-300, 1e-30])
def test_softmax_tends_to_the_argmax_as_the_temperature_vanishes(T: float) -> None:
    # x / T alone overflows (2 / 1e-320 = inf, and inf - inf = NaN); the limit is
    # the argmax, shared equally by ties, and a masked key stays at 0.
    x = np.array([[1.0, 2.0, 0.5], [3.0, -np.inf, 3.0]])
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no warning either
        got = ops.softmax(x, temperature=T)
    np.testing.assert_array_equal(got, [[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])


def test_fully_masked_row_is_nan() -> None:
    got = ops.softmax(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]))
    assert np.isnan(got[0]).all()
    np.testing.assert_array_equal(got[1], [1.0, 0.0])


def test_layer_norm_by_hand() -> None:
    # x = [1, 2, 3, 4]: mean 2.5, biased var 1.25
    got = ops.layer_norm(np.array([[1.0, 2, 3, 4]]), np.ones(4), np.zeros(4), 0.0)
    want = (np.array([1, 2, 3, 4]) - 2.5) / math.sqrt(1.25)
    np.testing.assert_allclose(got[0], want, atol=1e-15)


def test_layer_norm_eps_inside_the_root_and_gamma_beta() -> None:
    got = ops.layer_norm(np.array([[0.0, 2.0]]), np.array([2.0, 3.0]), np.array([1.0, -1.0]), 1.0)
    # mean 1, var 1: (x - 1) / sqrt(2)
    s = 1 / math.sqrt(2)
    np.testing.assert_allclose(got[0], [-s * 2 + 1, s * 3 - 1], atol=1e-15)


def test_rms_norm_by_hand() -> None:
    # x = [1, 2]: mean(x^2) = 2.5
    got = ops.rms_norm(np.array([[1.0, 2.0]]), np.ones(2), np.array([0.5, 0.0]), 0.0)
    r = math.sqrt(2.5)
    np.testing.assert_allclose(got[0], [1 / r + 0.5, 2 / r], atol=1e-15)


def test_activations_by_hand() -> None:
    x = np.array([-1.0, 0.0, 2.0])
    np.testing.assert_array_equal(ops.relu(x), [0.0, 0.0, 2.0])
    want_gelu = [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x]
    np.testing.assert_allclose(ops.gelu(x), want_gelu, atol=1e-15)
    c = math.sqrt(2 / math.pi)
    want_tanh = [0.5 * v * (1 + math.tanh(c * (v + 0.044715 * v**3))) for v in x]
    np.testing.assert_allclose(ops.gelu_tanh(x), want_tanh, atol=1e-15)
    assert ops.gelu(np.array([1.0]))[0] == pytest.approx(0.8413447460685429, abs=1e-15)


def test_sinusoidal_pe_by_hand() -> None:
    pe = ops.sinusoidal_pe(2, 4)
    np.testing.assert_allclose(pe[0], [0, 1, 0, 1], atol=0)
    np.testing.assert_allclose(
        pe[1], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)], atol=1e-15
    )


def test_sinusoidal_pe_odd_d_ends_with_a_sine() -> None:
    pe = ops.sinusoidal_pe(3, 5, base=100.0)
    want = [
        math.sin(2),
        math.cos(2),
        math.sin(2 / 100 ** (2 / 5)),
        math.cos(2 / 100 ** (2 / 5)),
        math.sin(2 / 100 ** (4 / 5)),
    ]
    np.testing.assert_allclose(pe[2], want, atol=1e-15)


def test_causal_mask_by_hand() -> None:
    inf = -np.inf
    np.testing.assert_array_equal(ops.causal_mask(3), [[0, inf, inf], [0, 0, inf], [0, 0, 0]])
    np.testing.assert_array_equal(ops.causal_mask(1), [[0.0]])


def test_key_padding_mask_masks_columns_only() -> None:
    got = ops.key_padding_mask(2, np.array([False, True, False]))
    np.testing.assert_array_equal(got, [[0, -np.inf, 0], [0, -np.inf, 0]])


def test_rope_rotates_pairs_by_position() -> None:
    x = np.array([[1.0, 0.0, 1.0, 0.0]] * 2)
    got = ops.rope(x, np.array([0, 1]), base=10000.0)
    np.testing.assert_allclose(got[0], x[0], atol=0)
    # position 1: pair 0 by 1 rad, pair 1 by 10000^(-2/4) = 0.01 rad
    np.testing.assert_allclose(
        got[1], [math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)], atol=1e-15
    )


def test_rope_halves_turns_column_i_with_column_i_plus_half_by_hand() -> None:
    """halves (GPT-NeoX, LLaMA, HF rotate_half): out_i = x_i cos θ_i − x_{i+h} sin θ_i,
    out_{i+h} = x_{i+h} cos θ_i + x_i sin θ_i, θ_i = pos · base^(−2i/d), h = d/2."""
    x = np.array([[1.0, 2.0, 3.0, 4.0]] * 2)
    got = ops.rope(x, np.array([0, 1]), 10000.0, "halves")
    np.testing.assert_array_equal(got[0], x[0])
    c0, s0, c1, s1 = math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)
    want = [1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1]
    np.testing.assert_allclose(got[1], want, rtol=1e-15, atol=1e-15)
    # odd d 5: pairs (0, 2), (1, 3) (h = 2); column 4 left as it is
    x5 = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]])
    got5 = ops.rope(x5, np.array([1]), 100.0, "halves")
    t1 = 100 ** (-2 / 5)
    want5 = [math.cos(1) - 3 * math.sin(1), 2 * math.cos(t1) - 4 * math.sin(t1),
             3 * math.cos(1) + math.sin(1), 4 * math.cos(t1) + 2 * math.sin(t1), 5.0]  # fmt: skip
    np.testing.assert_allclose(got5[0], want5, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("pairs", ["adjacent", "halves"])
def test_rope_is_complex_multiplication_of_each_pair_by_e_to_the_i_theta(pairs: str) -> None:
    """Pair i = (a, b) as the complex number a + i·b, times e^(iθ_i) (RoFormer 3.4.2): the
    columns (2i, 2i+1) for adjacent, (i, i + d/2) for halves; so halves is adjacent with
    the columns permuted, i ↔ 2i and i + d/2 ↔ 2i + 1."""
    rng = np.random.default_rng(5)
    x, pos, d = rng.standard_normal((4, 8)), np.array([0, 3, 7, 100]), 8
    theta = pos[:, None] * 50.0 ** (-np.arange(0, d, 2) / d)  # [4, 4]
    a, b = (x[:, 0::2], x[:, 1::2]) if pairs == "adjacent" else (x[:, :4], x[:, 4:])
    z = (a + 1j * b) * np.exp(1j * theta)
    got = ops.rope(x, pos, 50.0, pairs)
    got_a, got_b = (got[:, 0::2], got[:, 1::2]) if pairs == "adjacent" else (got[:, :4], got[:, 4:])
    np.testing.assert_allclose(got_a, z.real, atol=1e-14)
    np.testing.assert_allclose(got_b, z.imag, atol=1e-14)
    interleave = np.ravel(np.stack([np.arange(4), np.arange(4, 8)], axis=1))  # 0, 4, 1, 5, ...
    halves, adjacent = ops.rope(x, pos, 50.0, "halves"), ops.rope(x[:, interleave], pos, 50.0)
    np.testing.assert_array_equal(halves[:, interleave], adjacent)


@pytest.mark.parametrize("pairs", ["adjacent", "halves"])
def test_rope_relative_position_identity(pairs: str) -> None:
    """<R_m q, R_n k> depends only on n - m (000, RoPE section), for either pairing."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 6)), rng.standard_normal((1, 6))

    def score(m: int, n: int) -> float:
        rq, rk = ops.rope(q, np.array([m]), pairs=pairs), ops.rope(k, np.array([n]), pairs=pairs)
        return float(rq[0] @ rk[0])

    assert score(2, 5) == pytest.approx(score(10, 13), abs=1e-12)
    assert score(0, 3) == pytest.approx(score(7, 10), abs=1e-12)
    assert abs(score(0, 3) - score(0, 4)) > 1e-6


def test_moments_over_columns() -> None:
    mean, var = ops.moments(np.array([[1.0, 2.0], [3.0, 6.0]]), 0)
    np.testing.assert_array_equal(mean, [[2.0, 4.0]])
    np.testing.assert_array_equal(var, [[1.0, 4.0]])


def test_erf_matches_math_erf_to_one_ulp_on_every_range() -> None:
    # fdlibm's five ranges of |x| and their edges, both signs, and the special values
    edges = [2.0**-28, 0.84375, 1.25, 2.8571434020996094, 6.0]
    x = np.concatenate(
        [
            np.linspace(-7.0, 7.0, 20001),
            np.linspace(-1e-8, 1e-8, 101),
            [np.nextafter(e, d) for e in edges for d in (0.0, 10.0)],
            [-e for e in edges],
            [0.0, -0.0, 1e-310, 30.0, -30.0],
        ]
    )
    want = np.array([math.erf(v) for v in x])
    got = ops.erf(x)
    ulp = np.spacing(np.abs(want))
    assert np.all(np.abs(got - want) <= ulp), np.max(np.abs(got - want) / ulp)
    special = ops.erf(np.array([np.nan, np.inf, -np.inf]))
    assert np.isnan(special[0]) and special[1] == 1.0 and special[2] == -1.0


def test_erf_and_gelu_keep_shape_and_dtype() -> None:
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    assert ops.erf(x).shape == (3, 4) and ops.erf(x).dtype == np.float32
    assert ops.gelu(x).dtype == np.float32
    want = [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.ravel().tolist()]
    np.testing.assert_allclose(ops.gelu(x).ravel(), want, rtol=1e-4, atol=1e-6)  # float32


# Norms at float64's edges: the true values by decimal arithmetic at 60 digits, where
# squares of 1e200 (1e400) and of 1e-300 (1e-600) are still numbers.
def _exact_layer_norm(row: list[float], eps: float) -> list[float]:
    from decimal import Decimal, localcontext

    with localcontext() as c:
        c.prec, c.Emax, c.Emin = 60, 10**6, -(10**6)
        xs = [Decimal(v) for v in row]
        mean = sum(xs) / len(xs)
        var = sum((v - mean) ** 2 for v in xs) / len(xs)
        return [float((v - mean) / (var + Decimal(eps)).sqrt()) for v in xs]


def _exact_rms(row: list[float], eps: float) -> float:
    from decimal import Decimal, localcontext

    with localcontext() as c:
        c.prec, c.Emax, c.Emin = 60, 10**6, -(10**6)
        xs = [Decimal(v) for v in row]
        return float((sum(v * v for v in xs) / len(xs) + Decimal(eps)).sqrt())


EDGE_ROWS = [
    ([1e200, -1e200, 3e200], 1e-5),  # var 6.7e400 overflows; the output is finite
    ([1.7e308, 1.7e308, -1.7e308], 1e-5),  # the sum overflows too, and x − mean
    ([1e-300, -1e-300, 3e-300], 0.0),  # var 2.7e-600 underflows to 0: 0/0 with eps 0
    ([1e-160, 3e-160, -2e-160], 0.0),  # var 4.7e-320 is subnormal: a few bits
    ([1e200, -1e200, 3e200], 1e300),  # eps counts
]


@pytest.mark.parametrize(("row", "eps"), EDGE_ROWS)
def test_layer_norm_is_right_where_the_variance_leaves_float64(
    row: list[float], eps: float
) -> None:
    x = np.array([row, [1.0, 2.0, 4.0]])
    got = ops.layer_norm(x, np.ones(3), np.zeros(3), eps)
    np.testing.assert_allclose(got[0], _exact_layer_norm(row, eps), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(got[1], _exact_layer_norm([1.0, 2.0, 4.0], eps), rtol=1e-14)
    mean, _ = ops.row_mean_var(x)
    assert mean[0, 0] == pytest.approx(sum(row) / 3 if math.isfinite(sum(row)) else 1.7e308 / 3)


def test_layer_norm_of_a_constant_row_with_eps_0_is_still_0_over_0() -> None:
    with np.errstate(invalid="ignore"):
        got = ops.layer_norm(np.array([[1e-300, 1e-300]]), np.ones(2), np.zeros(2), 0.0)
    assert np.isnan(got).all()


@pytest.mark.parametrize(("row", "eps"), EDGE_ROWS)
def test_rms_is_right_where_the_mean_square_leaves_float64(row: list[float], eps: float) -> None:
    got = ops.rms(np.array([row]), eps)
    assert got[0, 0] == pytest.approx(_exact_rms(row, eps), rel=1e-14)


def test_batch_norm_moments_over_columns_of_huge_values() -> None:
    x = np.array([[1e200, 1.0], [-1e200, 2.0], [3e200, 4.0]])
    mean, var = ops.moments(x, 0)
    out = ops.standardize(x, mean, var, np.ones(2), np.zeros(2), 1e-5)
    np.testing.assert_allclose(
        out[:, 0], _exact_layer_norm([1e200, -1e200, 3e200], 1e-5), atol=1e-15
    )
    assert np.isinf(var[0, 0]) and mean[0, 0] == pytest.approx(1e200)


@pytest.mark.parametrize(
    ("T", "want"),
    [
        # (x − m)/T = [0, −2e308/1e308] = [0, −2], though −2e308 itself overflows
        (1e308, [1 / (1 + math.exp(-2)), math.exp(-2) / (1 + math.exp(-2))]),
        (4e307, [1 / (1 + math.exp(-5)), math.exp(-5) / (1 + math.exp(-5))]),
        (1e300, [1.0, 0.0]),  # e^(−2e8) is 0
        (1e-300, [1.0, 0.0]),
    ],
)
def test_softmax_with_a_temperature_where_the_row_spans_more_than_float64(
    T: float, want: list[float]
) -> None:
    got = ops.softmax(np.array([[1e308, -1e308]]), T)
    np.testing.assert_allclose(got[0], want, rtol=1e-15, atol=0)


def test_norms_computed_scaled_keep_float32() -> None:
    # float32 squares of 1e30 overflow (3.4e38 at most); the scaled path must stay float32
    x = np.array([[1e30, -1e30, 3e30], [1.0, 2.0, 4.0]], dtype=np.float32)
    r = ops.rms(x, 1e-5)
    mean, var = ops.moments(x, -1)
    out = ops.standardize(x, mean, var, np.ones(3, np.float32), np.zeros(3, np.float32), 1e-5)
    assert r.dtype == mean.dtype == var.dtype == out.dtype == np.float32
    assert r[0, 0] == pytest.approx(_exact_rms([1e30, -1e30, 3e30], 1e-5), rel=1e-6)
    np.testing.assert_allclose(out[0], _exact_layer_norm([1e30, -1e30, 3e30], 1e-5), atol=1e-6)
