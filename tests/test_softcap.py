"""Soft caps (model.attn_softcap, model.logit_softcap: Gemma 2's attn_logit_softcapping and
final_logit_softcapping, s ↦ c · tanh(s / c)) and a window per decoder layer (model.window
a list: Gemma 2's alternating sliding and full layers): worked by hand, the wrong orders
shown to differ, the KV cache against recomputation, the header, `explain`, the other
commands, float32, and every value refused."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import config_from
from random_configs import LLAMA, random_config
from reference_torch import reference_forward
from test_bad_inputs import Bad, _run_bad
from typer.testing import CliRunner

from trace_tf import generate as gen
from trace_tf import ops
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import conventions, run
from trace_tf.trace import Tracer

runner = CliRunner()
X = -math.inf


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def model_of(raw: dict[str, Any]) -> Config:
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    return cfg


def gemma2(seed: int = 4, **over: Any) -> dict[str, Any]:
    """Gemma 2's shape, small: decoder-only pre-norm RMSNorm, RoPE by halves, grouped-query
    GeGLU (tanh), tied scaled embeddings, caps 1.5 and 2 (small enough to bend these
    scores), layer 0 sliding over 2 keys, layer 1 full, every array given."""
    shape: dict[str, Any] = dict(
        d_model=8,
        n_heads=4,
        n_kv_heads=2,
        encoder_layers=0,
        decoder_layers=2,
        **{**LLAMA, "activation": "geglu_tanh"},
        biases=False,
        tie_embeddings=True,
        embed_scale="sqrt_d_model",
        tgt_len=5,
        window=[2, None],
        attn_softcap=1.5,
        logit_softcap=2.0,
    )
    shape.update(over)
    return random_config(np.random.default_rng(seed), **shape)


def write(tmp_path: Path, raw: dict[str, Any], name: str = "g.yaml") -> str:
    f = tmp_path / name
    f.write_text(json.dumps(raw), encoding="utf-8")  # (JSON is YAML)
    return str(f)


# ---------------------------------------------------------------------------
# By hand
# ---------------------------------------------------------------------------

# q = [1, 0] against keys [3, 0], [1, 0], [0, 1], scale 1: scores 3, 1, 0; the third key
# masked. Capped at c = 2: 2 tanh(1.5), 2 tanh(0.5), 2 tanh(0) (tanh from tables).
TANH_1_5, TANH_0_5 = 0.9051482536448664, 0.46211715726000974
ATTEND = [
    "attend",
    "--q",
    "1 0",
    "--k",
    "3 0; 1 0; 0 1",
    "--v",
    "1; 2; 3",
    "--scale",
    "1",
    "--mask",
    "0 0 -inf",
    "--softcap",
    "2",
    "--format",
    "json",
]


def test_a_capped_attention_by_hand() -> None:
    code, out, err = invoke(*ATTEND)
    assert code == 0, err
    steps = {s["path"]: s for s in json.loads(out)["steps"]}
    assert list(steps) == [
        "attn.scores",
        "attn.scaled",
        "attn.capped",
        "attn.masked",
        "attn.softmax",
        "attn.context",
    ]
    capped = [2 * TANH_1_5, 2 * TANH_0_5, 0.0]  # 1.8102965, 0.9242343, 0
    np.testing.assert_allclose(steps["attn.capped"]["value"], [capped], rtol=1e-15)
    assert steps["attn.capped"]["formula"] == "S_c = c · tanh((S / scale) / c),  c = 2 (soft cap)"
    masked = steps["attn.masked"]["value"][0]
    np.testing.assert_allclose(masked[:2], capped[:2], rtol=1e-15)
    assert masked[2] == "-inf"  # −inf added to the capped 0: −inf, not −c
    # softmax over the two visible keys: 1 / (1 + e^(0.9242 − 1.8103)) and the rest
    w0 = 1 / (1 + math.exp(capped[1] - capped[0]))
    np.testing.assert_allclose(steps["attn.softmax"]["value"], [[w0, 1 - w0, 0.0]], rtol=1e-14)
    np.testing.assert_allclose(steps["attn.context"]["value"], [[w0 + 2 * (1 - w0)]], rtol=1e-14)
    # uncapped, the first key would take 1 / (1 + e^(1 − 3)) = 0.88, not 0.71
    assert abs(w0 - 1 / (1 + math.exp(-2))) > 0.15


def test_the_cap_after_the_mask_would_weight_the_masked_key() -> None:
    """The wrong order: c · tanh(−inf / c) is −c, a finite score, so the masked key gets
    e^(−c) of weight; the engine caps before the mask, where −inf stays −inf."""
    code, out, err = invoke(*ATTEND)
    assert code == 0, err
    steps = {s["path"]: s["value"] for s in json.loads(out)["steps"]}
    scaled = np.array(steps["attn.scaled"], dtype=float)
    wrong = ops.softcap(scaled + np.array([[0, 0, -np.inf]]), 2.0)  # masked, then capped
    assert wrong[0, 2] == -2.0
    wrong_weights = ops.softmax(wrong)
    c0, c1 = 2 * TANH_1_5, 2 * TANH_0_5
    leak = math.exp(-2) / (math.exp(c0) + math.exp(c1) + math.exp(-2))  # 0.0154
    np.testing.assert_allclose(wrong_weights[0, 2], leak, rtol=1e-12)
    assert steps["attn.softmax"][0][2] == 0.0
    assert abs(wrong_weights[0, 0] - steps["attn.softmax"][0][0]) > 0.01  # 0.697 vs 0.708


def test_capped_logits_by_hand_and_probs_read_them() -> None:
    raw = gemma2()
    trace = run(model_of(raw), "full")
    out = trace.value("decoder.output")
    E = np.array([raw["embeddings"][t] for t in raw["vocab"]])  # tied: W = Eᵀ (unscaled)
    logits_raw = out @ E.T
    np.testing.assert_allclose(trace.value("logits_raw"), logits_raw, rtol=1e-13, atol=1e-13)
    capped = np.vectorize(lambda s: 2.0 * math.tanh(s / 2.0))(logits_raw)
    np.testing.assert_allclose(trace.value("logits"), capped, rtol=1e-13, atol=1e-13)
    assert np.abs(trace.value("logits")).max() < 2.0 < np.abs(logits_raw).max()  # it bends
    e = np.exp(capped - capped.max(axis=1, keepdims=True))
    np.testing.assert_allclose(trace.value("probs"), e / e.sum(1, keepdims=True), rtol=1e-13)
    assert trace["probs"].inputs == ("logits",) and trace["logits"].inputs == ("logits_raw",)
    assert trace["logits"].formula == "logits = c · tanh(logits_raw / c),  c = 2 (soft cap)"
    # off, there is no logits_raw, and logits is the product itself (SPEC section 3)
    plain = gemma2(logit_softcap=None)
    untouched = run(model_of(plain), "full")
    assert "logits_raw" not in untouched
    np.testing.assert_allclose(untouched.value("logits"), logits_raw, rtol=1e-13, atol=1e-13)


def test_alibi_is_added_to_the_capped_scores_not_capped_itself() -> None:
    raw = random_config(
        np.random.default_rng(2),
        d_model=6,
        n_heads=3,
        encoder_layers=0,
        decoder_layers=1,
        positional="alibi",
        tgt_len=6,
        attn_softcap=0.5,
    )
    trace = run(model_of(raw), "full")
    h = "decoder.0.self_attn.h0"
    scaled, capped = trace.value(f"{h}.scaled"), trace.value(f"{h}.capped")
    b, biased = trace.value(f"{h}.rel_bias"), trace.value(f"{h}.biased")
    np.testing.assert_allclose(capped, 0.5 * np.tanh(scaled / 0.5), rtol=1e-15)
    assert np.array_equal(biased, capped + b)  # B after the cap ...
    assert np.abs(capped).max() < 0.5 < np.abs(np.tril(biased)).max()  # ... and not capped
    # the other order (cap after the bias, as a mask would be) gives other weights
    wrong = ops.softmax(0.5 * np.tanh((scaled + b) / 0.5) + trace.value("decoder.mask"))
    assert np.abs(wrong - trace.value(f"{h}.softmax")).max() > 1e-2


# ---------------------------------------------------------------------------
# A window per decoder layer
# ---------------------------------------------------------------------------


def test_each_layer_masks_by_its_own_window() -> None:
    raw = gemma2(decoder_layers=3, window=[2, None, 3], tgt_len=5)
    trace = run(model_of(raw), "full")

    def by_hand(W: int) -> list[list[float]]:  # query i sees keys i − W < j <= i
        return [[0.0 if j <= i and (not W or j > i - W) else X for j in range(5)] for i in range(5)]

    assert trace.value("decoder.mask").tolist() == by_hand(0)
    assert trace.value("decoder.0.self_attn.mask").tolist() == by_hand(2)
    assert trace.value("decoder.2.self_attn.mask").tolist() == by_hand(3)
    assert "decoder.1.self_attn.mask" not in trace
    for layer, W in ((0, 2), (1, 0), (2, 3)):
        for h in range(4):
            weights = trace.value(f"decoder.{layer}.self_attn.h{h}.softmax")
            assert np.array_equal(weights == 0, np.isneginf(by_hand(W)))
    assert trace["decoder.0.self_attn.mask"].formula == (
        "M[i,j] = −inf for j > i or j ≤ i − 2 (causal, window 2)"
    )
    assert trace["decoder.mask"].formula.endswith("a sliding layer records its own)")


def test_one_window_for_every_layer_is_the_single_number() -> None:
    for listed, single in (([3, 3], 3), ([None, None], None)):
        a = run(model_of(gemma2(window=listed)), "full")
        b = run(model_of(gemma2(window=single)), "full")
        assert list(a.steps) == list(b.steps)
        for path in a.steps:
            assert np.array_equal(a.value(path), b.value(path)), path


def test_the_window_of_each_layer_matters() -> None:
    """The wrong layer sliding, or both, gives other probabilities (so the reference
    comparisons could see a mix-up)."""
    right = run(model_of(gemma2(tgt_len=6)), "full").value("probs")
    for wrong in ([None, 2], [2, 2], None):
        other = run(model_of(gemma2(tgt_len=6, window=wrong)), "full").value("probs")
        assert np.abs(other - right).max() > 1e-4, wrong


def test_generate_with_the_cache_equals_recomputation_and_the_reference() -> None:
    raw = gemma2(tgt_len=2)
    raw["weights"]["output"] = {"b": [0.0] * len(raw["vocab"])}
    raw["weights"]["output"]["b"][1] = -1000.0  # EOS (t1) never: every iteration runs
    cfg = model_of(raw)
    cached, full = Tracer(), Tracer()
    s = dict(greedy=True, max_tokens=6)
    a = gen.run(cfg, gen.settings(**s), cached)  # type: ignore[arg-type]
    b = gen.run(cfg, gen.settings(cache=False, **s), full)  # type: ignore[arg-type]
    assert a.generated == b.generated and len(a.generated) == 6
    prefix = list(raw["target"])
    for i, (x, y) in enumerate(zip(a.iterations, b.iterations, strict=True)):
        assert np.abs(x.model_probs - y.model_probs).max() <= 1e-12
        probs = reference_forward({**raw, "target": prefix})["probs"][-1]
        np.testing.assert_allclose(x.model_probs, probs, rtol=0, atol=1e-10)
        prefix.append(x.next)
        # the cached row, position 1 + i, sees keys i, i + 1 in layer 0 and all in layer 1
        if i:
            pos = 1 + i
            row = [X if j <= pos - 2 else 0.0 for j in range(pos + 1)]
            assert cached.trace.value(f"t{i}.decoder.0.self_attn.mask").tolist() == [row]
            assert cached.trace.value(f"t{i}.decoder.mask").tolist() == [[0.0] * (pos + 1)]
    # the caps matter here: uncapped, the distributions differ
    plain = model_of({**raw, "model": {**raw["model"], "logit_softcap": None}})
    c = gen.run(plain, gen.settings(**s))  # type: ignore[arg-type]
    assert max(np.abs(x.model_probs - z.model_probs).max() for x, z in zip(a.iterations, c.iterations, strict=True)) > 1e-3  # fmt: skip


# ---------------------------------------------------------------------------
# The header, explain, and the other commands
# ---------------------------------------------------------------------------


def test_the_header_states_both_caps_and_the_windows_by_layer() -> None:
    rows = dict(conventions(model_of(gemma2())))
    assert rows["soft caps"] == (
        "scores: S_c = c · tanh((S / scale) / c), c = 1.5, each in (−c, c) (step capped), "
        "before the position bias and the mask, in every attention block; logits: logits = "
        "c · tanh(logits_raw / c), c = 2, each in (−c, c), what probs and generate read"
    )
    assert "sliding windows by layer: layer 0 window 2, layer 1 full" in rows["masks"]
    one = dict(conventions(model_of(gemma2(logit_softcap=None, window=[3, 3]))))
    assert one["soft caps"].endswith("; logits: off")
    assert "sliding window 3 in every layer: query i sees keys i − 3 < j ≤ i" in one["masks"]
    none = dict(conventions(model_of(gemma2(attn_softcap=None, logit_softcap=None))))
    assert "soft caps" not in none


def test_explain_writes_the_arithmetic_of_a_cap(tmp_path: Path) -> None:
    path = write(tmp_path, gemma2())
    trace = run(model_of(gemma2()), "full")

    def explained(step: str, cell: str) -> str:
        code, out, err = invoke("explain", step, path, "--cell", cell, "--precision", "6")
        assert code == 0, err
        return " ".join(out.replace("│", " ").split())  # (the panel's lines, joined)

    s = float(trace.value("decoder.0.self_attn.h1.scaled")[2, 1])
    text = explained("decoder.0.self_attn.h1.capped", "2,1")
    assert "= c · tanh(scaled[2,1] / c)" in text
    assert f"= 1.5 · tanh({s:.6f}".rstrip("0") in text  # tanh of the scaled score, written
    assert "c = 1.5 (model.attn_softcap): the soft cap" in text
    assert "the arithmetic above agrees" in text
    text = explained("logits", "1,2")
    assert "= c · tanh(logits_raw[1,2] / c)" in text and "(model.logit_softcap)" in text
    assert "the arithmetic above agrees" in text
    text = explained("decoder.0.self_attn.mask", "3,1")
    assert "not within its window of 2" in text and "layer 0's mask (model.window.0: 2)" in text
    text = explained("decoder.mask", "3,0")
    assert "the mask of the full-attention layers (1)" in text
    # generate --explain: a cached row (position 6) of layer 0's own mask, and a capped logit
    gen_args = ["generate", path, "--greedy", "--max-tokens", "3", "--set", "tokens.eos=null"]
    code, out, err = invoke(*gen_args, "--explain", "t2.decoder.0.self_attn.mask", "--cell", "0,5")
    assert code == 0, err
    text = " ".join(out.replace("│", " ").split())
    assert "row i is position 6 + i" in text and "layer 0's mask (model.window.0: 2)" in text
    assert "= 0 (query 0 (position 6) may look at key 5 (6 − 2 < j ≤ 6, not a pad)" in text
    code, out, err = invoke(*gen_args, "--explain", "t2.logits", "--cell", "0,0")
    assert code == 0 and "= c · tanh(logits_raw[0,0] / c)" in " ".join(out.split()), err


def test_stages_cost_diff_formats_and_filters(tmp_path: Path) -> None:
    path = write(tmp_path, gemma2())
    code, out, _ = invoke("stages", "--format", "json")
    stages = {s["stage"]: s for s in json.loads(out)["stages"]}
    assert "c · tanh" in stages["capped"]["formula"] and "logits_raw" in stages
    code, out, err = invoke("cost", path, "--format", "json")
    assert code == 0, err
    code, out, err = invoke("step", path, "--stage", "capped", "--format", "json")
    assert code == 0, err
    paths = [s["path"] for s in json.loads(out)["steps"]]
    assert paths == [f"decoder.{l}.self_attn.h{h}.capped" for l in range(2) for h in range(4)]
    npz = tmp_path / "s.npz"
    code, _, err = invoke("decode", path, "--format", "npz", "--output", str(npz))
    assert code == 0, err
    with np.load(npz) as arrays:
        assert {"logits_raw", "logits", "decoder.0.self_attn.mask"} <= set(arrays.keys())
    code, out, err = invoke("step", path, "--stage", "logits_raw", "--format", "csv")
    assert code == 0 and out.count("\n") >= 5, err
    # diff: the cap at 30 against 1.5 changes capped first; uncapped, there is no step
    code, out, err = invoke("diff", path, "--set-b", "model.attn_softcap=30", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["first_difference"] == "decoder.0.self_attn.h0.capped"
    code, out, err = invoke("diff", path, "--set-b", "model.attn_softcap=null", "--format", "json")
    assert "decoder.0.self_attn.h0.capped" in json.loads(out)["only_a"]


def test_float32_caps_in_float32() -> None:
    raw = gemma2()
    raw["model"]["dtype"] = "float32"
    trace = run(model_of(raw), "full")
    wide = run(model_of(gemma2()), "full")
    for step in ("decoder.1.self_attn.h2.capped", "logits_raw", "logits", "probs"):
        assert trace.value(step).dtype == np.float32
        np.testing.assert_allclose(trace.value(step), wide.value(step), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------
# Refused
# ---------------------------------------------------------------------------


def _bad(extra: str, layers: str = "encoder_layers: 0, decoder_layers: 2") -> str:
    return f"model:\n  {{d_model: 4, {layers},\n  {extra}}}\nvocab: [a]\n"


BAD = [
    Bad(_bad("attn_softcap: 0"), "model.attn_softcap", 3, ("must be positive", "a number > 0")),
    Bad(_bad("attn_softcap: -50"), "model.attn_softcap", 3, ("a number > 0", "-50")),
    Bad(_bad("logit_softcap: 0"), "model.logit_softcap", 3, ("must be positive",)),
    Bad(_bad("logit_softcap: abc"), "model.logit_softcap", 3, ("not a number",)),
    Bad(_bad("logit_softcap: true"), "model.logit_softcap", 3, ("not a number",)),
    Bad(_bad("attn_softcap: .inf"), "model.attn_softcap", 3, ("not a finite number",)),
    Bad(
        _bad("attn_softcap: 50, score: additive"),
        "model.attn_softcap",
        3,
        (
            "a soft cap bounds a dot-product score, and model.score is additive",
            "expected model.score scaled_dot, dot or bilinear beside model.attn_softcap",
            "found model.score: additive",
        ),
    ),
    Bad(_bad("attn_softcap: 5, score: gaussian"), "model.attn_softcap", 3, ("gaussian",)),
    Bad(
        _bad("attn_softcap: 1.0e-50, dtype: float32"),
        "model.attn_softcap",
        3,
        ("below the range of float32",),
    ),
    Bad(
        _bad("logit_softcap: 1.0e+39, dtype: float32"),
        "model.logit_softcap",
        3,
        ("beyond the range of float32",),
    ),
    Bad(
        _bad("window: [2, null, 2]"),
        "model.window",
        3,
        (
            "a list of windows has one entry per decoder layer, and decoder_layers is 2",
            "expected 2 windows (each",
            "found 3 windows",
        ),
    ),
    Bad(_bad("window: []"), "model.window", 3, ("found 0 windows",)),
    Bad(_bad("window: [2, 0]"), "model.window.1", 3, ("must be at least 1",)),
    Bad(_bad("window: [2.5, null]"), "model.window.0", 3, ("not a whole number",)),
    Bad(_bad("window: [[2], null]"), "model.window.0", 3, ("not a whole number",)),
    Bad(
        _bad("window: [null, 3]", "encoder_layers: 1, decoder_layers: 2"),
        "model.window.1",
        3,
        ("decoder-only model", "encoder_layers is 1"),
    ),
    Bad(
        "attention: {Q: [[1]], K: [[1]], V: [[1]], softcap: 0}\n",
        "attention.softcap",
        1,
        ("must be positive",),
        args=("attend", "{file}"),
    ),
    Bad(
        "attention: {Q: [[1]], K: [[1]], V: [[1]], w: 1, score: gaussian, softcap: 2}\n",
        "attention.softcap",
        1,
        ("attention.score is gaussian",),
        args=("attend", "{file}"),
    ),
    Bad(
        None,
        "attention.softcap",
        None,
        ("must be positive",),
        args=("attend", "--q", "1", "--k", "1", "--v", "1", "--softcap", "-1"),
        names="--softcap",
    ),
]


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_cap_or_window_is_refused(bad: Bad, tmp_path: Path) -> None:
    _run_bad(bad, tmp_path)


def test_a_cap_set_on_the_command_line_is_refused_by_its_key(tmp_path: Path) -> None:
    path = write(tmp_path, gemma2())
    code, out, err = invoke("decode", path, "--set", "model.logit_softcap=-1")
    assert code == 2 and "model.logit_softcap" in err and "Traceback" not in err + out
    code, out, err = invoke("decode", path, "--set", "model.window=[1, 2, 3]")
    assert code == 2 and "model.window" in err and "found 3 windows" in err


def test_the_size_bound_counts_the_new_steps() -> None:
    """config.trace_size, the bound a model is refused by before anything is allocated,
    still bounds what a capped, per-layer-windowed run records, and counts the new steps:
    the capped scores, the sliding layers' masks and logits_raw."""
    from trace_tf.config import OBJECT_COST, trace_size

    for over in ({}, dict(decoder_layers=3, window=[2, None, 3])):
        cfg = model_of(gemma2(**over))
        trace = run(cfg, "full")
        recorded = sum(trace.value(p).size for p in trace.steps)
        bound = trace_size(cfg.model, 5, len(cfg.vocab))
        assert recorded + OBJECT_COST * len(trace.steps) <= bound
        plain = model_of(gemma2(**{**over, "window": 2, "attn_softcap": None}, logit_softcap=None))
        new = [p for p in trace.steps if p.endswith(("capped", "logits_raw", "self_attn.mask"))]
        grown = bound - trace_size(plain.model, 5, len(plain.vocab))
        assert grown >= sum(trace.value(p).size + OBJECT_COST for p in new)


# ---------------------------------------------------------------------------
# Hugging Face's Gemma 2: its layer types and its first layer's capped attention
# ---------------------------------------------------------------------------


def test_hugging_face_gemma2_layers_slide_and_cap_as_the_engine_does() -> None:
    """A small random Gemma2Model (eager, float64): its layer_types give model.window's list
    (layer i slides when i is even), each layer's attention weights are 0 exactly where
    the engine's mask of that layer is −inf, and layer 0's weights, whose input is the
    engine's (γ = 1 + weight; embeddings · √d, the unscaled table tied), are the
    engine's with the cap on. Later layers read Gemma 2's norms after each sublayer,
    which the engine does not have here, so only their masks are compared. HF's eager
    softmax runs in float32: 1e-6."""
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.Gemma2Config(
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        query_pre_attn_scalar=4,  # scaling 4^−½: model.scale sqrt_dk
        sliding_window=2,
        attn_logit_softcapping=0.5,  # small enough to bend these scores
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    hf = transformers.Gemma2Model(hf_cfg).double().eval()
    with torch.no_grad():  # drawn anew: HF's init (std 0.02, norm weights 0) bends nothing
        for p in hf.parameters():
            p.normal_(0.0, 0.7)
    ids = [1, 2, 3, 4, 5, 6]
    with torch.no_grad():
        attentions = hf(torch.tensor([ids]), output_attentions=True).attentions
    windows = [
        hf_cfg.sliding_window if t == "sliding_attention" else None for t in hf_cfg.layer_types
    ]
    assert windows == [2, None, 2, None]
    sd = {k: v.numpy() for k, v in hf.state_dict().items()}
    a0 = "layers.0.self_attn."
    raw = {
        "model": {
            "d_model": 8, "n_heads": 2, "n_kv_heads": 1, "d_k": 4, "d_ff": 16,
            "encoder_layers": 0, "decoder_layers": 4, "norm_position": "pre", "norm": "rms",
            "norm_eps": hf_cfg.rms_norm_eps, "positional": "rope", "rope_pairs": "halves",
            "pe_base": 10000, "activation": "geglu_tanh", "embed_scale": "sqrt_d_model",
            "tie_embeddings": True, "window": windows, "attn_softcap": 0.5,
        },
        "vocab": [f"t{i}" for i in range(10)],
        "embeddings": {f"t{i}": sd["embed_tokens.weight"][i].tolist() for i in range(10)},
        "target": [f"t{i}" for i in ids],
        "weights": {"decoder": [{"self_attn": {
            "W_q": sd[a0 + "q_proj.weight"].T.tolist(),
            "W_k": sd[a0 + "k_proj.weight"].T.tolist(),
            "W_v": sd[a0 + "v_proj.weight"].T.tolist(),
            "W_o": sd[a0 + "o_proj.weight"].T.tolist(),
            "norm": {"gamma": (1 + sd["layers.0.input_layernorm.weight"]).tolist()},
        }}]},
    }  # fmt: skip
    trace = run(model_of(raw), "full")
    for layer, W in enumerate(windows):
        mask = trace.value(f"decoder.{layer}.self_attn.mask" if W else "decoder.mask")
        for h in range(2):
            assert np.array_equal(attentions[layer][0, h].numpy() == 0, np.isneginf(mask))
    for h in range(2):
        ours = trace.value(f"decoder.0.self_attn.h{h}.softmax")
        np.testing.assert_allclose(ours, attentions[0][0, h].numpy(), rtol=0, atol=1e-6)
    # uncapped, the engine's weights are not HF's (so the cap is what made them agree)
    raw["model"]["attn_softcap"] = None
    uncapped = run(model_of(raw), "full").value("decoder.0.self_attn.h0.softmax")
    assert np.abs(uncapped - attentions[0][0, 0].numpy()).max() > 1e-2
