"""Safe YAML loading that keeps the line of every key, refuses duplicate keys,
Python tags and alias bombs, and reads numbers the way YAML 1.2 does.

PyYAML's composer builds a node graph without constructing any object; we walk
that graph ourselves, so nothing in a file can ever run code, and every value we
hand on carries the line it came from.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from trace_tf.errors import InputError

# Every plain YAML type we accept; anything else (!!python/object, !!binary, ...) is refused.
_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"

# YAML 1.1 (PyYAML) reads `1e-5` as a string; YAML 1.2 and every user read it as a number.
_FLOAT_12 = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")

MAX_NODES = 5_000_000  # expanded nodes; far above any honest file, far below an alias bomb


class Lines:
    """Key path -> line number (1-based) for everything read from a file."""

    def __init__(self) -> None:
        self._lines: dict[str, int] = {}

    def set(self, path: str, line: int) -> None:
        self._lines.setdefault(path, line)

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


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Number of nodes after alias expansion, computed in time linear in the graph."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # breaks recursive aliases, which are refused later anyway
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    memo[key] = min(size, MAX_NODES + 1)
    return memo[key]


class _Builder:
    def __init__(self, file: str) -> None:
        self.file = file
        self.lines = Lines()
        self._scalars = yaml.SafeLoader("")
        self._active: set[int] = set()

    def fail(self, node: yaml.Node, path: str, message: str, **kw: str) -> InputError:
        return InputError(
            message, file=self.file, path=path or None, line=node.start_mark.line + 1, **kw
        )

    def build(self, node: yaml.Node, path: str) -> Any:
        self.lines.set(path, node.start_mark.line + 1)
        if id(node) in self._active:
            raise self.fail(node, path, "recursive YAML alias")
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                if node.tag != _SEQ:
                    raise self.fail(node, path, f"YAML tag {node.tag} is not allowed")
                return [self.build(child, join(path, i)) for i, child in enumerate(node.value)]
            if isinstance(node, yaml.MappingNode):
                if node.tag != _MAP:
                    raise self.fail(node, path, f"YAML tag {node.tag} is not allowed")
                return self._mapping(node, path)
        finally:
            self._active.discard(id(node))
        raise self.fail(node, path, "unsupported YAML node")  # pragma: no cover

    def _scalar(self, node: yaml.ScalarNode, path: str) -> Any:
        tag = node.tag
        if tag == _STR and not node.style and _FLOAT_12.match(node.value):  # plain: None or ""
            return float(node.value)
        if tag == _BOOL and node.value.lower() not in ("true", "false"):
            return node.value  # YAML 1.2: yes/no/on/off are words, not booleans
        if tag in (_STR, _INT, _FLOAT, _BOOL, _NULL):
            return self._scalars.construct_object(node)
        raise self.fail(node, path, f"YAML tag {tag} is not allowed (only plain data is read)")

    def _mapping(self, node: yaml.MappingNode, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise self.fail(key_node, path, "YAML merge keys (<<) are not supported")
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.fail(key_node, path, "a mapping key must be a plain scalar")
            key = self._scalar(key_node, path)
            if isinstance(key, float) and key.is_integer():
                key = int(key)
            key = str(key) if not isinstance(key, bool) else str(key).lower()
            child = join(path, key)
            if key in out:
                first = self.lines.get(child)
                raise self.fail(
                    key_node, child, f"duplicate key {key!r} (first given on line {first})"
                )
            self.lines.set(child, key_node.start_mark.line + 1)
            out[key] = self.build(value_node, child)
        return out


def _compose(text: str) -> yaml.Node | None:
    """The node graph of `text`: libyaml's composer when present (ten times faster), the
    same graph; on any error, PyYAML's own, whose messages are the ones users see."""
    if getattr(yaml, "__with_libyaml__", False):
        try:
            node: yaml.Node | None = yaml.compose(text, Loader=yaml.CSafeLoader)
            return node
        except yaml.YAMLError:
            pass
    return yaml.compose(text, Loader=yaml.SafeLoader)


def parse_yaml(text: str, file: str) -> tuple[Any, Lines]:
    """YAML text -> plain Python data and the line of each key path."""
    try:
        node = _compose(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or "malformed YAML"
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
    if _expanded_size(node, {}) > MAX_NODES:
        raise InputError(
            f"the YAML expands to more than {MAX_NODES:,} nodes (an alias bomb?); refused",
            file=file,
        )
    builder = _Builder(file)
    return builder.build(node, ""), builder.lines


MAX_FILE_BYTES = 256 * 1024 * 1024


def examples_dir() -> Path:
    """The packaged examples (a plain directory of the installed package)."""
    return Path(__file__).resolve().parent / "examples"


def example_names() -> list[str]:
    return sorted(p.stem for p in examples_dir().glob("*.yaml"))


def read_text(path: Path) -> str:
    """A file's text, or an InputError saying why it cannot be read."""
    name = str(path)
    if not path.exists():
        raise InputError("no such file", file=name)
    if path.is_dir():
        raise InputError("is a directory, not a config file", file=name)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"file larger than {MAX_FILE_BYTES >> 20} MiB; refused", file=name)
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=name) from None
    if b"\x00" in data:
        raise InputError("not a text file (binary data)", file=name)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", file=name) from None


def walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (path, leaf) of nested dicts and lists."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, join(path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, join(path, i))
    else:
        yield path, value
