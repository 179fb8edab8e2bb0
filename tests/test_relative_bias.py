"""`model.positional: relative`: a learned bias B[i,j] = b(j − i) added to every
self-attention head's scaled scores (lecture 000 section 6.2), its steps, weights,
errors, header, cost, explain, diff and dtype. Numbers here are by hand or by numpy
written in the test; the whole forward pass is checked against the torch reference in
tests/test_engine_reference.py and the KV cache in tests/test_generate.py."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES, config_from
from random_configs import random_config, to_per_head
from test_bad_inputs import Bad, _run_bad
from test_generate import invoke, model_of

from trace_tf import cost, ops
from trace_tf.config import Config
from trace_tf.runner import conventions, run

FIXTURE = str(FIXTURES / "000_relative_bias.yaml")
TABLE = [-1.0, 0.5, 0.0, 1.0, 2.0]  # offsets −2..+2, max_len 3


def decoder_only(**weights: Any) -> dict[str, Any]:
    """d_model 2, one head, max_len 3, three target tokens; self_attn weights as given."""
    return {
        "model": {"d_model": 2, "encoder_layers": 0, "decoder_layers": 1,
                  "positional": "relative", "max_len": 3},
        "vocab": ["a", "b", "c"],
        "target": ["a", "b", "c"],
        "weights": {"decoder": [{"self_attn": weights}]},
    }  # fmt: skip


# ---------------------------------------------------------------------------
# The gather, by hand
# ---------------------------------------------------------------------------


def test_relative_bias_is_the_table_entry_of_each_offset_by_hand() -> None:
    table = np.array([10.0, 11.0, 12.0, 13.0, 14.0])  # b(−2) .. b(2)
    # row i, column j: b(j − i) = table[2 + j − i]
    assert ops.relative_bias(table, 3, 3).tolist() == [[12, 13, 14], [11, 12, 13], [10, 11, 12]]
    # rows at positions 1, 2 (a KV-cached step from start 1) over keys 0..2
    assert ops.relative_bias(table, 2, 3, start=1).tolist() == [[11, 12, 13], [10, 11, 12]]
    assert ops.relative_bias(table, 1, 3, start=2).tolist() == [[10, 11, 12]]
    assert ops.relative_bias(table, 1, 1).tolist() == [[12]]


# ---------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------


def test_each_self_attention_head_records_B_and_the_biased_scores_before_the_mask() -> None:
    cfg = model_of(decoder_only(heads=[{"rel_bias": TABLE}]))
    trace = run(cfg, "full")
    head = "decoder.0.self_attn.h0"
    paths = [s.path for s in trace if s.path.startswith(head)]
    assert paths == [f"{head}.{s}" for s in
                     ("q", "k", "v", "scores", "scaled", "rel_bias", "biased", "masked",
                      "softmax", "context")]  # fmt: skip
    assert "decoder.pe" not in trace  # no vector is added to the input
    B = trace.value(f"{head}.rel_bias")
    assert B.tolist() == [[0, 1, 2], [0.5, 0, 1], [-1, 0.5, 0]]  # b(j − i), by hand
    assert trace[f"{head}.rel_bias"].inputs == ("weights.decoder.0.self_attn.heads.0.rel_bias",)
    assert trace[f"{head}.rel_bias"].cols == ("a", "b", "c")
    scaled = trace.value(f"{head}.scaled")
    assert trace[f"{head}.scaled"].formula.startswith("S / sqrt(d_k)")  # SPEC: scores / scale
    assert np.array_equal(trace.value(f"{head}.biased"), scaled + np.array(B))
    assert trace[f"{head}.biased"].formula == "S / scale + B"
    masked = trace[f"{head}.masked"]
    assert masked.formula.startswith("S / scale + B + M")
    assert masked.inputs == (f"{head}.biased", "decoder.mask")
    assert trace[f"{head}.softmax"].inputs == (f"{head}.masked",)


def test_cross_attention_has_no_bias_and_an_unmasked_softmax_reads_biased() -> None:
    raw = random_config(np.random.default_rng(1), d_model=4, n_heads=2, decoder_layers=1,
                        positional="relative")  # fmt: skip
    trace = run(model_of(raw), "full")
    assert "encoder.0.self_attn.h1.rel_bias" in trace and "decoder.0.self_attn.h1.biased" in trace
    assert not any(".cross_attn." in p and p.endswith(("rel_bias", "biased")) for p in trace.steps)
    softmax = trace["encoder.0.self_attn.h0.softmax"]  # no pads: no mask in the encoder
    assert softmax.inputs == ("encoder.0.self_attn.h0.biased",)


def test_stage_names_and_the_attention_group_select_the_new_steps() -> None:
    code, out, err = invoke("step", FIXTURE, "--stage", "rel_bias", "--format", "json")
    assert code == 0, err
    [step] = json.loads(out)["steps"]
    assert step["path"] == "encoder.0.self_attn.h0.rel_bias" and step["stage"] == "rel_bias"
    assert step["value"] == [[0, 1, 2], [0.5, 0, 1], [-1, 0.5, 0]]
    code, out, err = invoke("step", FIXTURE, "--stage", "attention", "--format", "json")
    paths = [s["path"] for s in json.loads(out)["steps"]]
    assert "encoder.0.self_attn.h0.rel_bias" in paths and "encoder.0.self_attn.h0.biased" in paths
    code, _, err = invoke("step", "hello", "--stage", "biased")
    assert code == 2 and "model.positional: relative" in err


def test_fused_and_per_head_tables_give_identical_traces() -> None:
    raw = random_config(np.random.default_rng(4), d_model=6, n_heads=3, decoder_layers=1,
                        positional="relative", fused=True)  # fmt: skip
    a, b = run(model_of(raw), "full"), run(model_of(to_per_head(raw)), "full")
    assert list(a.steps) == list(b.steps)
    for path in a.steps:
        assert np.array_equal(a.value(path), b.value(path)), path
    fused = np.array(raw["weights"]["encoder"][0]["self_attn"]["rel_bias"])
    centre = raw["model"]["max_len"] - 1  # row 0, offsets 0, 1, 2: head 2's row from there
    assert np.array_equal(
        a.value("encoder.0.self_attn.h2.rel_bias")[0], fused[2, centre : centre + 3]
    )


def test_a_table_not_given_is_drawn_per_head_by_the_spec_rule() -> None:
    cfg = model_of({"model": {"d_model": 4, "n_heads": 2, "decoder_layers": 1, "seed": 5,
                              "init_std": 0.5, "positional": "relative", "max_len": 4},
                    "vocab": ["a"], "source": ["a"]})  # fmt: skip
    for stack, layers in (("encoder", cfg.encoder), ("decoder", cfg.decoder)):
        for h in range(2):
            path = f"{stack}.0.self_attn.heads.{h}.rel_bias"
            rng = np.random.default_rng([5, zlib.crc32(path.encode())])
            assert np.array_equal(
                layers[0].self_attn.heads[h].rel_bias, rng.standard_normal(7) * 0.5
            )
            assert path in cfg.drawn
    assert all(hw.rel_bias is None for hw in cfg.decoder[0].cross_attn.heads)  # type: ignore[union-attr]


# ---------------------------------------------------------------------------
# Bad input: exit 2, file, key path, expected, found
# ---------------------------------------------------------------------------

ENC_DEC = "model: {d_model: 2, decoder_layers: 1, positional: relative, max_len: 3}\nvocab: [a]\nsource: [a]\n"
CASES = [
    (
        "model: {d_model: 2, max_len: 3}\nvocab: [a]\nsource: [a]\n"
        "weights: {encoder: [{self_attn: {heads: [{rel_bias: [1, 2, 3, 4, 5]}]}}]}\n",
        "weights.encoder.0.self_attn.heads.0.rel_bias",
        ["model.positional is sinusoidal", "model.positional: relative", "found"],
    ),
    (
        "model: {d_model: 2, n_heads: 2, positional: rope, max_len: 3}\nvocab: [a]\nsource: [a]\n"
        "weights: {encoder: [{self_attn: {rel_bias: [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]}}]}\n",
        "weights.encoder.0.self_attn.rel_bias",
        ["model.positional is rope"],
    ),
    (
        ENC_DEC + "weights: {decoder: [{cross_attn: {heads: [{rel_bias: [1, 2, 3, 4, 5]}]}}]}\n",
        "weights.decoder.0.cross_attn.heads.0.rel_bias",
        ["cross-attention has no relative position bias", "rel_bias only in self_attn"],
    ),
    (
        ENC_DEC + "weights: {encoder: [{self_attn: {heads: [{rel_bias: [1, 2, 3, 4]}]}}]}\n",
        "weights.encoder.0.self_attn.heads.0.rel_bias",
        ["wrong shape", "shape 5 (2·max_len − 1, max_len 3)", "found shape 4"],
    ),
    (
        ENC_DEC + "weights: {encoder: [{self_attn: {rel_bias: [1, 2, 3, 4, 5]}}]}\n",
        "weights.encoder.0.self_attn.rel_bias",
        ["wrong shape", "shape 1 x 5 (n_heads x (2·max_len − 1), max_len 3)", "found shape 5"],
    ),
    (
        ENC_DEC + "weights: {encoder: [{self_attn: {rel_bias: [[1, 2, 3, 4, 5]], "
        "heads: [{rel_bias: [1, 2, 3, 4, 5]}]}}]}\n",
        "weights.encoder.0.self_attn.heads.0.rel_bias",
        ["one form per block", "found fused rel_bias beside heads.0.rel_bias"],
    ),
    (
        "model: {d_model: 2, positional: relative, max_len: 3}\nvocab: [a]\nsource: [a, a, a, a]\n",
        "source",
        [
            "longer than model.max_len (3) positions the relative bias reaches",
            "at most 3 tokens",
            "4 tokens",
        ],
    ),
]


@pytest.mark.parametrize(
    "text, path, words", CASES, ids=[c[1] + str(i) for i, c in enumerate(CASES)]
)
def test_a_bias_the_model_cannot_take_is_exit_2(
    text: str, path: str, words: list[str], tmp_path: Path
) -> None:
    """The bad-input corpus's oracle (one line, exit 2, the file and key path, nothing
    written), and each message's words, with what was expected."""
    _run_bad(Bad(text, path, None, (*words, "expected")), tmp_path)


# ---------------------------------------------------------------------------
# Header, cost, explain, diff, float32
# ---------------------------------------------------------------------------


def test_the_header_says_relative_bias_per_layer_and_head_self_attention_and_the_offsets() -> None:
    positions = dict(conventions(model_of(decoder_only())))["positions"]
    assert positions.startswith("relative bias B[i,j] = b_rel[j − i]")
    assert "per layer and head" in positions and "self-attention only" in positions
    assert "offsets ±2" in positions  # max_len 3


def test_B_is_a_lookup_and_the_model_costs_what_it_costs_with_sinusoidal_positions() -> None:
    raw = random_config(np.random.default_rng(2), d_model=4, n_heads=2, decoder_layers=1,
                        positional="relative")  # fmt: skip
    ledger = cost.ledger(model_of(raw))
    looked_up = [c for c in ledger if c.stage in ("rel_bias", "biased")]
    assert len(looked_up) == 2 * 2 * 2  # two self-attention blocks, two heads, two steps
    assert all(c.macs == 0 and c.kind == "elementwise" for c in looked_up)
    plain = dict(raw, model={k: v for k, v in raw["model"].items() if k != "positional"})
    for stack in ("encoder", "decoder"):
        for block in plain["weights"][stack]:
            for head in block["self_attn"]["heads"]:
                del head["rel_bias"]
    a, b = cost.totals(ledger), cost.totals(cost.ledger(model_of(plain)))
    assert a.by_kind == b.by_kind and a.total == b.total


def test_explain_shows_the_offset_the_index_and_the_sum() -> None:
    code, out, err = invoke("explain", "encoder.0.self_attn.h0.rel_bias", FIXTURE, "--cell", "2,0",
                            "--format", "json")  # fmt: skip
    assert code == 0, err
    e = json.loads(out)
    assert e["lines"] == ["encoder.0.self_attn.h0.rel_bias[2,0] = b_rel[h0][0 − 2] = b_rel[-2] "
                          "= rel_bias[0] = -1"]  # fmt: skip
    assert e["result"] == -1 and e["agrees"]
    assert "offset j − i = -2" in e["where"][0] and "2 − 2 = 0" in e["where"][0]
    code, out, err = invoke("explain", "encoder.0.self_attn.h0.biased", FIXTURE, "--cell", "0,2",
                            "--format", "json")  # fmt: skip
    e = json.loads(out)
    assert e["lines"] == [
        "encoder.0.self_attn.h0.biased[0,2] = scaled[0,2] + B[0,2] = 0.5 + 2 = 2.5"
    ]


def test_explain_finds_the_row_of_a_cached_step_at_its_position() -> None:
    """generate --trace with the cache: row 0 of t2's B is position 2."""
    from trace_tf import generate as gen
    from trace_tf.explain import explain
    from trace_tf.trace import Tracer

    cfg = model_of(decoder_only(heads=[{"rel_bias": TABLE}]) | {"target": ["a"],
                                                               "tokens": {"bos": "a"}})  # fmt: skip
    tr = Tracer()
    tr.name_all(cfg.named_arrays())
    gen.run(cfg, gen.settings(greedy=True, max_tokens=3), tr)
    step = tr.trace["t2.decoder.0.self_attn.h0.rel_bias"]
    assert step.value.tolist() == [[-1, 0.5, 0]]  # b(−2), b(−1), b(0)
    assert "(2 + i)" in step.formula
    e = explain(cfg, tr.trace, step, (0, 0))
    assert e.result == -1 and e.agrees and "query position 2" in e.where[0]


def test_diff_against_relative_positions() -> None:
    code, out, err = invoke(
        "diff", "hello", "--set-b", "model.positional=relative", "--format", "json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["only_a"] == ["encoder.pe", "decoder.pe"]
    heads = [f"{s}.0.self_attn.h{h}" for s in ("encoder", "decoder") for h in (0, 1)]
    assert data["only_b"] == [f"{p}.{n}" for p in heads for n in ("rel_bias", "biased")]


def test_float32_rounds_the_table_once() -> None:
    table = [0.1, 0.2, 0.3, 0.4, 0.5]
    cfg = config_from(decoder_only(heads=[{"rel_bias": table}]), dtype="float32")
    assert isinstance(cfg, Config)
    trace = run(cfg, "full")
    B = trace.value("decoder.0.self_attn.h0.rel_bias")
    t = np.float32(table)
    assert (
        B.dtype == np.float32 and trace.value("decoder.0.self_attn.h0.biased").dtype == np.float32
    )
    assert B.tolist() == [[t[2], t[3], t[4]], [t[1], t[2], t[3]], [t[0], t[1], t[2]]]
    code, out, err = invoke("step", FIXTURE, "--dtype", "float32", "--stage", "biased",
                            "--format", "json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["steps"][0]["value"][0] == [1, 1, 2.5]  # exact in float32 too
