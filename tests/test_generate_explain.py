"""`generate --explain STEP --cell I,J`: one entry of one step of an autoregressive
generation written out. Every explainer on generate's steps (paths `t<i>.` and
`t<i>.b<j>.`; KV-cached K and V, whose kept rows were computed at earlier iterations;
positions start.. of the new rows for positional encodings, RoPE, relative bias and
the causal mask; decoder-only models; beams) gives the recorded value, and the entries
equal those of a forward pass written here in numpy (test_explain_by_numpy.Reference,
SPEC §1-§3, no trace_tf code) on the prefix each iteration read."""

from __future__ import annotations

import io
import json
import math
import zlib
from typing import Any

import numpy as np
import pytest
from conftest import config_from, shape_id
from test_explain_by_numpy import Reference, _case
from test_generate import OLMO2, QK_NORM, RELATIVE, ROPE, SHAPES, TYPES, WINDOW, generation_config
from typer.testing import CliRunner

from trace_tf import generate as gen
from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.errors import InputError
from trace_tf.explain import explain, explanation_view
from trace_tf.render import least_width
from trace_tf.trace import Step, Trace, Tracer

runner = CliRunner()

# Each with the KV cache and with --no-cache.
STRATEGIES: dict[str, dict[str, Any]] = {
    "greedy": dict(greedy=True),
    "sample_seed": dict(sample=True, seed=3, temperature=1.5, top_k=4, top_p=0.8),
    "beam2": dict(beam=2),
}
CACHE = {"cache": dict(cache=True), "no_cache": dict(cache=False)}


def _generate(cfg: Config, **options: Any) -> tuple[gen.Generation, Trace]:
    tr = Tracer()
    tr.name_all(cfg.named_arrays())
    result = gen.run(cfg, gen.settings(max_tokens=4, **options), tr)
    return result, tr.trace


def _model_steps(trace: Trace) -> list[Step]:
    """Every step of the run but generate's sampling stages (checked on their own)."""
    return [s for s in trace if ".sample." not in s.path]


def _cells(step: Step, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """The first and last entries (with a KV cache, row 0 of K and V is a kept row and
    the last a new one), and two more at random."""
    shape = step.shape
    cells = {tuple(0 for _ in shape), tuple(n - 1 for n in shape)}
    cells |= {tuple(int(rng.integers(n)) for n in shape) for _ in range(2)}
    return sorted(cells)


# ---------------------------------------------------------------------------
# Every step of a traced generation: the arithmetic written out gives the recorded value
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(STRATEGIES))
# SHAPES[-3]: the embedding norm, in both stacks, padded; TYPES: token types (a new
# token's type, the position before it, in its token_type and input entries); QK_NORM:
# q_norm and k_norm before RoPE, and without it a cached K that is the norm itself; OLMO2:
# the whole projection's norm, each head's cached K its turned columns, and sandwich norms
@pytest.mark.parametrize(
    "shape",
    [
        *(SHAPES[0], SHAPES[2], SHAPES[-3], SHAPES[-1], *ROPE, *RELATIVE, *WINDOW, *TYPES),
        {**QK_NORM[0], "biases": True},  # (the output's bias keeps eos away)
        QK_NORM[1],
        {**OLMO2[0], "biases": True},
        OLMO2[1],
    ],
    ids=shape_id,
)
def test_every_step_of_a_generation_is_explained_and_agrees(
    shape: dict[str, Any], strategy: str
) -> None:
    raw = generation_config(5, **shape)
    raw["weights"]["output"]["b"][1] = -1e3  # never eos (t1): four iterations
    cfg = config_from(raw)
    assert isinstance(cfg, Config)
    rng = np.random.default_rng(0)
    for cache in CACHE.values():
        result, trace = _generate(cfg, **STRATEGIES[strategy], **cache)
        assert len(result.iterations) == 4
        for step in trace:  # the sampling stages t<i>.sample.* too
            for cell in _cells(step, rng):
                e = explain(cfg, trace, step, cell)
                assert e.value == float(step.value[cell]), (step.path, cell)
                assert e.agrees, (step.path, cell, e.value, e.result, e.lines())


def _render(e: Any) -> str:
    from rich.console import Console

    view = explanation_view(e)
    con = Console(width=max(200, least_width(view)), record=True, file=io.StringIO())
    con.print(view)
    return con.export_text()


# ---------------------------------------------------------------------------
# Against a forward pass written here: each entry is the reference's on the same prefix
# ---------------------------------------------------------------------------


def _no_eos(data: dict[str, Any]) -> dict[str, Any]:
    data["tokens"] = {k: v for k, v in data["tokens"].items() if k != "eos"}  # to the limit
    return data


NUMPY_CASES = {
    "post_sin_pads": _no_eos(
        _case({"d_model": 4, "n_heads": 2, "decoder_layers": 1, "d_ff": 6}, ["a", "P", "b"], ["S"])
    ),
    "pre_rope_temperature": _no_eos(
        _case(
            {"d_model": 6, "n_heads": 3, "decoder_layers": 1, "norm_position": "pre",
             "positional": "rope", "score": "dot", "temperature": 0.5, "d_k": 4},
            ["a", "b", "c"], ["S", "b"],
        )
    ),
    "rms_learned_additive": _no_eos(
        _case(
            {"d_model": 4, "n_heads": 2, "decoder_layers": 1, "norm": "rms",
             "positional": "learned", "max_len": 8, "score": "additive", "d_a": 3},
            ["a", "b"], ["S"],
        )
    ),
    "decoder_only_rope_gaussian": _no_eos(
        _case(
            {"d_model": 6, "n_heads": 2, "d_k": 3, "encoder_layers": 0, "decoder_layers": 2,
             "positional": "rope", "score": "gaussian"},
            None, ["S", "a"],
        )
    ),
    "rope_halves_pre_rms": _no_eos(
        _case(
            {"d_model": 8, "n_heads": 2, "encoder_layers": 0, "decoder_layers": 2,
             "positional": "rope", "rope_pairs": "halves", "norm_position": "pre",
             "norm": "rms"},
            None, ["S", "a"],
        )
    ),
    "window_decoder_only": _no_eos(
        _case(
            {"d_model": 4, "n_heads": 2, "encoder_layers": 0, "decoder_layers": 1, "window": 2},
            None, ["S", "a", "b"],
        )
    ),
    # token types: each generated token the type of the position before it
    "token_types_learned": _no_eos(
        _case(
            {"d_model": 4, "n_heads": 2, "decoder_layers": 1, "positional": "learned",
             "max_len": 8, "token_types": 3},
            ["a", "b", "P"], ["S", "b"],
        ) | {"source_types": [2, 0, 1], "target_types": [0, 2]}
    ),
}  # fmt: skip


def _prefixes(result: gen.Generation) -> dict[str, tuple[str, ...]]:
    """The prefix each iteration's scope read (`t<i>.`, or `t<i>.b<j>.`), from the
    generation's record of its choices."""
    out: dict[str, tuple[str, ...]] = {}
    for it in result.iterations:
        if it.beams:
            for j, b in enumerate(it.beams):
                out[f"t{it.index}.b{j}."] = result.start + b.tokens
        else:
            out[f"t{it.index}."] = it.prefix
    return out


def _origin(result: gen.Generation, scope: str, position: int) -> str:
    """Where a KV cache computed the key of `position` that `scope` reads: the iteration
    whose new rows held it, and for beam search the ancestor beam there (each kept
    extension's parent, `Candidate.beam`, in the order the live beams are kept)."""
    t = int(scope[1:].split(".")[0])
    first = len(result.start)  # iteration 0 computes positions 0..first-1
    at = max(0, position - first + 1)
    if ".b" not in scope:
        return f"t{at}."
    beam = int(scope.split(".")[1][1:])
    for it in range(t, at, -1):  # walk back to iteration `at`
        live = [c for c in result.iterations[it - 1].candidates if not c.finished]
        beam = live[beam].beam
    return f"t{at}.b{beam}."


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("case", list(NUMPY_CASES))
def test_generation_entries_equal_a_numpy_forward_pass_on_each_prefix(
    case: str, strategy: str
) -> None:
    for cache in CACHE.values():
        _check_against_numpy(NUMPY_CASES[case], {**STRATEGIES[strategy], **cache})


def _check_against_numpy(data: dict[str, Any], options: dict[str, Any]) -> None:
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    result, trace = _generate(cfg, **options)
    prefixes = _prefixes(result)
    refs: dict[tuple[str, ...], Reference] = {}
    stages_seen: set[str] = set()
    cached_score_checked = False
    rng = np.random.default_rng(1)
    for step in _model_steps(trace):
        scope = next((s for s in prefixes if step.path.startswith(s)), "")
        bare = step.path[len(scope) :]
        prefix = prefixes[scope] if scope else result.start
        if prefix not in refs:
            given = data.get("target_types")  # a generated token: the type before it
            extended = None if given is None else (given + [given[-1]] * len(prefix))[: len(prefix)]
            types = {} if extended is None else {"target_types": extended}
            refs[prefix] = Reference({**data, "target": list(prefix), **types})
        if bare not in refs[prefix].a:  # (every step the reference computes is checked)
            continue
        ref = refs[prefix].a[bare]
        offset = ref.shape[0] - step.shape[0]  # a cached iteration's rows: the last ones
        for cell in _cells(step, rng):
            e = explain(cfg, trace, step, cell)
            want = float(ref[(offset + cell[0], *cell[1:])])
            for got in (e.value, e.result):
                assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12) or (
                    math.isinf(want) and got == want
                ), (step.path, cell, got, want)
            if e.stage not in stages_seen:  # once per stage: as printed
                stages_seen.add(e.stage)
                assert "the arithmetic above agrees" in _render(e)
            j = cell[-1]
            cross = ".cross_attn." in step.path
            kept = j < offset if not cross else offset > 0  # computed at an earlier iteration
            if e.stage == "scores" and options["cache"] and kept and cfg.model.score != "additive":
                k_row = refs[prefix].a[bare.replace("scores", "k")][j]
                assert np.allclose(e.operands[f"k{j}"], k_row, rtol=1e-12, atol=1e-14)
                where = next(w for w in e.where if w.startswith(f"k{j} = "))
                # cross-attention's K: computed once, at the first iteration (beam 0)
                at = ("t0.b0." if ".b" in scope else "t0.") if cross else _origin(result, scope, j)
                origin = at + bare.replace("scores", "k")
                assert f"(cached: computed at {origin}, row {j})" in where, where
                cached_score_checked = True
    assert {"scores", "softmax", "k", "v", "context", "logits", "probs", "mask"} <= stages_seen
    if options["cache"] and cfg.model.score != "additive":
        assert cached_score_checked


def test_a_cached_key_row_is_explained_where_it_was_computed() -> None:
    """Row 0 of iteration 2's K (hello, greedy): kept since iteration 0, computed there
    from row 0 of t0's x, and equal to a numpy x0 · W_k + b_k of those numbers."""
    code, out, err = _invoke(
        "generate", "--max-tokens", "3", "--explain", "t2.decoder.0.self_attn.h1.k",
        "--cell", "0,2", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["lines"][0].startswith(
        "t2.decoder.0.self_attn.h1.k[0,2] = t0.decoder.0.self_attn.h1.k[0,2]"
    )
    assert (
        "row 0 is cached: computed at t0.decoder.0.self_attn.h1.k and kept since" in data["where"]
    )
    x = np.array(data["operands"]["x0"])
    w = np.array(data["operands"]["W_k[:,2]"])
    assert any(s.startswith("x0 = row 0 ('SOS') of t0.decoder.") for s in data["where"])
    assert math.isclose(data["value"], float(x @ w), rel_tol=1e-12)
    assert data["agrees"] and data["generated"]


@pytest.mark.parametrize(
    ("args", "inputs", "x"),
    [
        # hello, beam 3: t4's beam 2 descends from t3.b0, t2.b0 (its row 2, 'world')
        (
            "--beam 3 --max-tokens 5 --cell 2,1 --explain t4.b2.decoder.0.self_attn.h0.k",
            ["t2.b0.decoder.input", "weights.decoder.0.self_attn.heads.0.W_k"],
            "x0 = row 0 ('world') of t2.b0.decoder.input",
        ),
        # cross-attention's V, computed once, at iteration 0, from the encoder output
        (
            "--max-tokens 4 --explain t3.decoder.0.cross_attn.h1.v --cell 1,1",
            ["encoder.output", "weights.decoder.0.cross_attn.heads.1.W_v"],
            "x1 = row 1 ('world') of encoder.output",
        ),
    ],
)
def test_a_cached_row_s_inputs_are_those_it_was_computed_from(
    args: str, inputs: list[str], x: str
) -> None:
    """JSON `inputs` named the new rows' input of the iteration explained
    (t4.b2.decoder.input) or nothing (a cached cross-attention V), not what the row was
    computed from, which `where` names."""
    code, out, err = _invoke("generate", *args.split(), "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["agrees"] and data["inputs"] == inputs
    assert any(w.startswith(x) for w in data["where"]), data["where"]


def test_sampling_stages_against_numpy() -> None:
    """t<i>.sample.tempered, .top_k, .top_p: softmax(z / T) of the reference's last row
    of logits on the iteration's prefix; the 4 most probable; the smallest prefix by
    probability whose total reaches 0.7, of those; each renormalised. Every entry. A
    token top-p's stage leaves at 0 says which cut it: top-k, or the prefix (it said
    'outside that prefix or top-k')."""
    data = NUMPY_CASES["post_sin_pads"]
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    T, k, top_p = 0.7, 4, 0.7
    reasons: set[str] = set()
    for cache in (True, False):
        result, trace = _generate(
            cfg, sample=True, seed=2, temperature=T, top_k=k, top_p=top_p, cache=cache
        )
        for it in result.iterations:
            z = Reference({**data, "target": list(it.prefix)}).a["logits"][-1]
            tempered = np.exp((z - z.max()) / T)
            tempered /= tempered.sum()
            order = np.argsort(-tempered, kind="stable")
            top = set(order[:k].tolist())
            reach = int(np.searchsorted(np.cumsum(tempered[order]), top_p)) + 1
            nucleus = set(order[:reach].tolist()) & top
            want = {"tempered": tempered}
            for j in sorted(set(range(len(z))) - nucleus):  # 0, and why: the stage that cut it
                e = explain(cfg, trace, trace[f"t{it.index}.sample.top_p"], (0, j))
                why = (
                    "not among the 4 most probable (top-k)"
                    if j not in top
                    else "outside that prefix"
                )
                assert e.chain[-1].endswith(f"is {why})"), (it.index, j, e.chain)
                reasons.add(why)
            for name, kept in (("top_k", top), ("top_p", nucleus)):
                mask = np.isin(np.arange(len(z)), sorted(kept))
                want[name] = np.where(mask, tempered, 0) / tempered[mask].sum()
            for name, row in want.items():
                step = trace[f"t{it.index}.sample.{name}"]
                for j in range(len(z)):
                    e = explain(cfg, trace, step, (0, j))
                    assert e.agrees, (step.path, j)
                    assert math.isclose(e.result, row[j], rel_tol=1e-9, abs_tol=1e-15), (
                        step.path,
                        j,
                        e.result,
                        row[j],
                    )
                assert "the arithmetic above agrees" in _render(e)
    assert len(reasons) == 2  # both kinds of 0 were met


def test_a_kept_row_whose_origin_is_unknown_is_refused_not_misread() -> None:
    # Without the record of where its rows were computed, row 0 of a cached K would be
    # read from row −1 of the new rows' input: another row's numbers.
    cfg = config_from(NUMPY_CASES["post_sin_pads"])
    assert isinstance(cfg, Config)
    _, trace = _generate(cfg, greedy=True)
    trace.computed_in.clear()
    for stage in ("k", "v"):
        step = trace[f"t2.decoder.0.self_attn.h0.{stage}"]
        with pytest.raises(InputError, match=f"cannot explain row 0 of {step.path}"):
            explain(cfg, trace, step, (0, 0))
        assert explain(cfg, trace, step, (2, 0)).agrees  # the new row


# ---------------------------------------------------------------------------
# Positions start.. of a cached iteration's new row, and the relative bias
# ---------------------------------------------------------------------------


def test_generate_explain_of_a_cached_halves_k_row_turns_column_i_with_i_plus_half(
    tmp_yaml: Any,
) -> None:
    """halves (Hugging Face's rotate_half), d_k 4: column 1 of a key pairs with column 3,
    by θ = pos · 10000^(−2/4). Row 2 of t3's K, kept since t2 (position 2): k_raw[0,1] cos θ
    − k_raw[0,3] sin θ, k_raw that of a numpy forward pass (Reference) on t3's prefix."""
    data = _no_eos(_case({"d_model": 4, "n_heads": 1, "encoder_layers": 0, "decoder_layers": 1,
                          "positional": "rope", "rope_pairs": "halves"}, None, ["S"]))  # fmt: skip
    path = tmp_yaml(json.dumps(data))
    code, out, err = _invoke(
        "generate", path, "--greedy", "--max-tokens", "4", "--explain",
        "t3.decoder.0.self_attn.h0.k", "--cell", "2,1", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    e = json.loads(out)
    assert e["lines"][:2] == [
        "t3.decoder.0.self_attn.h0.k[2,1] = t2.decoder.0.self_attn.h0.k[2,1]",
        "  = k_raw[0,1] cos θ − k_raw[0,3] sin θ",
    ], e["lines"]
    assert "row 2 is cached: computed at t2.decoder.0.self_attn.h0.k and kept since" in e["where"]
    theta = 2 * 10000 ** (-2 / 4)
    assert e["operands"]["θ"] == [pytest.approx(theta, rel=1e-15)]
    ref = Reference({**data, "target": ["S", *e["generated"][:2]]})  # positions 0..2
    k_raw = ref.a["decoder.0.self_attn.h0.k_raw"][2]
    assert e["operands"]["k_raw[0,1]"] == [pytest.approx(k_raw[1], rel=1e-12)]
    assert e["operands"]["k_raw[0,3]"] == [pytest.approx(k_raw[3], rel=1e-12)]
    want = k_raw[1] * math.cos(theta) - k_raw[3] * math.sin(theta)
    assert math.isclose(e["value"], want, rel_tol=1e-12) and e["agrees"]


def test_positions_of_a_cached_row_by_hand() -> None:
    """Iteration 3 of a decoder-only greedy run from a one-token prompt feeds position 3:
    sinusoidal PE row 3, the causal mask of query position 3, and (relative) b_rel[j − 3]."""
    data = _no_eos(_case({"d_model": 4, "n_heads": 1, "encoder_layers": 0, "decoder_layers": 1},
                         None, ["S"]))  # fmt: skip
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    _, trace = _generate(cfg, greedy=True)
    for col in range(4):
        e = explain(cfg, trace, trace["t3.decoder.pe"], (0, col))
        angle = 3 / 10000 ** (2 * (col // 2) / 4)
        want = math.sin(angle) if col % 2 == 0 else math.cos(angle)
        assert math.isclose(e.result, want, rel_tol=1e-12) and e.agrees
    mask = trace["t2.decoder.mask"]
    assert mask.shape == (1, 3)
    for j in range(3):  # position 2 sees keys 0..2: all zeros
        e = explain(cfg, trace, mask, (0, j))
        assert e.result == 0.0 and "position 2" in e.chain[-1]

    rel = _no_eos(_case({"d_model": 4, "n_heads": 2, "encoder_layers": 0, "decoder_layers": 1,
                         "positional": "relative", "max_len": 6}, None, ["S"]))  # fmt: skip
    cfg = config_from(rel)
    assert isinstance(cfg, Config)
    _, trace = _generate(cfg, greedy=True)
    for h in range(2):  # the drawn table, by SPEC §2's rule, written here
        path = f"decoder.0.self_attn.heads.{h}.rel_bias"
        table = np.random.default_rng([7, zlib.crc32(path.encode())]).standard_normal(11)
        step = trace[f"t3.decoder.0.self_attn.h{h}.rel_bias"]
        for j in range(4):
            e = explain(cfg, trace, step, (0, j))
            assert e.result == table[5 + j - 3] and e.agrees, (h, j)
            assert f"b_rel[{j - 3}]" in e.chain


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


def _invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


def test_generate_explain_prints_the_explanation_only() -> None:
    code, out, err = _invoke(
        "generate", "--max-tokens", "4", "--explain", "t3.decoder.0.self_attn.h0.scores",
        "--cell", "0,1",
    )  # fmt: skip
    assert code == 0, err
    assert "t3.decoder.0.self_attn.h0.scores[0,1] = q0 · k1" in out
    assert "(cached: computed at t1.decoder.0.self_attn.h0.k, row 1)" in out
    assert "the arithmetic above agrees" in out
    assert "next-token distribution" not in out.lower() and "decoding" not in out


def test_generate_explain_json_and_beam_paths() -> None:
    code, out, err = _invoke(
        "generate", "--beam", "2", "--max-tokens", "3", "--explain",
        "t2.b1.decoder.0.self_attn.h1.softmax", "--cell", "0,1", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["step"] == "t2.b1.decoder.0.self_attn.h1.softmax" and data["cell"] == [0, 1]
    assert data["agrees"] and data["stage"] == "softmax"
    assert {"trace_tf", "title", "value", "result", "lines", "where", "generated"} <= set(data)
    # the same generation as without --explain
    code, out, _ = _invoke("generate", "--beam", "2", "--max-tokens", "3", "--format", "json")
    assert json.loads(out)["generated"] == data["generated"]


def test_generate_explain_takes_a_stage_or_pattern_that_selects_one_step() -> None:
    code, out, err = _invoke(
        "generate", "--max-tokens", "2", "--explain", "t1.*.h1.scaled", "--format", "json"
    )
    assert code == 2 and "selects 2 steps; name one" in err  # self- and cross-attention
    code, out, err = _invoke(
        "generate", "--max-tokens", "2", "--explain", "t1.*self_attn.h1.scaled", "--format", "json"
    )
    assert code == 0, err
    assert json.loads(out)["step"] == "t1.decoder.0.self_attn.h1.scaled"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--explain", "t5.logits"], "no step 't5.logits' in this run (did you mean 't"),
        (
            ["--explain", "t1.decoder.0.self_attn.h0.scores", "--cell", "0,5"],
            "--cell 0,5 is outside",
        ),
        (["--explain", "t1.probs", "--cell", "x"], "--cell must be whole numbers"),
        (["--cell", "0,1"], "--cell chooses the entry --explain writes out: add --explain STEP"),
        (["--explain", "t1.probs", "--stage", "k", "--trace"], "--explain names its one step"),
        (["--explain", "t1.probs", "--format", "csv"], "not --format csv"),
    ],
)
def test_generate_explain_bad_input_exits_2(args: list[str], message: str) -> None:
    code, _, err = _invoke("generate", "--max-tokens", "2", *args)
    assert code == 2 and message in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1


def test_generate_explain_over_the_limit_does_not_advise_a_stage() -> None:
    # --explain traces every step, and refuses --stage: the advice named it all the same
    code, _, err = _invoke(
        "generate", "--explain", "t0.probs", "--max-tokens", "2000", "--max-elements", "100000"
    )
    assert code == 2 and "the trace of 2000 iteration(s) would hold about" in err
    assert "expected fewer --max-tokens or a higher --max-elements" in err and "--stage" not in err


def test_generate_explain_of_an_empty_step_over_the_limit_does_not_advise_a_stage() -> None:
    # --explain '' is --explain all the same (it names no step, said after the size):
    # the advice took an empty STEP for no --explain, and named --stage
    code, _, err = _invoke(
        "generate", "--explain", "", "--max-tokens", "2000", "--max-elements", "100000"
    )
    assert code == 2 and "the trace of 2000 iteration(s) would hold about" in err
    assert "expected fewer --max-tokens or a higher --max-elements" in err and "--stage" not in err


def test_explain_points_an_iteration_step_to_generate_explain() -> None:
    code, _, err = _invoke("explain", "t2.decoder.0.self_attn.h0.softmax")
    assert code == 2
    assert "`trace-tf generate [CONFIG] [its options] --explain STEP --cell I,J`" in err


def test_a_cached_iteration_s_mask_row_masks_the_pad_tokens_of_the_prefix() -> None:
    """README: the newest row's causal mask is zeros but for keys that are tokens.pad
    (hello, its pad set to 'world', which greedy generates): −inf there, as decode masks
    the pads of a target, and the same row with --no-cache."""
    rows = {}
    for cache in ("--cache", "--no-cache"):
        args = ["generate", "--set", "tokens.pad=world", "--max-tokens", "5", cache]
        code, out, err = _invoke(*args, "--trace", "--stage", "mask", "--format", "json")
        assert code == 0, err
        data = json.loads(out)
        rows[cache] = {s["path"]: s["value"][-1] for s in data["steps"]}
    prefix = data["tokens"]["target"] + data["generated"]
    assert "world" in prefix[:4]
    for t in range(5):
        want = ["-inf" if tok == "world" else 0.0 for tok in prefix[: t + 1]]
        assert rows["--cache"][f"t{t}.decoder.mask"] == want
        assert rows["--no-cache"][f"t{t}.decoder.mask"] == want
