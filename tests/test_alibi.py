"""`model.positional: alibi`: ALiBi's fixed bias B[i,j] = −m_h·(i − j) on every
self-attention head's scaled scores (Press et al. 2022; the encoder's −m_h·|i − j|), its
slopes, steps, header, explain, cache and refusals. Numbers here are by hand (the slopes
from the paper's formulas written below); the whole forward pass is checked against the
torch reference in tests/test_engine_reference.py and tests/test_generate.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES
from test_bad_inputs import Bad, _run_bad
from test_generate import invoke, model_of

from trace_tf import cost, ops
from trace_tf.runner import conventions, run


def by_hand_slopes(H: int) -> list[float]:
    """The paper's rule: m_h = 2^(−8(h+1)/H) for H a power of two; else those of the
    power of two below, then every other slope of twice it (Hugging Face's too)."""
    if H & (H - 1) == 0:
        return [2 ** (-8 * (h + 1) / H) for h in range(H)]
    low = 2 ** int(math.log2(H))
    return by_hand_slopes(low) + by_hand_slopes(2 * low)[0::2][: H - low]


def test_the_slopes_of_4_and_3_heads_by_hand() -> None:
    assert ops.alibi_slopes(4).tolist() == [2**-2, 2**-4, 2**-6, 2**-8]
    assert ops.alibi_slopes(3).tolist() == [2**-4, 2**-8, 2**-2]  # 2 heads', then 2^(−8·1/4)
    assert ops.alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]  # the paper's 1/2..1/256
    for H in range(1, 20):
        assert ops.alibi_slopes(H).tolist() == pytest.approx(by_hand_slopes(H), rel=1e-15), H
    assert ops.alibi_slopes(3).tolist() != by_hand_slopes(4)[:3]  # not the first of 4 heads


def test_B_by_hand_causal_symmetric_and_from_a_start() -> None:
    assert ops.alibi_bias(0.5, 3, 3).tolist() == [[0, 0.5, 1], [-0.5, 0, 0.5], [-1, -0.5, 0]]
    assert ops.alibi_bias(0.5, 3, 3, symmetric=True).tolist() == [
        [0, -0.5, -1],
        [-0.5, 0, -0.5],
        [-1, -0.5, 0],
    ]
    # the new row of a KV-cached step at position 2 over keys 0..2: the last row of the whole
    assert ops.alibi_bias(0.5, 1, 3, start=2).tolist() == [[-1, -0.5, 0]]
    assert not np.signbit(np.diag(ops.alibi_bias(0.5, 2, 2))).any()  # 0, not −0


def three_tokens(**model: Any) -> dict[str, Any]:
    """Decoder-only, d_model 2, 2 heads of d_k 1: head 0 reads column 0 of X as q and k,
    head 1 column 1; X = the embeddings a [1, 0], b [0, 1], c [2, 0] (alibi adds no PE)."""
    q0, q1 = [[1.0], [0.0]], [[0.0], [1.0]]
    head = lambda w: {"W_q": w, "W_k": w, "W_v": w}  # noqa: E731
    return {
        "model": {"d_model": 2, "n_heads": 2, "encoder_layers": 0, "decoder_layers": 1,
                  "positional": "alibi", **model},
        "vocab": ["a", "b", "c"],
        "embeddings": {"a": [1, 0], "b": [0, 1], "c": [2, 0]},
        "target": ["a", "b", "c"],
        "weights": {"decoder": [{"self_attn": {"heads": [head(q0), head(q1)]}}]},
    }  # fmt: skip


def test_a_three_token_example_worked_by_hand() -> None:
    trace = run(model_of(three_tokens()), "full")
    h0 = "decoder.0.self_attn.h0"
    # scores x0_i x0_j with x0 = [1, 0, 2], scale √1; head 0's slope 2^(−8·1/2) = 1/16
    assert trace.value(f"{h0}.scaled").tolist() == [[1, 0, 2], [0, 0, 0], [2, 0, 4]]
    m = 1 / 16
    assert trace.value(f"{h0}.rel_bias").tolist() == [[0, m, 2 * m], [-m, 0, m], [-2 * m, -m, 0]]
    assert trace.value(f"{h0}.biased")[2].tolist() == [2 - 2 * m, -m, 4]
    e = [math.exp(2 - 2 * m), math.exp(-m), math.exp(4)]  # row 2 sees all three keys
    assert trace.value(f"{h0}.softmax")[2].tolist() == pytest.approx([x / sum(e) for x in e])
    e = [math.exp(0 - m), math.exp(0)]  # row 1: scores 0, so softmax(−m, 0)
    assert trace.value(f"{h0}.softmax")[1, :2].tolist() == pytest.approx([x / sum(e) for x in e])
    # head 1's slope 2^(−8·2/2) = 1/256
    assert trace.value("decoder.0.self_attn.h1.rel_bias")[2].tolist() == [-2 / 256, -1 / 256, 0]
    assert trace[f"{h0}.rel_bias"].formula == "B[i,j] = −m·(i − j),  m = 2^(−8·1/2) = 0.0625"
    assert trace[f"{h0}.rel_bias"].inputs == ()  # no weight: the bias is fixed
    assert trace[f"{h0}.masked"].inputs == (f"{h0}.biased", "decoder.mask")


def test_the_softmax_equals_bloom_m_j_form_a_per_row_constant_apart() -> None:
    """BLOOM adds m·j (the keys' positions) where the paper adds −m·(i − j) = m·j − m·i:
    the scores differ by m·i in row i, the softmax not."""
    trace = run(model_of(three_tokens()), "full")
    h0 = "decoder.0.self_attn.h0"
    j = np.arange(3)
    scaled = trace.value(f"{h0}.scaled")
    bloom = scaled + j / 16 + trace.value("decoder.mask")
    e = np.exp(bloom - bloom.max(axis=1, keepdims=True))
    np.testing.assert_allclose(trace.value(f"{h0}.softmax"), e / e.sum(1, keepdims=True), 0, 1e-15)
    assert (trace.value(f"{h0}.biased") - (scaled + j / 16))[2].tolist() == [-2 / 16] * 3


def test_the_encoder_is_symmetric_and_cross_attention_has_none() -> None:
    raw = three_tokens(encoder_layers=1, n_heads=1, d_model=2)
    raw["source"] = ["a", "b", "c"]
    raw["weights"] = {}
    trace = run(model_of(raw), "full")
    m = 2**-8  # one head: 2^(−8·1/1)
    B = trace.value("encoder.0.self_attn.h0.rel_bias")
    assert B.tolist() == [[0, -m, -2 * m], [-m, 0, -m], [-2 * m, -m, 0]]
    assert trace["encoder.0.self_attn.h0.rel_bias"].formula.startswith("B[i,j] = −m·|i − j|")
    assert not any(".cross_attn." in p and p.endswith(("rel_bias", "biased")) for p in trace.steps)
    assert "encoder.pe" not in trace and "decoder.pe" not in trace


def test_the_cached_rows_continue_their_positions_as_recomputing_does() -> None:
    from trace_tf import generate as gen
    from trace_tf.trace import Tracer

    raw = three_tokens() | {"target": ["a"], "tokens": {"bos": "a"}}
    cached, full = Tracer(), Tracer()
    a = gen.run(model_of(raw), gen.settings(greedy=True, max_tokens=3), cached)
    b = gen.run(model_of(raw), gen.settings(greedy=True, max_tokens=3, cache=False), full)
    assert list(a.generated) == list(b.generated)
    step = cached.trace["t2.decoder.0.self_attn.h0.rel_bias"]
    assert step.value.tolist() == [[-2 / 16, -1 / 16, 0]]  # position 2 over keys 0..2
    assert "((2 + i) − j)" in step.formula
    assert step.value.tolist() == [
        full.trace.value("t2.decoder.0.self_attn.h0.rel_bias")[-1].tolist()
    ]
    for x, y in zip(a.iterations, b.iterations, strict=True):
        assert np.abs(x.model_probs - y.model_probs).max() <= 1e-12


def test_given_slopes_are_used_as_written_by_hand() -> None:
    """model.alibi_slopes [0.5, 0.125]: B = −m·(i − j) with each, the softmax of row 2 of
    head 0 by hand (scores 2, 0, 4 as above), and the header, formula and slope text."""
    trace = run(model_of(three_tokens(alibi_slopes=[0.5, 0.125])), "full")
    h0, h1 = "decoder.0.self_attn.h0", "decoder.0.self_attn.h1"
    assert trace.value(f"{h0}.rel_bias").tolist() == [[0, 0.5, 1], [-0.5, 0, 0.5], [-1, -0.5, 0]]
    assert trace.value(f"{h1}.rel_bias")[2].tolist() == [-0.25, -0.125, 0]
    e = [math.exp(2 - 1), math.exp(0 - 0.5), math.exp(4)]
    assert trace.value(f"{h0}.softmax")[2].tolist() == pytest.approx([x / sum(e) for x in e])
    assert (
        trace[f"{h1}.rel_bias"].formula == "B[i,j] = −m·(i − j),  m = model.alibi_slopes[1] = 0.125"
    )
    positions = dict(conventions(model_of(three_tokens(alibi_slopes=[0.5, 0.125]))))["positions"]
    assert positions.endswith("slopes m_h given (model.alibi_slopes): 0.5 0.125")
    # the paper's slopes given are the paper's run, number for number
    paper = run(model_of(three_tokens()), "full")
    same = run(model_of(three_tokens(alibi_slopes=by_hand_slopes(2))), "full")
    assert all((paper.value(p) == same.value(p)).all() for p in paper.steps)


def test_explain_says_a_given_slope(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    import yaml

    file = tmp_yaml(yaml.safe_dump(three_tokens(alibi_slopes=[0.5, 0.125])))
    code, out, err = invoke("explain", "decoder.0.self_attn.h1.biased", file, "--cell", "2,0",
                            "--format", "json")  # fmt: skip
    assert code == 0, err
    e = json.loads(out)
    assert e["result"] == 0 - 0.25 and e["agrees"]  # head 1's scaled score 0, B −0.125 · 2
    assert "m = model.alibi_slopes[1] = 0.125: head 1's slope of 2 (ALiBi, given)" in e["where"]


@pytest.mark.parametrize("score", ["dot", "additive", "bilinear", "gaussian"])
def test_every_score_function_gets_the_same_b(score: str) -> None:
    """B is added to score / scale whatever the score: −m·(i − j) by hand, then the
    softmax of row 2 of head 0 from the recorded scaled scores plus that B."""
    trace = run(model_of(three_tokens(score=score)), "full")
    h0 = "decoder.0.self_attn.h0"
    B = [[0, 1 / 16, 2 / 16], [-1 / 16, 0, 1 / 16], [-2 / 16, -1 / 16, 0]]
    assert trace.value(f"{h0}.rel_bias").tolist() == B
    row = trace.value(f"{h0}.scaled")[2] + np.array(B[2])
    np.testing.assert_array_equal(trace.value(f"{h0}.biased")[2], row)
    e = np.exp(row - row.max())
    np.testing.assert_allclose(trace.value(f"{h0}.softmax")[2], e / e.sum(), rtol=1e-15)


def test_no_max_len_bounds_alibi() -> None:
    raw = three_tokens(max_len=2)
    assert run(model_of(raw), "full").value("decoder.0.self_attn.h0.rel_bias").shape == (3, 3)


# ---------------------------------------------------------------------------
# Header, stages, explain, cost, --set, diff
# ---------------------------------------------------------------------------


def test_the_header_states_slopes_and_both_forms() -> None:
    positions = dict(conventions(model_of(three_tokens(n_heads=2))))["positions"]
    assert positions.startswith("ALiBi (Press et al. 2022), fixed, no weights")
    assert "−m_h·(i − j)" in positions and "−m_h·|i − j|" in positions
    assert "none in cross-attention" in positions and positions.endswith("0.0625 0.00390625")
    raw = {"model": {"d_model": 3, "n_heads": 3, "positional": "alibi"}, "vocab": ["a"],
           "source": ["a"]}  # fmt: skip
    three = dict(conventions(model_of(raw)))
    assert "H' = 2" in three["positions"] and three["positions"].endswith("0.0625 0.00390625 0.25")


def test_explain_writes_the_slope_and_the_distance(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    import yaml

    file = tmp_yaml(yaml.safe_dump(three_tokens()))
    code, out, err = invoke("explain", "decoder.0.self_attn.h0.rel_bias", file, "--cell", "2,0",
                            "--format", "json")  # fmt: skip
    assert code == 0, err
    e = json.loads(out)
    assert e["lines"] == [
        "decoder.0.self_attn.h0.rel_bias[2,0] = −m·(i − j) = −0.0625 · 2 = -0.125"
    ]
    assert e["result"] == -0.125 and e["agrees"]
    assert e["where"][0].startswith("m = 2^(−8·1/2) = 0.0625: head 0's slope of 2")
    assert e["where"][1].startswith("distance i − j = 2")
    code, out, err = invoke("explain", "decoder.0.self_attn.h0.biased", file, "--cell", "2,0",
                            "--format", "json")  # fmt: skip
    e = json.loads(out)
    assert e["lines"] == [
        "decoder.0.self_attn.h0.biased[2,0] = scaled[2,0] + B[2,0] = 2 + (-0.125) = 1.875"
    ]
    assert any(w.startswith("m = 2^(−8·1/2)") for w in e["where"])
    assert any(w.startswith("distance i − j = 2") for w in e["where"])


def test_explain_under_a_cache_writes_the_distance_from_the_row_s_position(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    """A KV-cached step's row i is position t + i: its distance is (t + i) − j as the
    formula's, not i − j (which is −1 here: row 0 minus key 1)."""
    import yaml

    raw = three_tokens() | {"target": ["a"], "tokens": {"bos": "a"}}
    file = tmp_yaml(yaml.safe_dump(raw))
    code, out, err = invoke("generate", file, "--greedy", "--max-tokens", "3", "--explain",
                            "t2.decoder.0.self_attn.h0.biased", "--cell", "0,1",
                            "--format", "json")  # fmt: skip
    assert code == 0, err
    e = json.loads(out)
    distance = [w for w in e["where"] if w.startswith("distance")]
    assert distance == ["distance (2 + i) − j = 1 (key 1 seen from query position 2; causal)"]
    assert e["agrees"]


def test_stages_document_alibi() -> None:
    code, out, err = invoke("stages", "--format", "json")
    assert code == 0, err
    [stage] = [s for s in json.loads(out)["stages"] if s["stage"] == "rel_bias"]
    assert "alibi: B[i,j] = −m·(i − j), the encoder's −m·|i − j|" in stage["formula"]
    assert "ALiBi" in stage["meaning"]


def test_B_costs_nothing_more_than_sinusoidal_positions() -> None:
    raw = three_tokens()
    ledger = cost.ledger(model_of(raw))
    assert [c.macs for c in ledger if c.stage in ("rel_bias", "biased")] == [0] * 4
    plain = dict(raw, model={k: v for k, v in raw["model"].items() if k != "positional"})
    assert cost.totals(ledger).total == cost.totals(cost.ledger(model_of(plain))).total


def test_set_positional_alibi_and_diff_against_sinusoidal() -> None:
    code, out, err = invoke(
        "decode", "hello", "--set", "model.positional=alibi", "--format", "json"
    )
    assert code == 0, err
    paths = [s["path"] for s in json.loads(out)["steps"]]
    assert "encoder.0.self_attn.h1.rel_bias" in paths and "encoder.pe" not in paths
    code, out, err = invoke(
        "diff", "hello", "--set-b", "model.positional=alibi", "--format", "json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["only_a"] == ["encoder.pe", "decoder.pe"]
    heads = [f"{s}.0.self_attn.h{h}" for s in ("encoder", "decoder") for h in (0, 1)]
    assert data["only_b"] == [f"{p}.{n}" for p in heads for n in ("rel_bias", "biased")]


# ---------------------------------------------------------------------------
# Bad input: exit 2, file, key path, expected, found
# ---------------------------------------------------------------------------

ALIBI = "model: {d_model: 2, decoder_layers: 1, positional: alibi}\nvocab: [a]\nsource: [a]\n"
CASES = [
    (
        ALIBI + "weights: {encoder: [{self_attn: {heads: [{rel_bias: [1, 2, 3]}]}}]}\n",
        "weights.encoder.0.self_attn.heads.0.rel_bias",
        ["ALiBi's bias is fixed, not learned", "no rel_bias with model.positional: alibi"],
    ),
    (
        ALIBI + "weights: {decoder: [{self_attn: {rel_bias: [[1, 2, 3]]}}]}\n",
        "weights.decoder.0.self_attn.rel_bias",
        ["ALiBi's bias is fixed, not learned", "found a rel_bias"],
    ),
    (
        ALIBI + "weights: {decoder: [{cross_attn: {heads: [{rel_bias: [1, 2, 3]}]}}]}\n",
        "weights.decoder.0.cross_attn.heads.0.rel_bias",
        ["cross-attention has no relative position bias"],
    ),
    (
        "model: {d_model: 2, positional: alibi, rope_scaling: {type: linear, factor: 2}}\n"
        "vocab: [a]\nsource: [a]\n",
        "model.rope_scaling",
        ["model.positional is alibi"],
    ),
    (
        "model: {d_model: 2, positional: alibl}\nvocab: [a]\nsource: [a]\n",
        "model.positional",
        ["alibi"],
    ),
    (
        "model: {d_model: 2, n_heads: 2, positional: alibi, alibi_slopes: [0.5]}\n"
        "vocab: [a]\nsource: [a]\n",
        "model.alibi_slopes",
        ["wrong shape", "expected shape 2 (n_heads)", "found shape 1"],
    ),
    (
        "model: {d_model: 2, n_heads: 2, positional: alibi, alibi_slopes: [0.5, 0]}\n"
        "vocab: [a]\nsource: [a]\n",
        "model.alibi_slopes.1",
        ["must be positive", "a number > 0", "found the number 0"],
    ),
    (
        "model: {d_model: 2, n_heads: 2, positional: alibi, alibi_slopes: [.nan, 1]}\n"
        "vocab: [a]\nsource: [a]\n",
        "model.alibi_slopes.0",
        ["not a finite number", "found the number nan"],
    ),
    (
        "model: {d_model: 2, n_heads: 2, positional: alibi, alibi_slopes: [0.5, a]}\n"
        "vocab: [a]\nsource: [a]\n",
        "model.alibi_slopes.1",
        ["not a number", "found the string 'a'"],
    ),
    (
        "model: {d_model: 2, n_heads: 2, alibi_slopes: [0.5, 0.25]}\nvocab: [a]\nsource: [a]\n",
        "model.alibi_slopes",
        ["model.positional is sinusoidal", "model.positional: alibi beside", "found positional"],
    ),
]


@pytest.mark.parametrize("text, path, words", CASES, ids=[str(i) for i in range(len(CASES))])
def test_what_alibi_cannot_take_is_exit_2(
    text: str, path: str, words: list[str], tmp_path: Path
) -> None:
    """The bad-input corpus's oracle (one line, exit 2, the file and key path, nothing
    written), and each message's words, with what was expected."""
    _run_bad(Bad(text, path, None, (*words, "expected")), tmp_path)


def test_a_relative_table_refused_when_set_to_alibi() -> None:
    fixture = str(FIXTURES / "000_relative_bias.yaml")
    code, _, err = invoke("encode", fixture, "--set", "model.positional=alibi")
    assert code == 2 and "Traceback" not in err
    assert "rel_bias" in err and "ALiBi's bias is fixed" in err and "set by --set" in err


def test_slopes_of_another_n_heads_name_what_set_it() -> None:
    code, _, err = invoke("encode", "hello", "--set", "model.positional=alibi",
                          "--set", "model.alibi_slopes=[0.5]")  # fmt: skip
    assert code == 2 and "Traceback" not in err
    assert "model.alibi_slopes: wrong shape" in err and "expected shape 2 (n_heads)" in err
    code, _, err = invoke("encode", "hello", "--set", "model.positional=alibi",
                          "--set", "model.alibi_slopes=[0.5, 0.1]", "--set", "model.n_heads=1",
                          "--set", "model.d_k=4")  # fmt: skip
    assert code == 2 and "model.n_heads set by --set" in err and "found shape 2" in err
