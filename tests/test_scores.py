"""The attention score functions of 003 and 004 (model.score, attention.score), each
against a second implementation written here in plain Python, and their weights'
validation and drawing."""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import pytest
from conftest import config_from
from random_configs import random_config

from trace_tf import ops
from trace_tf.config import Config
from trace_tf.errors import InputError
from trace_tf.runner import conventions, run

HEAD = "encoder.0.self_attn.h0"


def _cfg(score: str, rng: np.random.Generator, **extra: Any) -> dict[str, Any]:
    """A random encoder with explicit weights and the score's own weights per head."""
    data = random_config(rng, d_model=4, n_heads=2, src_len=3, **extra)
    data["model"]["score"] = score
    for layer in data["weights"]["encoder"]:
        for head in layer["self_attn"]["heads"]:
            if score == "additive":
                data["model"]["d_a"] = 3
                head["W_a_q"] = rng.standard_normal((2, 3)).tolist()
                head["W_a_k"] = rng.standard_normal((2, 3)).tolist()
                head["v_a"] = rng.standard_normal(3).tolist()
            elif score == "bilinear":
                head["W_b"] = rng.standard_normal((2, 2)).tolist()
            elif score == "gaussian":
                head["w"] = rng.uniform(0.5, 2.0, 2).tolist()
    return data


def _rows(a: np.ndarray) -> list[list[float]]:
    return [[float(x) for x in row] for row in a]


def additive_by_loops(
    q: list[list[float]], k: list[list[float]], W_q: Any, W_k: Any, v: Any
) -> list[list[float]]:
    """003's a(k, q) = vᵀ tanh(W_k k + W_q q) in the document's column-vector form:
    W_q here is h x q, the transpose of trace-tf's row-vector W_a_q."""
    out = []
    for qi in q:
        row = []
        for kj in k:
            total = 0.0
            for a in range(len(v)):
                wq = sum(W_q[a][f] * qi[f] for f in range(len(qi)))
                wk = sum(W_k[a][f] * kj[f] for f in range(len(kj)))
                total += v[a] * math.tanh(wq + wk)
            row.append(total)
        out.append(row)
    return out


def test_additive_scores_against_a_second_implementation() -> None:
    data = _cfg("additive", np.random.default_rng(1))
    trace = run(config_from(data))
    for h in range(2):
        head = data["weights"]["encoder"][0]["self_attn"]["heads"][h]
        q = _rows(trace.value(f"encoder.0.self_attn.h{h}.q"))
        k = _rows(trace.value(f"encoder.0.self_attn.h{h}.k"))
        W_q = np.array(head["W_a_q"]).T.tolist()  # row form -> the document's column form
        W_k = np.array(head["W_a_k"]).T.tolist()
        want = additive_by_loops(q, k, W_q, W_k, head["v_a"])
        got = trace.value(f"encoder.0.self_attn.h{h}.scores")
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        # the recorded pieces: q W_a_q, k W_a_k, and tanh of their sums per feature
        qa = [[sum(W_q[a][f] * qi[f] for f in range(2)) for a in range(3)] for qi in q]
        np.testing.assert_allclose(trace.value(f"encoder.0.self_attn.h{h}.q_a"), qa, atol=1e-12)
        tanh = trace.value(f"encoder.0.self_attn.h{h}.tanh")
        assert tanh.shape == (3, 3, 3)
        ka = trace.value(f"encoder.0.self_attn.h{h}.k_a")
        assert tanh[2, 1, 0] == pytest.approx(math.tanh(qa[2][0] + ka[1, 0]), abs=1e-15)
    # scores are not scaled unless the file says so
    np.testing.assert_array_equal(trace.value(f"{HEAD}.scaled"), trace.value(f"{HEAD}.scores"))


def test_additive_single_operation_allows_keys_of_another_width() -> None:
    """The fixture colleague's 003 example, recomputed here from the document's
    column-vector matrices (W_q = [[1,-1],[0,1]], W_k = [[1,0,1],[0,1,-1]], v = [1,2])."""
    q = [[1.0, 0.0]]
    keys = [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    W_q, W_k, v = [[1, -1], [0, 1]], [[1, 0, 1], [0, 1, -1]], [1, 2]
    want = additive_by_loops(q, keys, W_q, W_k, v)
    op = config_from(
        {
            "attention": {
                "score": "additive",
                "Q": q,
                "K": keys,
                "V": [[10], [20], [30]],
                "W_a_q": np.array(W_q).T.tolist(),
                "W_a_k": np.array(W_k).T.tolist(),
                "v_a": v,
            }
        }
    )
    trace = run(op)
    np.testing.assert_allclose(trace.value("attn.scores"), want, atol=1e-15)
    e = [math.exp(s) for s in want[0]]
    out = sum(x * y for x, y in zip(e, [10, 20, 30], strict=True)) / sum(e)
    assert trace.value("attn.context")[0, 0] == pytest.approx(out, abs=1e-12)
    assert out == pytest.approx(21.61240091209382, abs=1e-12)  # the fixture colleague's value


@pytest.mark.parametrize("score", ["bilinear", "additive"])
def test_sqrt_dk_of_a_single_operation_is_the_keys_width(score: str) -> None:
    """d_k is the keys' width (README: W_b is d_q x d_k, W_a_k is d_k x d_a); with queries
    of 3 features and keys of 2, `scale: sqrt_dk` divided by √3, the queries' width,
    and said `sqrt(d_k) ≈ 1.73205`."""
    Q, K = [[0.3, -1.2, 0.5]], [[0.2, 0.9], [1.5, -0.3]]
    weights: dict[str, Any] = (
        {"W_b": [[0.1, 0.2], [-0.3, 0.4], [0.5, -0.6]]}
        if score == "bilinear"
        else {"W_a_q": [[0.1], [-0.3], [0.5]], "W_a_k": [[0.7], [0.9]], "v_a": [2]}
    )
    op = {"score": score, "Q": Q, "K": K, "V": [[1], [3]], "scale": "sqrt_dk", **weights}
    trace = run(config_from({"attention": op}))
    if score == "bilinear":  # (q W_b) · k by hand
        want = [0.64 * 0.2 + -0.72 * 0.9, 0.64 * 1.5 + -0.72 * -0.3]
    else:  # v_a tanh(q W_a_q + k W_a_k), q W_a_q = 0.03 + 0.36 + 0.25 = 0.64
        want = [2 * math.tanh(0.64 + 0.14 + 0.81), 2 * math.tanh(0.64 + 1.05 - 0.27)]
    np.testing.assert_allclose(trace.value("attn.scores")[0], want, rtol=1e-14)
    np.testing.assert_allclose(
        trace.value("attn.scaled")[0], [w / math.sqrt(2) for w in want], rtol=1e-14
    )
    assert trace["attn.scaled"].formula == "S / sqrt(d_k),  sqrt(d_k) ≈ 1.41421"


def test_bilinear_scores_by_hand() -> None:
    data = _cfg("bilinear", np.random.default_rng(2))
    trace = run(config_from(data))
    W_b = data["weights"]["encoder"][0]["self_attn"]["heads"][0]["W_b"]
    q, k = _rows(trace.value(f"{HEAD}.q")), _rows(trace.value(f"{HEAD}.k"))
    want = [
        [sum(qi[a] * W_b[a][b] * kj[b] for a in range(2) for b in range(2)) for kj in k] for qi in q
    ]
    np.testing.assert_allclose(trace.value(f"{HEAD}.scores"), want, atol=1e-12)
    np.testing.assert_allclose(trace.value(f"{HEAD}.q_b"), np.array(q) @ np.array(W_b), atol=1e-12)


def test_gaussian_scores_by_hand_and_nadaraya_watson() -> None:
    data = _cfg("gaussian", np.random.default_rng(3))
    trace = run(config_from(data))
    w = data["weights"]["encoder"][0]["self_attn"]["heads"][0]["w"]
    q, k = _rows(trace.value(f"{HEAD}.q")), _rows(trace.value(f"{HEAD}.k"))
    want = [[-0.5 * sum(((qi[f] - kj[f]) * w[f]) ** 2 for f in range(2)) for kj in k] for qi in q]
    np.testing.assert_allclose(trace.value(f"{HEAD}.scores"), want, atol=1e-12)
    # 003: the weights are the normalised Gaussian kernel K(u) = exp(-u²/2) / sqrt(2 pi)
    for i, qi in enumerate(q):
        kern = [
            math.exp(-0.5 * sum(((qi[f] - kj[f]) * w[f]) ** 2 for f in range(2)))
            / math.sqrt(2 * math.pi)
            for kj in k
        ]
        np.testing.assert_allclose(
            trace.value(f"{HEAD}.softmax")[i], [x / sum(kern) for x in kern], atol=1e-12
        )


def test_gaussian_calculator_reproduces_003_kernel_regression() -> None:
    xs, ys = [0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 4.0, 9.0]
    for x, w in ((1.5, 1.0), (1.5, 2.0), (1.2, 1.0), (1.2, 2.0)):
        op = config_from(
            {
                "attention": {
                    "score": "gaussian",
                    "Q": [[x]],
                    "K": [[v] for v in xs],
                    "V": [[v] for v in ys],
                    "w": w,
                }
            }
        )
        kern = [math.exp(-0.5 * ((x - xi) * w) ** 2) for xi in xs]
        f = sum(kv * y for kv, y in zip(kern, ys, strict=True)) / sum(kern)
        assert run(op).value("attn.context")[0, 0] == pytest.approx(f, abs=1e-12)


def test_dot_is_not_scaled_and_scaled_dot_is() -> None:
    rng = np.random.default_rng(4)
    dot = run(config_from(_cfg("dot", rng)))
    rng = np.random.default_rng(4)
    scaled = run(config_from(_cfg("scaled_dot", rng)))
    s = dot.value(f"{HEAD}.scores")
    np.testing.assert_array_equal(s, scaled.value(f"{HEAD}.scores"))
    np.testing.assert_array_equal(dot.value(f"{HEAD}.scaled"), s)
    np.testing.assert_allclose(scaled.value(f"{HEAD}.scaled"), s / math.sqrt(2), atol=1e-15)
    assert "not scaled" in dot[f"{HEAD}.scaled"].formula


def test_an_explicit_scale_applies_to_any_score() -> None:
    data = _cfg("gaussian", np.random.default_rng(5))
    data["model"]["scale"] = 4
    trace = run(config_from(data))
    np.testing.assert_allclose(
        trace.value(f"{HEAD}.scaled"), trace.value(f"{HEAD}.scores") / 4, atol=1e-15
    )


def test_score_applies_to_cross_attention_too() -> None:
    data = random_config(np.random.default_rng(6), d_model=4, n_heads=1, decoder_layers=1)
    data["model"]["score"] = "bilinear"
    cfg = config_from(data)
    trace = run(cfg)
    assert isinstance(cfg, Config)
    W_b = cfg.decoder[0].cross_attn.heads[0].score.W_b  # type: ignore[union-attr]
    q = trace.value("decoder.0.cross_attn.h0.q")
    k = trace.value("decoder.0.cross_attn.h0.k")
    np.testing.assert_allclose(trace.value("decoder.0.cross_attn.h0.scores"), q @ W_b @ k.T)


def test_missing_score_weights_are_drawn_by_key_path() -> None:
    data = {"model": {"d_model": 4, "n_heads": 2, "score": "additive", "d_a": 5, "seed": 7}}
    data["source"] = [[1, 2, 3, 4]]
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    sw = cfg.encoder[0].self_attn.heads[1].score
    for key, shape in (("W_a_q", (2, 5)), ("W_a_k", (2, 5)), ("v_a", (5,))):
        path = f"encoder.0.self_attn.heads.1.{key}"
        want = np.random.default_rng([7, zlib.crc32(path.encode())]).standard_normal(shape)
        np.testing.assert_array_equal(getattr(sw, key), want)
        assert path in cfg.drawn
    # giving one weight does not change another drawn one
    data["weights"] = {"encoder": [{"self_attn": {"heads": [{}, {"v_a": [1, 2, 3, 4, 5]}]}}]}
    cfg2 = config_from(data)
    assert isinstance(cfg2, Config)
    np.testing.assert_array_equal(cfg2.encoder[0].self_attn.heads[1].score.W_a_q, sw.W_a_q)
    # the gaussian width is drawn as one number
    g = config_from({"model": {"d_model": 2, "score": "gaussian"}, "source": [[1, 2]]})
    assert isinstance(g, Config) and g.encoder[0].self_attn.heads[0].score.w.shape == ()  # type: ignore[union-attr]


def test_fused_projections_with_per_head_score_weights() -> None:
    data = random_config(np.random.default_rng(8), d_model=4, n_heads=2, fused=True)
    data["model"]["score"] = "bilinear"
    data["weights"]["encoder"][0]["self_attn"]["heads"] = [{"W_b": [[1, 0], [0, 2]]}]
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    np.testing.assert_array_equal(cfg.encoder[0].self_attn.heads[0].score.W_b, [[1, 0], [0, 2]])
    data["weights"]["encoder"][0]["self_attn"]["heads"] = [{"W_q": [[0, 0]] * 4}]
    with pytest.raises(InputError, match="one form per block"):
        config_from(data)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            {
                "model": {"d_model": 2, "score": "additive"},
                "source": [[1, 2]],
                "weights": {"encoder": [{"self_attn": {"heads": [{"W_b": [[1, 0], [0, 1]]}]}}]},
            },
            "W_b is a weight of score bilinear, but the score is additive",
        ),
        (
            {
                "model": {"d_model": 2, "score": "bilinear"},
                "source": [[1, 2]],
                "weights": {"encoder": [{"self_attn": {"heads": [{"W_b": [[1, 0]]}]}}]},
            },
            "wrong shape",
        ),
        (
            {"model": {"d_model": 2, "score": "addtive"}, "source": [[1, 2]]},
            "did you mean 'additive'",
        ),
        (
            {"attention": {"score": "additive", "Q": [[1]], "K": [[1]], "V": [[1]]}},
            "missing W_a_q",
        ),
        (
            {"attention": {"Q": [[1, 0]], "K": [[1, 0, 1]], "V": [[1]]}},
            "columns as Q",
        ),
        (
            {
                "attention": {
                    "score": "gaussian",
                    "Q": [[1, 0]],
                    "K": [[1, 0]],
                    "V": [[1]],
                    "w": [1, 2, 3],
                }
            },
            "attention.w",
        ),
    ],
)
def test_bad_score_configs_name_the_key(data: dict[str, Any], match: str) -> None:
    with pytest.raises(InputError, match=match):
        config_from(data)


def test_conventions_name_the_score_function() -> None:
    cfg = config_from(_cfg("additive", np.random.default_rng(9)))
    attention = dict(conventions(cfg))["attention"]
    assert "additive" in attention and "d_a 3" in attention and "scores / 1" in attention


def test_ops_score_functions_by_hand() -> None:
    q, k = np.array([[1.0, 2.0]]), np.array([[3.0, -1.0], [0.0, 0.0]])
    np.testing.assert_array_equal(ops.dot_scores(q, k), [[1.0, 0.0]])
    # −½ ((1−3)²·w0² + (2+1)²·w1²) with w = [1, 2]: −½ (4 + 36) = −20
    assert ops.gaussian_scores(q, k, np.array([1.0, 2.0]))[0, 0] == -20.0
    feats = ops.additive_features(np.array([[0.5]]), np.array([[0.25], [-0.5]]))
    np.testing.assert_allclose(feats[0, :, 0], [math.tanh(0.75), 0.0], atol=1e-16)


@pytest.mark.parametrize("score", ["dot", "additive", "bilinear", "gaussian"])
def test_every_score_function_decodes_the_same_with_and_without_the_kv_cache(score: str) -> None:
    from trace_tf import generate

    data = random_config(np.random.default_rng(14), d_model=4, n_heads=2, decoder_layers=2)
    data["model"]["score"] = score
    data["model"]["positional"] = "rope"
    data.pop("target")
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    cached = generate.run(cfg, generate.Settings(max_tokens=5, cache=True))
    fresh = generate.run(cfg, generate.Settings(max_tokens=5, cache=False))
    assert cached.generated == fresh.generated
    for a, b in zip(cached.iterations, fresh.iterations, strict=True):
        np.testing.assert_allclose(a.model_probs, b.model_probs, rtol=0, atol=1e-12)


def test_gaussian_scores_take_no_memory_of_queries_by_keys_by_features() -> None:
    # The same numbers, bit for bit, as all pairs at once, without the [L_q, L_k, d]
    # arrays (twice 46 MB here), which for long inputs outgrew the rest of the run.
    import tracemalloc

    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((300, 64)) * 5, rng.standard_normal((300, 64)) * 5
    for w in (1.0, 0.3, rng.standard_normal(64)):
        diff = (q[:, None, :] - k[None, :, :]) * w
        expected = -0.5 * np.sum(diff * diff, axis=-1)
        tracemalloc.start()
        got = ops.gaussian_scores(q, k, w)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert np.array_equal(got, expected)
        assert peak < 4 * got.nbytes, peak  # (the pairs at once: 64 times its size)
    q32, k32 = q.astype(np.float32), k.astype(np.float32)
    assert ops.gaussian_scores(q32, k32, 0.5).dtype == np.float32


W = "weights.encoder.0.self_attn.heads.0.w"
GAUSSIAN = "model: {d_model: 2, score: gaussian}\nsource: [[1, 2]]\n"


@pytest.mark.parametrize(
    ("text", "sets", "said"),
    [
        (  # given as one number in the file
            GAUSSIAN + "weights: {encoder: [{self_attn: {heads: [{w: 2}]}}]}\n",
            [f"{W}.0=3"],
            f"{W} is a single number, with no entries (line 3 of",
        ),
        (GAUSSIAN, [f"{W}.0=3"], "w is a single number here, with no entries to set (not given: "),
        (  # a single operation's, 1 when not given
            "attention: {score: gaussian, Q: [[1, 2]], K: [[1, 0]], V: [[1, 0]]}\n",
            ["attention.w.1=3"],
            "w is a single number here, with no entries to set (not given: it is 1)",
        ),
    ],
    ids=["file", "drawn", "operation"],
)
def test_an_entry_of_a_gaussian_w_that_is_one_number_says_so(
    tmp_yaml: Any, text: str, sets: list[str], said: str
) -> None:
    """`--set ...w.0=3` where w is one number: the message said `expected the whole
    weight first, ... of shape 2` (or `a mapping or list`), not that w is one number."""
    from trace_tf.config import load

    with pytest.raises(InputError) as info:
        load(tmp_yaml(text), sets)
    message = str(info.value)
    assert said in message and "expected a single number" in message, message
    assert "of shape" not in message and "a mapping or list" not in message, message


def test_entries_of_a_gaussian_w_given_per_feature_are_set(tmp_yaml: Any) -> None:
    from trace_tf.config import load

    text = GAUSSIAN + "weights: {encoder: [{self_attn: {heads: [{w: [2, 5]}]}}]}\n"
    cfg = load(tmp_yaml(text), [f"{W}.1=3"])
    assert isinstance(cfg, Config)
    assert list(cfg.encoder[0].self_attn.heads[0].score.w) == [2, 3]  # type: ignore[union-attr]
