"""Token types (model.token_types, BERT's segment embeddings): `<stack>.token_type` is row
type_i of `weights.token_types` for each position i, added into `<stack>.input`. By hand on
a tiny config, the drawing rule, the weights_file and --set, generate's rule for a new
token's type, float32, the header, explain, stages, cost, diff, JSON, and every refusal.
(Against Hugging Face's BertModel: tests/test_hf_bert.py; against the torch reference:
tests/test_engine_reference.py and tests/test_generate.py.)"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import config_from
from test_bad_inputs import Bad, _run_bad
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.runner import conventions, run

runner = CliRunner()

# d_model 2, embeddings scaled by 2, sinusoidal positions, two token types
TABLE = [[0.5, 0.25], [-1.0, 4.0]]
TINY: dict[str, Any] = {
    "model": {"d_model": 2, "embed_scale": 2, "token_types": 2},
    "vocab": ["a", "b"],
    "embeddings": {"a": [1, 2], "b": [3, -1]},
    "source": ["a", "b", "a"],
    "source_types": [0, 1, 1],
    "weights": {"token_types": TABLE},
}


def model_of(data: dict[str, Any]) -> Config:
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    return cfg


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def written(tmp_path: Path, data: dict[str, Any], name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def steps_of(out: str) -> dict[str, np.ndarray]:
    return {s["path"]: np.array(s["value"], dtype=float) for s in json.loads(out)["steps"]}


def test_the_input_by_hand() -> None:
    trace = run(model_of(TINY), "encode")
    # row i of the table by the type of position i: 0, 1, 1
    assert trace.value("encoder.token_type").tolist() == [[0.5, 0.25], [-1, 4], [-1, 4]]
    # X = 2 E + PE + T, PE[pos] = [sin pos, cos pos] for d_model 2
    s1, c1, s2, c2 = math.sin(1), math.cos(1), math.sin(2), math.cos(2)
    expected = [[2 + 0 + 0.5, 4 + 1 + 0.25], [6 + s1 - 1, -2 + c1 + 4], [2 + s2 - 1, 4 + c2 + 4]]
    np.testing.assert_allclose(trace.value("encoder.input"), expected, rtol=0, atol=1e-15)
    assert trace["encoder.input"].formula.startswith("X = E · 2 + PE + T")
    assert trace["encoder.input"].inputs == ("encoder.embed", "encoder.pe", "encoder.token_type")
    step = trace["encoder.token_type"]
    assert step.formula == "T = token_types[type],  types 0 1 1"
    assert step.inputs == ("weights.token_types",)
    paths = list(trace.steps)
    assert paths.index("encoder.pe") < paths.index("encoder.token_type")
    assert paths.index("encoder.token_type") < paths.index("encoder.input")


def test_no_positions_and_no_types_given() -> None:
    """positional none: X = E + T; source_types not given: every position type 0."""
    data = {**TINY, "model": {"d_model": 2, "token_types": 2, "positional": "none"}}
    del data["source_types"]
    trace = run(model_of(data), "encode")
    assert trace.value("encoder.token_type").tolist() == [[0.5, 0.25]] * 3
    assert trace.value("encoder.input").tolist() == [[1.5, 2.25], [3.5, -0.75], [1.5, 2.25]]
    assert trace["encoder.input"].formula == "X = E + T"
    assert "encoder.pe" not in trace


def test_without_token_types_nothing_is_added_and_nothing_else_changes() -> None:
    """model.token_types 0 (the default) records no token_type; the table drawn for a
    model with types leaves every other drawn array as it was (SPEC's rule per path)."""
    plain = {"model": {"d_model": 4}, "vocab": ["a", "b"], "source": ["a", "b"]}
    typed = {**plain, "model": {"d_model": 4, "token_types": 3}, "source_types": [2, 0]}
    a, b = run(model_of(plain), "encode"), run(model_of(typed), "encode")
    assert "encoder.token_type" not in a and "encoder.token_type" in b
    assert np.array_equal(a.value("encoder.embed"), b.value("encoder.embed"))
    rng = np.random.default_rng([0, zlib.crc32(b"token_types")])
    table = rng.standard_normal((3, 4))  # SPEC section 2: drawn under its key path
    assert np.array_equal(b.value("encoder.token_type"), table[[2, 0]])
    assert model_of(typed).drawn[-2:] == ("token_types", "output.W")
    np.testing.assert_allclose(
        b.value("encoder.input") - a.value("encoder.input"), table[[2, 0]], rtol=0, atol=1e-15
    )


def test_the_table_from_a_weights_file_and_by_set(tmp_path: Path) -> None:
    np.savez(tmp_path / "w.npz", token_types=np.array(TABLE))
    data = {k: v for k, v in TINY.items() if k != "weights"} | {"weights_file": "w.npz"}
    path = written(tmp_path, data)
    code, out, err = invoke("encode", path, "--format", "json")
    assert code == 0, err
    assert steps_of(out)["encoder.token_type"].tolist() == [[0.5, 0.25], [-1, 4], [-1, 4]]
    # one entry over a copy of the npz's array, and the weights command names both
    code, out, err = invoke(
        "encode", path, "--set", "weights.token_types.1.0=5", "--format", "json"
    )
    assert code == 0, err
    assert steps_of(out)["encoder.token_type"].tolist() == [[0.5, 0.25], [5, 4], [5, 4]]
    code, out, err = invoke(
        "weights", path, "--set", "weights.token_types.1.0=5", "--format", "json"
    )
    assert code == 0, err
    w = next(w for w in json.loads(out)["weights"] if w["path"] == "weights.token_types")
    assert w["kind"] == "npz" and w["array"] == "token_types" and w["shape"] == [2, 2]
    assert w["partly"] == ["--set weights.token_types.1.0"]
    # and another layout of types from the command line
    code, out, err = invoke("encode", path, "--set", "source_types=[1, 1, 0]", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["tokens"]["source_types"] == [1, 1, 0]
    assert steps_of(out)["encoder.token_type"].tolist() == [[-1, 4], [-1, 4], [0.5, 0.25]]


DECODER: dict[str, Any] = {
    "model": {"d_model": 4, "n_heads": 2, "encoder_layers": 0, "decoder_layers": 1},
    "vocab": ["S", "E", "a", "b", "c"],
    "tokens": {"bos": "S", "eos": "E"},
    "target": ["S", "a", "b"],
    "weights": {"output": {"b": [0, -1000, 0, 0, 0]}},  # never eos: run to the limit
}


def test_a_generated_token_takes_the_type_of_the_position_before_it(tmp_path: Path) -> None:
    data = {
        **DECODER,
        "model": {**DECODER["model"], "token_types": 3},
        "target_types": [0, 2, 1],
    }
    path = written(tmp_path, data)
    table = model_of(data).token_types
    assert table is not None
    for cache in ("--cache", "--no-cache"):
        code, out, err = invoke(
            "generate", path, "--max-tokens", "3", "--trace", cache, "--format", "json"
        )
        assert code == 0, err
        result = json.loads(out)
        assert result["tokens"]["target_types"] == [0, 2, 1]
        assert (
            "a new token takes the type of the position before it"
            in (result["conventions"]["token types"])
        )
        steps = {s["path"]: np.array(s["value"]) for s in result["steps"]}
        assert np.array_equal(steps["t0.decoder.token_type"], table[[0, 2, 1]])
        for t in (1, 2):  # the new row (cached) or the whole prefix: type 1 after the target
            rows = steps[f"t{t}.decoder.token_type"]
            want = table[[1]] if cache == "--cache" else table[[0, 2, 1] + [1] * t]
            assert np.array_equal(rows, want)
    # each iteration is `decode` of its prefix with the types extended so, and not with
    # the new token's type 0 (the rule is seen in the numbers)
    for it in result["iterations"][1:]:
        prefix = it["prefix"]
        probs = np.array(list(it["probs"].values()))
        for types, same in (([0, 2, 1, 1, 1], True), ([0, 2, 1, 0, 0], False)):
            code, out, err = invoke(
                "decode",
                path,
                "--set",
                f"target=[{', '.join(prefix)}]",
                "--set",
                f"target_types={types[: len(prefix)]}",
                "--format",
                "json",
            )
            assert code == 0, err
            last = steps_of(out)["probs"][-1]
            assert (np.abs(last - probs).max() <= 1e-12) == same


def test_generate_from_bos_is_type_0_and_beams_follow_the_rule(tmp_path: Path) -> None:
    data = {**DECODER, "model": {**DECODER["model"], "token_types": 2}}
    del data["target"]
    path = written(tmp_path, data)
    table = model_of(data).token_types
    assert table is not None
    code, out, err = invoke(
        "generate", path, "--beam", "2", "--max-tokens", "3", "--trace", "--format", "json"
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["tokens"]["target_types"] == [0]
    rows = [np.array(s["value"]) for s in result["steps"] if s["path"].endswith("token_type")]
    assert len(rows) >= 3 and all(np.array_equal(r, table[[0] * len(r)]) for r in rows)


def test_npz_and_csv_hold_the_step(tmp_path: Path) -> None:
    path = written(tmp_path, TINY)
    out = tmp_path / "t.npz"
    code, _, err = invoke("encode", path, "--format", "npz", "--output", str(out))
    assert code == 0, err
    with np.load(out) as z:
        assert z["encoder.token_type"].tolist() == [[0.5, 0.25], [-1, 4], [-1, 4]]
    code, csv, err = invoke("step", path, "--stage", "token_type", "--format", "csv")
    assert code == 0, err
    assert csv.splitlines()[1:] == ["a,0.5,0.25", "b,-1.0,4.0", "a,-1.0,4.0"]


def test_float32_looks_up_the_rounded_table() -> None:
    cfg = model_of({**TINY, "model": {**TINY["model"], "dtype": "float32"}})
    trace = run(cfg, "encode")
    assert trace.value("encoder.token_type").dtype == np.float32
    assert trace.value("encoder.input").dtype == np.float32
    wide = run(model_of(TINY), "encode")
    np.testing.assert_allclose(
        trace.value("encoder.input"), wide.value("encoder.input"), rtol=1e-6, atol=0
    )


def test_the_header_states_the_table_and_the_types() -> None:
    rows = dict(conventions(model_of(TINY)))
    assert rows["token types"] == (
        "table weights.token_types (2 rows): row type_i added to position i's embedding "
        "(BERT's token_type_embeddings); source types 0 1 1"
    )
    long = {**TINY, "source": ["a"] * 20, "source_types": [0] * 10 + [1] * 10}
    assert (
        "source types 0 0 0 0 0 0 0 0 … 1 1 1 1" in dict(conventions(model_of(long)))["token types"]
    )
    assert "token types" not in dict(conventions(model_of({**DECODER})))


def test_explain_writes_the_lookup_and_the_three_terms(tmp_path: Path) -> None:
    path = written(tmp_path, TINY)
    code, out, err = invoke("explain", "encoder.token_type", path, "--cell", "2,1")
    assert code == 0, err
    assert "encoder.token_type[2,1] = token_types[1,1] = 4" in out
    assert "row 2 has type 1 (source_types)" in out
    # types not given: every one 0, and explain says so rather than naming source_types
    code, out, err = invoke(
        "explain", "encoder.token_type", path, "--cell", "2,1", "--set", "source_types=null"
    )
    assert code == 0, err
    assert "row 2 has type 0 (every type 0: the config gives no source_types)" in out
    assert "token_types = weights.token_types (" in out
    code, out, err = invoke("explain", "encoder.input", path, "--cell", "1,0", "--format", "json")
    assert code == 0, err
    e = json.loads(out)
    text = json.dumps(e, ensure_ascii=False)
    assert "E[1,0] × embed_scale + PE[1,0] + T[1,0]" in text
    assert "T = encoder.token_type: token_types[1], row 1's type" in text
    assert math.isclose(e["result"], 6 + math.sin(1) - 1, rel_tol=0, abs_tol=1e-15)


def test_stages_cost_and_diff(tmp_path: Path) -> None:
    path = written(tmp_path, TINY)
    code, out, _ = invoke("stages", "--format", "json")
    stage = next(s for s in json.loads(out)["stages"] if s["key"] == "token_type")
    assert "token_types[type]" in stage["formula"]
    # a lookup: no multiply-adds
    code, out, err = invoke("cost", path, "--format", "json")
    assert code == 0, err
    entry = next(e for e in json.loads(out)["ledger"] if e["path"] == "encoder.token_type")
    assert entry["macs"] == 0
    # --vary L repeats each token with its type
    code, out, err = invoke("cost", path, "--vary", "L=3,6")
    assert code == 0, err
    # another layout of types: the first difference is the lookup
    code, out, err = invoke("diff", path, "--set-b", "source_types=[0, 0, 1]", "--format", "json")
    assert code == 0, err
    d = json.loads(out)
    first = next(s for s in d["steps"] if s["status"] == "differs")
    assert first["path"] == "encoder.token_type"
    # --stage token_type on a model without token types says what records it
    code, _, err = invoke("step", "hello", "--stage", "token_type")
    assert code == 2 and "with model.token_types >= 1" in err


TYPED = "model:\n  d_model: 2\n  token_types: 2\nvocab: [a, b]\nsource: [a, b, a]\n"
PLAIN = "model:\n  d_model: 2\nvocab: [a, b]\nsource: [a, b]\n"
DEC = (
    "model:\n  d_model: 2\n  encoder_layers: 0\n  decoder_layers: 1\n  token_types: 2\n"
    "vocab: [a, S]\ntokens: {bos: S}\n"
)
REFUSED = [
    Bad(TYPED + "source_types: [0, 1]\n", "source_types", 6,
        ("2 token types for the 3 positions of source", "a list of 3 whole numbers from 0 to 1")),
    Bad(TYPED + "source_types: [0, 2, 1]\n", "source_types.1", 6,
        ("type 2 is beyond the token-type table (model.token_types 2: types 0 to 1)",
         "expected a whole number from 0 to 1, found 2")),
    # a whole float far beyond the table is said as written, not as its 309 digits
    Bad(TYPED + "source_types: [0, 1e308, 1]\n", "source_types.1", 6,
        ("type 1e+308 is beyond the token-type table", "found 1e+308")),
    # Hugging Face's names say trace-tf's, not a spelling suggestion (tokens, pe_base)
    Bad(TYPED + "token_type_ids: [0, 1, 1]\n", "token_type_ids", 6,
        ("Hugging Face's name; trace-tf's are source_types and target_types",)),
    Bad(TYPED.replace("token_types: 2", "type_vocab_size: 2"), "model.type_vocab_size", 3,
        ("Hugging Face's name; trace-tf's is model.token_types",)),
    Bad(TYPED + "weights: {token_type_embeddings: [[1, 2]]}\n", "weights.token_type_embeddings",
        6, ("Hugging Face's name; trace-tf's is weights.token_types",)),
    Bad(TYPED + "source_types: [0, -1, 1]\n", "source_types.1", 6, ("a whole number >= 0",)),
    Bad(TYPED + "source_types: [0, 0.5, 1]\n", "source_types.1", 6, ("not a whole number",)),
    Bad(TYPED + "source_types: 1\n", "source_types", 6, ("not a list of token types",)),
    Bad(PLAIN + "source_types: [0, 1]\n", "source_types", 5,
        ("token types given, but model.token_types is 0",)),
    Bad(PLAIN + "weights: {token_types: [[1, 2]]}\n", "weights.token_types", 5,
        ("a token-type table is given, but model.token_types is 0",)),
    Bad(TYPED + "weights: {token_types: [[1, 2]]}\n", "weights.token_types", 6,
        ("wrong shape", "shape 2 x 2 (token_types x d_model)", "found shape 1 x 2")),
    Bad(TYPED.replace("2\nvocab", "-1\nvocab"), "model.token_types", 3, ("a whole number >= 0",)),
    Bad(TYPED.replace("2\nvocab", "two\nvocab"), "model.token_types", 3, ("not a whole number",)),
    Bad(TYPED.replace("2\nvocab", "200000000\nvocab"), "model", 1,
        ("too large", "token_types 200000000")),
    Bad(TYPED + "target_types: [0]\n", "target_types", 6,
        ("token types for target, but the model reads no target (decoder_layers: 0)",)),
    Bad(DEC + "source_types: [0]\n", None, None,
        ("source_types: token types for source, but the model reads no source",),
        args=("decode", "{file}")),
    Bad(DEC + "target_types: [1]\n", "target_types", 8,
        ("no target is given (the decoder starts from [tokens.bos], type 0)",),
        args=("generate", "{file}")),
    # a --set that changes the source's length names the override that made the mismatch
    Bad(TYPED + "source_types: [0, 1, 1]\n", "source_types", 6,
        ("3 token types for the 2 positions of source (source set by --set)",),
        args=("encode", "{file}", "--set", "source=[a, b]")),
    Bad(TYPED + "source_types: [0, 1, 1]\n", "source_types.1", None,
        ("type 1 is beyond the token-type table (model.token_types 1: types 0 to 0) "
         "(model.token_types set by --set)",),
        args=("encode", "{file}", "--set", "model.token_types=1")),
]  # fmt: skip


@pytest.mark.parametrize("bad", REFUSED, ids=lambda b: b.says[0][:50])
def test_bad_token_types_are_refused(bad: Bad, tmp_path: Path) -> None:
    _run_bad(bad, tmp_path)
