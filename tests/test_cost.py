"""`trace-tf cost`: multiply-adds against hand counts, and --vary (issue 6)."""

from __future__ import annotations

import json
from typing import Any

import yaml
from conftest import config_from
from typer.testing import CliRunner

from trace_tf import cost
from trace_tf.cli import app
from trace_tf.config import Config

runner = CliRunner()

# d_model 6, 2 heads of d_k = d_v = 3, d_ff 8, one encoder and one decoder layer,
# 5 words, a 3-token source and a 2-token target.
SMALL: dict[str, Any] = {
    "model": {"d_model": 6, "n_heads": 2, "d_ff": 8, "encoder_layers": 1, "decoder_layers": 1},
    "vocab": ["a", "b", "c", "SOS", "EOS"],
    "tokens": {"bos": "SOS", "eos": "EOS"},
    "source": ["a", "b", "c"],
    "target": ["SOS", "a"],
}


def small() -> Config:
    cfg = config_from(SMALL)
    assert isinstance(cfg, Config)
    return cfg


def test_each_step_counts_rows_inner_columns_by_hand() -> None:
    by_path = {c.path: c for c in cost.ledger(small())}
    # encoder, L = 3: Q = X W_q is 3 x 6 times 6 x 3
    assert by_path["encoder.0.self_attn.h0.q"].macs == 3 * 6 * 3
    assert by_path["encoder.0.self_attn.h0.q"].terms == (3, 6, 3)
    assert by_path["encoder.0.self_attn.h1.scores"].macs == 3 * 3 * 3  # L_q L_k d_k
    assert by_path["encoder.0.self_attn.h1.context"].macs == 3 * 3 * 3  # L_q L_k d_v
    assert by_path["encoder.0.self_attn.wo"].macs == 3 * 6 * 6  # L (H d_v) d_model
    assert by_path["encoder.0.ffn.hidden"].macs == 3 * 6 * 8
    assert by_path["encoder.0.ffn.out"].macs == 3 * 8 * 6
    # cross-attention: queries from the 2 target rows, keys and values from 3 source rows
    assert by_path["decoder.0.cross_attn.h0.q"].macs == 2 * 6 * 3
    assert by_path["decoder.0.cross_attn.h0.k"].macs == 3 * 6 * 3
    assert by_path["decoder.0.cross_attn.h0.scores"].macs == 2 * 3 * 3
    assert by_path["logits"].macs == 2 * 6 * 5
    softmax = by_path["encoder.0.self_attn.h0.softmax"]
    assert softmax.kind == "elementwise" and softmax.macs == 0 and softmax.shape == (3, 3)


def test_totals_per_kind_and_overall_by_hand() -> None:
    t = cost.totals(cost.ledger(small()))
    enc_proj = 2 * 3 * (3 * 6 * 3) + 3 * 6 * 6  # q, k, v of 2 heads; W_o
    dec_self_proj = 2 * 3 * (2 * 6 * 3) + 2 * 6 * 6
    cross_proj = 2 * (2 * 6 * 3 + 2 * 3 * 6 * 3) + 2 * 6 * 6  # q from 2 rows, k and v from 3
    attention = 2 * 2 * (3 * 3 * 3) + 2 * 2 * (2 * 2 * 3) + 2 * 2 * (2 * 3 * 3)
    ffn = 2 * (3 * 6 * 8) + 2 * (2 * 6 * 8)
    output = 2 * 6 * 5
    assert t.by_kind == {
        "projection": enc_proj + dec_self_proj + cross_proj,
        "attention": attention,
        "ffn": ffn,
        "output": output,
    }
    assert t.total == 1080 + 228 + 480 + 60 == sum(t.by_kind.values())
    assert t.by_stage["scores"] == t.by_stage["context"] == attention // 2


def test_cost_command_table_and_json(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    path = tmp_yaml(yaml.safe_dump(SMALL))
    result = runner.invoke(app, ["cost", path])
    assert result.exit_code == 0, result.output
    assert "encoder.0.self_attn.h0.q" in result.stdout and "L_q·d_model·d_k" in result.stdout
    result = runner.invoke(app, ["cost", path, "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["totals"]["total"] == 1848
    q = next(x for x in data["ledger"] if x["path"] == "decoder.0.self_attn.h1.q")
    assert q["macs"] == 2 * 6 * 3 and q["shape"] == [2, 3] and q["kind"] == "projection"


def test_vary_L_has_one_row_per_value_and_attention_grows_as_L_squared(tmp_yaml) -> None:  # type: ignore[no-untyped-def]
    path = tmp_yaml(yaml.safe_dump(SMALL))
    args = ["cost", path, "--vary", "L=2,4,8", "--repeat", "1", "--format", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    vary = json.loads(result.stdout)["vary"]
    assert [r["value"] for r in vary["rows"]] == [2, 4, 8]
    # L = 4 (source and target): 3 attentions x 2 heads x (scores + context) of 4 x 4 x 3
    assert vary["rows"][1]["by_kind"]["attention"] == 3 * 2 * 2 * (4 * 4 * 3)
    assert vary["exponents"]["attention"] == 2.0
    assert vary["exponents"]["projection"] == vary["exponents"]["ffn"] == 1.0
    last = vary["rows"][-1]
    assert last["predicted"] == last["measured"] > 0  # normalised to the largest row
    table = runner.invoke(app, ["cost", path, "--vary", "L=2,4,8", "--repeat", "1"])
    assert table.exit_code == 0 and "pred. ms" in table.stdout and "meas. ms" in table.stdout


def test_vary_D_draws_every_weight_at_the_new_width() -> None:
    result = runner.invoke(app, ["cost", "--vary", "D=4,8", "--repeat", "1", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["vary"]["rows"]
    # hello: 2 heads, source 2 tokens, target [SOS]; D = 8 gives d_k 4, d_ff 32
    enc_q = 2 * 8 * 4
    assert rows[1]["by_kind"]["ffn"] == 2 * (2 * 8 * 32) + 2 * (1 * 8 * 32)
    assert rows[1]["by_kind"]["projection"] % enc_q == 0
    assert json.loads(result.stdout)["vary"]["exponents"]["ffn"] == 2.0


def test_bad_vary_is_exit_2() -> None:
    for bad in ("X=1,2", "L=", "L=a,b", "L=0,4", "L"):
        result = runner.invoke(app, ["cost", "--vary", bad])
        assert result.exit_code == 2, (bad, result.output)
        assert "--vary" in result.stderr


def test_repeat_is_bounded() -> None:
    # a mistyped --repeat 1000000 would time the runs for hours
    result = runner.invoke(app, ["cost", "--vary", "L=2", "--repeat", "101"])
    assert result.exit_code == 2 and "1<=x<=100" in result.stderr


# The audit's c03 (/tmp/numaudit/cfg/c03_rope_deconly.yaml): decoder-only, pre-norm,
# RoPE; d_model 8, 2 heads of d_k = d_v = 4, d_ff 32, 2 layers, 6 target tokens, V 7.
ROPE_DECODER_ONLY: dict[str, Any] = {
    "model": {
        "d_model": 8,
        "n_heads": 2,
        "decoder_layers": 2,
        "encoder_layers": 0,
        "positional": "rope",
        "pe_base": 50,
        "norm_position": "pre",
        "seed": 11,
    },
    "vocab": ["p", "q", "r", "s", "PAD", "BOS", "EOS"],
    "tokens": {"bos": "BOS", "eos": "EOS", "pad": "PAD"},
    "target": ["BOS", "p", "q", "PAD", "r", "s"],
}


def test_rope_rotation_is_elementwise_and_the_projections_are_q_raw_k_raw_by_hand() -> None:
    cfg = config_from(ROPE_DECODER_ONLY)
    assert isinstance(cfg, Config)
    by_path = {c.path: c for c in cost.ledger(cfg)}
    L, d, dk, dff, V = 6, 8, 4, 32, 7
    for name in ("q_raw", "k_raw", "v"):
        c = by_path[f"decoder.1.self_attn.h1.{name}"]
        assert (c.kind, c.terms, c.macs) == ("projection", (L, d, dk), 6 * 8 * 4)
    for name in ("q", "k"):  # RoPE(q_raw): a 2 x 2 rotation of each column pair
        c = by_path[f"decoder.0.self_attn.h0.{name}"]
        assert (c.kind, c.macs, c.shape) == ("elementwise", 0, (L, dk))
    t = cost.totals(cost.ledger(cfg))
    per_layer_projection = 2 * 3 * (L * d * dk) + L * (2 * dk) * d  # q_raw, k_raw, v; wo
    assert per_layer_projection == 1536
    assert t.by_kind == {
        "projection": 2 * per_layer_projection,  # 3072
        "attention": 2 * 2 * 2 * (L * dk * L),  # scores and context, 2 heads, 2 layers
        "ffn": 2 * 2 * (L * d * dff),
        "output": L * d * V,
    }
    assert t.total == 3072 + 1152 + 6144 + 336 == 10704
    assert "q" not in t.by_stage and "k" not in t.by_stage


def test_rope_costs_what_the_same_model_with_sinusoidal_positions_costs() -> None:
    """The rotation adds no product: every kind's count equals the unrotated model's,
    decoder-only and encoder-decoder (whose cross-attention is never rotated)."""
    enc_dec = {**SMALL, "model": {**SMALL["model"], "positional": "rope"}}
    for data in (ROPE_DECODER_ONLY, enc_dec):
        rope, plain = (
            cost.totals(cost.ledger(config_from(d)))  # type: ignore[arg-type]
            for d in (data, {**data, "model": {**data["model"], "positional": "sinusoidal"}})
        )
        assert rope.by_kind == plain.by_kind and rope.total == plain.total
