"""Where every weight came from (Config.sources), as `explain` and `step` say it: typed
in the YAML (its line), an array of weights_file, a --set, a variant, drawn (seed and
σ, reproduced here by SPEC section 2's formula), a default, a fused matrix's columns,
or the tied output."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import Config

runner = CliRunner()

# Line numbers below are this text's own (1-based).
CONFIG = """\
model:
  d_model: 2
  n_heads: 2
  d_k: 1
  d_ff: 2
  seed: 3
  init_std: 0.5
vocab: [a, b, c]
embeddings:
  a: [1, 2]
source: [a, b]
weights:
  encoder:
    - self_attn:
        W_q: [[1, 2], [3, 4]]
        b_q: [0.5, 0.25]
      ffn:
        W_1: [[1, 0], [0, 1]]
        norm: {gamma: [2, 3]}
variants:
  v:
    weights.encoder.0.ffn.W_2: [[1, 1], [2, 2]]
"""


def line_of(text: str, needle: str) -> int:
    """The 1-based line of the first line holding `needle`."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def explain(path: str, step: str, cell: str, *args: str) -> tuple[str, dict[str, Any]]:
    """explain's text (200 columns wide) and its JSON."""
    base = ["explain", step, path, "--cell", cell, *args]
    text = runner.invoke(app, base, env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    data = runner.invoke(app, [*base, "--format", "json"])
    assert data.exit_code == 0, data.output
    return text.stdout, json.loads(data.stdout)


def write(tmp_path: Path, text: str = CONFIG) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_weight_typed_in_the_yaml_is_named_by_its_line(tmp_path: Path) -> None:
    path = write(tmp_path)
    line = line_of(CONFIG, "W_1:")
    text, data = explain(path, "encoder.0.ffn.hidden", "1,1")
    assert f"column 1 of weights.encoder.0.ffn.W_1 ({path} line {line}) = [0, 1]" in text
    src = data["sources"]["weights.encoder.0.ffn.W_1"]
    assert src == {"kind": "file", "text": f"{path} line {line}", "file": path, "line": line}
    # γ given, β the default
    text, data = explain(path, "encoder.0.ffn.norm", "0,1")
    assert f"weights.encoder.0.ffn.norm.gamma ({path} line {line_of(CONFIG, 'gamma')})" in text
    assert "weights.encoder.0.ffn.norm.beta (default: zeros)" in text
    assert data["sources"]["weights.encoder.0.ffn.norm.beta"]["kind"] == "default"


def test_a_drawn_weight_says_seed_and_sigma_and_they_reproduce_it(tmp_path: Path) -> None:
    path = write(tmp_path)
    text, data = explain(path, "encoder.0.ffn.out", "0,1")
    assert "column 1 of weights.encoder.0.ffn.W_2 (drawn: seed 3, N(0, 0.5²)) = [" in text
    src = data["sources"]["weights.encoder.0.ffn.W_2"]
    assert src["kind"] == "drawn" and src["draw_path"] == "encoder.0.ffn.W_2"
    # SPEC section 2, from the stated seed, σ and path alone
    rng = np.random.default_rng([src["seed"], zlib.crc32(src["draw_path"].encode())])
    W_2 = rng.standard_normal((2, 2)) * src["init_std"]
    assert (src["seed"], src["init_std"]) == (3, 0.5)
    assert data["operands"]["W_2[:,1]"] == W_2[:, 1].tolist()
    # an embedding drawn likewise, under embeddings.<token>
    text, data = explain(path, "encoder.embed", "1,0")
    assert "embedding['b'] (drawn: seed 3, N(0, 0.5²))" in text
    src = data["sources"]["embeddings.b"]
    rng = np.random.default_rng([3, zlib.crc32(b"embeddings.b")])
    assert data["operands"]["embedding['b']"] == (rng.standard_normal(2) * 0.5).tolist()
    assert src["draw_path"] == "embeddings.b"


def test_a_set_and_a_variant_are_named(tmp_path: Path) -> None:
    path = write(tmp_path)
    text, data = explain(
        path, "encoder.0.ffn.out", "0,0", "--variant", "v",
        "--set", "weights.encoder.0.self_attn.W_o=[[1, 0], [0, 1]]",
    )  # fmt: skip
    line = line_of(CONFIG, "weights.encoder.0.ffn.W_2")
    assert (
        f"column 0 of weights.encoder.0.ffn.W_2 (variant 'v', {path} line {line}) = [1, 2]" in text
    )
    assert data["sources"]["weights.encoder.0.ffn.W_2"] == {
        "kind": "variant",
        "text": f"variant 'v', {path} line {line}",
        "file": path,
        "line": line,
        "by": "variant 'v'",
    }
    text, data = explain(
        path,
        "encoder.0.self_attn.wo",
        "0,1",
        "--set",
        "weights.encoder.0.self_attn.W_o=[[1, 0], [0, 1]]",
    )
    assert "column 1 of weights.encoder.0.self_attn.W_o (--set) = [0, 1]" in text
    assert data["sources"]["weights.encoder.0.self_attn.W_o"]["kind"] == "set"
    # a --set of a mapping above the weight names the key it set; one inside, the entry
    text, _ = explain(
        path,
        "encoder.0.ffn.hidden",
        "0,1",
        "--set",
        "weights.encoder.0.ffn={W_1: [[5, 6], [7, 8]]}",
    )
    assert "column 1 of weights.encoder.0.ffn.W_1 (--set weights.encoder.0.ffn) = [6, 8]" in text
    text, data = explain(
        path, "encoder.0.ffn.hidden", "0,1", "--set", "weights.encoder.0.ffn.W_1.0.1=9"
    )
    line = line_of(CONFIG, "W_1:")
    assert (
        f"(... line {line}; entries set by --set weights.encoder.0.ffn.W_1.0.1) = [9, 1]"
        in text.replace(path, "...")
    )
    assert data["sources"]["weights.encoder.0.ffn.W_1"]["partly"] == [
        "--set weights.encoder.0.ffn.W_1.0.1"
    ]


def test_a_fused_heads_columns_name_the_fused_matrix_and_its_line(tmp_path: Path) -> None:
    path = write(tmp_path)
    text, data = explain(path, "encoder.0.self_attn.h1.q", "0,0")
    w_line, b_line = line_of(CONFIG, "W_q:"), line_of(CONFIG, "b_q:")
    assert (
        f"column 1 of weights.encoder.0.self_attn.W_q (head 1's 1..1; {path} line {w_line}) = [2, 4]"
        in text
    )
    assert (
        f"entry 1 of weights.encoder.0.self_attn.b_q (head 1's 1..1; {path} line {b_line})" in text
    )
    assert data["sources"]["weights.encoder.0.self_attn.W_q"]["line"] == w_line
    # the per-head key's own source, as `step` and `weights` show it
    cfg_step = runner.invoke(
        app, ["step", path, "--stage", "encoder.0.self_attn.h1.q"], env={"COLUMNS": "200"}
    )
    assert (
        "weights.encoder.0.self_attn.heads.1.W_q   weight (column 1 of weights.encoder.0.self_attn.W_q "
        f"({path} line {w_line}))" in cfg_step.stdout
    )


def test_the_tied_output_names_each_tokens_embedding(tmp_path: Path) -> None:
    text = CONFIG.replace(
        "  init_std: 0.5\n", "  init_std: 0.5\n  tie_embeddings: true\n  decoder_layers: 1\n"
    )
    text = text.replace("source: [a, b]\n", "source: [a, b]\ntarget: [a]\n")
    path = write(tmp_path, text)
    out, data = explain(path, "logits", "0,0")
    assert f"the embedding of 'a' ({path} line {line_of(text, 'a: [1, 2]')}) = [1, 2]" in out
    out, data = explain(path, "logits", "0,2")
    assert "the embedding of 'c' (drawn: seed 3, N(0, 0.5²)) = [" in out
    tie = data["sources"]["embeddings (tied, transposed)"]
    assert tie["kind"] == "tied" and tie["line"] == line_of(text, "tie_embeddings")
    assert data["sources"]["embeddings.c"]["draw_path"] == "embeddings.c"


def test_an_npz_array_is_named(tmp_path: Path) -> None:
    W_1 = np.array([[3.0, 4.0], [5.0, 6.0]])
    np.savez(tmp_path / "w.npz", **{"encoder.0.ffn.W_1": W_1})
    text = CONFIG.replace("        W_1: [[1, 0], [0, 1]]\n", "").replace(
        "vocab:", "weights_file: w.npz\nvocab:"
    )
    path = write(tmp_path, text)
    npz = str(tmp_path / "w.npz")
    out, data = explain(path, "encoder.0.ffn.hidden", "0,1")
    assert (
        f"column 1 of weights.encoder.0.ffn.W_1 ({npz}, array 'encoder.0.ffn.W_1') = [4, 6]" in out
    )
    assert data["sources"]["weights.encoder.0.ffn.W_1"] == {
        "kind": "npz",
        "text": f"{npz}, array 'encoder.0.ffn.W_1'",
        "file": npz,
        "array": "encoder.0.ffn.W_1",
    }


def test_step_titles_a_weight_input_with_its_source(tmp_path: Path) -> None:
    path = write(tmp_path)
    result = runner.invoke(
        app, ["step", path, "--stage", "encoder.0.ffn.*"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    line = line_of(CONFIG, "W_1:")
    assert f"weights.encoder.0.ffn.W_1   weight ({path} line {line})   [2 × 2]" in result.stdout
    assert (
        "weights.encoder.0.ffn.W_2   weight (drawn: seed 3, N(0, 0.5²))   [2 × 2]" in result.stdout
    )


SCORES = """\
model:
  d_model: 2
  n_heads: 2
  d_k: 2
  d_ff: 2
  positional: relative
  max_len: 3
  score: additive
  norm_position: pre
vocab: [a, b]
source: [[1, 2], [3, 4]]
weights:
  encoder:
    - self_attn:
        rel_bias: [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
        heads:
          - v_a: [1, -1]
  encoder_final_norm: {beta: [0.5, 0.5]}
"""


def test_score_weights_rel_bias_final_norm_and_a_numeric_source(tmp_path: Path) -> None:
    path = write(tmp_path, SCORES)
    out, data = explain(path, "encoder.0.self_attn.h0.scores", "1,0")
    assert (
        f"v_a = weights.encoder.0.self_attn.heads.0.v_a ({path} line {line_of(SCORES, 'v_a')})"
        in out
    )
    out, _ = explain(path, "encoder.0.self_attn.h0.q_a", "1,0")
    assert "column 0 of weights.encoder.0.self_attn.heads.0.W_a_q (drawn: seed 0, N(0, 1²))" in out
    out, data = explain(path, "encoder.0.self_attn.h1.rel_bias", "1,0")
    line = line_of(SCORES, "rel_bias")
    assert f"row 1 of weights.encoder.0.self_attn.rel_bias (fused; {path} line {line})" in out
    out, _ = explain(path, "encoder.final_norm", "1,0")
    assert "weights.encoder_final_norm.gamma (default: ones)" in out
    assert (
        f"weights.encoder_final_norm.beta ({path} line {line_of(SCORES, 'encoder_final_norm')})"
        in out
    )
    out, data = explain(path, "encoder.embed", "1,0")
    assert f"source is given as numbers ({path} line {line_of(SCORES, 'source')})" in out
    assert data["sources"]["source"]["line"] == line_of(SCORES, "source")


def test_bilinear_and_learned_positions(tmp_path: Path) -> None:
    text = SCORES.replace("score: additive", "score: bilinear").replace("relative", "learned")
    text = text.replace("        rel_bias: [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]\n", "")
    text = text.replace("          - v_a: [1, -1]\n", "          - W_b: [[1, 0], [0, 2]]\n")
    text = text.replace("source: [[1, 2], [3, 4]]", "source: [a, b]")
    path = write(tmp_path, text)
    out, _ = explain(path, "encoder.0.self_attn.h0.q_b", "0,1")
    assert (
        f"column 1 of weights.encoder.0.self_attn.heads.0.W_b ({path} line {line_of(text, 'W_b')})"
        in out
    )
    out, data = explain(path, "encoder.pe", "1,0")
    assert "positional = weights.positional (drawn: seed 0, N(0, 1²))" in out
    src = data["sources"]["weights.positional"]
    rng = np.random.default_rng([0, zlib.crc32(src["draw_path"].encode())])
    assert data["operands"]["positional"] == [rng.standard_normal((3, 2))[1, 0]]


def test_the_weights_command_lists_every_weight_with_shape_and_source(tmp_path: Path) -> None:
    path = write(tmp_path)
    result = runner.invoke(app, ["weights", path, "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["path"]: r for r in json.loads(result.stdout)["weights"]}
    assert rows["weights.encoder.0.ffn.W_1"] == {
        "path": "weights.encoder.0.ffn.W_1",
        "shape": [2, 2],
        "kind": "file",
        "text": f"{path} line {line_of(CONFIG, 'W_1:')}",
        "file": path,
        "line": line_of(CONFIG, "W_1:"),
    }
    assert rows["weights.encoder.0.self_attn.heads.1.W_q"]["part"] == "column 1"
    assert rows["weights.encoder.0.ffn.norm.beta"]["kind"] == "default"
    assert "weights.encoder.0.ffn.b_1" not in rows  # not given: the model adds no bias
    src = rows["weights.encoder.0.ffn.W_2"]
    assert src["shape"] == [2, 2] and (src["seed"], src["init_std"]) == (3, 0.5)
    assert src["draw_path"] == "encoder.0.ffn.W_2"
    table = runner.invoke(app, ["weights", path], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "weights.encoder.0.ffn.W_2" in table.stdout
    assert "drawn: seed 3, N(0, 0.5²)" in table.stdout
    single = tmp_path / "op.yaml"
    single.write_text("norm: {x: [[1, 2]]}\n", encoding="utf-8")
    result = runner.invoke(app, ["weights", str(single)])
    assert result.exit_code == 2 and "single norm operation" in result.stderr


def test_the_weights_table_elides_a_long_vocabulary_unless_full(tmp_path: Path) -> None:
    vocab = [f"w{i}" for i in range(20)]
    path = tmp_path / "v.yaml"
    path.write_text(
        "model: {d_model: 2, n_heads: 1, d_ff: 2, encoder_layers: 1, decoder_layers: 0}\n"
        f"vocab: [{', '.join(vocab)}]\nsource: [w0]\n",
        encoding="utf-8",
    )
    wide = {"COLUMNS": "200"}
    table = runner.invoke(app, ["weights", str(path)], env=wide).stdout
    shown = [t for t in vocab if f"embeddings.{t} " in table]
    assert shown == ["w0", "w1", "w2", "w3", "w16", "w17", "w18", "w19"]
    assert "… 12 more embeddings (--full shows them)" in table
    assert "weights.encoder.0.ffn.W_1" in table  # the layers' weights are all shown
    full = runner.invoke(app, ["weights", str(path), "--full"], env=wide).stdout
    assert all(f"embeddings.{t} " in full for t in vocab) and "more embeddings" not in full
    listed = json.loads(runner.invoke(app, ["weights", str(path), "--format", "json"]).stdout)
    assert sum(r["path"].startswith("embeddings.") for r in listed["weights"]) == 20


def weights_json(path: str, *args: str) -> dict[str, dict[str, Any]]:
    """`weights --format json`, its rows by key path."""
    result = runner.invoke(app, ["weights", path, "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return {r["path"]: r for r in json.loads(result.stdout)["weights"]}


DOTTED = """\
model: {d_model: 2, n_heads: 1, d_k: 2, d_ff: 2}
vocab: [1, 1.5, ".", x]
embeddings:
  1: [1, 1]
  1.5: [2, 2]
source: [1, 1.5, .]
"""


def test_a_set_of_a_dotted_token_is_named_as_the_set(tmp_path: Path) -> None:
    """`embeddings..` (as README writes it) sets the token '.': its source is the --set,
    not the line of `embeddings:`."""
    path = write(tmp_path, DOTTED)
    rows = weights_json(path, "--set", "embeddings..=[9, 9]")
    assert rows["embeddings.."]["kind"] == "set", rows["embeddings.."]
    _, data = explain(path, "encoder.embed", "2,0", "--set", "embeddings..=[9, 9]")
    assert data["sources"]["embeddings.."]["kind"] == "set"


def test_entries_set_in_a_dotted_token_are_its_own_not_a_shorter_tokens(
    tmp_path: Path,
) -> None:
    """`embeddings.1.5` is the token '1.5': neither it nor its entry `embeddings.1.5.1`
    sets entries of the token '1' (the overrides' keys were split at every dot)."""
    path = write(tmp_path, DOTTED)
    one = f"{path} line {line_of(DOTTED, '1: [1, 1]')}"
    rows = weights_json(path, "--set", "embeddings.1.5=[3, 3]")
    assert rows["embeddings.1"]["text"] == one and "partly" not in rows["embeddings.1"]
    assert rows["embeddings.1.5"]["kind"] == "set"
    rows = weights_json(path, "--set", "embeddings.1.5.1=3")
    assert rows["embeddings.1"]["text"] == one and "partly" not in rows["embeddings.1"]
    assert rows["embeddings.1.5"]["partly"] == ["--set embeddings.1.5.1"]


def test_an_entry_set_in_a_fused_matrix_is_named_only_for_the_head_it_is_in(
    tmp_path: Path,
) -> None:
    """W_q.0.0 is in head 0's column 0 of the fused W_q: head 1's column does not hold
    it, and must not say that entries of it were set; a whole row is in both heads."""
    path = write(tmp_path)
    w_q = "weights.encoder.0.self_attn.W_q"
    rows = weights_json(path, "--set", f"{w_q}.0.0=5")
    assert rows["weights.encoder.0.self_attn.heads.0.W_q"]["partly"] == [f"--set {w_q}.0.0"]
    assert "partly" not in rows["weights.encoder.0.self_attn.heads.1.W_q"]
    _, data = explain(path, "encoder.0.self_attn.h1.q", "0,0", "--set", f"{w_q}.0.0=5")
    line = line_of(CONFIG, "W_q:")
    said = f"W_q[:,0] = column 1 of {w_q} (head 1's 1..1; {path} line {line}) = [2, 4]"
    assert said in data["where"], data["where"]
    _, data = explain(path, "encoder.0.self_attn.h0.q", "0,0", "--set", f"{w_q}.0.0=5")
    said = f"(head 0's 0..0; {path} line {line}; entries set by --set {w_q}.0.0) = [5, 3]"
    assert any(w.endswith(said) for w in data["where"]), data["where"]
    b_q = "weights.encoder.0.self_attn.b_q"
    rows = weights_json(path, "--set", f"{w_q}.1=[7, 8]", "--set", f"{b_q}.1=1")
    assert rows["weights.encoder.0.self_attn.heads.0.W_q"]["partly"] == [f"--set {w_q}.1"]
    assert rows["weights.encoder.0.self_attn.heads.1.W_q"]["partly"] == [f"--set {w_q}.1"]
    assert "partly" not in rows["weights.encoder.0.self_attn.heads.0.b_q"]
    assert rows["weights.encoder.0.self_attn.heads.1.b_q"]["partly"] == [f"--set {b_q}.1"]


def test_an_entry_set_in_a_fused_rel_bias_is_named_only_for_its_heads_row(
    tmp_path: Path,
) -> None:
    """rel_bias.0.2 is in head 0's row of the fused table: explain's lookup for head 1
    said its row had entries set by it."""
    text = CONFIG.replace("  init_std: 0.5\n", "  init_std: 0.5\n  positional: relative\n")
    text = text.replace(
        "        b_q: [0.5, 0.25]\n",
        "        b_q: [0.5, 0.25]\n        rel_bias: [[1, 2, 3], [4, 5, 6]]\n",
    ).replace("  d_ff: 2\n", "  d_ff: 2\n  max_len: 2\n")
    path = write(tmp_path, text)
    key = "weights.encoder.0.self_attn.rel_bias"
    line = line_of(text, "rel_bias:")
    _, data = explain(path, "encoder.0.self_attn.h1.rel_bias", "0,1", "--set", f"{key}.0.2=0")
    said = f"row 1 of {key} (fused; {path} line {line}), i.e. "
    assert any(said in w for w in data["where"]), data["where"]
    _, data = explain(path, "encoder.0.self_attn.h0.rel_bias", "0,1", "--set", f"{key}.0.2=0")
    said = f"row 0 of {key} (fused; {path} line {line}; entries set by --set {key}.0.2), i.e. "
    assert any(said in w for w in data["where"]), data["where"]


def test_the_weights_table_at_40_columns_breaks_paths_after_their_dots(tmp_path: Path) -> None:
    """On a narrow terminal each key path goes over lines after its dots, as the other
    tables' paths do; it was folded inside a part (`weights.enco` / `der.0.self_a`), and
    a source's words inside a word."""
    path = write(tmp_path)
    result = runner.invoke(
        app,
        ["weights", path, "--set", "weights.encoder.0.self_attn.W_q.0.0=5"],
        env={"COLUMNS": "40"},
    )
    assert result.exit_code == 0, result.output
    rows: list[tuple[list[str], list[str]]] = []
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) != 3 or cells[0] == "weight":
            continue
        if cells[1]:  # a shape: a new row
            rows.append(([], []))
        rows[-1][0].append(cells[0])
        rows[-1][1].append(cells[2])
    expected = weights_json(path, "--set", "weights.encoder.0.self_attn.W_q.0.0=5")
    assert ["".join(p for p in parts if p) for parts, _ in rows] == list(expected)
    for (parts, source), src in zip(rows, expected.values(), strict=True):
        parts = [p for p in parts if p]
        assert all(p.endswith(".") for p in parts[:-1]), parts
        # each line of the source ends at a space or after a dot, never inside a word
        text, at = src["text"], 0
        for piece in (p for p in source if p):
            at = text.index(piece, at) + len(piece)
            assert at == len(text) or text[at] == " " or piece.endswith("."), (piece, text)


def test_entries_set_in_a_weight_the_config_does_not_give(tmp_path: Path) -> None:
    """An entry set in a drawn weight (W_2.0.1), a default (γ.1), a drawn embedding or
    a bias not given is set over what the weight would be: the draw (SPEC's rule,
    recomputed here), ones, zeros; every other entry keeps it. Its source says both.
    (It was an error: 'W_2.0: not a number; expected a number, found a mapping'.)"""
    from trace_tf.config import load

    path = write(tmp_path)

    def drawn(key: str, shape: tuple[int, ...]) -> np.ndarray:  # seed 3, init_std 0.5
        return np.random.default_rng([3, zlib.crc32(key.encode())]).standard_normal(shape) * 0.5

    sets = {
        "weights.encoder.0.ffn.W_2.0.1": 5.0,
        "weights.encoder.0.self_attn.norm.gamma.1": 7.0,
        "embeddings.b.0": 9.0,
        "weights.encoder.0.ffn.b_2.1": 2.0,
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    cfg = load(path, [f"{k}={v}" for k, v in sets.items()])
    assert isinstance(cfg, Config)
    W_2 = drawn("encoder.0.ffn.W_2", (2, 2))
    W_2[0, 1] = 5.0
    np.testing.assert_array_equal(cfg.encoder[0].ffn.W_2, W_2)
    np.testing.assert_array_equal(cfg.encoder[0].self_attn.norm.gamma, [1.0, 7.0])
    b = drawn("embeddings.b", (2,))
    b[0] = 9.0
    np.testing.assert_array_equal(cfg.embeddings["b"], b)
    np.testing.assert_array_equal(cfg.encoder[0].ffn.b_2, [0.0, 2.0])
    rows = weights_json(path, *args)
    seed = "drawn: seed 3, N(0, 0.5²)"
    for key, text in (
        ("weights.encoder.0.ffn.W_2", seed),
        ("weights.encoder.0.self_attn.norm.gamma", "default: ones"),
        ("embeddings.b", seed),
        ("weights.encoder.0.ffn.b_2", "default: zeros"),
    ):
        entry = next(k for k in sets if k.startswith(key + "."))
        assert rows[key]["text"] == f"{text}; entries set by --set {entry}", rows[key]
        assert rows[key]["partly"] == [f"--set {entry}"]
    out, data = explain(path, "encoder.0.ffn.out", "0,1", *args)
    assert f"weights.encoder.0.ffn.W_2 ({seed}; entries set by --set weights.encoder" in out
    assert data["sources"]["weights.encoder.0.ffn.b_2"]["kind"] == "default"
    # an entry beyond the weight's shape is named
    result = runner.invoke(app, ["encode", path, "--set", "weights.encoder.0.ffn.W_2.0.2=1"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        "weights.encoder.0.ffn.W_2.0.2: no such entry (set by --set weights.encoder.0.ffn."
        "W_2.0.2); expected indices within shape 2 x 2"
    ) in result.stderr
    # entries of a fused weight the config does not give: no one array to set them over
    whole, key = "weights.encoder.0.self_attn.W_k", "weights.encoder.0.self_attn.W_k.0.1"
    result = runner.invoke(app, ["encode", path, "--set", f"{key}=5"])
    assert result.exit_code == 2, result.output
    assert (
        f"{whole}: entries set in a weight the config does not give (by --set {key}); "
        f"expected the whole weight first, --set {whole}=[...]"
    ) in result.stderr, result.stderr


def test_a_row_set_in_a_drawn_weight_must_be_a_whole_row(tmp_path: Path) -> None:
    """`W_2.1=[...]` sets row 1 of the drawn W_2 (shape 2 x 2) and keeps row 0 as drawn;
    a row of another length, or a number for a row, is refused, not written in part."""
    from trace_tf.config import load

    path = write(tmp_path)
    cfg = load(path, ["weights.encoder.0.ffn.W_2.1=[7, 8]"])
    assert isinstance(cfg, Config)
    drawn = np.random.default_rng([3, zlib.crc32(b"encoder.0.ffn.W_2")]).standard_normal((2, 2))
    np.testing.assert_array_equal(cfg.encoder[0].ffn.W_2, [drawn[0] * 0.5, [7.0, 8.0]])
    for value, found in (("[7]", "found shape 1"), ("7", "found shape scalar")):
        result = runner.invoke(
            app, ["encode", path, "--set", f"weights.encoder.0.ffn.W_2.1={value}"]
        )
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert "weights.encoder.0.ffn.W_2.1: wrong shape" in result.stderr
        assert f"expected shape 2, {found}" in result.stderr


def drawn_W_2() -> np.ndarray:
    """CONFIG's W_2 as drawn: SPEC's rule, seed 3, init_std 0.5."""
    rng = np.random.default_rng([3, zlib.crc32(b"encoder.0.ffn.W_2")])
    return rng.standard_normal((2, 2)) * 0.5


def test_an_entry_of_a_drawn_weight_set_twice_is_the_last_value(tmp_path: Path) -> None:
    """`W_2.0.1=5` then `W_2.0.1=7` over the drawn W_2: the second override of the same
    key lost that the first had made W_2 of its entries, and the run stopped with
    'W_2.0: not a number ...; found a mapping'."""
    from trace_tf.config import load

    path = write(tmp_path)
    key = "weights.encoder.0.ffn.W_2.0.1"
    cfg = load(path, [f"{key}=5", f"{key}=7"])
    assert isinstance(cfg, Config)
    expected = drawn_W_2()
    expected[0, 1] = 7.0
    np.testing.assert_array_equal(cfg.encoder[0].ffn.W_2, expected)
    row = weights_json(path, "--set", f"{key}=5", "--set", f"{key}=7")["weights.encoder.0.ffn.W_2"]
    assert row["text"] == f"drawn: seed 3, N(0, 0.5²); entries set by --set {key}"


def test_a_whole_weight_set_after_entries_of_its_draw_replaces_them(tmp_path: Path) -> None:
    """`W_2.0.1=5` then `W_2=[[1, 2], [3, 4]]`: the whole weight given last is the
    weight (it was the draw with entry 0,1 read from the new matrix, 2). After
    `W_2=null` (drawn again) only the entries set since count (one set before made
    an internal error, KeyError)."""
    from trace_tf.config import load

    path = write(tmp_path)
    w = "weights.encoder.0.ffn.W_2"
    cfg = load(path, [f"{w}.0.1=5", f"{w}=[[1, 2], [3, 4]]"])
    assert isinstance(cfg, Config)
    np.testing.assert_array_equal(cfg.encoder[0].ffn.W_2, [[1.0, 2.0], [3.0, 4.0]])
    cfg = load(path, [f"{w}.1.0=3", f"{w}=null", f"{w}.0.1=5"])
    assert isinstance(cfg, Config)
    expected = drawn_W_2()
    expected[0, 1] = 5.0
    np.testing.assert_array_equal(cfg.encoder[0].ffn.W_2, expected)
    result = runner.invoke(
        app, ["encode", path, "--set", f"{w}.1.0=3", "--set", f"{w}=null", "--set", f"{w}.0.1=5"]
    )
    assert result.exit_code == 0, result.output


def test_an_index_below_an_entry_of_a_drawn_weight_is_no_such_entry(tmp_path: Path) -> None:
    """`W_2.0.1.0=1` (one index too many): the list made at W_2.0.1 was taken for the
    array, and the message said 'W_2.0: not a number; expected a number, found a
    mapping', naming no override."""
    path = write(tmp_path)
    key = "weights.encoder.0.ffn.W_2.0.1.0"
    result = runner.invoke(app, ["encode", path, "--set", f"{key}=1"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        f"{key}: no such entry (set by --set {key}); expected indices of shape 2 x 2"
    ) in result.stderr, result.stderr


def test_a_key_below_a_weight_not_given_that_is_no_index_is_no_such_entry(
    tmp_path: Path,
) -> None:
    """`W_2.-1.0=1` or `W_2.0.x=1` with W_2 drawn (or a fused W_q not given): the
    mapping the override made was reported as the weight's fault, 'W_2: not a number
    ...; expected a number, found a mapping'."""
    path = write(tmp_path)
    for key, shape in (
        ("weights.encoder.0.ffn.W_2.-1.0", "2 x 2"),
        ("weights.encoder.0.ffn.W_2.0.x", "2 x 2"),
        ("weights.encoder.0.self_attn.norm.gamma.-1", "2"),
        ("embeddings.b.-1", "2"),
    ):
        result = runner.invoke(app, ["encode", path, "--set", f"{key}=1"])
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert (
            f"{key}: no such entry (set by --set {key}); expected indices of shape {shape}"
        ) in result.stderr, result.stderr


def test_an_entry_of_a_matrix_a_single_operation_file_does_not_give(tmp_path: Path) -> None:
    """`attention.Q.0.1=5` where the file gives no Q: the message said the whole
    'weight' was needed, adding that 'not given, a weight is drawn' (a single
    operation's Q is never drawn: without one the run stops, 'missing Q')."""
    path = tmp_path / "op.yaml"
    path.write_text("attention: {K: [[1, 2]], V: [[3]]}\n", encoding="utf-8")
    result = runner.invoke(app, ["attend", str(path), "--set", "attention.Q.0.1=5"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().endswith(
        "attention.Q: entries set in a matrix the config does not give (by --set "
        "attention.Q.0.1); expected the whole matrix first, --set attention.Q=[...], "
        "found only entries: attention.Q.0.1"
    ), result.stderr


def test_an_entry_set_below_a_layer_index_with_a_leading_zero(tmp_path: Path) -> None:
    """`weights.encoder.00.ffn.W_2.0.1=5`: the list index 00 is layer 0, but the
    override was recorded under `encoder.00`, so the weight it made at `encoder.0`
    was not known to be made of entries: 'W_2.0: not a number; found a mapping'."""
    from trace_tf.config import load

    path = write(tmp_path)
    cfg = load(path, ["weights.encoder.00.ffn.W_2.0.1=5"])
    assert isinstance(cfg, Config)
    expected = drawn_W_2()
    expected[0, 1] = 5.0
    np.testing.assert_array_equal(cfg.encoder[0].ffn.W_2, expected)
    row = weights_json(path, "--set", "weights.encoder.00.ffn.W_2.0.1=5")
    assert row["weights.encoder.0.ffn.W_2"]["partly"] == ["--set weights.encoder.0.ffn.W_2.0.1"]


def test_an_embeddings_token_is_shown_in_its_path_as_a_label_shows_it(tmp_path: Path) -> None:
    """The empty token and the space token both showed as the path `embeddings.` in the
    `weights` and `diff` weights tables, two rows alike; a newline token as `b\\nc`, the
    four characters' token's look. Each is now shown as its label is, quoted where it
    could be misread (README, "how a token is shown"); JSON keeps the whole path."""
    path = tmp_path / "tokens.yaml"
    path.write_text(
        json.dumps(
            {
                "model": {"d_model": 4, "n_heads": 1},
                "vocab": ["", " ", "a", "b\nc", "x\\y"],
                "source": ["a", " "],
            }
        )
    )
    shown = ["embeddings.''", "embeddings.' '", "embeddings.a", "embeddings.'b\\nc'"]
    shown.append("embeddings.'x\\\\y'")
    for args in (["weights"], ["diff", "--set-b", "model.seed=3", "--brief"]):
        out = runner.invoke(app, [args[0], str(path), *args[1:]], env={"COLUMNS": "200"})
        assert out.exit_code == 0, out.stderr
        # (a row's first cell: up to its border, or two spaces)
        paths = [re.split(r" *│| {2,}", line.strip("│ "))[0] for line in out.stdout.splitlines()]
        assert [p for p in paths if p.startswith("embeddings.")] == shown, args
