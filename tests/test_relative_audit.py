"""An independent check of `model.positional: relative` (000 section 6.2): every
self-attention head's B, biased scores, softmax and context recomputed in plain numpy
from the head's input and the weights written in the config, for every score function,
masks, temperature, pre-norm, float32, several heads and layers."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest
from random_configs import random_config
from test_generate import model_of

from trace_tf.runner import run


def my_B(table: list[float], positions_q: list[int], n_k: int) -> np.ndarray:
    """B[i,j] = b(j − i), b(o) the table entry max_len − 1 + o, written as a loop."""
    max_len = (len(table) + 1) // 2
    return np.array([[table[max_len - 1 + j - i] for j in range(n_k)] for i in positions_q])


def my_scores(score: str, q: np.ndarray, k: np.ndarray, head: dict[str, Any]) -> np.ndarray:
    if score in ("dot", "scaled_dot"):
        return q @ k.T
    if score == "bilinear":
        return q @ np.array(head["W_b"]) @ k.T
    if score == "additive":
        qa, ka = q @ np.array(head["W_a_q"]), k @ np.array(head["W_a_k"])
        return np.array([[np.dot(head["v_a"], np.tanh(a + b)) for b in ka] for a in qa])
    w = np.array(head["w"])
    return np.array([[-0.5 * np.sum(((a - b) * w) ** 2) for b in k] for a in q])


def score_weights(rng: np.random.Generator, score: str, d_k: int) -> dict[str, Any]:
    if score == "bilinear":
        return {"W_b": rng.standard_normal((d_k, d_k)).tolist()}
    if score == "additive":
        return {"W_a_q": rng.standard_normal((d_k, 3)).tolist(),
                "W_a_k": rng.standard_normal((d_k, 3)).tolist(),
                "v_a": rng.standard_normal(3).tolist()}  # fmt: skip
    if score == "gaussian":
        return {"w": rng.uniform(0.5, 1.5, d_k).tolist()}
    return {}


def check_every_self_attention(raw: dict[str, Any], dtype: str = "float64") -> None:
    from conftest import config_from

    cfg = config_from(raw, dtype=dtype) if dtype != "float64" else model_of(raw)
    trace = run(cfg, "full")  # type: ignore[arg-type]
    m = raw["model"]
    score = m.get("score", "scaled_dot")
    T = m.get("temperature", 1.0)
    pad = raw.get("tokens", {}).get("pad")
    tol = 1e-12 if dtype == "float64" else 2e-5
    checked = 0
    for stack, tokens in (("encoder", raw.get("source")), ("decoder", raw.get("target"))):
        for l, block in enumerate(raw["weights"].get(stack, [])):
            for h, head in enumerate(block["self_attn"]["heads"]):
                p = f"{stack}.{l}.self_attn.h{h}"
                x = np.asarray(trace[f"{p}.q"].inputs and trace.value(trace[f"{p}.q"].inputs[0]),
                               dtype=np.float64)  # fmt: skip
                q = x @ np.array(head["W_q"]) + np.array(head.get("b_q", 0.0))
                k = x @ np.array(head["W_k"]) + np.array(head.get("b_k", 0.0))
                v = x @ np.array(head["W_v"]) + np.array(head.get("b_v", 0.0))
                L, d_k = len(x), q.shape[1]
                scale = float(m.get("scale", np.sqrt(d_k) if score == "scaled_dot" else 1.0))
                B = my_B(head["rel_bias"], list(range(L)), L)
                biased = my_scores(score, q, k, head) / scale + B
                allowed = np.ones((L, L), dtype=bool)
                if stack == "decoder":
                    allowed &= np.tri(L, dtype=bool)
                if pad is not None:
                    allowed &= np.array([t != pad for t in tokens])[None, :]
                z = np.where(allowed, biased / T, -np.inf)
                e = np.exp(z - z.max(axis=1, keepdims=True))
                A = e / e.sum(axis=1, keepdims=True)
                assert np.array_equal(trace.value(f"{p}.rel_bias"), B.astype(dtype)), p
                np.testing.assert_allclose(trace.value(f"{p}.biased"), biased, rtol=tol, atol=tol)
                np.testing.assert_allclose(trace.value(f"{p}.softmax"), A, rtol=tol, atol=tol)
                np.testing.assert_allclose(trace.value(f"{p}.context"), A @ v, rtol=tol, atol=tol)
                checked += 1
    assert checked == 2 * (m.get("encoder_layers", 1) + m.get("decoder_layers", 0))


SHAPES = [
    {"score": s, **extra}
    for s in ("scaled_dot", "dot", "additive", "bilinear", "gaussian")
    for extra in ({}, {"temperature": 0.7, "norm_position": "pre", "pad": True})
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s.values())))
def test_every_head_of_every_layer_against_plain_numpy(shape: dict[str, Any]) -> None:
    shape = dict(shape)
    score, T = shape.pop("score"), shape.pop("temperature", None)
    rng = np.random.default_rng(hash(score) % 1000)
    raw = random_config(rng, d_model=4, n_heads=2, encoder_layers=2, decoder_layers=2,
                        positional="relative", src_len=4, tgt_len=3, max_len=4, **shape)  # fmt: skip
    raw["model"]["score"] = score
    if score == "additive":
        raw["model"]["d_a"] = 3
    if T is not None:
        raw["model"]["temperature"] = T
    for stack in ("encoder", "decoder"):
        for block in raw["weights"][stack]:
            for head in block["self_attn"]["heads"]:
                head.update(score_weights(rng, score, 2))
            if "cross_attn" in block:
                for head in block["cross_attn"]["heads"]:
                    head.update(score_weights(rng, score, 2))
    tables = [h["rel_bias"] for s in ("encoder", "decoder") for b in raw["weights"][s]
              for h in b["self_attn"]["heads"]]  # fmt: skip
    assert len({tuple(t) for t in tables}) == len(tables) == 8  # every table its own
    assert all(len(t) == 7 for t in tables)  # max_len 4 = the source length exactly
    check_every_self_attention(raw)
    if score == "scaled_dot":
        check_every_self_attention(copy.deepcopy(raw), dtype="float32")


# ---------------------------------------------------------------------------
# generate: the KV cache's rows of B, at the max_len bound, for every strategy
# ---------------------------------------------------------------------------

GEN_SHAPES = [
    dict(d_model=4, n_heads=2, encoder_layers=0, decoder_layers=2, tgt_len=2),
    dict(d_model=4, n_heads=2, encoder_layers=1, decoder_layers=2, tgt_len=1, src_len=4),
]
STRATEGIES = [dict(greedy=True), dict(sample=True, seed=4), dict(beam=2)]


@pytest.mark.parametrize("shape", GEN_SHAPES, ids=["decoder-only", "encoder-decoder"])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=["greedy", "sample", "beam"])
def test_cached_generation_up_to_max_len_against_plain_numpy(
    shape: dict[str, Any], strategy: dict[str, Any]
) -> None:
    from test_generate import generation_config

    from trace_tf import generate as gen
    from trace_tf.explain import explain
    from trace_tf.trace import Tracer

    max_len = 4
    raw = generation_config(11, max_len=max_len, positional="relative", **shape)
    raw["tokens"].pop("eos", None)  # run to the bound
    cfg = model_of(raw)
    prefix = len(raw["target"])
    bound = max_len - prefix + 1  # the last token produced is never fed back
    runs = {}
    for cache in (True, False):
        tr = Tracer()
        tr.name_all(cfg.named_arrays())
        runs[cache] = (gen.run(cfg, gen.settings(max_tokens=bound, cache=cache, **strategy), tr),
                       tr.trace)  # fmt: skip
    (cached, trace), (uncached, _) = runs[True], runs[False]
    assert len(cached.iterations) == bound == len(uncached.iterations)
    assert [it.next for it in cached.iterations] == [it.next for it in uncached.iterations]
    for a, b in zip(cached.iterations, uncached.iterations, strict=True):
        np.testing.assert_allclose(a.model_probs, b.model_probs, rtol=0, atol=1e-12)
    checked = 0
    for path in trace.steps:
        if not path.endswith(".rel_bias"):
            continue
        head = path.removesuffix(".rel_bias")
        stack, layer, h = head.split(".")[-4], int(head.split(".")[-3]), int(head[-1])
        table = raw["weights"][stack][layer]["self_attn"]["heads"][h]["rel_bias"]
        q, k = trace.value(f"{head}.q"), trace.value(f"{head}.k")
        n_q, n_k = len(q), len(k)
        positions = list(range(n_k - n_q, n_k))  # the new rows sit after the cached ones
        B = my_B(table, positions, n_k)
        assert np.array_equal(trace.value(path), B), path
        z = q @ k.T / np.sqrt(q.shape[1]) + B
        if stack == "decoder":  # causal; the source has no pads here
            z = np.where(np.array(positions)[:, None] >= np.arange(n_k)[None, :], z, -np.inf)
        e = np.exp(z - z.max(axis=1, keepdims=True))
        np.testing.assert_allclose(trace.value(f"{head}.softmax"), e / e.sum(axis=1, keepdims=True),
                                   rtol=0, atol=1e-12)  # fmt: skip
        for j in range(n_k):  # explain every cell of the last row, as a student would
            for stage, want in (("rel_bias", B[-1, j]), ("biased", z[-1, j] if np.isfinite(z[-1, j])
                                                          else None)):  # fmt: skip
                if want is None:
                    continue
                e_ = explain(cfg, trace, trace[f"{head}.{stage}"], (n_q - 1, j))
                assert e_.agrees and abs(e_.result - want) <= 1e-12, (head, stage, j)
        checked += 1
    heads_per_iteration = 2 * shape["decoder_layers"]
    assert checked >= bound * heads_per_iteration


# ---------------------------------------------------------------------------
# explain: what it names is what it reads
# ---------------------------------------------------------------------------


def test_explain_of_masked_names_the_biased_scores_it_adds_M_to() -> None:
    """With a bias, masked = biased + M: the scaled scores alone are not what is added."""
    from test_generate import invoke

    code, out, err = invoke("explain", "decoder.0.self_attn.h0.masked", "hello", "--set",
                            "model.positional=relative", "--set", "target=[SOS, hello]",
                            "--cell", "1,0", "--format", "json")  # fmt: skip
    assert code == 0, err
    e = json.loads(out)
    assert e["lines"][0].startswith("decoder.0.self_attn.h0.masked[1,0] = biased[1,0] + M[1,0] = ")
    assert e["where"][0] == "biased = decoder.0.self_attn.h0.biased"
    code, out, _ = invoke("step", "hello", "--set", "model.positional=relative", "--set",
                          "target=[SOS, hello]", "--stage", "biased", "--format", "json")  # fmt: skip
    steps = {s["path"]: s["value"] for s in json.loads(out)["steps"]}
    biased = steps["decoder.0.self_attn.h0.biased"][1][0]
    assert e["operands"]["biased"] == [biased] == [e["result"]]  # M[1,0] = 0 (causal, j < i)


def test_explain_of_a_cached_row_writes_its_position_as_the_formula_does() -> None:
    """t2's row 0 is position 2: b_rel[j − (2 + i)], never j − 2 + i."""
    from trace_tf import generate as gen
    from trace_tf.explain import explain
    from trace_tf.trace import Tracer

    table = [-1.0, 0.5, 0.0, 1.0, 2.0]  # offsets −2..+2, max_len 3
    cfg = model_of({"model": {"d_model": 2, "encoder_layers": 0, "decoder_layers": 1,
                              "positional": "relative", "max_len": 3},
                    "vocab": ["a", "b"], "tokens": {"bos": "a"},
                    "weights": {"decoder": [{"self_attn": {"heads": [{"rel_bias": table}]}}]}})  # fmt: skip
    tr = Tracer()
    tr.name_all(cfg.named_arrays())
    gen.run(cfg, gen.settings(greedy=True, max_tokens=3), tr)
    step = tr.trace["t2.decoder.0.self_attn.h0.rel_bias"]
    assert step.formula.startswith("B[i,j] = b_rel[j − (2 + i)]")
    e = explain(cfg, tr.trace, step, (0, 1))  # key 1 from position 2: offset −1, b(−1) = 0.5
    assert e.chain[:3] == ("b_rel[h0][1 − (2 + 0)]", "b_rel[-1]", "rel_bias[1]")
    assert e.result == 0.5 and e.agrees


# ---------------------------------------------------------------------------
# Messages: what max_len counts
# ---------------------------------------------------------------------------

TABLE_OF_3 = (
    "model: {d_model: 2, encoder_layers: 0, decoder_layers: 1, positional: relative, max_len: 3}\n"
    "vocab: [a]\ntokens: {bos: a}\ntarget: [a]\n"
    "weights: {decoder: [{self_attn: {heads: [{rel_bias: [1, 2, 3, 4, 5]}]}}]}\n"
)


@pytest.mark.parametrize(
    "args, words",
    [
        # max_len 3 reaches 3 positions through 5 offsets: never "3 relative offsets"
        (["decode", "--set", "target=[a, a, a, a]"],
         ["target: longer than model.max_len (3) positions the relative bias reaches",
          "expected at most 3 tokens, found 4 tokens"]),
        (["generate", "--max-tokens", "4"],
         ["would feed the decoder 4 positions, beyond the 3 positions the relative bias reaches",
          "expected --max-tokens <= 3, found 4"]),
        # max_len set on the command line: the table written for max_len 3 no longer fits
        (["decode", "--set", "model.max_len=4"],
         ["weights.decoder.0.self_attn.heads.0.rel_bias: wrong shape",
          "expected shape 7 (2·max_len − 1, max_len 4), found shape 5"]),
    ],
)  # fmt: skip
def test_what_max_len_bounds_is_said_in_positions(
    tmp_yaml, args: list[str], words: list[str]
) -> None:  # type: ignore[no-untyped-def]
    from test_generate import invoke

    file = tmp_yaml(TABLE_OF_3)
    code, _, err = invoke(args[0], file, *args[1:])
    assert code == 2 and err.count("\n") == 1 and file in err and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)


def test_explain_every_cell_of_B_and_biased_against_plain_numpy() -> None:
    """Each cell of every head's rel_bias, biased and masked written out agrees with the
    table entry of its offset and with scaled + B (+ M) computed here."""
    from trace_tf.explain import explain

    raw = random_config(np.random.default_rng(7), d_model=4, n_heads=2, encoder_layers=1,
                        decoder_layers=1, positional="relative", src_len=3, tgt_len=3,
                        max_len=3, pad=True)  # fmt: skip
    cfg = model_of(raw)
    trace = run(cfg, "full")
    for stack in ("encoder", "decoder"):
        for h, head in enumerate(raw["weights"][stack][0]["self_attn"]["heads"]):
            p = f"{stack}.0.self_attn.h{h}"
            B = my_B(head["rel_bias"], [0, 1, 2], 3)
            scaled = trace.value(f"{p}.scaled")
            for i in range(3):
                for j in range(3):
                    for stage, want in (("rel_bias", B[i, j]), ("biased", scaled[i, j] + B[i, j])):
                        e = explain(cfg, trace, trace[f"{p}.{stage}"], (i, j))
                        assert e.agrees and e.result == want, (p, stage, i, j)
                    if f"{p}.masked" in trace:
                        e = explain(cfg, trace, trace[f"{p}.masked"], (i, j))
                        assert e.agrees and e.chain[0].startswith(f"biased[{i},{j}] + M")


def test_a_drawn_table_is_drawn_whole_so_max_len_moves_every_offset() -> None:
    """README: a drawn rel_bias is one vector from offset −(max_len − 1) up, so another
    max_len puts offset 0 on another draw; a drawn learned table keeps its first rows."""
    import zlib

    def drawn_b0(max_len: int) -> float:
        path = "encoder.0.self_attn.heads.0.rel_bias"
        rng = np.random.default_rng([0, zlib.crc32(path.encode())])
        return float(rng.standard_normal(2 * max_len - 1)[max_len - 1])

    def traced(positional: str, max_len: int) -> np.ndarray:
        cfg = model_of({"model": {"d_model": 2, "positional": positional, "max_len": max_len},
                        "vocab": ["a"], "source": ["a"]})  # fmt: skip
        step = "encoder.0.self_attn.h0.rel_bias" if positional == "relative" else "encoder.pe"
        return run(cfg, "full").value(step)

    assert traced("relative", 3).tolist() == [[drawn_b0(3)]]
    assert traced("relative", 4).tolist() == [[drawn_b0(4)]] != [[drawn_b0(3)]]
    assert np.array_equal(traced("learned", 3), traced("learned", 4))
