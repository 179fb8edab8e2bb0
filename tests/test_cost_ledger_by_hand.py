"""`trace-tf cost` and `trace-tf stages` against a ledger written out here from the
SPEC (§1-§3) and README's counting conventions alone: every row (path, shape,
multiply-adds) in order, for configs over the stack layouts, heads, norm positions,
positions, score functions, d_ff, temperature and masks. Nothing here calls the
engine's cost code to get the expected numbers; the config's sizes are read from
the plain data given, with the SPEC's defaults."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from conftest import config_from
from typer.testing import CliRunner

from trace_tf import cost
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import run
from trace_tf.stages import STAGES, stage_of

runner = CliRunner()

Row = tuple[str, tuple[int, ...], int]  # path, shape, multiply-adds


def _sizes(m: dict[str, Any], vocab: int) -> dict[str, Any]:
    """The model's sizes with the SPEC §2 defaults."""
    d = m["d_model"]
    H = m.get("n_heads", 1)
    dk = m.get("d_k", d // H)
    pre = m.get("norm_position", "post") == "pre"
    score = m.get("score", "scaled_dot")
    return {
        "d": d, "H": H, "dk": dk, "dv": m.get("d_v", dk), "dff": m.get("d_ff", 4 * d),
        "da": m.get("d_a", dk), "enc": m.get("encoder_layers", 1),
        "dec": m.get("decoder_layers", 0), "pos": m.get("positional", "sinusoidal"),
        "pre": pre, "final": m.get("final_norm", pre), "rms": m.get("norm", "layer") == "rms",
        "score": score, "V": vocab,
    }  # fmt: skip


def expected_ledger(data: dict[str, Any]) -> list[Row]:
    s = _sizes(data["model"], len(data["vocab"]))
    d, H, dk, dv, dff, da = s["d"], s["H"], s["dk"], s["dv"], s["dff"], s["da"]
    pad = data.get("tokens", {}).get("pad")
    src = list(data.get("source", [])) if s["enc"] else []
    tgt = list(data.get("target", [data["tokens"]["bos"]])) if s["dec"] else []
    rows: list[Row] = []

    def add(path: str, shape: tuple[int, ...], macs: int = 0) -> None:
        rows.append((path, shape, macs))

    def norm(prefix: str, L: int) -> None:
        for stat in ("rms",) if s["rms"] else ("mean", "var"):
            add(f"{prefix}.{stat}", (L, 1))
        add(prefix, (L, d))

    def attention(p: str, Lq: int, Lk: int, masked: bool, rope: bool) -> None:
        if s["pre"]:
            norm(f"{p}.norm", Lq)
        for h in range(H):
            a = f"{p}.h{h}"
            if rope:  # the projections are q_raw, k_raw; q, k their rotation (no products)
                add(f"{a}.q_raw", (Lq, dk), Lq * d * dk)
                add(f"{a}.q", (Lq, dk))
                add(f"{a}.k_raw", (Lk, dk), Lk * d * dk)
                add(f"{a}.k", (Lk, dk))
            else:
                add(f"{a}.q", (Lq, dk), Lq * d * dk)
                add(f"{a}.k", (Lk, dk), Lk * d * dk)
            add(f"{a}.v", (Lk, dv), Lk * d * dv)
            if s["score"] == "additive":  # v_a · tanh(q W_a_q + k W_a_k) for each pair
                add(f"{a}.q_a", (Lq, da), Lq * dk * da)
                add(f"{a}.k_a", (Lk, da), Lk * dk * da)
                add(f"{a}.tanh", (Lq, Lk, da))
                add(f"{a}.scores", (Lq, Lk), Lq * Lk * da)
            elif s["score"] == "bilinear":  # (q W_b) · k
                add(f"{a}.q_b", (Lq, dk), Lq * dk * dk)
                add(f"{a}.scores", (Lq, Lk), Lq * Lk * dk)
            else:  # dot, scaled_dot: q · k; gaussian: one term per feature of each pair
                add(f"{a}.scores", (Lq, Lk), Lq * Lk * dk)
            add(f"{a}.scaled", (Lq, Lk))
            if masked:
                add(f"{a}.masked", (Lq, Lk))
            add(f"{a}.softmax", (Lq, Lk))
            add(f"{a}.context", (Lq, dv), Lq * Lk * dv)
        add(f"{p}.concat", (Lq, H * dv))
        add(f"{p}.wo", (Lq, d), Lq * H * dv * d)
        add(f"{p}.residual", (Lq, d))
        if not s["pre"]:
            norm(f"{p}.norm", Lq)

    def ffn(p: str, L: int) -> None:
        if s["pre"]:
            norm(f"{p}.norm", L)
        add(f"{p}.hidden", (L, dff), L * d * dff)
        add(f"{p}.act", (L, dff))
        add(f"{p}.out", (L, d), L * dff * d)
        add(f"{p}.residual", (L, d))
        if not s["pre"]:
            norm(f"{p}.norm", L)

    def stack(name: str, seq: list[str], layers: int, blocks: list[str]) -> None:
        L = len(seq)
        add(f"{name}.embed", (L, d))
        if s["pos"] in ("sinusoidal", "learned"):
            add(f"{name}.pe", (L, d))
        add(f"{name}.input", (L, d))
        self_masked = name == "decoder" or pad in seq  # causal, or pads as keys
        cross_masked = name == "decoder" and s["enc"] > 0 and pad in src
        if self_masked:
            add(f"{name}.mask", (L, L))
        if cross_masked:
            add("decoder.cross_mask", (L, len(src)))
        for layer in range(layers):
            for block in blocks:
                if block == "self_attn":
                    attention(f"{name}.{layer}.self_attn", L, L, self_masked, s["pos"] == "rope")
                else:  # RoPE applies to self-attention only
                    attention(f"{name}.{layer}.cross_attn", L, len(src), cross_masked, False)
            ffn(f"{name}.{layer}.ffn", L)
        if s["final"]:
            norm(f"{name}.final_norm", L)
        add(f"{name}.output", (L, d))

    if s["enc"]:
        stack("encoder", src, s["enc"], ["self_attn"])
    if s["dec"]:
        blocks = ["self_attn", "cross_attn"] if s["enc"] else ["self_attn"]
        stack("decoder", tgt, s["dec"], blocks)
    L_out = len(tgt) if s["dec"] else len(src)
    add("logits", (L_out, s["V"]), L_out * d * s["V"])
    add("probs", (L_out, s["V"]))
    return rows


VOCAB = ["a", "b", "c", "P", "S", "E"]
TOKENS = {"bos": "S", "eos": "E"}
PADS = {**TOKENS, "pad": "P"}


def _case(model: dict[str, Any], source: Any = None, target: Any = None, pad: bool = False):  # type: ignore[no-untyped-def]
    data: dict[str, Any] = {"model": model, "vocab": VOCAB, "tokens": PADS if pad else TOKENS}
    if source is not None:
        data["source"] = source
    if target is not None:
        data["target"] = target
    return data


CASES: dict[str, dict[str, Any]] = {
    "encoder_only_one_head": _case(
        {"d_model": 4, "decoder_layers": 0}, ["a", "b", "c"]),
    "encoder_only_3_heads_two_layers_pads_d_ff_6": _case(
        {"d_model": 6, "n_heads": 3, "encoder_layers": 2, "d_ff": 6},
        ["a", "P", "b", "P"], pad=True),
    "enc_dec_post_2_heads_d_k_d_v_given": _case(
        {"d_model": 4, "n_heads": 2, "d_k": 3, "d_v": 5, "decoder_layers": 1, "d_ff": 7},
        ["a", "b"], ["S", "a", "b"]),
    "enc_dec_pre_rms_rope_temperature": _case(
        {"d_model": 4, "n_heads": 2, "decoder_layers": 2, "norm_position": "pre",
         "norm": "rms", "positional": "rope", "temperature": 0.25},
        ["a", "b", "c"], ["S", "b"]),
    "enc_dec_pads_both_sides_learned": _case(
        {"d_model": 4, "n_heads": 1, "decoder_layers": 1, "positional": "learned",
         "max_len": 8},
        ["a", "P", "b"], ["S", "P"], pad=True),
    "pad_set_but_absent_none_positions": _case(
        {"d_model": 4, "n_heads": 2, "decoder_layers": 1, "positional": "none"},
        ["a", "b"], ["S"], pad=True),
    "decoder_only_no_target": _case(
        {"d_model": 4, "n_heads": 2, "encoder_layers": 0, "decoder_layers": 2}),
    "decoder_only_rope_pre_final_off": _case(
        {"d_model": 6, "n_heads": 3, "encoder_layers": 0, "decoder_layers": 1,
         "positional": "rope", "norm_position": "pre", "final_norm": False},
        target=["S", "a", "b", "c"]),
    "post_with_final_norm": _case(
        {"d_model": 4, "decoder_layers": 1, "final_norm": True}, ["a"], ["S", "a"]),
    "dot": _case({"d_model": 4, "n_heads": 2, "decoder_layers": 1, "score": "dot"},
                 ["a", "b", "c"], ["S", "a"]),
    "additive_d_a_3": _case(
        {"d_model": 4, "n_heads": 2, "decoder_layers": 1, "score": "additive", "d_a": 3},
        ["a", "b", "c"], ["S", "a"]),
    "additive_d_a_default_rope_pads": _case(
        {"d_model": 4, "n_heads": 2, "decoder_layers": 1, "score": "additive",
         "positional": "rope"},
        ["a", "P"], ["S", "a", "P"], pad=True),
    "bilinear_d_k_3": _case(
        {"d_model": 4, "n_heads": 2, "d_k": 3, "decoder_layers": 1, "score": "bilinear"},
        ["a", "b"], ["S", "a", "b"]),
    "gaussian_pre": _case(
        {"d_model": 4, "n_heads": 2, "decoder_layers": 1, "score": "gaussian",
         "norm_position": "pre"},
        ["a", "b", "c"], ["S"]),
}  # fmt: skip


def _cfg(data: dict[str, Any]) -> Config:
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    return cfg


@pytest.mark.parametrize("name", CASES)
def test_every_row_of_the_ledger_is_the_hand_count(name: str) -> None:
    data = CASES[name]
    got = [(c.path, c.shape, c.macs) for c in cost.ledger(_cfg(data))]
    want = expected_ledger(data)
    assert [r[0] for r in got] == [r[0] for r in want]  # names and order first
    for g, w in zip(got, want, strict=True):
        assert g == w, name


@pytest.mark.parametrize("name", CASES)
def test_the_recorded_steps_are_the_ledger_and_the_spec_names(name: str) -> None:
    """What a run records (the steps `stages` documents) is the same list, with the
    same shapes, and each path is one of the stage registry's."""
    data = CASES[name]
    trace = run(_cfg(data))
    want = expected_ledger(data)
    assert [(s.path, s.shape) for s in trace] == [(p, sh) for p, sh, _ in want]
    for s in trace:
        entry = stage_of(s.path)
        assert entry is not None and s.path.rsplit(".", 1)[-1] in (entry.name, "norm"), s.path
        assert s.stage == entry.name, s.path


@pytest.mark.parametrize("name", CASES)
def test_the_totals_and_the_json_are_the_sum_of_the_hand_rows(name: str) -> None:
    data = CASES[name]
    want = expected_ledger(data)
    by_stage: dict[str, int] = {}
    for path, _, macs in want:
        if macs:
            stage = path.rsplit(".", 1)[-1]
            by_stage[stage] = by_stage.get(stage, 0) + macs
    kind_of = {"scores": "attention", "context": "attention", "hidden": "ffn", "out": "ffn",
               "logits": "output"}  # fmt: skip
    by_kind = dict.fromkeys(("projection", "attention", "ffn", "output"), 0)
    for stage, macs in by_stage.items():
        by_kind[kind_of.get(stage, "projection")] += macs
    data_file = json.dumps(data)
    result = runner.invoke(app, ["cost", "-", "--format", "json"], input=data_file)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) == {"trace_tf", "title", "ledger", "totals"}
    assert out["totals"] == {"by_stage": by_stage, "by_kind": by_kind,
                             "total": sum(by_stage.values())}  # fmt: skip
    for row, (path, shape, macs) in zip(out["ledger"], want, strict=True):
        assert (row["path"], tuple(row["shape"]), row["macs"]) == (path, shape, macs)
        assert row["stage"] == path.rsplit(".", 1)[-1]
        assert row["macs"] == (math.prod(row["terms"]) if row["terms"] else 0)
        want_kind = kind_of.get(row["stage"], "projection") if macs else "elementwise"
        assert row["kind"] == want_kind, path


def _vary(data: dict[str, Any], spec: str) -> dict[str, Any]:
    result = runner.invoke(
        app, ["cost", "-", "--vary", spec, "--repeat", "1", "--format", "json"],
        input=json.dumps(data),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["vary"]


def _by_kind_by_hand(data: dict[str, Any]) -> dict[str, int]:
    kinds = dict.fromkeys(("projection", "attention", "ffn", "output"), 0)
    for path, _, macs in expected_ledger(data):
        stage = path.rsplit(".", 1)[-1]
        kind = {"scores": "attention", "context": "attention", "hidden": "ffn", "out": "ffn",
                "logits": "output"}.get(stage, "projection")  # fmt: skip
        kinds[kind] += macs
    return kinds


@pytest.mark.parametrize("name", ["enc_dec_post_2_heads_d_k_d_v_given", "additive_d_a_3",
                                  "decoder_only_no_target", "encoder_only_one_head"])  # fmt: skip
def test_vary_L_rows_are_the_hand_ledger_of_the_repeated_tokens(name: str) -> None:
    data = CASES[name]
    out = _vary(data, "L=2,4,8")
    for row in out["rows"]:
        L = row["value"]
        resized = dict(data)
        bos = data["tokens"]["bos"]
        for key in ("source", "target"):
            seq = data.get(key, [bos] if key == "target" else None)
            if seq is not None:
                resized[key] = [seq[i % len(seq)] for i in range(L)]
        assert row["by_kind"] == _by_kind_by_hand(resized), (name, L)
    # projections, the FFN and the output grow as L, attention as L² (both sides grow)
    assert out["exponents"]["projection"] == pytest.approx(1.0)
    assert out["exponents"]["attention"] == pytest.approx(2.0)
    assert out["exponents"]["ffn"] == pytest.approx(1.0)
    assert out["exponents"]["output"] == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["enc_dec_post_2_heads_d_k_d_v_given", "additive_d_a_3",
                                  "bilinear_d_k_3", "gaussian_pre"])  # fmt: skip
def test_vary_D_rows_are_the_hand_ledger_with_the_default_widths(name: str) -> None:
    data = CASES[name]
    out = _vary(data, "D=8,16,32")
    for row in out["rows"]:
        m = {k: v for k, v in data["model"].items() if k not in ("d_k", "d_v", "d_ff", "d_a")}
        assert row["by_kind"] == _by_kind_by_hand({**data, "model": {**m, "d_model": row["value"]}})
    # d_k, d_v, d_a follow D / H and d_ff 4 D: projections and the FFN grow as D²,
    # attention and the output as D
    assert out["exponents"]["projection"] == pytest.approx(2.0)
    assert out["exponents"]["attention"] == pytest.approx(1.0)
    assert out["exponents"]["ffn"] == pytest.approx(2.0)
    assert out["exponents"]["output"] == pytest.approx(1.0)


def test_stages_lists_each_recorded_stage_with_the_spec_names() -> None:
    result = runner.invoke(app, ["stages", "--format", "json"])
    assert result.exit_code == 0, result.output
    listed = {s["stage"] for s in json.loads(result.stdout)["stages"]}
    assert listed == {s.name for s in STAGES}
    recorded = {
        stage_of(path).name  # type: ignore[union-attr]
        for data in CASES.values()
        for path, _, _ in expected_ledger(data)
    }
    # SPEC §3's last parts, plus the score functions' and RMSNorm's own steps
    spec = {"embed", "pe", "input", "mask", "cross_mask", "q", "k", "v", "q_raw", "k_raw",
            "scores", "scaled", "masked", "softmax", "context", "concat", "wo", "residual",
            "norm", "mean", "var", "rms", "hidden", "act", "out", "final_norm", "output",
            "logits", "probs", "q_a", "k_a", "tanh", "q_b"}  # fmt: skip
    assert recorded == spec
    assert recorded <= listed
