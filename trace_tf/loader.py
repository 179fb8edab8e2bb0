"""Safe YAML loading that keeps the line of every key, refuses duplicate keys,
Python tags and alias bombs, and reads numbers the way YAML 1.2 does.

PyYAML's composer builds a node graph without constructing any object; we walk
that graph ourselves, so nothing in a file can ever run code, and every value we
hand on carries the line it came from.
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

import yaml

from trace_tf.errors import InputError, quoted

# Every plain YAML type we accept; anything else (!!python/object, !!binary, ...) is refused.
_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"

_MERGE = "tag:yaml.org,2002:merge"


class _Resolver12(yaml.resolver.BaseResolver):
    """YAML 1.2's core schema for plain scalars, in place of PyYAML's YAML 1.1 rules:
    `010` is ten (1.1: eight), `1e-5` a number (1.1: a string), `0o17` octal, and
    `1:30`, `1_000`, `0b101`, `yes`, `off` and dates are text (1.1: 90, 1000, 5, true,
    false, a timestamp). `<<` is still recognised, to be refused as a merge key."""


_INT_PATTERN = r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+"
_FLOAT_PATTERN = (
    r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)"
)
for _tag, _pattern, _first in (
    (_BOOL, r"true|True|TRUE|false|False|FALSE", "tTfF"),
    (_NULL, r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    (_INT, _INT_PATTERN, "-+0123456789"),  # before float: `10`
    (_FLOAT, _FLOAT_PATTERN, "-+0123456789."),
    (_MERGE, r"<<", "<"),
):
    _Resolver12.add_implicit_resolver(_tag, re.compile(f"^(?:{_pattern})$"), list(_first))

_INT_TEXT = re.compile(f"(?:{_INT_PATTERN})\\Z")
_FLOAT_TEXT = re.compile(f"(?:{_FLOAT_PATTERN})\\Z")
# A double-quoted "\ud800" is a UTF-16 surrogate, no character: libyaml refuses it, and
# PyYAML's Python parser (which words libyaml's errors) made a str no output can encode.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _integer(text: str) -> int | None:
    """The integer of `text` (matched by _INT_TEXT: decimal, 0o octal or 0x hex); None
    when too long to be read (beyond float64 whatever its base)."""
    sign = text[0] if text[0] in "+-" else ""
    digits = text[len(sign) :]
    if len(digits) > MAX_INT_CHARS:
        return None
    base = {"0o": 8, "0x": 16}.get(digits[:2], 10)
    value = int(digits[2:] if base != 10 else digits, base)
    return -value if sign == "-" else value


def read_number(text: str) -> float | None:
    """A number written outside YAML (an inline matrix) read by the same YAML 1.2 rules
    as a plain scalar of the file: 1e-5, 010 (ten), 0o17, 0x1F, .inf; None for text
    (1_000, 0b101, 1:30). An integer beyond float64 is inf."""
    if _INT_TEXT.match(text):
        value = _integer(text)
        if value is None or abs(value) > sys.float_info.max:
            return -math.inf if text.startswith("-") else math.inf
        return float(value)
    if _FLOAT_TEXT.match(text):
        lower = text.lower()
        return float(lower.replace(".", "") if "inf" in lower or "nan" in lower else text)
    return None


def beyond_float64(text: str, value: float) -> tuple[str, str] | None:
    """Why a number written `text`, read as `value`, is refused, as (problem, expected):
    1e400 read as inf (not .inf, which writes an infinity as such), or a number written
    nonzero (1e-400) read as 0; None where float64 holds it. The one rule of the file,
    an option (`--scale 1e-400`) and an inline matrix (`--mask "0 -1e400"`)."""
    if math.isinf(value) and "inf" not in text.lower():
        return "number too large", FLOAT64_MOST
    if value == 0 and any(digit in "123456789" for digit in text.lower().split("e")[0]):
        return "number too small", FLOAT64_LEAST
    return None


def _c_loader() -> type | None:
    """libyaml's parser and composer, resolving by YAML 1.2 (None without libyaml)."""
    try:
        from yaml._yaml import CParser
    except ImportError:
        return None

    class CLoader12(CParser, _Resolver12):
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            _Resolver12.__init__(self)

    return CLoader12


_CLoader12 = _c_loader()

MAX_NODES = 5_000_000  # expanded nodes; far above any honest file, far below an alias bomb
MAX_DEPTH = 64  # nesting levels; an honest file needs about 10 (weights.encoder.0...W_q.row)
PYTHON_PARSER_CHARS = 100_000  # the longest text whose errors PyYAML's parser words (0.5 s)
FLOAT64_MOST = f"a number of magnitude at most {sys.float_info.max:.6g} (float64)"
# 2^-1075, half float64's smallest number 5e-324 (not a float64 itself): smaller rounds to 0
FLOAT64_LEAST = "0, or a number of magnitude above 2.47033e-324 (float64 rounds less to 0)"
MAX_INT_CHARS = 4000  # a longer integer literal is beyond float64 whatever its base


class Lines:
    """Key path -> line number (1-based) for everything read from a file."""

    def __init__(self) -> None:
        self._lines: dict[str, int] = {}

    def set(self, path: str, line: int) -> None:
        self._lines.setdefault(path, line)

    def given(self, path: str) -> bool:
        """Whether the file itself holds `path`."""
        return path in self._lines

    def get(self, path: str) -> int | None:
        """The line of `path`, or of its nearest enclosing key."""
        while True:
            if path in self._lines:
                return self._lines[path]
            if "." not in path:
                return None
            path = path.rsplit(".", 1)[0]


def join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _expanded_size(root: yaml.Node) -> tuple[int, int]:
    """Nodes and nesting depth after alias expansion, in time linear in the graph.

    Iterative (no Python recursion), so neither a long chain of aliases nor deep
    nesting can exhaust the stack before it is measured and refused. A scalar counts
    (1, 1) where it stands; only lists and mappings are visited and remembered.
    """
    if isinstance(root, yaml.ScalarNode):
        return 1, 1
    memo: dict[int, tuple[int, int]] = {}
    active: set[int] = set()  # the nodes on the current path: a recursive alias meets one
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            size, depth = 1, 1
            for c in _children(node):
                if isinstance(c, yaml.ScalarNode):
                    size += 1
                    depth = max(depth, 2)
                else:
                    k = memo.get(id(c), (1, 1))  # (1, 1): a recursive alias
                    size += k[0]
                    depth = max(depth, 1 + k[1])
            memo[key] = (min(size, MAX_NODES + 1), depth)
            active.discard(key)
        elif key not in memo and key not in active:
            active.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node) if not isinstance(c, yaml.ScalarNode))
    return memo[id(root)]


_BREAKS = "\r\n\x85\u2028\u2029"
_BLANK = "\0 \t" + _BREAKS  # what may end a token: the end, a space, a tab, a break


class _DepthLimitedLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    yaml.composer.Composer,
    _Resolver12,
):
    """PyYAML's composer (in Python), resolving by YAML 1.2 and refusing nesting deeper
    than MAX_DEPTH before its own recursion could exhaust the Python stack, and more
    than MAX_NODES values before they fill the memory."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _Resolver12.__init__(self)

    _depth = 0
    _nodes = 0

    # PyYAML's scanner takes no tab as a space between tokens, where libyaml (and YAML)
    # takes one wherever it cannot be indentation: `a:<tab>1`, `[1,<tab>2]`, a tab before
    # a comment. Read as libyaml reads them, a file means the same with or without
    # libyaml, and a file libyaml refuses is not refused for a tab it took.

    def scan_to_next_token(self) -> None:
        """libyaml's rule: a tab is a space in flow context, or where no simple key may
        start (after a key's `:` or a scalar), never at the start of a line."""
        super().scan_to_next_token()
        while self.peek() == "\t" and (self.flow_level or not self.allow_simple_key):
            self.forward()
            super().scan_to_next_token()

    def scan_plain_spaces(self, indent: int, start_mark: yaml.Mark) -> list[str] | None:
        """PyYAML's own, but with libyaml's tabs: between the words of a line (`a b<tab>c`),
        and on a continued or blank line once past the scalar's indentation (a tab
        before it cannot indent, and is refused there as by libyaml)."""
        chunks: list[str] = []
        length = 0
        while self.peek(length) in " \t":
            length += 1
        whitespaces = self.prefix(length)
        self.forward(length)
        if self.peek() in _BREAKS:
            line_break = self.scan_line_break()  # type: ignore[no-untyped-call]
            self.allow_simple_key = True
            if self._document_marker():
                return None
            breaks = []
            while True:
                ch = self.peek()
                if ch == " " or (ch == "\t" and self.column >= indent):
                    self.forward()
                elif ch in _BREAKS:
                    breaks.append(self.scan_line_break())  # type: ignore[no-untyped-call]
                    if self._document_marker():
                        return None
                else:
                    break
            if line_break != "\n":
                chunks.append(line_break)
            elif not breaks:
                chunks.append(" ")
            chunks.extend(breaks)
        elif whitespaces:
            chunks.append(whitespaces)
        return chunks

    def _document_marker(self) -> bool:
        return self.prefix(3) in ("---", "...") and self.peek(3) in _BLANK

    def scan_tag(self) -> yaml.TagToken:
        """PyYAML's own, but a tab may follow a tag as a space does (`!!str<tab>1`), as
        in libyaml."""
        start_mark = self.get_mark()
        ch = self.peek(1)
        handle: str | None
        if ch == "<":
            handle = None
            self.forward(2)
            suffix = self.scan_tag_uri("tag", start_mark)
            if self.peek() != ">":
                raise yaml.scanner.ScannerError(
                    "while parsing a tag",
                    start_mark,
                    f"expected '>', but found {self.peek()!r}",
                    self.get_mark(),
                )
            self.forward()
        elif ch in _BLANK:
            handle = None
            suffix = "!"
            self.forward()
        else:
            length = 1
            while ch not in _BLANK and ch != "!":
                length += 1
                ch = self.peek(length)
            if ch == "!":
                handle = self.scan_tag_handle("tag", start_mark)  # type: ignore[no-untyped-call]
            else:
                handle = "!"
                self.forward()
            suffix = self.scan_tag_uri("tag", start_mark)
        self._blank_next("while scanning a tag", start_mark, "' '")
        return yaml.TagToken((handle, suffix), start_mark, self.get_mark())

    def scan_block_scalar_indicators(self, start_mark: yaml.Mark) -> tuple[bool | None, int | None]:
        """PyYAML's own, but a tab may follow the indicators (`|<tab># note`), as in libyaml."""
        chomping: bool | None = None
        increment: int | None = None
        for _ in range(2):
            ch = self.peek()
            if ch in "+-" and chomping is None:
                chomping = ch == "+"
            elif ch in "0123456789" and increment is None:
                if ch == "0":
                    raise yaml.scanner.ScannerError(
                        "while scanning a block scalar",
                        start_mark,
                        "expected indentation indicator in the range 1-9, but found 0",
                        self.get_mark(),
                    )
                increment = int(ch)
            else:
                break
            self.forward()
        self._blank_next(
            "while scanning a block scalar", start_mark, "chomping or indentation indicators"
        )
        return chomping, increment

    def _blank_next(self, context: str, start_mark: yaml.Mark, expected: str) -> None:
        """PyYAML's error where a space, a tab or a line's end must come next."""
        if self.peek() not in _BLANK:
            raise yaml.scanner.ScannerError(
                context,
                start_mark,
                f"expected {expected}, but found {self.peek()!r}",
                self.get_mark(),
            )

    def scan_block_scalar_ignored_line(self, start_mark: yaml.Mark) -> None:
        """PyYAML's own, but with tabs as spaces before a comment or the line's end."""
        while self.peek() in " \t":
            self.forward()
        super().scan_block_scalar_ignored_line(start_mark)

    def scan_plain(self) -> yaml.ScalarToken:
        """PyYAML's own, but a `?` inside a plain scalar in a flow collection is part
        of it, as in YAML 1.2 and libyaml (`[hello, how?]`); PyYAML ends the scalar there."""
        chunks: list[str] = []
        start_mark = end_mark = self.get_mark()
        indent = self.indent + 1
        spaces: list[str] | None = []
        while self.peek() != "#":
            length = 0
            while True:
                ch = self.peek(length)
                if ch in _BLANK or (self.flow_level and ch in ",[]{}"):
                    break
                if ch == ":" and self.peek(length + 1) in _BLANK + (
                    ",[]{}" if self.flow_level else ""
                ):
                    break
                length += 1
            if length == 0:
                break
            self.allow_simple_key = False
            chunks.extend(spaces or ())
            chunks.append(self.prefix(length))
            self.forward(length)
            end_mark = self.get_mark()
            spaces = self.scan_plain_spaces(indent, start_mark)
            if not spaces or self.peek() == "#" or (not self.flow_level and self.column < indent):
                break
        return yaml.ScalarToken("".join(chunks), True, start_mark, end_mark)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _too_deep(self.name, mark.line + 1)
            if self._nodes > MAX_NODES:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _too_many(self.name, mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Builder:
    def __init__(self, file: str) -> None:
        self.file = file
        self.lines = Lines()
        self._active: set[int] = set()

    def fail(self, node: yaml.Node, path: str, message: str, **kw: str) -> InputError:
        return InputError(
            message, file=self.file, path=path or None, line=node.start_mark.line + 1, **kw
        )

    def build(self, node: yaml.Node, path: str) -> Any:
        self.lines.set(path, node.start_mark.line + 1)
        if id(node) in self._active:
            raise self.fail(
                node,
                path,
                "recursive YAML alias",
                expected="an alias of a value it is not inside",
                found="an alias inside the list or mapping it names",
            )
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                if node.tag != _SEQ:
                    raise self._tagged(node, path)
                return [self.build(child, join(path, i)) for i, child in enumerate(node.value)]
            if isinstance(node, yaml.MappingNode):
                if node.tag != _MAP:
                    raise self._tagged(node, path)
                return self._mapping(node, path)
        finally:
            self._active.discard(id(node))
        raise self.fail(node, path, "unsupported YAML node")  # pragma: no cover

    def _scalar(self, node: yaml.ScalarNode, path: str) -> Any:
        """A scalar by its tag: resolved by YAML 1.2 when plain, or given (`!!int 5`)."""
        tag, text = node.tag, node.value
        if node.style == '"' and (bad := _SURROGATE.search(text)):
            raise self.fail(
                node,
                path,
                f"a \\u escape of a UTF-16 surrogate in {quoted(text, 40)}, which is no character",
                expected="an escape of a Unicode character (\\U0001F600 beyond U+FFFF)",
                found=f"U+{ord(bad.group()):04X}",
            )
        if tag == _STR:
            return text
        if tag == _NULL and text in ("", "~", "null", "Null", "NULL"):
            return None
        if tag == _BOOL and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if tag == _INT:
            return self._int(node, path)
        if tag == _FLOAT and _FLOAT_TEXT.match(text):
            value = read_number(text)
            beyond = None if value is None else beyond_float64(text, value)
            if beyond is not None:
                raise self.fail(node, path, beyond[0], expected=beyond[1], found=text)
            return value
        if tag in (_NULL, _BOOL, _FLOAT):
            raise self._invalid(node, path)
        raise self._tagged(node, path)

    def _int(self, node: yaml.ScalarNode, path: str) -> int:
        """An integer (decimal, 0o octal, 0x hex), refused when beyond float64 (every
        number ends up as one)."""
        if not _INT_TEXT.match(node.value):
            raise self._invalid(node, path)
        value = _integer(node.value)
        if value is None or abs(value) > sys.float_info.max:
            raise self.fail(
                node,
                path,
                "integer too large",
                expected=FLOAT64_MOST,
                found=f"an integer of {len(node.value)} characters",
            )
        return value

    def _tagged(self, node: yaml.Node, path: str) -> InputError:
        """`!!python/object:...`, `!!binary`, `!custom`: refused, never constructed."""
        return self.fail(
            node,
            path,
            f"YAML tag {node.tag} is not allowed (only plain data is read)",
            expected="plain YAML: numbers, text, true/false, null, lists and mappings",
            found=f"the tag {node.tag}",
        )

    def _invalid(self, node: yaml.ScalarNode, path: str) -> InputError:
        """`!!int abc` and the like."""
        kind = node.tag.rsplit(":", 1)[-1]
        return self.fail(
            node,
            path,
            f"not a valid {kind}",
            expected=f"a YAML {kind}",
            found=quoted(node.value, 40),
        )

    def _mapping(self, node: yaml.MappingNode, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                raise self.fail(
                    key_node,
                    path,
                    "YAML merge keys (<<) are not supported",
                    expected="the merged keys written out",
                    found="<<",
                )
            if not isinstance(key_node, yaml.ScalarNode):
                kind = "a list" if isinstance(key_node, yaml.SequenceNode) else "a mapping"
                raise self.fail(
                    key_node,
                    path,
                    "a mapping key must be a plain scalar",
                    expected="a name or number",
                    found=kind,
                )
            key = self._scalar(key_node, path)
            if isinstance(key, float) and key.is_integer():
                key = int(key)
            # as YAML writes them: `true`, `null` (a key `~` or `null` is no 'None')
            key = "null" if key is None else str(key).lower() if isinstance(key, bool) else str(key)
            child = join(path, key)
            if key in out:
                first = self.lines.get(child)
                raise self.fail(
                    key_node,
                    child,
                    f"duplicate key {quoted(key)} (first given on line {first})",
                    expected="each key once",
                )
            self.lines.set(child, key_node.start_mark.line + 1)
            out[key] = self.build(value_node, child)
        return out


def _compose(text: str, file: str) -> yaml.Node | None:
    """The node graph of `text`: libyaml's composer when present (ten times faster), the
    same graph; on any error, PyYAML's own, whose messages are the ones users see.

    Both composers recurse once per nesting level, and libyaml's in C, where deep enough
    nesting (a 200 kB line of `[`) crashes the process: so the depth is measured first,
    on the parser's events, whenever the text could nest deeper than is safe. The same
    pass counts the values of a text that could hold more than MAX_NODES: composed, each
    costs microseconds and hundreds of bytes (a 36 MB list of numbers took minutes and
    gigabytes before its count was refused)."""
    if _CLoader12 is not None:
        try:
            if _could_nest(text, 1000) or _could_hold(text, MAX_NODES):
                _check_events(yaml.parse(text, Loader=yaml.CSafeLoader), file)
            node: yaml.Node | None = yaml.compose(text, Loader=_CLoader12)
            return node
        except yaml.MarkedYAMLError:
            # PyYAML's parser, in Python, reads a long text for minutes before it reaches
            # the error (a typo at the end of 3 MB took 20 s): libyaml's words, then
            if len(text) > PYTHON_PARSER_CHARS:
                raise
        except (yaml.YAMLError, UnicodeEncodeError):  # (a lone surrogate: see _unreadable)
            pass
    loader = _DepthLimitedLoader(text)
    loader.name = file
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def _could_nest(text: str, depth: int) -> bool:
    """Whether `text` might nest `depth` levels: every list or mapping opens with one of
    these characters (`[`, `{`, a `-` or `?` entry, a `key:`), so fewer cannot."""
    return sum(text.count(c) for c in "[{-?:") >= depth


def _could_hold(text: str, values: int) -> bool:
    """Whether `text` might hold more than `values` values: each but the first begins
    after one of these characters (`[`, `{`, `,`, `-`, `?`, `:`, a line break), and a
    key may bring an implicit null (`{a,b}`: 5 values), so fewer cannot. (The length
    alone does not bound them: `{a,a,...}` holds one a character.)"""
    return 2 * sum(text.count(c) for c in "[{,-?:" + _BREAKS) + 1 > values


def _too_deep(file: str, line: int | None) -> InputError:
    """Nesting deeper than MAX_DEPTH, at the line of the list or mapping one too deep."""
    return InputError(
        "the YAML nests too deeply; refused",
        file=file,
        line=line,
        expected=f"at most {MAX_DEPTH} nested lists or mappings",
        found=f"more than {MAX_DEPTH} levels",
    )


def _too_many(file: str, line: int | None) -> InputError:
    """More than MAX_NODES values as written, at the line where the count passed it."""
    return InputError(
        f"the YAML holds more than {MAX_NODES:,} values; refused",
        file=file,
        line=line,
        expected=f"at most {MAX_NODES:,} numbers, texts, lists and mappings (weights not "
        "given are drawn)",
    )


def _check_events(events: Iterator[yaml.Event], file: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH, and more than MAX_NODES values, from the
    parser's events (no recursion, no nodes built)."""
    depth = nodes = 0
    try:
        for event in events:
            kind = type(event)
            if kind is yaml.ScalarEvent or kind is yaml.AliasEvent:
                nodes += 1
            elif kind is yaml.SequenceStartEvent or kind is yaml.MappingStartEvent:
                depth += 1
                nodes += 1
            elif kind is yaml.SequenceEndEvent or kind is yaml.MappingEndEvent:
                depth -= 1
            if depth > MAX_DEPTH or nodes > MAX_NODES:
                line = event.start_mark.line + 1 if event.start_mark else None
                raise _too_deep(file, line) if depth > MAX_DEPTH else _too_many(file, line)
    except yaml.MarkedYAMLError as exc:
        # libyaml 0.2.6 (PyYAML 6.0.4's wheels) stops at 1000 levels itself, and its
        # scanner, reading ahead, may do so before the parser gives the 65th level here
        if exc.problem != "exceeded maximum nesting depth":
            raise
        mark = exc.problem_mark
        raise _too_deep(file, mark.line + 1 if mark else None) from None


def _unreadable(exc: yaml.reader.ReaderError, text: str, file: str) -> InputError:
    """A character YAML does not allow (a control character, U+FFFE), said on one line
    with its line. A lone surrogate is a byte of a command-line argument that was not
    UTF-8 (Python keeps such a byte 0xNN as U+DCNN): named as that byte."""
    line = text.count("\n", 0, exc.position) + 1
    column = exc.position - text.rfind("\n", 0, exc.position)
    code = exc.character if isinstance(exc.character, int) else ord(exc.character)
    if 0xDC80 <= code <= 0xDCFF:
        return InputError(
            "not UTF-8 text",
            file=file,
            line=line,
            expected="UTF-8 text",
            found=f"the byte 0x{code - 0xDC00:02x}",
        )
    return InputError(
        f"a character YAML does not allow (column {column})",
        file=file,
        line=line,
        expected="printable text (a tab, line breaks, and printable Unicode)",
        found=f"U+{code:04X}"
        + (" (a control character)" if code < 0x20 or 0x7F <= code < 0xA0 else ""),
    )


def parse_yaml(text: str, file: str) -> tuple[Any, Lines]:
    """YAML text -> plain Python data and the line of each key path."""
    try:
        node = _compose(text, file)
    except yaml.reader.ReaderError as exc:
        raise _unreadable(exc, text, file) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or "malformed YAML"
        if exc.context:  # "while parsing a flow mapping", "expected a single document ..."
            problem = f"{exc.context}, {problem}"
        if "\\t" in problem or "'\\t'" in str(exc):
            problem += " (tabs cannot indent YAML; use spaces)"
        raise InputError(
            f"malformed YAML: {problem}",
            file=file,
            line=mark.line + 1 if mark else None,
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(f"malformed YAML: {exc}", file=file) from None
    if node is None:
        return None, Lines()
    size, depth = _expanded_size(node)
    if size > MAX_NODES:
        raise InputError(
            f"the YAML expands to more than {MAX_NODES:,} nodes (an alias bomb?); refused",
            file=file,
            expected=f"at most {MAX_NODES:,} values after expanding aliases",
        )
    if depth > MAX_DEPTH:
        # As written (libyaml composed it, being shallow enough to be safe): its line
        _check_events(yaml.parse(text, Loader=_DepthLimitedLoader), file)  # type: ignore[arg-type]
        raise InputError(
            "the YAML nests too deeply (counting what its aliases expand to); refused",
            file=file,
            expected=f"at most {MAX_DEPTH} nested lists or mappings",
            found=f"{depth} levels",
        )
    builder = _Builder(file)
    return builder.build(node, ""), builder.lines


MAX_FILE_BYTES = 256 * 1024 * 1024


def examples_dir() -> Path:
    """The packaged examples (a plain directory of the installed package)."""
    return Path(__file__).resolve().parent / "examples"


def example_names() -> list[str]:
    return sorted(p.stem for p in examples_dir().glob("*.yaml"))


def example_title(name: str) -> str:
    """A packaged example's `title:` as YAML reads it (a quoted title unquoted, its
    escapes read), "" where it has none. Only the YAML events up to it are parsed, not
    the whole file: `trace-tf examples` reads every example and must start quickly."""
    text = (examples_dir() / f"{name}.yaml").read_text(encoding="utf-8")
    loader = yaml.CSafeLoader if _CLoader12 is not None else yaml.SafeLoader
    depth, items, key = 0, 0, None  # items: the keys and values of the top mapping so far
    for event in yaml.parse(text, Loader=loader):
        if depth == 1 and not isinstance(event, yaml.CollectionEndEvent):
            if items % 2 == 1 and key == "title":  # the title's value
                return event.value if isinstance(event, yaml.ScalarEvent) else ""
            if items % 2 == 0:
                key = event.value if isinstance(event, yaml.ScalarEvent) else None
            items += 1
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return ""


# The files the running command has read, as (device, inode), its config given by
# name or as stdin: its --output may not replace one (the CLI empties this as each
# command starts).
FILES_READ: set[tuple[int, int]] = set()


def read_text(path: Path) -> str:
    """A file's text, or an InputError saying why it cannot be read."""
    name = str(path)
    if os.path.isdir(path):
        raise InputError("is a directory, not a config file", file=name)
    try:
        with open(path, "rb") as fh:
            return read_stream(fh, name)
    except FileNotFoundError:
        raise InputError("no such file", file=name) from None
    except OSError as exc:  # a name too long, a loop of links, no permission
        raise InputError(f"cannot read: {exc.strerror}", file=name) from None


def read_stream(fh: BinaryIO, name: str) -> str:
    """The text of an open file or of stdin (`name` for messages), or an InputError.
    The file is noted in FILES_READ (stdin too: `- < c.yaml` reads c.yaml)."""
    try:
        st = os.fstat(fh.fileno())
        FILES_READ.add((st.st_dev, st.st_ino))
    except (OSError, ValueError):  # a stream with no file (io.BytesIO), or closed
        pass
    chunks: list[bytes] = []
    size = 0
    try:
        # In chunks, stopping past the limit: a device such as /dev/zero never ends, and
        # read(limit) would reserve the whole limit in memory even for a small file.
        while chunk := fh.read(1 << 20):
            size += len(chunk)
            if size > MAX_FILE_BYTES:
                raise InputError(f"file larger than {MAX_FILE_BYTES >> 20} MiB; refused", file=name)
            chunks.append(chunk)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=name) from None
    data = b"".join(chunks)
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # a UTF-16/32 byte-order mark
        raise InputError(
            "UTF-16 or UTF-32 text", file=name, expected="UTF-8 text", found="a UTF-16/32 BOM"
        )
    at = data.find(b"\x00")
    if at >= 0:
        raise InputError(
            "not a text file (binary data)",
            file=name,
            line=data.count(b"\n", 0, at) + 1,
            expected="YAML text (UTF-8)",
            found=f"a NUL byte (byte {at})",
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"not UTF-8 text (byte {exc.start})",
            file=name,
            line=data.count(b"\n", 0, exc.start) + 1,
            expected="UTF-8 text",
            found=f"the byte 0x{data[exc.start]:02x}",
        ) from None


# ---------------------------------------------------------------------------
# Weights from a .npz file (`weights_file:`)
# ---------------------------------------------------------------------------

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip's first local header, or an empty zip
_NPY_HEADER_MAX = 10_000  # numpy.load's own bound on an .npy header (max_header_size)


def _npy_header(fp: IO[bytes]) -> tuple[tuple[int, ...], bool, Any]:
    """An .npy member's (shape, fortran_order, dtype), its header's length read and
    bounded before the header is: numpy reads a header of any claimed length (4 GB in
    version 2.0) before it checks it, and a few MB of compressed spaces would fill it."""
    import struct

    from numpy.lib import format as npy

    version = npy.read_magic(fp)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f"an .npy format version {version[0]}.{version[1]}, not 1.0 or 2.0")
    size = 2 if version == (1, 0) else 4
    length_bytes = fp.read(size)
    if len(length_bytes) < size:
        raise ValueError("EOF: reading the array header's length")
    (length,) = struct.unpack("<H" if size == 2 else "<I", length_bytes)
    if length > _NPY_HEADER_MAX:
        raise ValueError(f"an array header of {length:,} bytes (numpy's limit {_NPY_HEADER_MAX:,})")
    return _parsed_npy_header(version, length_bytes + fp.read(length))


@functools.lru_cache(maxsize=64)
def _parsed_npy_header(version: tuple[int, int], raw: bytes) -> tuple[tuple[int, ...], bool, Any]:
    """_npy_header's parse of the header bytes `raw`, kept for the next member with the
    same header (numpy parses it as Python: 50,000 embeddings of one shape took 9 s)."""
    import io

    from numpy.lib import format as npy

    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, fortran, dtype = read(io.BytesIO(raw), max_header_size=_NPY_HEADER_MAX)
    if any(n < 0 for n in shape):  # (numpy reads the shape unchecked)
        raise ValueError(f"a negative dimension in its shape {shape}")
    return shape, fortran, dtype


def read_npz(path: Path, name: str, max_numbers: int, cost: int) -> list[tuple[str, Any]]:
    """The arrays of a numpy .npz file, in the file's order, each float64 (ints and
    float32 widened exactly; a 0-d array as a number), or an InputError naming the file
    (`name`) and the array. Never pickle, and every member's header is read (bounded:
    `_npy_header`), its dtype and shape checked, before any data: more than
    `max_numbers` numbers in all (each array counting `cost` more) is refused unread.
    Each member is read by its own name (numpy.load's `npz["a.npy"]` would read member
    `a.npy`, the array `a`, for the array `a.npy`), and only a regular file is opened
    for reading (a pipe or a terminal would wait for bytes a zip cannot use)."""
    import stat

    if os.path.isdir(path):
        raise InputError("is a directory, not an .npz file", file=name)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise InputError("no such file", file=name) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=name) from None
    with open(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            kind = "a pipe" if stat.S_ISFIFO(st.st_mode) else "a device or special file"
            raise InputError(
                f"not a regular file ({kind})",
                file=name,
                expected="an .npz file (a zip archive is read by seeking in it)",
            )
        FILES_READ.add((st.st_dev, st.st_ino))
        return _read_npz_file(fh, name, max_numbers, cost)


def _read_npz_file(fh: BinaryIO, name: str, max_numbers: int, cost: int) -> list[tuple[str, Any]]:
    """read_npz's reading of the open regular file `fh`."""
    import zipfile
    import zlib

    import numpy as np

    magic = fh.read(6)
    if not magic.startswith(_ZIP_MAGIC):
        single = magic == b"\x93NUMPY"
        raise InputError(
            "not an .npz file" + (" (a single .npy array)" if single else ""),
            file=name,
            expected="a numpy .npz archive (numpy.savez), one array per weight",
            found="an .npy file" if single else f"the bytes {magic!r} at its start",
        )
    fh.seek(0)
    member = ""

    def bad(message: str, expected: str | None = None, found: str | None = None) -> InputError:
        return InputError(
            message,
            file=name,
            path=f"array {quoted(member.removesuffix('.npy'))}" if member else None,
            expected=expected,
            found=found,
        )

    try:
        with zipfile.ZipFile(fh) as archive:
            members = archive.namelist()
            if not members:
                raise bad(
                    "holds no arrays", "one array per weight (numpy.savez)", "an empty archive"
                )
            headers: list[tuple[str, tuple[int, ...], bool, Any]] = []
            seen: set[str] = set()
            for member in members:
                if not member.endswith(".npy"):
                    raise bad("not an array", "members written by numpy.savez (NAME.npy)")
                if member in seen:
                    raise bad("given twice in the archive", "each array once")
                seen.add(member)
                with archive.open(member) as fp:
                    shape, fortran, dtype = _npy_header(fp)
                if dtype.kind not in "fiu" or dtype.itemsize > 8 or dtype.fields is not None:
                    raise bad(
                        "not an array of real numbers",
                        "float64, float32, float16 or integers",
                        f"dtype {dtype}",
                    )
                headers.append((member, shape, fortran, dtype))
            member = ""
            numbers = sum(math.prod(shape) for _, shape, _, _ in headers)
            if numbers + cost * len(headers) > max_numbers:
                raise bad(
                    "too large: its arrays are over the limit (raise it with --max-elements); "
                    "refused before reading them",
                    f"at most {max_numbers:,} numbers (each array counting {cost} more)",
                    f"{numbers:,} numbers in {len(headers):,} arrays",
                )
            out: list[tuple[str, Any]] = []
            for member, shape, fortran, dtype in headers:
                with archive.open(member) as fp:
                    if _npy_header(fp) != (shape, fortran, dtype):
                        raise ValueError("its header changed while it was read")
                    size = math.prod(shape) * dtype.itemsize
                    data = fp.read(size)
                    if len(data) < size:
                        raise ValueError(f"EOF: {len(data):,} bytes of data, expected {size:,}")
                    if fp.read(1):
                        raise ValueError(
                            f"more data than its header's shape holds ({size:,} bytes)"
                        )
                flat = np.frombuffer(data, dtype=dtype)
                arr = np.asarray(
                    flat.reshape(shape, order="F" if fortran else "C"), dtype=np.float64, order="C"
                )  # (0-d stays 0-d)
                out.append((member.removesuffix(".npy"), arr[()] if arr.ndim == 0 else arr))
            return out
    except InputError:
        raise
    except (
        ValueError,
        OSError,
        EOFError,
        zipfile.BadZipFile,
        zlib.error,
        RuntimeError,
        NotImplementedError,
    ) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise bad(
            "corrupt or unreadable" + (" member" if member else " .npz (zip) file"),
            "a numpy .npz archive (numpy.savez)",
            quoted(detail, 80),
        ) from None
