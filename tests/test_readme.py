"""README.md against the program: its links, options, config reference, counts and the
commands it shows, so that what a user follows literally cannot drift from what runs.
(The recipes' Python blocks are run by tests/test_torch_modules.py and tests/test_hf_*.py.)"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

import pytest
import typer
import yaml
from conftest import FIXTURES, REPO, config_from
from typer.testing import CliRunner

from trace_tf import config as C
from trace_tf.cli import app

README = (REPO / "README.md").read_text(encoding="utf-8")
runner = CliRunner()


def prose() -> str:
    """README without its fenced code blocks (whose `# ...` lines are comments, not headings)."""
    return re.sub(r"^```.*?^```", "", README, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def section(heading: str) -> str:
    """The text under `heading` (a `## ` or `### ` line) up to the next heading."""
    body = prose().split(f"\n{heading}\n", 1)[1]
    return re.split(r"\n#{2,3} ", body, maxsplit=1)[0]


def test_every_link_within_the_readme_resolves_to_a_heading() -> None:
    anchors = {slug(h) for h in re.findall(r"^#{1,4} (.+)$", prose(), flags=re.M)}
    links = set(re.findall(r"\]\(#([^)]+)\)", README))
    assert links, "README links its sections"
    assert sorted(links - anchors) == []
    # the rule itself: a heading with backticks, dashes and brackets
    assert slug("Large models: `--dtype float32`") == "large-models---dtype-float32"


def _options() -> dict[str, list[str]]:
    """Every option each command's --help shows (hidden ones left out)."""
    group: Any = typer.main.get_command(app)
    return {
        name: [
            o
            for p in cmd.params
            if not getattr(p, "hidden", False)
            for o in p.opts
            if o[:2] == "--"
        ]
        for name, cmd in group.commands.items()
    }


def test_every_option_in_a_help_is_in_the_readme() -> None:
    options = _options()
    assert "--dtype" in options["encode"] and "--dtype" not in options["attend"]  # hidden there
    missing = {
        name: [o for o in opts if not re.search(re.escape(o) + r"(?![\w-])", README)]
        for name, opts in options.items()
    }
    assert {name: opts for name, opts in missing.items() if opts} == {}


def test_the_dtype_help_says_what_float32_costs_in_precision() -> None:
    # issue 6: the option must say float32's effect on precision where it is offered
    for name in ("encode", "decode", "step", "generate", "diff", "explain", "cost", "weights"):
        text = " ".join(runner.invoke(app, [name, "--help"], env={"COLUMNS": "400"}).stdout.split())
        assert "about 7 significant digits" in text, name


def _table(title: str) -> list[list[str]]:
    """The rows of the README table whose header's first cell is `title`."""
    lines = README.split(f"\n| {title} |", 1)[1].split("\n\n", 1)[0].split("\n")[2:]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines]


def test_the_config_reference_lists_every_key_and_no_other() -> None:
    top = [k for row in _table("top-level key") for k in re.findall(r"`(\w+)`", row[0])]
    assert top == C.TOP_KEYS
    model = [re.fullmatch(r"`(\w+)`", row[0]).group(1) for row in _table("`model` key")]  # type: ignore[union-attr]
    assert model == C.MODEL_KEYS
    (expect,) = [row[1] for row in _table("top-level key") if row[0] == "`expect`"]
    assert tuple(re.findall(r"`(\w+)`", expect.split(": ", 1)[1])) == C.EXPECT_KEYS
    (tokens,) = [row[1] for row in _table("top-level key") if row[0] == "`tokens`"]
    assert tokens.startswith("`{bos, eos, pad}`")


def test_the_config_reference_gives_the_defaults_the_code_has() -> None:
    def model(**given: Any) -> Any:
        return config_from({"model": given, "vocab": ["a"], "source": ["a"]}).model

    base = model(d_model=8)
    m = model(d_model=8, n_heads=2)  # every derived default a number of its own
    derived = {  # the defaults the table states in words: (their value, the code's)
        "`n_heads`": (m.n_heads, m.n_kv_heads),
        "d_model / n_heads (an error if not whole)": (m.d_model // m.n_heads, m.d_k),
        "`d_k`": (m.d_k, m.d_v),  # d_v's; d_a's below
        "4 · d_model": (4 * m.d_model, m.d_ff),
        "true for `pre`, `sandwich` and `output`, false for `post`": (
            (True, True, True, False),
            (
                *(
                    model(d_model=8, norm_position=p).final_norm
                    for p in ("pre", "sandwich", "output")
                ),
                base.final_norm,
            ),
        ),
        "`sqrt_dk` with `score: scaled_dot`, 1 with another": (
            (math.sqrt(m.d_k), 1.0),
            (m.scale, model(d_model=8, score="dot").scale),
        ),
        "null (unlimited)": (0, base.window),
        "null (all of d_k)": ((0, m.d_k), (m.rope_dims, m.rotary_dims)),
        "null (a dense FFN)": (0, base.experts),
        "required beside `experts`": (0, base.experts_top_k),
        "7 (with `swiglu_oss`)": (
            (0.0, 7.0),
            (base.swiglu_limit, model(d_model=8, activation="swiglu_oss").swiglu_limit),
        ),
        "`d_ff` (with a shared expert)": (
            (0, m.d_ff),
            (
                base.shared_expert_d_ff,
                model(
                    d_model=8, n_heads=2, experts=2, experts_top_k=1, shared_expert="plain"
                ).shared_expert_d_ff,
            ),
        ),
        "1.702 (with `swiglu_oss`)": (
            (0.0, 1.702),
            (base.swiglu_alpha, model(d_model=8, activation="swiglu_oss").swiglu_alpha),
        ),
    }
    for key, default, _ in _table("`model` key"):
        key = key.strip("`")
        if default == "required":
            assert key == "d_model"
        elif key == "d_a":
            assert default == "`d_k`" and m.d_a == m.d_k
        elif default in derived:
            want, got = derived[default]
            assert got == want, key
        else:
            text = default.strip("`")
            want = float(text) if re.fullmatch(r"[\d.e+-]+", text) else yaml.safe_load(text)
            assert getattr(base, key) == want, (key, default)


def test_the_counts_the_readme_states_are_true() -> None:
    import test_bad_inputs
    import test_engine_reference
    import test_generate

    def words(text: str) -> int:
        """A number the README writes in words, one to ninety-nine."""
        units = [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
        ]
        units += ["thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
        tens = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
        ten, _, unit = text.partition("-")
        if ten in tens:
            return 10 * (tens.index(ten) + 2) + (units.index(unit) if unit else 0)
        return units.index(text)

    assert [words(w) for w in ("nineteen", "twenty-one", "thirty-six", "forty")] == [19, 21, 36, 40]
    tests = section("## Tests")
    engine = re.search(r"on\s+(\S+)\s+random\s+configurations\s+\(post/pre", tests)
    assert engine and words(engine.group(1)) == len(test_engine_reference.SHAPES)
    assert f"runs the same {engine.group(1)} with `--dtype float32`" in " ".join(tests.split())
    greedy = re.search(r"on\s+(\S+)\s+random\s+configurations,\s+with and without", tests)
    marks = test_generate.test_greedy_matches_the_reference_step_by_step.pytestmark  # type: ignore[attr-defined]
    assert greedy and words(greedy.group(1)) == len(marks[0].args[1])
    corpus = re.search(
        r"a corpus of\s+about (\d+) such inputs",
        section("## Reliability: bad input, safety, numerical honesty"),
    )
    assert corpus and abs(len(test_bad_inputs.CORPUS) - int(corpus.group(1))) <= 10
    hello = yaml.safe_load((FIXTURES / "hello.yaml").read_text(encoding="utf-8"))
    entries = re.search(r"checks, in (\d+) entries", README)
    assert entries and int(entries.group(1)) == len(hello["expect"])


def _commands(heading: str) -> list[list[str]]:
    """The runnable `trace-tf ...` lines of the indented blocks of a section (a synopsis,
    with `[OPTION]` or `a | b`, is not one), as argument lists, comments dropped."""
    lines = re.findall(r"^    trace-tf (.+)$", section(heading), flags=re.M)
    runs = []
    for line in lines:
        args = shlex.split(line, comments=True)
        if any(a.startswith("[") or a == "|" for a in args):
            continue
        runs.append([p for a in args for p in (sorted(map(str, REPO.glob(a))) or [a])])
    return runs


@pytest.mark.parametrize(
    "heading",
    [
        "## Usage",
        "## The Hello World example, and where its document is wrong",
        "## Generating: `trace-tf generate`",
    ],
)
def test_the_commands_the_readme_shows_run_as_printed(
    heading: str, tmp_path: Any, monkeypatch: Any
) -> None:
    monkeypatch.chdir(REPO)
    runs = _commands(heading)
    assert len(runs) >= 3, heading
    for args in runs:
        if args[0] == "cost":  # --vary times every value --repeat times; once is enough here
            args = [*args, "--repeat", "1"]
        result = runner.invoke(app, args, env={"COLUMNS": "120"})
        assert result.exit_code == 0, (args, result.stderr)
        assert result.stdout, args


def test_the_code_layout_lists_every_module_and_the_tests_named_exist() -> None:
    listed = [re.fullmatch(r"`(\w+)\.py`", row[0]) for row in _table("module")]
    modules = {p.stem for p in (REPO / "trace_tf").glob("*.py")} - {"__init__"}
    assert sorted(m.group(1) for m in listed if m) == sorted(modules)
    named = set(re.findall(r"`?(tests/\w+\.py)", README))
    assert named and sorted(p for p in named if not (REPO / p).is_file()) == []


def test_the_limits_and_defaults_the_readme_states_are_the_codes() -> None:
    from trace_tf import cli, loader

    text = " ".join(README.split())
    for claim in (
        f"{loader.MAX_NODES:,} values in a file",
        f"{loader.MAX_DEPTH} levels of nesting",
        f"{loader.MAX_FILE_BYTES >> 20} MiB per file",
        f"short ({loader.PYTHON_PARSER_CHARS:,} characters at most)",
        f"over {loader._NPY_HEADER_MAX:,} bytes, numpy's own bound",
        f"(default 2^{C.DEFAULT_MAX_ELEMENTS.bit_length() - 1})",
        f"{cli.MIN_WIDTH} at the least and {cli.MAX_WIDTH} at the most",
        f"`--show` rows, default {cli.SHOWN_ROWS},",
        f"1 to 100, default {cli.TIMED_RUNS};",
    ):
        assert claim in text, claim
    assert C.DEFAULT_MAX_ELEMENTS == 2**28
