"""Report tables at narrow terminals: a path goes onto lines after its dots, a formula
at its spaces, and no word, path part or number is split across lines (rich's fold
split "self_attn" into "self_a" / "ttn", and "multiply-adds" into "multiply" / "-adds";
the diff summary cut paths to "…softmax", h0's and h1's rows alike)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.render import shown_token
from trace_tf.stages import GROUP_MEANINGS, STAGES

runner = CliRunner()
WORD = re.compile(r"[A-Za-z0-9_]+")
DIFF = ["diff", "hello", "--set-b", "model.scale=30"]


def shown(args: list[str], columns: int) -> str:
    result = runner.invoke(app, args, env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


def data(args: list[str]) -> dict:  # type: ignore[type-arg]
    return json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)


def words(*texts: str) -> set[str]:
    return {w for t in texts for w in WORD.findall(t)}


def assert_no_word_split(text: str, allowed: set[str]) -> None:
    """Every run of word characters printed is a whole word of the report's texts: a
    word split across lines leaves pieces ("ttn", "caled") that are none of them."""
    split = sorted(w for w in words(text) - allowed if not w.isdigit())  # (numbers: below)
    assert not split, split


def box_cells(text: str, column: int, key: int) -> list[str]:
    """Column `column` of a boxed table's body, a row's lines joined; a row starts on a
    line whose column `key` is not empty."""
    rows: list[str] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[key]:
            rows.append(cells[column])
        else:
            rows[-1] += cells[column]
    return rows


@pytest.mark.parametrize("columns", [40, 50, 60])
def test_cost_wraps_paths_at_dots_and_formulas_at_spaces(columns: int) -> None:
    out = shown(["cost"], columns)
    ledger = data(["cost"])["ledger"]
    allowed = words(
        *(c["path"] + " " + c["formula"] for c in ledger),
        "multiply adds of every step shape count totals stage or kind share grows as",
        "total projection attention ffn output O L D d_ff V 100",
    )
    assert_no_word_split(out, allowed)
    assert any("multiply-adds" in line for line in out.splitlines()[:4])  # its header
    # every path, its lines joined; the formula with its terms; every count whole
    first = box_cells(out, 0, 1)[: len(ledger)]
    assert first == [c["path"] for c in ledger]
    formulas = box_cells(out, 2, 1)[: len(ledger)]
    for c, formula in zip(ledger, formulas, strict=True):
        terms = " = " + "·".join(map(str, c["terms"])) if c["terms"] else ""
        assert formula.replace(" ", "") == (c["formula"] + terms).replace(" ", "")
    counts = box_cells(out, 3, 1)[: len(ledger)]
    assert counts == [f"{c['macs']:,}" if c["macs"] else "—" for c in ledger]


@pytest.mark.parametrize("columns", [40, 50, 60])
def test_stages_wraps_paths_at_dots_and_text_at_spaces(columns: int) -> None:
    out = shown(["stages"], columns)
    allowed = words(
        *(f"{s.name} {s.formula} {s.meaning} {' '.join(s.paths)} {s.shape}" for s in STAGES),
        *(f"{k} {v}" for k, v in GROUP_MEANINGS.items()),
        "stages select with stage NAME formula meaning and the paths recorded shape",
        "groups also group selects",
    )
    assert_no_word_split(out, allowed)
    # each path, where broken, is broken after a dot: its lines joined give it back
    about = "".join(box_cells(out, 1, 0))
    for s in STAGES:
        for p in s.paths:
            assert p in about, p
    assert "…" not in out.replace("cos(…)", "").replace("| … |", "")  # nothing cut


@pytest.mark.parametrize("columns", [40, 50, 60])
def test_diff_summary_keeps_every_path_whole_over_lines(columns: int) -> None:
    out = shown(DIFF, columns)
    steps = [s for s in data(DIFF)["steps"] if s["status"] != "same"]
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("step ")) + 1  # (its header)
    rows: list[list[str]] = []  # each row's cells, its path as the lines it is shown on
    pieces: list[list[str]] = []
    for line in lines[start:]:
        cells = line.split()
        if len(cells) > 1:
            rows.append(cells)
            pieces.append([cells[0]])
        elif cells and rows:
            pieces[-1].append(cells[0])
    rows, pieces = rows[: len(steps)], pieces[: len(steps)]
    # every path whole, its lines joined: h0's and h1's rows told apart
    assert ["".join(p) for p in pieces] == [s["path"] for s in steps]
    for p in pieces:  # broken only after a dot
        assert all(x.endswith(".") for x in p[:-1]), p
    assert any(len(p) > 1 for p in pieces)  # (this width does break paths)
    for r, s in zip(rows, steps, strict=True):
        assert r[2] == f"{s['max_abs_diff']:.3g}"  # numbers whole
        assert r[3] == "[" + ",".join(map(str, s["at"])) + "]"
        assert r[4].startswith(f"{s['cells_differing']}/")
    assert max(map(cell_len, lines)) <= columns  # and it fits the terminal


@pytest.mark.parametrize("extra", [["--set-b", "model.scale=30"], ["--brief", "--all"]])
def test_diff_summary_fits_40_columns_its_header_over_two_lines(extra: list[str]) -> None:
    # It was 45 cells wide at 40 columns: "max |B−A|" took 9 cells over numbers of 5.
    args = ["diff", "hello", "--set-b", "model.scale=30", *extra]
    lines = shown(args, 40).splitlines()
    assert max(map(cell_len, lines)) <= 40
    at = next(i for i, x in enumerate(lines) if x.startswith("step "))
    assert lines[at - 1].split() == ["max"] and lines[at].split()[2] == "|B−A|"
    assert lines[at - 1].index("max") + 3 == lines[at].index("|B−A|") + 5  # right-aligned
    # wider, where it fits as it is, the header is one line
    assert "max |B−A|" in shown(args, 60)


@pytest.mark.parametrize(
    "change", [["model.positional=rope", "--brief"], ["model.d_ff=6", "--brief"]]
)
def test_diff_summary_fits_40_columns_its_status_over_lines(change: list[str]) -> None:
    # 41 and 51 cells at 40 columns: the status "only in A" (9 cells) and "shape 2 × 8
    # → 2 × 6" (19) were kept on one line. Now a status goes over lines at its spaces,
    # a shape's kept whole ("shape" / "2 × 8 →" / "2 × 6"), as a path after its dots.
    args = ["diff", "hello", "--set-b", *change]
    steps = [s for s in data(args)["steps"] if s["status"] != "same"]
    lines = shown(args, 40).splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("step "))
    assert max(map(cell_len, lines[at - 2 :])) <= 40
    start = lines[at].index("status")
    statuses: list[str] = []  # each row's status, its lines joined (rows: blank-separated)
    blocks = re.split(r"\n *\n", "\n".join(lines[at + 1 :]))
    for block in blocks:
        statuses.append(" ".join(x[start : start + 7].strip() for x in block.splitlines()))
    statuses = statuses[: len(steps)]
    expected = []
    for s in steps:
        if s["status"] == "shape":
            a, b = ("{} × {}".format(*s[k]) for k in ("shape_a", "shape_b"))
            expected.append(f"shape {a} → {b}")
        else:
            expected.append(s["status"])
    assert [x.strip() for x in statuses] == expected


def test_check_fits_40_columns_numbers_and_verdicts_whole() -> None:
    # It was 48 cells wide: step / variant / ok / "max |error|" / tolerance, two
    # spaces apart. Now its header goes over two lines, one space between columns, and
    # the variant names (already cut to 8 cells, "…scale30") to 7.
    args = ["check", "fixtures/hello.yaml"]
    results = data(args)["results"]
    lines = shown(args, 40).splitlines()
    assert max(map(cell_len, lines)) <= 40
    at = next(i for i, x in enumerate(lines) if x.startswith("step "))
    assert lines[at - 1].split() == ["max"]
    assert lines[at].split() == ["step", "variant", "ok", "|error|", "tolerance"]
    rows = [x.split() for x in lines[at + 1 :] if re.search(r"\s(ok|FAIL)\s", x)]
    assert len(rows) == len(results)
    for row, r in zip(rows, results, strict=True):
        assert row[-3] == ("ok" if r["ok"] else "FAIL")
        assert float(row[-2]) == pytest.approx(r["max_abs_error"], rel=5e-3, abs=0)  # 3 digits
        tolerance = row[-1].removesuffix("·|v|")
        assert float(tolerance) == (r["rtol"] or r["atol"])
        if r["variant"]:  # a name cut in its middle keeps its end
            assert r["variant"].endswith(row[1].lstrip("…")[-4:])
    assert "max |error|" in shown(args, 60)  # where it fits, as before


def test_diff_header_breaks_its_first_differing_path_after_a_dot() -> None:
    # At 40 columns its panel read "encoder.0.self_attn.h0.scale" / "d (differs)".
    out = shown(DIFF, 40)
    panel = out[: out.index("╰")]
    first = data(DIFF)["first_difference"]
    allowed = words(
        first,
        "trace tf diff A B hello packaged example model scale 30 result first difference",
        "differs of 87 steps 52 differ 35 the same list them with all atol 1e 12",
    )
    assert_no_word_split(panel, allowed)
    result = [x.strip("│ ") for x in panel.splitlines() if x.strip("│ ")][3:]
    assert first in "".join(x.removeprefix("result").strip() for x in result)


@pytest.mark.parametrize("columns", [40, 60, 120])
def test_check_names_each_config_whole_above_its_own_rows(columns: int) -> None:
    # Several configs shared one column, cut at narrow widths to "000…yaml": the five
    # 000_/001_/002_ files read alike. Each name is now a line of its own, whole,
    # above its entries; rows between two names are that config's.
    files = sorted(str(p) for p in Path("fixtures").glob("*.yaml"))
    results = data(["check", *files])["results"]
    names = [Path(f).name for f in files]
    out = shown(["check", *files], columns).splitlines()
    assert [x for x in out if x.strip() in names] == names  # whole, in order, once each
    at = [out.index(n) for n in names] + [len(out)]
    for name, start, end in zip(names, at[:-1], at[1:], strict=True):
        body = [x for x in out[start + 1 : end] if not x.startswith("step ")]  # (the header)
        verdicts = [x for x in body if re.search(r"\s(ok|FAIL)\s", x)]
        assert len(verdicts) == sum(Path(r["config"]).name == name for r in results)
    assert "config" not in out[2].split()  # no config column: the header is the step's


def test_check_keeps_two_configs_of_one_file_name_apart(tmp_path: Path) -> None:
    # Grouped (and named) by file name, a/x.yaml and b/x.yaml were one "x.yaml" in the
    # title, the rows of both under it. Each is now named by the path as given.
    for d, fixture in (("a", "000_relative_bias.yaml"), ("b", "002_causal_mask.yaml")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x.yaml").write_text(Path("fixtures", fixture).read_text())
    files = [str(tmp_path / "a" / "x.yaml"), str(tmp_path / "b" / "x.yaml")]
    results = data(["check", *files])["results"]
    out = shown(["check", *files], 400).splitlines()
    at = [out.index(f) for f in files] + [len(out)]  # each path on a line of its own
    for file, start, end in zip(files, at[:-1], at[1:], strict=True):
        body = [x for x in out[start + 1 : end] if not x.startswith("step ")]  # (the header)
        verdicts = [x for x in body if re.search(r"\s(ok|FAIL)\s", x)]
        assert len(verdicts) == sum(r["config"] == file for r in results) > 0


LONG_TOKEN = "supercalifragilistic" * 3  # 60 letters, one of hello's vocab below
LONG_VOCAB = ["vocab=[hello, mundo, world, how, '?', EOS, SOS, a, hola, " + LONG_TOKEN + "]"]


@pytest.mark.parametrize("columns", [40, 60, 80])
def test_weights_shortens_a_long_token_in_its_key_path_to_fit(columns: int) -> None:
    """`weights`' key path `embeddings.<token>` held the whole 60-letter token: 91 cells
    at 80 columns. The token is now shortened in its middle (to 32 cells, fewer where
    the table would not fit otherwise); the shapes are whole, JSON keeps the whole path."""
    args = ["weights", "hello", "--set", *LONG_VOCAB]
    text = shown(args, columns)
    assert max(map(cell_len, text.splitlines())) <= columns
    assert LONG_TOKEN not in text and "super" in text and "…" in text
    weights = data(args)["weights"]
    assert box_cells(text, 1, 1) == [" × ".join(map(str, w["shape"])) for w in weights]
    assert f"embeddings.{LONG_TOKEN}" in [w["path"] for w in weights]


@pytest.mark.parametrize("columns", [60, 80])
def test_diff_weights_shortens_a_long_token_where_it_would_not_fit(columns: int) -> None:
    """`diff`'s table of the weights that differ held the whole 60-letter token in its
    key path, and so every key path on one line: 106 cells at 60 and 80 columns. Where
    it would not fit otherwise the token is now shortened as `weights` shortens it; the
    numbers stay whole, and JSON keeps the whole path."""
    args = ["diff", "hello", "--set", *LONG_VOCAB, "--set-b", "model.seed=1", "--brief"]
    text = shown(args, columns).split("weights that differ")[1]  # (the panel: overrides)
    assert max(map(cell_len, text.splitlines())) <= columns
    assert LONG_TOKEN not in text and "super" in text and "…" in text
    weights = data(args)["weights"]
    assert f"embeddings.{LONG_TOKEN}" in [w["path"] for w in weights]
    maxima = {f"{w['max_abs_diff']:.3g}" for w in weights if w["status"] == "differs"}
    assert maxima <= set(text.split())  # every largest difference whole
    assert LONG_TOKEN in shown(args, 200).split("weights that differ")[1]  # fits: as before


@pytest.mark.parametrize(("change", "widest"), [("model.d_ff=6", 40), ("model.seed=1", 40)])
def test_diff_weights_at_40_columns_as_narrow_as_its_words_and_numbers(
    change: str, widest: int
) -> None:
    """At 40 columns `diff`'s table of the weights that differ was 55 cells wide (the
    shapes "4 × 8 → 4 × 6" on one line) and 57 (every column that wraps as wide as
    the widest, "embeddings."). Its columns now go one space apart, "max" / "|B−A|"
    over two lines, a shape or a status at its spaces (a shape kept whole), and each
    column that wraps at its least: it fits, and 43 (the key path's "embeddings.", a
    shape, the cells, a number, where, and the source's "drawn:"); 40 now, where
    under its largest difference (see the next test)."""
    args = ["diff", "hello", "--set-b", change, "--brief"]
    text = shown(args, 40).split("weights that differ")[1].split("\nsteps, ")[0]
    assert max(map(cell_len, text.splitlines())) <= widest
    weights = [w for w in data(args)["weights"] if w["status"] != "same"]
    words = set(text.split())
    for w in weights:  # every number and shape whole
        if w["status"] == "differs":
            assert f"{w['max_abs_diff']:.3g}" in words
            assert "[" + ",".join(map(str, w["at"])) + "]" in words
        for shape in (w["shape_a"], w["shape_b"]):
            assert " × ".join(map(str, shape)) in text


@pytest.mark.parametrize(
    "change",
    [["model.seed=1"], ["model.seed=2"], ["model.seed=2", "--set", *LONG_VOCAB]],
)
def test_diff_weights_fit_40_columns_each_place_under_its_largest_difference(
    change: list[str],
) -> None:
    """At its narrowest `diff`'s table of the weights that differ was 43 cells wide at
    40 columns (the key path's "embeddings.", a shape, the cells, a number, where, the
    source's "drawn:", one space apart). Where it would not fit otherwise, each largest
    |B − A| now has its place under it, in one column ("max" / "|B−A|" / "at"): the
    table fits, each weight's largest difference and its place whole, right-aligned one
    above the other, as JSON gives them. Wider, as before."""
    args = ["diff", "hello", "--set-b", *change, "--brief"]
    text = shown(args, 40).split("weights that differ")[1].split("\nsteps, ")[0]
    lines = text.splitlines()
    assert max(map(cell_len, lines)) <= 40
    head = next(i for i, x in enumerate(lines) if x.startswith("weight "))
    ends = [lines[head - 2].index("max") + 3, lines[head - 1].index("|B−A|") + 5]
    assert ends == [lines[head].index(" at ") + 3] * 2  # its header: "max" / "|B−A|" / "at"
    pairs = []
    for i, line in enumerate(lines[:-1]):
        found = re.search(r" \d+/\d+ +(\S+)", line)
        if found:
            end = found.end(1)
            place = re.search(r"(\[[\d,]+\])$", lines[i + 1][:end])
            assert place, (line, lines[i + 1])
            pairs.append((found.group(1), place.group(1)))
    weights = [w for w in data(args)["weights"] if w["status"] == "differs"]
    assert len(weights) > 20
    assert pairs == [
        (f"{w['max_abs_diff']:.3g}", "[" + ",".join(map(str, w["at"])) + "]") for w in weights
    ]
    wide = shown(args, 200).split("weights that differ")[1]
    assert re.search(r"max \|B−A\| +at +A → B there", wide)  # fits: as before


def test_generate_shortens_a_long_token_label_to_fit_its_panel() -> None:
    """`generate`'s next-token table showed a 60-letter token in 32 cells, a label's:
    its panel 53 cells wide at 40 columns. The token is now shortened further, as a
    matrix's labels are, to the most cells that let the panel fit; the p's whole."""
    args = ["generate", "hello", "--set", *LONG_VOCAB, "--greedy", "--max-tokens", "2"]
    text = shown(args, 40)
    assert max(map(cell_len, text.splitlines())) <= 40
    rows = [x for x in text.splitlines() if re.match(r"│ +\d+  ", x)]
    label = [x for x in rows if "super" in x]
    assert label and all("…" in x and LONG_TOKEN not in x for x in label)
    assert all(re.search(r"  \d\.\d{4} ", x) for x in rows)
    wide = shown(args, 120)  # where it fits, as before: a label's 32 cells
    assert shown_token(LONG_TOKEN) in wide and "…" in shown_token(LONG_TOKEN)


def test_generate_beam_hypotheses_one_space_apart_where_they_would_not_fit() -> None:
    """`generate --beam`'s hypotheses were 53 cells wide at 40 columns (50 for 4
    tokens), two spaces between columns and every column padded. Where the panel would
    not fit otherwise they are now one space apart, as narrow as their words and numbers
    (a token, n, logP, score, ended, the mark; 5 spaces, the panel's 4); wider, as before."""
    args = ["generate", "hello", "--beam", "3", "--max-tokens", "4", "--length-penalty", "0.6"]
    text = shown(args, 40)
    panel = text[text.index("╭─ generated") :].splitlines()
    rows = [x.strip("│ ").split() for x in panel if re.search(r" (cut|eos) ", x)]
    assert rows and all(len(r) >= 5 for r in rows)
    for r in rows:  # n, logP, score: whole
        assert r[1].isdigit() and all(re.fullmatch(r"-?\d+\.\d{4}", x) for x in r[2:4])
    columns = [max(cell_len(r[k]) for r in rows) for k in range(4)]
    need = max(columns[0], len("tokens")) + max(columns[1], 1)
    need += max(columns[2], 5) + max(columns[3], 5) + len("ended") + len("◀ result") + 5 + 4
    assert max(map(cell_len, panel)) == max(need, 40)
    assert "│  tokens               n     logP " in shown(args, 80)  # fits: as before


MIDDLING = """\
model: {d_model: 4, n_heads: 2, decoder_layers: 1, encoder_layers: 1}
vocab: [SOS, alpha_beta_gamma_delta, epsilon_zeta_eta_theta, EOS]
tokens: {bos: SOS, eos: EOS}
source: [alpha_beta_gamma_delta]
target: [SOS]
"""


@pytest.mark.parametrize("columns", [40, 60])
def test_generate_beam_hypotheses_at_their_least_set_apart(columns: int, tmp_path: Path) -> None:
    """Where the hypotheses' tokens were set at their least (the table one space apart),
    the table measured as wide as they let it, so their lines were not seen to wrap: the
    rows ran together, a hypothesis's tokens over lines into the next one's ("EOS" under
    the row of n 2 read as the start of the next), with no blank line between (at 40
    columns with a length penalty; at 60 with 22-letter tokens). A blank line now sets
    each row apart, as wherever the tokens wrap."""
    config = tmp_path / "middling.yaml"
    config.write_text(MIDDLING)
    args = ["generate", "hello", "--beam", "3", "--max-tokens", "4", "--length-penalty", "0.6"]
    if columns == 60:
        args = ["generate", str(config), "--beam", "3", "--max-tokens", "4"]
    text = shown(args, columns)
    panel = [x.strip("│").strip() for x in text[text.index("╭─ generated") :].splitlines()]
    rows = [i for i, x in enumerate(panel) if re.search(r" (cut|eos)( ◀ result)?$", x)]
    assert len(rows) == 3 and any(panel[i + 1] for i in rows)  # (tokens over lines)
    assert all(panel[i - 1] == "" for i in rows[1:])


@pytest.mark.parametrize("variant", [[], ["--variant", "document_logits"]])
def test_generate_beam_hypotheses_fit_40_columns_logp_and_score_one_column(
    variant: list[str],
) -> None:
    """`generate --beam 3`'s hypotheses were 46 cells wide at 40 columns (a token, n,
    logP, score, ended and the mark, one space apart), though with no length penalty
    each score is its logP (the title says so). Where the panel would not fit otherwise,
    they are now one column, "logP =" / "score": the panel fits 40 columns, each
    hypothesis's logP whole (JSON's, to 4 places), its tokens whole words; the rows,
    their tokens over lines, set apart by a blank line. Wider, as before."""
    args = ["generate", "hello", "--beam", "3", *variant]
    text = shown(args, 40)
    panel = text[text.index("╭─ generated") :].splitlines()
    assert max(map(cell_len, panel)) <= 40
    body = [x.strip("│").rstrip() for x in panel]
    assert any(x.endswith(" logP =") for x in body)
    assert any(re.match(r" tokens +n +score ended$", x) for x in body)
    hyps = data(args)["finished"] + data(args)["unfinished"]
    rows = [x for x in body if re.search(r" (cut|eos)( ◀ result)?$", x)]
    assert [r.split()[-4 if r.endswith("result") else -2] for r in rows] == [
        f"{h['logprob']:.4f}" for h in hyps
    ]
    vocab = {t for h in hyps for t in h["tokens"]}
    starts = [i for i, x in enumerate(body) if x in rows]
    for h, i, j in zip(hyps, starts, [*starts[1:], len(body)], strict=False):
        lines = body[i:j]
        tokens = [lines[0].split()[: -5 if lines[0].endswith("result") else -3]]
        tokens += [x.split() for x in lines[1:] if x.split() and set(x.split()) <= vocab]
        assert [t for line in tokens for t in line] == h["tokens"]
        assert j == len(body) or body[j - 1].strip() == ""  # a blank line between rows
    wide = shown(args, 80)
    assert re.search(r"│  tokens +n +logP +score +ended", wide)  # fits: as before


def test_generate_beam_a_score_equal_to_its_logp_only_as_printed_keeps_its_column() -> None:
    """With a length penalty of 1e-9 every score prints as its logP to 4 places, but is
    not it (logP / ((5 + n) / 6)^1e-9): the two stay two columns at 40, not one headed
    "logP =" / "score", which would claim an equality the title's formula denies."""
    args = ["generate", "hello", "--beam", "3", "--length-penalty", "1e-9"]
    hyps = data(args)["finished"] + data(args)["unfinished"]
    assert all(h["score"] != h["logprob"] for h in hyps)
    assert all(f"{h['score']:.4f}" == f"{h['logprob']:.4f}" for h in hyps)  # as printed
    text = shown(args, 40)
    panel = text[text.index("╭─ generated") :]
    assert "logP =" not in panel
    assert re.search(r" tokens +n +logP +score +ended", panel)


@pytest.mark.parametrize("letters", [16, 18, 20, 24, 28])
def test_weights_shortens_a_token_shorter_than_a_label_just_enough(letters: int) -> None:
    """The token was shortened to 32 cells less the table's excess, measured with both
    wrapping columns at one common width: a 16- to 20-letter token (under 32) was left
    whole, the table 45-47 cells at 40 columns. It is now shortened by what the table
    is too wide, from the key paths' own widest piece: the table fits, and fills the
    terminal where the token is shortened (it keeps as much as fits)."""
    token = "abcdefghijklmnopqrstuvwxyz"[:letters]
    args = ["weights", "hello", "--set", LONG_VOCAB[0].replace(LONG_TOKEN, token)]
    text = shown(args, 40)
    assert max(map(cell_len, text.splitlines())) == 40
    assert re.search(rf"│ abcde\w*…\w*{token[-1]} +│", text)


@pytest.mark.parametrize("columns", [40, 60])
def test_cost_vary_deals_its_columns_over_tables_that_fit(columns: int) -> None:
    """`cost --vary`'s table of nine number columns took 78 cells, at 60 columns too;
    its columns are now dealt out over tables that fit, each led by L, no number cut."""
    args = ["cost", "--vary", "L=4,8"]
    text = shown(args, columns).split("multiply-adds as L")[1]
    assert max(map(cell_len, text.splitlines())) <= columns
    heads = [c for line in text.splitlines() if line.startswith("┃") for c in line.split("┃")]
    named = [c.strip() for c in heads if c.strip()]
    assert named.count("L") > 1  # (more than one table)
    assert sorted(set(named)) == sorted(
        ["L", "proj", "attn", "ffn", "output", "total", "attn %", "pred. ms", "meas. ms"]
    )
    assert len(named) == len(set(named)) + named.count("L") - 1
    for r in data(args)["vary"]["rows"]:  # L=4 and 8: totals under 10,000, written exactly
        assert re.search(rf"│ +{r['value']} │.* {r['total']:,} │", text)


@pytest.mark.parametrize("columns", [60])
def test_generate_beam_extensions_fit_60_columns(columns: int) -> None:
    """`generate --beam 3`'s extensions (eight columns, two spaces apart) made every
    iteration's panel 62-63 cells at 60 columns; where they do not fit, one space now
    sets the columns apart. Each extension's p, as the beams' JSON gives it, is whole."""
    args = ["generate", "--beam", "3"]
    text = shown(args, columns)
    assert max(map(cell_len, text.splitlines())) <= columns
    first = data(args)["iterations"][0]["beams"][0]["probs"]
    panel = text.split("iteration 0 ")[1].split("iteration 1 ")[0]
    for token, p in first.items():
        assert re.search(rf"│ +\d+ +0 {re.escape(token)} +{p:.4f} ", panel), token


@pytest.mark.parametrize("columns", [40, 45, 61, 62, 80, 120])
def test_examples_lists_every_title_whole_and_unquoted_at_its_spaces(columns: int) -> None:
    # "hello        Hello World (The Random Transformer)" was 49 cells at 40 columns; with
    # the 14 worked examples packaged, the titles (quoted YAML scalars) printed with
    # their quotes, and after names of up to 31 characters padded to 12, out of line.
    # Now each title as YAML reads it: beside its name, in one column after the
    # longest name, where that leaves it 30 cells; else under its name, indented 4.
    import yaml

    from trace_tf.loader import example_names, examples_dir

    names = example_names()
    titles = {
        n: yaml.safe_load((examples_dir() / f"{n}.yaml").read_text(encoding="utf-8"))["title"]
        for n in names
    }
    column = max(map(len, names)) + 1  # 32: beside from 62 columns
    beside = columns - column >= 30
    lines = shown(["examples"], columns).splitlines()
    assert max(map(cell_len, lines)) <= columns
    at = column if beside else 4  # where each line of a title starts
    shown_titles: dict[str, list[str]] = {}
    name = ""
    for line in lines:
        if line.startswith(" "):  # a title's next line
            assert name and line[:at].isspace() and line[at] != " ", line
            shown_titles[name].append(line[at:])
        elif beside:  # its name, padded, and its title's first line
            name = line[:column].rstrip()
            assert line[len(name) : at].isspace() and line[at] != " ", line
            shown_titles[name] = [line[at:]]
        else:  # its name alone
            name = line
            shown_titles[name] = []
    assert list(shown_titles) == names
    assert {n: " ".join(t) for n, t in shown_titles.items()} == titles
    assert all('"' not in t for t in titles.values())  # (the old listing showed their quotes)
    if beside and column + len(titles["hello"]) <= columns:  # a title that fits: one line
        assert f"{'hello':{column}s}{titles['hello']}" in lines


def test_cost_fits_40_columns_its_cells_unpadded() -> None:
    # It was 53 cells wide at 40 columns (the ledger 50: its rules and a space either
    # side of every cell; the totals' "O(L·D·d_ff)" kept on one line). Where a boxed
    # table would not fit otherwise, its cells lose that space, and a growth formula
    # goes over lines after its "·".
    out = shown(["cost"], 40)
    assert max(map(cell_len, out.splitlines())) <= 40
    ledger = data(["cost"])["ledger"]
    assert box_cells(out, 0, 1)[: len(ledger)] == [c["path"] for c in ledger]
    counts = box_cells(out, 3, 1)[: len(ledger)]
    assert counts == [f"{c['macs']:,}" if c["macs"] else "—" for c in ledger]
    totals = out[out.index("totals") :]
    grows = [g for g in box_cells(totals, 3, 0) if g]
    assert grows == ["O(L·D²)", "O(L²·D)", "O(L·D·d_ff)", "O(L·D·V)"]
    assert "│ encoder.embed " in shown(["cost"], 80)  # where it fits, padded as before


def test_stages_at_40_columns_is_as_wide_as_its_longest_words() -> None:
    # 47 cells at 40 columns; its cells unpadded, 41: "final_norm" (10), the formula
    # "sublayer(Norm(x)))" (18), the shape's "instance:" (9) and 4 rules. A formula
    # too long for its column now goes on after a call's "(" ("sublayer(Norm(" /
    # "x)))"), never inside a name: 40.
    out = shown(["stages"], 40)
    assert max(map(cell_len, out.splitlines())) <= 40
    about = "".join(box_cells(out, 1, 0))
    for s in STAGES:
        assert s.formula.replace(" ", "") in about.replace(" ", ""), s.formula
    assert "│ embed " in shown(["stages"], 80)  # padded where it fits


def test_check_cuts_no_variant_name_where_that_would_not_make_it_fit() -> None:
    # At scale 3 errors are shown in full (0.0006250596046), and the table cannot fit
    # 40 columns: the variant names stay as they were ("document"), not cut to 7 cells.
    args = ["check", "fixtures/hello.yaml", "--set", "model.scale=3"]
    out = runner.invoke(app, args, env={"COLUMNS": "40"}).stdout  # (exit 1: some fail)
    assert " document " in out and "…cument" not in out


@pytest.mark.parametrize(
    "args",
    [
        ["weights", "hello", "--set", "model.init_std=1.2345e-200"],
        ["diff", "hello", "--set-b", "model.init_std=1.2345e-200"],
    ],
)
def test_a_source_breaks_after_a_path_dot_never_inside_its_numbers(args: list[str]) -> None:
    # A source goes over lines after its paths' dots (a weights_file key), never after
    # the point of a number: "N(0, 1." / "2345e-200²)" read as two numbers.
    assert "1.2345e-200²" in shown(args, 40)
