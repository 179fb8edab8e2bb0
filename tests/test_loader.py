"""The safe YAML loader: plain data only, bounded in size and depth, every error an InputError."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trace_tf import loader
from trace_tf.errors import InputError
from trace_tf.loader import MAX_DEPTH, parse_yaml, read_text


def _refused(text: str) -> InputError:
    with pytest.raises(InputError) as info:
        parse_yaml(text, "f.yaml")
    assert info.value.file == "f.yaml"
    return info.value


def test_yaml_1_2_numbers_and_words() -> None:
    data, lines = parse_yaml("a: 1e-5\nb: yes\nc: 0x10\nd: -.inf\n", "f.yaml")
    assert data == {"a": 1e-5, "b": "yes", "c": 16, "d": float("-inf")}
    assert lines.get("c") == 3


# The YAML 1.2 core schema (yaml.org/spec/1.2.2, 10.3.2), plain scalars: each text and
# what the schema says it is. YAML 1.1 (PyYAML's own rules) reads the first group as
# 8, 15, 90, 1000, 5 and a date, and `0o17`, `.NaN`'s neighbours alike, differently.
YAML_12 = [
    ("010", 10),  # decimal with a leading zero (1.1: octal 8)
    ("-010", -10),
    ("0o17", 15),  # 1.2's octal (1.1: a string)
    ("0x1F", 31),
    ("+12", 12),
    ("1:30", "1:30"),  # (1.1: sexagesimal 90)
    ("1_000", "1_000"),  # (1.1: 1000)
    ("0b101", "0b101"),  # (1.1: binary 5)
    ("12_3.5", "12_3.5"),
    ("2002-12-14", "2002-12-14"),  # (1.1: a timestamp, which trace-tf refuses)
    ("1e-5", 1e-5),  # (1.1: a string)
    ("1E+3", 1000.0),
    (".5", 0.5),
    ("3.", 3.0),
    ("-.inf", float("-inf")),
    ("+.INF", float("inf")),
    ("yes", "yes"),  # (1.1: true)
    ("Off", "Off"),  # (1.1: false)
    ("TRUE", True),
    ("False", False),
    ("~", None),
    ("NULL", None),
]


@pytest.mark.parametrize("text, value", YAML_12, ids=[t for t, _ in YAML_12])
def test_plain_scalars_follow_the_yaml_1_2_core_schema(text: str, value: object) -> None:
    data, _ = parse_yaml(f"a: {text}\nb: [{text}]\n", "f.yaml")
    assert data == {"a": value, "b": [value]}
    assert type(data["a"]) is type(value)
    quoted, _ = parse_yaml(f"a: '{text}'\n", "f.yaml")
    assert quoted == {"a": text}  # quoted: always text


def test_yaml_1_2_nan() -> None:
    data, _ = parse_yaml("a: .nan\nb: .NaN\n", "f.yaml")
    assert all(v != v for v in data.values())  # NaN is not equal to itself


def test_the_python_composer_reads_numbers_as_libyaml_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # without libyaml (or when it fails), PyYAML's own composer, with the same rules
    text = "".join(f"k{i}: {t}\n" for i, (t, _) in enumerate(YAML_12))
    with_c, _ = parse_yaml(text, "f.yaml")
    monkeypatch.setattr(loader, "_CLoader12", None)
    without, _ = parse_yaml(text, "f.yaml")
    assert with_c == without == {f"k{i}": v for i, (_, v) in enumerate(YAML_12)}


def _both_ways(text: str, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    """What parse_yaml gives (data and lines, or the error's line) with libyaml, then
    without it (PyYAML's scanner and composer, in Python)."""

    def read() -> object:
        try:
            data, lines = parse_yaml(text, "f.yaml")
            return repr(data), lines._lines  # (repr: a NaN equals itself)
        except InputError as err:
            return str(err)

    with_c = read()
    with monkeypatch.context() as m:
        m.setattr(loader, "_CLoader12", None)
        return with_c, read()


# Where PyYAML's own scanner departed from libyaml (and from YAML): a tab as a space
# between tokens, and a `?` inside a plain scalar of a flow collection. Each text is
# read by libyaml as the comment says; the Python path must read it alike.
SAME_EITHER_WAY = [
    "a:\t1\n",  # a tab after a key's colon
    "a: 1\t\n",  # a trailing tab
    "a: [1,\t2]\n",  # a tab in a flow sequence
    "a: {b:\t1}\n",
    "a: [1, 2]\t# a comment after a tab\n",
    "a\t: 1\n",
    "a: 'x'\t\n",
    "a: b\tc\n",  # a tab inside a plain scalar: 'b\tc'
    "a: b \t c\td\n",
    "a: b\t\n  c\n",  # 'b c'
    "a:\t\n  b: 1\n",
    "vocab: [hello, how?, a?b, a ? b]\n",  # `?` inside plain scalars of a flow collection
    "a: {k?: v?}\n",
    "a: [?b]\n",  # a `?` that starts a flow entry is a key: [{b: null}]
    "\ta: 1\n",  # a tab that indents: refused either way, on its line
    "a:\n\t- 1\n",
    "- \t1\n",
    "a: b\n\tc\n",
    # a tab past a plain scalar's indentation on its next or a blank line: 'x y', 'x\ny'
    "a: x\n \t y\n",
    "a: x\n  \t\n  y\n",
    "a: 1\n \t\nb: 2\n",
    "- x\n \t\n- y\n",
    "a: [x\n\ty]\n",  # refused either way: a tab before the indentation
    "a: !!str\t1\n",  # a tab after a tag
    "a: |\t# a comment after a tab\n  x\n",  # and after a block scalar's indicators
    "a: >-\t\n  x\n",
    "a: |2\t\n   x\n",
]


@pytest.mark.parametrize("text", SAME_EITHER_WAY)
def test_the_python_scanner_reads_tabs_and_question_marks_as_libyaml_does(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_c, without = _both_ways(text, monkeypatch)
    assert with_c == without


def test_tabs_as_spaces_and_question_marks_read_as_written() -> None:
    data, _ = parse_yaml("a:\t[1,\t2]\t# c\nb: x\ty\nv: [how?, a ? b]\n", "f.yaml")
    assert data == {"a": [1, 2], "b": "x\ty", "v": ["how?", "a ? b"]}


def test_an_error_after_a_tab_is_reported_where_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # libyaml fails on line 3; the message comes from the Python parser, which must not
    # stop first at the (valid) tab of line 1 and blame it.
    for path in (loader._CLoader12, None):
        monkeypatch.setattr(loader, "_CLoader12", path)
        err = _refused("a:\t1\nb: [1,\t2]\nc: [1, 2\n")
        assert err.line == 4 and "tab" not in str(err), str(err)


def test_every_fixture_and_corpus_text_reads_the_same_without_libyaml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conftest import FIXTURES
    from test_bad_inputs import CORPUS

    texts = [p.read_text(encoding="utf-8") for p in sorted(FIXTURES.glob("*.yaml"))]
    texts += [c.values[0].text for c in CORPUS if isinstance(c.values[0].text, str)]
    for text in texts:
        with_c, without = _both_ways(text, monkeypatch)
        assert with_c == without, text


def test_the_merge_key_is_still_named() -> None:
    err = _refused("a: &x {b: 1}\nc: {<<: *x}\n")
    assert "merge keys" in str(err) and err.found == "<<" and err.line == 2


@pytest.mark.parametrize("opener, closer", [("[", "]"), ("{a: ", "}")])
def test_deep_nesting_is_refused_not_a_recursion_error(opener: str, closer: str) -> None:
    # PyYAML's composer recurses once per level: 5000 levels would exhaust the stack.
    err = _refused("x: " + opener * 5000 + "1" + closer * 5000 + "\n")
    assert "nests too deeply" in str(err) and err.line == 1
    assert err.expected == f"at most {MAX_DEPTH} nested lists or mappings"


def test_nesting_within_the_limit_is_read() -> None:
    depth = MAX_DEPTH - 2  # the top mapping and its key take two levels
    data, _ = parse_yaml("x: " + "[" * depth + "1" + "]" * depth + "\n", "f.yaml")
    value = data["x"]
    for _ in range(depth - 1):
        value = value[0]
    assert value == [1]


def test_a_long_chain_of_aliases_is_refused_by_its_expanded_depth() -> None:
    # Each anchor nests the previous one: shallow as written, 2000 levels once expanded.
    text = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 2000))
    err = _refused(text)
    assert "nests too deeply (counting what its aliases expand to)" in str(err)
    assert err.found == "2002 levels"


def test_expanded_size_counts_as_a_plain_expansion_does() -> None:
    # Checked against the tree the aliases expand to, walked by plain recursion.
    import yaml

    from trace_tf.loader import _CLoader12, _DepthLimitedLoader, _expanded_size

    def expanded(node: yaml.Node) -> tuple[int, int]:
        if isinstance(node, yaml.ScalarNode):
            return 1, 1
        pairs = node.value if isinstance(node, yaml.MappingNode) else [(n,) for n in node.value]
        kids = [expanded(n) for pair in pairs for n in pair]
        return 1 + sum(k[0] for k in kids), 1 + max((k[1] for k in kids), default=0)

    for text in (
        "x: 1\n",
        "a: &s hello\nb: [*s, *s, {*s : *s}]\n",
        "a: &l [1, [2, [3]]]\nb: [*l, {k: *l}, [[*l]]]\nc: &m {p: *l, q: [*l, *l]}\nd: [*m, *m]\n",
        "- &e []\n- [*e, *e, {}]\n- {? [1, 2] : *e}\n",
        "top\n",
    ):
        node = yaml.compose(text, Loader=_CLoader12 or _DepthLimitedLoader)
        assert _expanded_size(node) == expanded(node), text


def test_billion_laughs_is_refused_quickly() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    start = time.perf_counter()
    err = _refused("\n".join(lines) + "\n")
    assert time.perf_counter() - start < 2.0  # a bound on a hang, not a benchmark
    assert "alias bomb" in str(err)


@pytest.mark.parametrize(
    "literal", ["9" * 400, "-" + "9" * 400, "0x" + "f" * 300, "9" * 5000, "1" + "0" * 309]
)
def test_integers_beyond_float64_are_refused_with_their_line(literal: str) -> None:
    # 5000 digits would also trip Python's int-to-str limit (ValueError) in a naive loader.
    err = _refused(f"a: 1\nb: [1, {literal}]\n")
    assert err.path == "b.1" and err.line == 2 and "integer too large" in str(err)


@pytest.mark.parametrize("literal", ["1e400", "-1e400", "1.8e308", "2E+308"])
def test_floats_beyond_float64_are_refused_with_their_line(literal: str) -> None:
    # float("1e400") is inf: where infinities are allowed (an `expect` value) it was read
    # as .inf, silently; an infinity is written .inf.
    err = _refused(f"a: 1\nb: [1, {literal}]\n")
    assert err.path == "b.1" and err.line == 2 and "number too large" in str(err)
    assert f"found {literal}" in str(err)


def test_the_largest_float64_and_infinities_are_read() -> None:
    data, _ = parse_yaml(
        "a: [1.7976931348623157e308, -1.7976931348623157e+308, .inf, -.Inf]\n", "t"
    )
    assert data == {"a": [sys.float_info.max, -sys.float_info.max, math.inf, -math.inf]}


def test_the_largest_float64_integer_is_read() -> None:
    big = int(sys.float_info.max)
    data, _ = parse_yaml(f"a: {big}\n", "f.yaml")
    assert data["a"] == big


@pytest.mark.parametrize(
    "text, kind",
    [
        ("a: !!int abc\n", "int"),
        ("a: !!float abc\n", "float"),
        ("a: !!int ''\n", "int"),
        ("a: !!float ''\n", "float"),
    ],
)
def test_explicit_scalar_tags_that_do_not_parse_are_refused(text: str, kind: str) -> None:
    err = _refused(text)
    assert err.path == "a" and f"not a valid {kind}" in str(err)


@pytest.mark.parametrize(
    "text",
    [
        "a: !!python/object/apply:os.system ['true']\n",
        "a: !!python/name:os.system\n",
        "a: !!python/object:collections.OrderedDict {}\n",
        "a: !!binary aGVsbG8=\n",
        "a: !!timestamp 2001-12-14\n",
        "a: !!set {x}\n",
        "a: !custom 1\n",
        "a: !custom [1]\n",
        "a: !custom {b: 1}\n",
    ],
)
def test_every_non_plain_tag_is_refused(text: str) -> None:
    err = _refused(text)
    assert "tag" in str(err) and err.path == "a" and err.line == 1
    assert err.expected is not None and err.found is not None and "tag" in err.found


def test_read_text_stops_one_byte_past_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loader, "MAX_FILE_BYTES", 10)
    ok = tmp_path / "ok.yaml"
    ok.write_text("a: 123456")  # 9 bytes
    assert read_text(ok) == "a: 123456"
    big = tmp_path / "big.yaml"
    big.write_text("a: 12345678")  # 11 bytes
    with pytest.raises(InputError, match="larger than"):
        read_text(big)


def test_an_endless_device_is_refused_not_read_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "MAX_FILE_BYTES", 1 << 16)
    with pytest.raises(InputError, match="larger than"):
        read_text(Path("/dev/zero"))


@pytest.mark.parametrize(
    "text, line",
    [
        ("model: " + "[" * 100_000 + "]" * 100_000 + "\n", 1),
        ("model: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n", 1),
        ("model:\n" + "- " * 100_000 + "1\n", 2),
    ],
    ids=["flow-lists", "flow-mappings", "block-entries"],
)
def test_nesting_that_would_crash_libyaml_is_refused_in_a_real_process(
    text: str, line: int, tmp_path: Path
) -> None:
    # libyaml's composer recurses in C: 100,000 levels overflow the C stack and kill the
    # process (exit -11), which no try/except can catch. Run the command for real.
    import subprocess

    path = tmp_path / "deep.yaml"
    path.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "trace_tf", "encode", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-500:]
    assert done.stderr.startswith(f"trace-tf: error: {path}:{line}: the YAML nests too deeply")


@pytest.mark.parametrize("libyaml", [True, False])
def test_more_values_than_the_limit_are_refused_before_they_are_built(
    libyaml: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 36 MB list of 12 million numbers took minutes and gigabytes to compose before
    # its count was refused; now the parser's events are counted first (libyaml), or the
    # composer stops at the limit (Python). Shown here with a limit of 1000.
    monkeypatch.setattr(loader, "MAX_NODES", 1000)
    if not libyaml:
        monkeypatch.setattr(loader, "_CLoader12", None)
    text = "model: {d_model: 4}\nembeddings:\n  a: [" + "1, " * 2000 + "1]\n"
    err = _refused(text)
    assert str(err) == (
        "f.yaml:3: the YAML holds more than 1,000 values; refused; expected at most 1,000 "
        "numbers, texts, lists and mappings (weights not given are drawn)"
    )
    data, _ = parse_yaml("a: [" + "1, " * 900 + "1]\n", "f.yaml")  # within it: read
    assert data == {"a": [1] * 901}


@pytest.mark.skipif(loader._CLoader12 is None, reason="the count on libyaml's events")
def test_a_text_of_one_value_per_character_is_counted_before_it_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The events were counted only in a text of more than 2 characters per value of the
    # limit, but a flow mapping's keys without values, `{a,a,...}`, hold a key and its
    # null for every 2 characters: a 6 MB file of them was composed whole (60 s, 2 GB)
    # before it was refused, and as "an alias bomb?". Shown with a limit of 1000.
    monkeypatch.setattr(loader, "MAX_NODES", 1000)
    monkeypatch.setattr(loader, "_expanded_size", None)  # (reached only once composed)
    err = _refused("x: {" + "a," * 600 + "a}\n")
    assert str(err).startswith("f.yaml:1: the YAML holds more than 1,000 values; refused")


@pytest.mark.skipif(loader._CLoader12 is None, reason="libyaml's own words")
def test_a_long_text_that_libyaml_refuses_is_not_parsed_again_in_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # PyYAML's Python parser words the message of a short text; over a long one it took
    # minutes to reach the error (a typo at the end of 3 MB: 20 s). libyaml's words then.
    monkeypatch.setattr(loader, "PYTHON_PARSER_CHARS", 20)

    def never(*args: object) -> None:
        raise AssertionError("parsed again in Python")

    monkeypatch.setattr(loader._DepthLimitedLoader, "__init__", never)
    err = _refused("a: [1, 2, 3]\nb: [4, 5, 6]\nc: [\n")
    assert err.line == 4 and str(err).startswith("f.yaml:4: malformed YAML: ")


def test_libyamls_own_nesting_limit_is_refused_as_ours() -> None:
    # libyaml 0.2.6 (PyYAML 6.0.4) stops at 1000 levels itself; its scanner reads ahead,
    # so 100,000 `[` raised its ScannerError before the 65th level reached _check_events,
    # and the message was "malformed YAML: while increasing flow level, exceeded maximum
    # nesting depth". Its error, as that libyaml raises it, on any PyYAML:
    import yaml

    mark = yaml.Mark("<unicode string>", 1006, 0, 1006, None, None)

    def events() -> Iterator[yaml.Event]:
        yield yaml.StreamStartEvent()
        raise yaml.scanner.ScannerError(
            "while increasing flow level", mark, "exceeded maximum nesting depth", mark
        )

    with pytest.raises(InputError) as caught:
        loader._check_events(events(), "deep.yaml")
    assert str(caught.value).startswith("deep.yaml:1: the YAML nests too deeply; refused")
    # another scanner error is left to parse_yaml to word
    other = yaml.scanner.ScannerError("while scanning", mark, "found a tab", mark)

    def bad() -> Iterator[yaml.Event]:
        raise other
        yield  # pragma: no cover

    with pytest.raises(yaml.scanner.ScannerError):
        loader._check_events(bad(), "bad.yaml")
