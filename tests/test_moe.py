"""A mixture of experts (model.experts; Mixtral, Qwen-MoE): the router, its top-k with
ties, the renormalisation, each expert on its own tokens and the weighted sum, by hand in
numpy; the steps, their selection, explain, cost, weights from every place, and the
drawn weights' paths. (Every step against tests/reference_torch.py:
tests/test_engine_reference.py; against Hugging Face: tests/test_hf_mixtral.py.)"""

from __future__ import annotations

import copy
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import config_from
from random_configs import LLAMA, random_config
from typer.testing import CliRunner

from trace_tf import cost
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.explain import explain
from trace_tf.runner import run

runner = CliRunner()


def _invoke(*args: str) -> Any:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "json" in args else result.stdout


def _mixtral(normalize: bool | None = None, k: int = 2, E: int = 4) -> dict[str, Any]:
    """Mixtral's shape, small: 2 decoder layers, E experts, every array given."""
    return random_config(
        np.random.default_rng(5),
        d_model=6,
        n_heads=2,
        d_ff=5,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        biases=False,
        tgt_len=6,
        experts=E,
        experts_top_k=k,
        experts_normalize=normalize,
    )


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def _by_hand(X: np.ndarray, ffn: dict[str, Any], k: int, normalize: bool) -> dict[str, Any]:
    """The mixture by hand: logits, softmax, each row's k largest (stable: the lowest index
    first among equals), their weights, each expert's SwiGLU on its rows, the sum."""
    W_r = np.array(ffn["router"])
    R = X @ W_r
    P = np.exp(R - R.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    W = np.zeros_like(P)
    chosen = []
    for i, row in enumerate(P):
        top = sorted(range(len(row)), key=lambda e: (-row[e], e))[:k]
        chosen.append(top)
        total = sum(row[e] for e in top)
        for e in top:
            W[i, e] = row[e] / total if normalize else row[e]
    out = np.zeros_like(X)
    experts = {}
    for e, fw in enumerate(ffn["experts"]):
        rows = [i for i in range(len(X)) if e in chosen[i]]
        if not rows:
            continue
        Xe = X[rows]
        H = Xe @ np.array(fw["W_1"])
        U = Xe @ np.array(fw["W_3"])
        Y = (_silu(H) * U) @ np.array(fw["W_2"])
        experts[e] = {"rows": rows, "x": Xe, "hidden": H, "up": U, "out": Y}
        for r, i in enumerate(rows):
            out[i] += W[i, e] * Y[r]
    return {"router": R, "route_prob": P, "routed": W, "experts": experts, "out": out}


@pytest.mark.parametrize("normalize", [True, False])
def test_every_mixture_step_by_hand(normalize: bool) -> None:
    raw = _mixtral(normalize)
    trace = run(config_from(raw), "full")
    unused = 0
    for l in range(2):
        p = f"decoder.{l}.ffn."
        ffn = raw["weights"]["decoder"][l]["ffn"]
        want = _by_hand(trace.value(p + "norm"), ffn, 2, normalize)
        for name in ("router", "route_prob", "routed", "out"):
            np.testing.assert_allclose(trace.value(p + name), want[name], rtol=1e-12, atol=1e-14)
        W = trace.value(p + "routed")
        assert ((W > 0).sum(axis=1) == 2).all()
        sums = W.sum(axis=1)
        if normalize:
            np.testing.assert_allclose(sums, 1, rtol=1e-15)
        else:
            assert (sums < 1).all()
        for e in range(4):
            if e not in want["experts"]:  # an expert no token chose records nothing
                assert not [s for s in trace.paths() if s.startswith(f"{p}e{e}.")]
                unused += 1
                continue
            hand = want["experts"][e]
            rows = [raw["target"][i] for i in hand["rows"]]
            for name in ("x", "hidden", "up", "out"):
                step = trace[f"{p}e{e}.{name}"]
                np.testing.assert_allclose(step.value, hand[name], rtol=1e-12, atol=1e-14)
                assert step.rows == tuple(rows)  # labelled with the tokens routed to it
        assert trace[p + "router"].cols == ("e0", "e1", "e2", "e3")
    assert unused  # (this config leaves an expert idle somewhere: that case is covered)


def test_the_renormalisation_changes_the_output() -> None:
    on = run(config_from(_mixtral(True)), "full")
    off = run(config_from(_mixtral(False)), "full")
    assert np.abs(on.value("decoder.0.ffn.out") - off.value("decoder.0.ffn.out")).max() > 1e-2


def _tied(k: int) -> dict[str, Any]:
    """One token, whose router gives experts 1 and 3 the logit 0 exactly (their columns of
    W_r zero), expert 0 the logit 5 (k 2: first, then the tie) or −5 (k 1: the tie first),
    expert 2 −6: W_r's columns 0 and 2 are multiples of the token's x (what the router reads)."""
    raw = _mixtral(True, k=k)
    raw["target"] = raw["target"][:1]
    x = run(config_from(raw), "full").value("decoder.0.ffn.norm")[0]
    W_r = np.zeros((6, 4))
    W_r[:, 0] = (5.0 if k == 2 else -5.0) * x / (x @ x)
    W_r[:, 2] = -6.0 * x / (x @ x)
    raw["weights"]["decoder"][0]["ffn"]["router"] = W_r.tolist()
    return raw


@pytest.mark.parametrize("k", [1, 2])
def test_a_tie_goes_to_the_lowest_index(k: int) -> None:
    raw = _tied(k)
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    trace = run(cfg, "full")
    R = trace.value("decoder.0.ffn.router")[0]
    np.testing.assert_allclose(R, [5.0 if k == 2 else -5.0, 0, -6, 0], atol=1e-12)
    P = trace.value("decoder.0.ffn.route_prob")[0]
    assert R[1] == R[3] == 0 and P[1] == P[3]  # exactly equal
    W = trace.value("decoder.0.ffn.routed")[0]
    if k == 1:  # e1 and e3 tie for the top: e1 wins, its weight 1
        assert list(W) == [0.0, 1.0, 0.0, 0.0]
    else:  # e0 first, e1 and e3 tie for second: e1 wins
        assert W[2] == W[3] == 0 and W[0] > W[1] > 0
        assert W[0] == pytest.approx(P[0] / (P[0] + P[1]), rel=1e-15)
    assert "decoder.0.ffn.e1.out" in trace and "decoder.0.ffn.e3.out" not in trace
    e = explain(cfg, trace, trace["decoder.0.ffn.routed"], (0, 3))
    assert e.result == 0.0 and "of equal ones the lowest index" in " ".join(e.where)


def test_the_steps_are_selected_by_stage_layer_and_pattern(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(_mixtral()), encoding="utf-8")
    data = _invoke("step", str(path), "--stage", "routed", "--format", "json")
    assert [s["path"] for s in data["steps"]] == ["decoder.0.ffn.routed", "decoder.1.ffn.routed"]
    data = _invoke("step", str(path), "--stage", "router", "--layer", "1", "--format", "json")
    assert [s["path"] for s in data["steps"]] == ["decoder.1.ffn.router"]
    data = _invoke("step", str(path), "--stage", "decoder.0.ffn.e*.out", "--format", "json")
    paths = [s["path"] for s in data["steps"]]
    assert paths and all(p.startswith("decoder.0.ffn.e") for p in paths)
    # --layer 1 is the layer, never expert 1 (e1), nor --stage out of layer 0's experts
    data = _invoke("step", str(path), "--stage", "out", "--layer", "1", "--format", "json")
    assert {s["path"].split(".")[1] for s in data["steps"]} == {"1"}
    assert "decoder.1.ffn.out" in [s["path"] for s in data["steps"]]
    data = _invoke("step", str(path), "--stage", "ffn", "--layer", "0", "--format", "json")
    assert "decoder.0.ffn.route_prob" in [s["path"] for s in data["steps"]]
    stages = {s["key"] for s in _invoke("stages", "--format", "json")["stages"]}
    assert {"router", "route_prob", "routed", "x"} <= stages


def test_the_header_states_the_conventions() -> None:
    from trace_tf.runner import conventions

    cfg = config_from(_mixtral(False, k=3))

    text = dict(conventions(cfg))["experts"]
    assert "mixture of 4 experts" in text and "the 3 of largest probability" in text
    assert "ties: the lowest index" in text and "not renormalised" in text
    assert "renormalised to sum to 1" in dict(conventions(config_from(_mixtral())))["experts"]


def test_explain_agrees_on_every_mixture_step() -> None:
    cfg = config_from(_mixtral())
    assert isinstance(cfg, Config)
    trace = run(cfg, "full")
    seen = set()
    for step in trace:
        if ".ffn." not in step.path or step.stage in ("norm", "rms", "residual"):
            continue
        for cell in [(0, 0), (step.shape[0] - 1, step.shape[1] - 1), (1 % step.shape[0], 2)]:
            e = explain(cfg, trace, step, cell)
            assert e.agrees, (step.path, cell, e.value, e.result)
            seen.add(step.stage)
    assert seen == {"router", "route_prob", "routed", "x", "hidden", "act", "up", "gated", "out"}
    # an unchosen expert's weight is 0, said so; a chosen one's written out
    W = trace.value("decoder.0.ffn.routed")
    i, e = 0, int(np.argmin(W[0]))
    lines = explain(cfg, trace, trace["decoder.0.ffn.routed"], (i, e))
    assert lines.result == 0.0 and "not chosen" in lines.chain[-1]
    e = int(np.argmax(W[0]))
    lines = explain(cfg, trace, trace["decoder.0.ffn.routed"], (i, e))
    assert lines.chain[0].startswith(f"P[0,{e}] / (P[0,{e}] + P[0,")


def test_cost_counts_the_token_expert_pairs_computed_not_E_dense_ffns() -> None:
    raw = _mixtral()
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    L, d, dff, E, k = 6, 6, 5, 4, 2
    ledger = cost.ledger(cfg)
    layer0 = [c for c in ledger if c.path.startswith("decoder.0.ffn.")]
    by_stage: dict[str, int] = {}
    for c in layer0:
        by_stage[c.stage] = by_stage.get(c.stage, 0) + c.macs
    assert by_stage["router"] == L * d * E
    # each of the L·k token-expert pairs: W_1, W_3 (d·d_ff each), W_2 (d_ff·d)
    assert by_stage["hidden"] == by_stage["up"] == L * k * d * dff
    out = {c.path: c.macs for c in layer0 if c.stage == "out"}
    assert out.pop("decoder.0.ffn.out") == L * k * d  # the weighted sum
    assert sum(out.values()) == L * k * dff * d
    assert sum(by_stage.values()) < L * d * E + E * 3 * L * d * dff  # not E dense FFNs


def test_the_experts_weights_are_drawn_under_their_paths_and_set_and_listed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "model: {d_model: 4, d_ff: 3, encoder_layers: 0, decoder_layers: 1, activation: swiglu,"
        " experts: 3, experts_top_k: 2, seed: 3}\nvocab: [a, b]\ntarget: [a, b, a]\n",
        encoding="utf-8",
    )
    cfg = config_from(
        {
            "model": {
                "d_model": 4,
                "d_ff": 3,
                "encoder_layers": 0,
                "decoder_layers": 1,
                "activation": "swiglu",
                "experts": 3,
                "experts_top_k": 2,
                "seed": 3,
            },
            "vocab": ["a", "b"],
            "target": ["a", "b", "a"],
        }
    )
    assert isinstance(cfg, Config)
    for key, shape in (("router", (4, 3)), ("experts.1.W_1", (4, 3)), ("experts.2.W_2", (3, 4))):
        rng = np.random.default_rng([3, zlib.crc32(f"decoder.0.ffn.{key}".encode())])
        np.testing.assert_array_equal(
            cfg.named_arrays()[f"weights.decoder.0.ffn.{key}"], rng.standard_normal(shape)
        )
    weights = _invoke("weights", str(path), "--format", "json")["weights"]
    listed = [w["path"] for w in weights if ".ffn." in w["path"]]
    assert listed[:4] == [
        "weights.decoder.0.ffn.router",
        "weights.decoder.0.ffn.experts.0.W_1",
        "weights.decoder.0.ffn.experts.0.W_3",
        "weights.decoder.0.ffn.experts.0.W_2",
    ]
    # --set one entry; an .npz array under its key path; the steps read them
    data = _invoke(
        "decode",
        str(path),
        "--format",
        "json",
        "--set",
        "weights.decoder.0.ffn.experts.1.W_1.0.0=5",
    )
    W_1 = cfg.named_arrays()["weights.decoder.0.ffn.experts.1.W_1"].copy()
    W_1[0, 0] = 5
    steps = {s["path"]: np.array(s["value"]) for s in data["steps"]}
    assert "decoder.0.ffn.e1.x" in steps  # (expert 1 has tokens in this config)
    np.testing.assert_allclose(steps["decoder.0.ffn.e1.hidden"], steps["decoder.0.ffn.e1.x"] @ W_1)
    router = np.arange(12.0).reshape(4, 3) / 10
    np.savez(
        tmp_path / "w.npz", **{"decoder.0.ffn.router": router, "decoder.0.ffn.experts.1.W_1": W_1}
    )
    with path.open("a", encoding="utf-8") as fh:
        fh.write("weights_file: w.npz\n")
    data = _invoke("decode", str(path), "--format", "json")
    steps = {s["path"]: np.array(s["value"]) for s in data["steps"]}
    np.testing.assert_allclose(
        steps["decoder.0.ffn.router"], steps["decoder.0.self_attn.norm"] @ router
    )
    weights = _invoke("weights", str(path), "--format", "json")["weights"]
    src = {w["path"]: w for w in weights}
    assert src["weights.decoder.0.ffn.experts.1.W_1"]["kind"] == "npz"
    assert src["weights.decoder.0.ffn.experts.0.W_1"]["kind"] == "drawn"


def test_json_npz_and_diff_carry_the_mixture(tmp_path: Path) -> None:
    import yaml

    raw = _mixtral()
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    out = tmp_path / "t.npz"
    result = runner.invoke(app, ["decode", str(path), "--format", "npz", "--output", str(out)])
    assert result.exit_code == 0, result.output
    with np.load(out) as arrays:
        assert "decoder.1.ffn.routed" in arrays.files
        trace = run(config_from(raw), "full")
        np.testing.assert_array_equal(
            arrays["decoder.1.ffn.routed"], trace.value("decoder.1.ffn.routed")
        )
    other = copy.deepcopy(raw)
    other["model"]["experts_normalize"] = False
    path_b = tmp_path / "n.yaml"
    path_b.write_text(yaml.safe_dump(other), encoding="utf-8")
    result = runner.invoke(app, ["diff", str(path), str(path_b), "--format", "json"])
    assert result.exit_code == 0, result.output[-500:]
    rows = {r["path"]: r for r in json.loads(result.stdout)["steps"]}
    assert rows["decoder.0.ffn.route_prob"]["status"] == "same"
    assert rows["decoder.0.ffn.routed"]["status"] == "differs"


# model.experts as a list (Qwen-MoE's mlp_only_layers): each decoder layer's number of
# experts, null for a dense FFN. Every step against tests/reference_torch.py:
# tests/test_engine_reference.py; against Hugging Face: tests/test_hf_qwen2_moe.py.


def _by_layer(experts: list[int | None], k: int = 2) -> dict[str, Any]:
    """Mixtral's shape with each decoder layer's own experts, every array given."""
    return random_config(
        np.random.default_rng(9),
        d_model=6,
        n_heads=2,
        d_ff=5,
        encoder_layers=0,
        decoder_layers=len(experts),
        **LLAMA,
        biases=False,
        tgt_len=6,
        experts=experts,
        experts_top_k=k,
    )


def test_a_list_of_equal_entries_is_the_single_value_step_for_step() -> None:
    from trace_tf.runner import conventions

    listed = config_from(_by_layer([3, 3]))
    single = copy.deepcopy(_by_layer([3, 3]))
    single["model"]["experts"] = 3
    one = config_from(single)
    assert isinstance(listed, Config) and isinstance(one, Config)
    assert listed.model == one.model and conventions(listed) == conventions(one)
    a, b = run(listed, "full"), run(one, "full")
    assert list(a.steps) == list(b.steps)
    for path in a.steps:
        assert np.array_equal(a.value(path), b.value(path)), path
    dense = copy.deepcopy(single)
    dense["model"] |= {"experts": [None, None], "experts_top_k": None}
    for layer in dense["weights"]["decoder"]:
        layer["ffn"] = {"norm": layer["ffn"]["norm"]} | layer["ffn"]["experts"][0]
    cfg = config_from(dense)
    assert isinstance(cfg, Config) and cfg.model.experts == 0 and not cfg.model.layer_experts


def test_a_dense_layer_among_mixtures_computes_its_ffn_by_hand() -> None:
    raw = _by_layer([4, None, 3])
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    assert [cfg.model.experts_of(l) for l in range(3)] == [4, 0, 3]
    trace = run(cfg, "full")
    assert "decoder.1.ffn.router" not in trace and "decoder.1.ffn.e0.x" not in trace.paths()
    assert trace.value("decoder.0.ffn.router").shape == (6, 4)
    assert trace.value("decoder.2.ffn.router").shape == (6, 3)
    # layer 1's FFN: the dense SwiGLU of its own W_1, W_3, W_2 on its normalised input
    ffn = raw["weights"]["decoder"][1]["ffn"]
    X = trace.value(trace["decoder.1.ffn.hidden"].inputs[0])
    W_1, W_3, W_2 = (np.array(ffn[k]) for k in ("W_1", "W_3", "W_2"))
    want = (_silu(X @ W_1) * (X @ W_3)) @ W_2
    np.testing.assert_allclose(trace.value("decoder.1.ffn.out"), want, rtol=1e-12, atol=1e-12)
    # the sparse layers by hand, as Mixtral's
    for l in (0, 2):
        X = trace.value(trace[f"decoder.{l}.ffn.router"].inputs[0])
        hand = _by_hand(X, raw["weights"]["decoder"][l]["ffn"], 2, True)
        np.testing.assert_allclose(trace.value(f"decoder.{l}.ffn.out"), hand["out"], atol=1e-12)


def test_experts_by_layer_in_header_explain_cost_and_size_bound() -> None:
    from trace_tf.config import OBJECT_COST, trace_size
    from trace_tf.runner import conventions

    cfg = config_from(_by_layer([4, None, 3]))
    assert isinstance(cfg, Config)
    text = dict(conventions(cfg))["experts"]
    assert "by layer: layer 0 4 experts, layer 1 dense (one FFN), layer 2 3 experts" in text
    trace = run(cfg, "full")
    for step in trace:
        if ".ffn." not in step.path or step.stage in ("norm", "rms", "residual"):
            continue
        for cell in [(0, 0), (step.shape[0] - 1, step.shape[1] - 1)]:
            e = explain(cfg, trace, step, cell)
            assert e.agrees, (step.path, cell, e.value, e.result)
    # the dense layer's out is a product, the sparse layers' the weighted sum
    ledger = {c.path: c for c in cost.ledger(cfg)}
    L, d, dff = 6, 6, 5
    assert ledger["decoder.1.ffn.out"].macs == L * dff * d
    assert ledger["decoder.0.ffn.out"].macs == ledger["decoder.2.ffn.out"].macs == L * 2 * d
    recorded = sum(trace.value(p).size for p in trace.steps)
    assert recorded + OBJECT_COST * len(trace.steps) <= trace_size(cfg.model, 6, len(cfg.vocab))


# A shared expert (model.shared_expert: Qwen2-MoE's gated one, DeepSeek's plain one):
# an FFN of shared_expert_d_ff on every token, added to the routed sum (times σ(X w_g)).


def _shared(kind: str, width: int | None = 7) -> dict[str, Any]:
    return random_config(
        np.random.default_rng(4),
        d_model=6,
        n_heads=2,
        d_ff=5,
        encoder_layers=0,
        decoder_layers=2,
        **LLAMA,
        biases=False,
        tgt_len=6,
        experts=[4, None],
        experts_top_k=2,
        shared_expert=kind,
        shared_expert_d_ff=width,
    )


@pytest.mark.parametrize("kind", ["gated", "plain"])
def test_the_shared_expert_by_hand(kind: str) -> None:
    raw = _shared(kind)
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    trace = run(cfg, "full")
    ffn = raw["weights"]["decoder"][0]["ffn"]
    X = trace.value(trace["decoder.0.ffn.router"].inputs[0])
    hand = _by_hand(X, ffn, 2, True)
    s = ffn["shared"]
    assert np.array(s["W_1"]).shape == (6, 7)  # its own width, shared_expert_d_ff
    S = (_silu(X @ np.array(s["W_1"])) * (X @ np.array(s["W_3"]))) @ np.array(s["W_2"])
    np.testing.assert_allclose(trace.value("decoder.0.ffn.shared.out"), S, atol=1e-12)
    if kind == "gated":
        g = 1 / (1 + np.exp(-(X @ np.array(ffn["shared_gate"]))))
        np.testing.assert_allclose(trace.value("decoder.0.ffn.shared.gate"), g, atol=1e-12)
        want = hand["out"] + g * S
    else:
        assert "decoder.0.ffn.shared.gate" not in trace.paths()
        want = hand["out"] + S
    np.testing.assert_allclose(trace.value("decoder.0.ffn.out"), want, rtol=1e-12, atol=1e-12)
    assert not np.allclose(hand["out"], want)  # (the shared expert is not negligible)
    # the dense layer of the list has no shared expert
    assert not any(p.startswith("decoder.1.ffn.shared") for p in trace.paths())


def test_the_shared_expert_in_header_explain_cost_and_size_bound() -> None:
    from trace_tf.config import OBJECT_COST, trace_size
    from trace_tf.runner import conventions

    cfg = config_from(_shared("gated"))
    assert isinstance(cfg, Config)
    text = dict(conventions(cfg))["experts"]
    assert "a shared expert, an FFN of width 7 (shared_expert_d_ff) on every token" in text
    assert "g = σ(X w_g)" in text
    trace = run(cfg, "full")
    for step in trace:
        if ".ffn." not in step.path or step.stage in ("norm", "rms", "residual"):
            continue
        for cell in [
            (0, 0),
            (step.shape[0] - 1, step.shape[1] - 1),
            (min(2, step.shape[0] - 1), 0),
        ]:
            e = explain(cfg, trace, step, cell)
            assert e.agrees, (step.path, cell, e.value, e.result)
    out = explain(cfg, trace, trace["decoder.0.ffn.out"], (2, 3))
    assert out.chain[0].endswith(" + g[2] · S[2,3]")
    gate = explain(cfg, trace, trace["decoder.0.ffn.shared.gate"], (2, 0))
    assert gate.chain[0] == "σ(x2 · shared_gate[:,0])"
    ledger = {c.path: c.macs for c in cost.ledger(cfg)}
    L, d, ff = 6, 6, 7
    assert ledger["decoder.0.ffn.shared.hidden"] == ledger["decoder.0.ffn.shared.up"] == L * d * ff
    assert ledger["decoder.0.ffn.shared.gate"] == L * d
    assert ledger["decoder.0.ffn.out"] == L * (2 + 1) * d  # k weighted outs and g ⊙ S
    plain = config_from(_shared("plain"))
    assert isinstance(plain, Config)
    assert {c.path: c.macs for c in cost.ledger(plain)}["decoder.0.ffn.out"] == L * 2 * d
    for c in (cfg, plain):
        tr = run(c, "full")
        recorded = sum(tr.value(p).size for p in tr.steps)
        assert recorded + OBJECT_COST * len(tr.steps) <= trace_size(c.model, 6, len(c.vocab))


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_generate_explain_reads_each_layers_own_ffn_under_the_iteration_prefix(
    layer: int, tmp_path: Path
) -> None:
    """Under generate's prefix (`t1.decoder.1.ffn.out`) a layer's FFN is its own: the dense
    layer's out a product, a mixture's the weighted sum of its experts (the layer was read
    from the path's second part, `decoder`, and every layer taken for a mixture); each
    entry's arithmetic agrees with the value the generation recorded."""
    path = tmp_path / "by_layer.yaml"
    path.write_text(json.dumps(_by_layer([4, None, 3])), encoding="utf-8")
    step = f"t1.decoder.{layer}.ffn.out"
    e = _invoke(
        "generate", str(path), "--greedy", "--max-tokens", "2", "--explain", step,
        "--cell", "0,1", "--format", "json",
    )  # fmt: skip
    dense = layer == 1
    assert ("W_2[:,1]" in e["lines"][0]) == dense and ("W[0," in e["lines"][0]) != dense
    assert e["agrees"]
