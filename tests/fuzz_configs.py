"""Generated bad input for trace-tf, and the oracle every run must pass (SPEC section 6).

A case is a config file (a packaged example, or a random valid model from
random_configs.py, mutated: on its parsed YAML, dumped back, or on its raw text), maybe
an npz beside it, and one command line. The oracle: exit 0 or 2 (1 where `check` or
`diff --exit-code` may say so); on 2, stderr ends in one line `trace-tf: error: ...`
naming the file (or the option), with no traceback or Python repr in it; exit 3 or an
escaping exception is a bug; no file the command was given changes; a run ends within
seconds; JSON on stdout parses, every number finite or written as SPEC says.

Used by tests/test_fuzz.py (a seeded loop, in CI), and by hand for a campaign:

    .venv/bin/python tests/fuzz_configs.py --minutes 10 --seed 1

which runs cases until the time is up, one subprocess run (the real `trace-tf`) in every
`--subprocess-every` (default 50), dedupes failures by (command, kind, location: the
trace_tf frame that raised, or the message's wording with names and numbers blanked),
minimises one reproducer of each to a small YAML and prints them.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import io
import json
import math
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).parent))  # random_configs, run as a script

from random_configs import random_config
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.loader import examples_dir, parse_yaml, read_number

EXAMPLES = sorted(examples_dir().glob("*.yaml"))
SECONDS = 10  # a run longer than this is a hang (the slowest honest case takes ~1 s)
MAX_OUTPUT = 5_000_000  # characters on stdout: more, from a small config, is a bug

# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------


@dataclass
class Case:
    """One run: the config's text, files beside it, the command line ({file}, {dir})."""

    text: str | bytes
    args: list[str]
    what: list[str] = field(default_factory=list)  # the mutations, for the report
    files: dict[str, bytes | None] = field(default_factory=dict)  # None: a directory
    data: Any = None  # the mutated data the text was dumped from (None: raw text)


class _Dumper(yaml.SafeDumper):
    """YAML that trace-tf's 1.2 loader reads back as the data: a string it would read as
    a number (`1e-5`, `010`) is quoted, as 1.1's dumper does not know to."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = '"' if read_number(value) is not None else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(data: Any) -> str:
    return yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=None,
        width=10_000,
    )


def example_data() -> list[tuple[str, Any]]:
    """Every packaged example (fixtures/ links them), parsed as trace-tf parses it."""
    return [(p.stem, parse_yaml(p.read_text(encoding="utf-8"), p.name)[0]) for p in EXAMPLES]


def random_model(rng: np.random.Generator) -> dict[str, Any]:
    """A small random valid model of any kind random_configs makes."""
    n_heads = int(rng.choice([1, 2]))
    d_model = n_heads * int(rng.integers(1, 4))
    enc = int(rng.integers(0, 3))
    dec = int(rng.integers(0 if enc else 1, 3))
    positional = str(rng.choice(["sinusoidal", "learned", "rope", "none", "relative"]))
    if positional == "rope" and (d_model // n_heads) % 2:
        positional = "sinusoidal"
    kw: dict[str, Any] = {
        "d_model": d_model,
        "n_heads": n_heads,
        "encoder_layers": enc,
        "decoder_layers": dec,
        "norm_position": str(rng.choice(["post", "pre", "sandwich", "output"])),
        "norm": str(rng.choice(["layer", "rms"])),
        "activation": str(rng.choice(["relu", "gelu", "swiglu", "geglu_tanh"])),
        "positional": positional,
        "biases": bool(rng.integers(2)),
        "fused": bool(rng.integers(2)),
        "src_len": int(rng.integers(1, 4)),
        "tgt_len": int(rng.integers(1, 4)),
        "pad": bool(rng.integers(2)),
        "tie_embeddings": bool(rng.integers(2)),
        "embed_norm": bool(rng.integers(2)),
        "d_ff": int(rng.integers(1, 5)),
    }
    if n_heads == 2 and rng.integers(3) == 0:
        kw["n_kv_heads"] = 1
    if enc == 0 and rng.integers(3) == 0:
        kw["window"] = int(rng.integers(1, 3))
    elif enc == 0 and rng.integers(3) == 0:  # Gemma 2's: a window per layer, null full
        kw["window"] = [[1, 2, None][int(rng.integers(3))] for _ in range(dec)]
    if rng.integers(3) == 0:
        kw["attn_softcap"] = float(rng.choice([0.5, 2.0, 50.0]))
    if rng.integers(3) == 0:
        kw["logit_softcap"] = float(rng.choice([0.5, 30.0]))
    if rng.integers(3) == 0:  # GPT-OSS's attention sinks, fused or per head
        kw["attn_sinks"] = True
    if rng.integers(3) == 0:
        kw["qk_norm"] = str(rng.choice(["head", "projection"]))
    if positional == "rope" and enc == 0 and rng.integers(3) == 0:  # Gemma 3's: RoPE by layer
        kw["pe_base"] = [float(rng.choice([10000.0, 10.0])) for _ in range(dec)]
        linear = {"type": "linear", "factor": 8.0}
        kw["rope_scaling"] = [[None, linear][int(rng.integers(2))] for _ in range(dec)]
    if rng.integers(3) == 0:  # a mixture of experts: k of E, renormalised or not
        kw["experts"] = int(rng.integers(1, 4))
        kw["experts_top_k"] = int(rng.integers(1, kw["experts"] + 1))
        kw["experts_normalize"] = bool(rng.integers(2))
        if enc == 0 and rng.integers(2) == 0:  # by layer: some dense (Qwen-MoE's)
            kw["experts"] = [[kw["experts"], None][int(rng.integers(2))] for _ in range(dec)]
            kw["experts"][0] = int(rng.integers(kw["experts_top_k"], 4))  # (one sparse)
        if rng.integers(2) == 0:  # a shared expert (Qwen2-MoE's gated, DeepSeek's plain)
            kw["shared_expert"] = str(rng.choice(["gated", "plain"]))
            kw["shared_expert_d_ff"] = int(rng.integers(1, 6))
    return random_config(rng, **kw)


def _nodes(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every node of the tree with its path (keys and indices from the root)."""
    yield path, data
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _nodes(v, (*path, i))


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        data = data[p]
    return data


def _put(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    _get(data, path[:-1])[path[-1]] = value
    return data


def _pick(rng: np.random.Generator, items: list[Any]) -> Any:
    return items[int(rng.integers(len(items)))]


def _is_matrix(v: Any) -> bool:
    return (
        isinstance(v, list)
        and bool(v)
        and all(isinstance(r, list) and r and all(_num(x) for x in r) for r in v)
    )


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


ODD_VALUES: list[Any] = [
    "abc",
    "",
    "−2",
    "nan",
    "inf",
    [],
    {},
    None,
    True,
    False,
    10**30,
    2**64,
    -3,
    0,
    1.5,
    -0.5,
    float("nan"),
    float("inf"),
    float("-inf"),
    1e308,
    5e-324,
    [[[[[[[[1]]]]]]]],
    [1, "a"],
    [[1, 2], [3]],
    {"x": 1},
    "sqrt_dk",
]


def m_delete(rng: np.random.Generator, data: Any) -> str:
    maps = [(p, v) for p, v in _nodes(data) if isinstance(v, dict) and v]
    path, node = _pick(rng, maps)
    key = _pick(rng, list(node))
    del node[key]
    return f"delete {'.'.join(map(str, (*path, key)))}"


def _some_node(rng: np.random.Generator, data: Any) -> tuple[tuple[Any, ...], Any]:
    """A node below the root; half the time one that is not a number (a config is mostly
    matrix entries, and a key or a whole matrix is as worth spoiling)."""
    nodes = list(_nodes(data))[1:]
    if rng.integers(2):
        nodes = [(p, v) for p, v in nodes if not _num(v)] or nodes
    return _pick(rng, nodes)  # type: ignore[no-any-return]


def m_retype(rng: np.random.Generator, data: Any) -> str:
    path, _ = _some_node(rng, data)
    value = copy.deepcopy(_pick(rng, ODD_VALUES))
    _put(data, path, value)
    return f"{'.'.join(map(str, path))} = {value!r}"


def m_reshape(rng: np.random.Generator, data: Any) -> str:
    mats = [(p, v) for p, v in _nodes(data) if _is_matrix(v)]
    if not mats:
        return m_retype(rng, data)
    path, m = _pick(rng, mats)
    how = _pick(rng, ["drop-row", "drop-col", "add-row", "add-col", "ragged", "3d", "T", "flat"])
    if how == "drop-row":
        m = m[:-1]
    elif how == "drop-col":
        m = [r[:-1] for r in m]
    elif how == "add-row":
        m = [*m, list(m[-1])]
    elif how == "add-col":
        m = [[*r, 1.0] for r in m]
    elif how == "ragged":
        m = [*m[:-1], [*m[-1], 1.0]]
    elif how == "3d":
        m = [[[x] for x in r] for r in m]
    elif how == "T":
        m = [list(c) for c in zip(*m, strict=False)]
    else:
        m = [x for r in m for x in r]
    _put(data, path, m)
    return f"{'.'.join(map(str, path))}: {how}"


def _typo(rng: np.random.Generator, key: str) -> str:
    if len(key) < 2:
        return key + "x"
    i = int(rng.integers(len(key) - 1))
    how = int(rng.integers(4))
    if how == 0:
        return key[:i] + key[i + 1 :]
    if how == 1:
        return key[:i] + key[i + 1] + key[i] + key[i + 2 :]
    if how == 2:
        return key.upper()
    return key + "s"


def m_rename(rng: np.random.Generator, data: Any) -> str:
    maps = [(p, v) for p, v in _nodes(data) if isinstance(v, dict) and v]
    path, node = _pick(rng, maps)
    key = _pick(rng, list(node))
    new = _typo(rng, str(key))
    if new in node:
        return "rename: no-op"
    node[new] = node.pop(key)
    return f"rename {'.'.join(map(str, (*path, key)))} -> {new}"


MODEL_VALUES: dict[str, list[Any]] = {
    "d_model": [0, -1, 1, 3, 7, 10**9, 2.5],
    "n_heads": [0, -1, 3, 5, 10**6, 1.5],
    "n_kv_heads": [0, -1, 3, 2, 1, 100],
    "d_k": [0, -1, 1, 2, 5, 2.5],
    "d_v": [0, -1, 1, 7],
    "d_ff": [0, -1, 1, 10**8],
    "d_a": [0, -1, 2],
    "encoder_layers": [0, -1, 2, 10**7],
    "decoder_layers": [0, -1, 1, 2, 10**7],
    "positional": ["rope", "relative", "learned", "none", "sinusoidal", "alibi"],
    "rope_pairs": ["halves", "adjacent", "pairs"],
    "pe_base": [0, 1, -1, 0.5, 1e308, [10000, 10], [10], [-1], []],
    "rope_scaling": [
        None,
        {"type": "linear", "factor": 2},
        [None, {"type": "linear", "factor": 8}],
        [{"type": "yarn"}],
        [5],
    ],
    "max_len": [0, 1, -1, 2, 10**9],
    "embed_scale": [0, -1, "sqrt_d_model", "sqrt", 1e308],
    "norm_position": ["pre", "post", "mid", "sandwich", "output"],
    "qk_norm": ["head", "projection", "none", "whole"],
    "final_norm": [True, False, "yes"],
    "norm": ["rms", "layer", "batch", "instance"],
    "norm_eps": [0, -1, 1e308, 5e-324],
    "activation": ["gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh", "tanh"],
    "scale": [0, -1, "sqrt_dk", "sqrt_d_model", 1e-308, 5e-324],
    "temperature": [0, -1, 1e-308, 1e308],
    "seed": [-1, 2**70, 1.5, "x"],
    "init_std": [0, -1, 1e308],
    "tie_embeddings": [True, False],
    "embed_norm": [True, False],
    "window": [-1, 0, 1, 2, 1.5, None, 10**9, [2, None], [None], [1, 0], []],
    "attn_softcap": [0, -1, 1e-300, 1e-50, 1e39, 0.5, 50, None, "x", True],
    "logit_softcap": [0, -1, 1e-50, 1e39, 0.5, 30, None, [1]],
    "attn_sinks": [True, False, 1, "yes", None, [True]],
    "score": ["dot", "additive", "bilinear", "gaussian", "cosine"],
    "dtype": ["float32", "float16", "float64"],
    "experts": [0, -1, 1, 2, 3, 2.5, None, "x", 10**7, [2, None], [None], [3, 0], []],
    "experts_top_k": [0, -1, 1, 2, 9, None, True],
    "experts_normalize": [True, False, "yes", None, 1],
    "shared_expert": ["gated", "plain", "none", None, "x", True],
    "shared_expert_d_ff": [0, -1, 1, 3, 2.5, None, "x", 10**7],
    "causal": [True],
}


def m_model(rng: np.random.Generator, data: Any) -> str:
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict):
        return m_retype(rng, data)
    said = []
    for _ in range(int(rng.integers(1, 4))):
        key = _pick(rng, list(MODEL_VALUES))
        model[key] = _pick(rng, MODEL_VALUES[key])
        said.append(f"model.{key}={model[key]!r}")
    return ", ".join(said)


def m_sequence(rng: np.random.Generator, data: Any) -> str:
    key = _pick(rng, ["source", "target"])
    value = _pick(
        rng,
        [[], "", None, ["zzz"], ["a", "zzz"], "  ", [[]], [[1]], [["a"]], [[1, 2, 3, 4, 5, 6, 7]]],
    )
    if isinstance(data, dict):
        old = data.get(key)
        if isinstance(old, list) and old and rng.integers(2):
            value = [*old, old[0]] if rng.integers(2) else [*old, "zzz"]
        data[key] = value
    return f"{key} = {value!r}"


def m_tokens(rng: np.random.Generator, data: Any) -> str:
    if not isinstance(data, dict):
        return m_retype(rng, data)
    vocab = data.get("vocab")
    how = _pick(rng, ["dup-vocab", "bos", "eos", "pad", "emb-unknown", "empty-vocab"])
    if how == "dup-vocab" and isinstance(vocab, list) and vocab:
        vocab.append(vocab[0])
    elif how in ("bos", "eos", "pad"):
        tokens = data.setdefault("tokens", {})
        if isinstance(tokens, dict):
            tokens[how] = _pick(rng, ["zzz", None, 3, [1], ""])
    elif how == "emb-unknown":
        emb = data.setdefault("embeddings", {})
        if isinstance(emb, dict):
            emb["zzz"] = [1.0]
    else:
        data["vocab"] = []
    return f"tokens: {how}"


def m_variant(rng: np.random.Generator, data: Any) -> str:
    if not isinstance(data, dict):
        return m_retype(rng, data)
    paths = [".".join(map(str, p)) for p, _ in _nodes(data) if p]
    key = _pick(rng, [*paths, "model.d_modl", "weights.encoder.9.ffn.W_1", "nope", "a..b"])
    value = copy.deepcopy(_pick(rng, ODD_VALUES))
    body = _pick(rng, [{key: value}, "x", None, [], {"": 1}])
    data["variants"] = {"v": body}
    return f"variants.v = {body!r}"


def m_expect(rng: np.random.Generator, data: Any) -> str:
    if not isinstance(data, dict):
        return m_retype(rng, data)
    entry = {
        "step": _pick(rng, ["encoder.0.self_attn.h0.q", "nope", "logits", "attn.softmax", ""]),
        "value": copy.deepcopy(_pick(rng, [[[1.0]], 1, "x", [[float("nan")]], []])),
    }
    if rng.integers(2):
        entry[_pick(rng, ["atol", "rtol", "variant", "document", "cell"])] = _pick(
            rng, [-1, "x", float("nan"), "v", None]
        )
    data["expect"] = [entry]
    return f"expect = {entry!r}"


def m_redraw(rng: np.random.Generator, data: Any) -> str:
    """A model of other sizes and conventions, every weight drawn: past validation to the
    engine, the explainer and the renderer with what a user may combine."""
    if _kind(data)[0] != "model" or not isinstance(data, dict):
        return m_model(rng, data)
    for key in ("weights", "embeddings", "expect", "variants", "weights_file"):
        data.pop(key, None)
    model = data.setdefault("model", {"d_model": 2})
    said = []
    n_heads = int(_pick(rng, [1, 2, 4]))
    model["n_heads"] = n_heads
    model["d_model"] = n_heads * int(rng.integers(1, 4))
    said.append(f"d_model {model['d_model']}, n_heads {n_heads}")
    for key, values in REDRAW.items():
        if rng.integers(3) == 0:
            model[key] = _pick(rng, values)
            said.append(f"{key} {model[key]!r}")
    if rng.integers(3) == 0:
        model["encoder_layers"] = int(rng.integers(0, 3))
        model["decoder_layers"] = int(rng.integers(0 if model["encoder_layers"] else 1, 3))
        said.append(f"layers {model['encoder_layers']}/{model['decoder_layers']}")
    if "window" in model and rng.integers(4):  # mostly where it is allowed
        model["encoder_layers"], model["decoder_layers"] = 0, max(1, model.get("decoder_layers", 1))
    if model.get("n_kv_heads") not in (None, *[k for k in (1, 2, 4) if n_heads % k == 0]):
        model["n_kv_heads"] = 1
    if model.get("positional") == "rope" and model.get("d_k", 2) % 2:
        model["d_k"] = 2
    if rng.integers(4) == 0:  # a mixture of experts, every weight drawn
        model["experts"], model["experts_top_k"] = 3, int(_pick(rng, [1, 2, 3]))
        said.append(f"experts 3, top {model['experts_top_k']}")
    return "redraw: " + ", ".join(said)


REDRAW: dict[str, list[Any]] = {
    "n_kv_heads": [1, 2],
    "d_k": [1, 2, 3],
    "d_v": [1, 3],
    "d_ff": [1, 3],
    "d_a": [1, 2],
    "positional": ["rope", "relative", "learned", "none", "sinusoidal"],
    "rope_pairs": ["halves", "adjacent"],
    "max_len": [4, 8],
    "embed_scale": [2, "sqrt_d_model"],
    "norm_position": ["pre", "post", "sandwich", "output"],
    "qk_norm": ["head", "projection"],
    "final_norm": [True, False],
    "norm": ["rms", "layer"],
    "norm_eps": [0, 1e-3],
    "activation": ["gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh", "swiglu_oss"],
    "scale": [1, "sqrt_dk", 1e-300],
    "temperature": [0.5, 1e-300, 1e300],
    "init_std": [0, 1e-200, 1e200],
    "tie_embeddings": [True],
    "embed_norm": [True],
    "window": [1, 2, [1, None]],
    "attn_softcap": [0.5, 50],
    "logit_softcap": [0.5, 30],
    "attn_sinks": [True],
    "score": ["dot", "additive", "bilinear", "gaussian", "scaled_dot"],
    "dtype": ["float32"],
}


DATA_MUTATIONS: list[Callable[[np.random.Generator, Any], str]] = [
    m_delete,
    m_retype,
    m_retype,
    m_reshape,
    m_reshape,
    m_rename,
    m_model,
    m_model,
    m_sequence,
    m_tokens,
    m_variant,
    m_expect,
]

# ---------------------------------------------------------------------------
# weights_file
# ---------------------------------------------------------------------------


def _npz(arrays: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def m_weights_file(rng: np.random.Generator, data: Any, case: Case) -> str:
    """Move one weight (or embedding) of the YAML into `w.npz`, and spoil it or the file."""
    leaves = []
    for root in ("weights", "embeddings"):
        tree = data.get(root) if isinstance(data, dict) else None
        for p, v in _nodes(tree):
            named = bool(p) and isinstance(_get(tree, p[:-1]), dict)  # a weight, not a row
            if named and (_is_matrix(v) or (isinstance(v, list) and v and all(map(_num, v)))):
                leaves.append((tree, p, v, "embeddings." if root == "embeddings" else ""))
    arrays: dict[str, Any] = {}
    if leaves:
        tree, path, value, prefix = _pick(rng, leaves)
        parent = _get(tree, path[:-1])
        if isinstance(parent, dict):
            del parent[path[-1]]
        name = prefix + ".".join(map(str, path))
        arrays[name] = np.asarray(value, dtype=float)
    else:
        name = "encoder.0.ffn.W_1"
        arrays[name] = np.ones((2, 2))
    how = _pick(
        rng,
        [
            "ok",
            "object",
            "complex",
            "int8",
            "bool",
            "0-d",
            "float16",
            "shape",
            "nan",
            "unicode",
            "typo-name",
            "missing",
            "directory",
            "truncated",
            "not-zip",
            "npy",
            "empty",
            "both",
            "record",
        ],
    )
    a = arrays[name]
    if how == "object":
        arrays[name] = np.array([None, 1], dtype=object)
    elif how == "complex":
        arrays[name] = a.astype(complex)
    elif how in ("int8", "bool", "float16"):
        arrays[name] = a.astype(how if how != "bool" else np.bool_)
    elif how == "0-d":
        arrays[name] = np.float64(1.0)
    elif how == "shape":
        arrays[name] = np.ones((*a.shape, 2))
    elif how == "nan":
        arrays[name] = np.full(a.shape, np.nan)
    elif how == "unicode":
        arrays[name] = np.array(["a", "b"])
    elif how == "record":
        arrays[name] = np.zeros(2, dtype=[("x", "f8")])
    elif how == "typo-name":
        arrays[name.replace("_", "", 1) or "x"] = arrays.pop(name)
    elif how == "empty":
        arrays = {}
    elif how == "both" and leaves:  # the YAML keeps it too: given twice
        _put(tree, path, value)
    if how == "object":  # (numpy pickles it; trace-tf must refuse it unread)
        buf = io.BytesIO()
        np.savez(buf, allow_pickle=True, **arrays)  # type: ignore[arg-type]
        blob: bytes | None = buf.getvalue()
    else:
        blob = _npz(arrays)
    if how == "missing":
        blob = b""
    elif how == "directory":
        blob = None
    elif how == "truncated":
        assert blob is not None
        blob = blob[: int(rng.integers(1, len(blob)))]
    elif how == "not-zip":
        blob = b"model: {d_model: 2}\n"
    elif how == "npy":
        buf = io.BytesIO()
        np.save(buf, a)
        blob = buf.getvalue()
    if how != "missing":
        case.files["w.npz"] = blob
    data["weights_file"] = "w.npz"
    return f"weights_file: {name} {how}"


# ---------------------------------------------------------------------------
# Raw text
# ---------------------------------------------------------------------------


def raw(rng: np.random.Generator, text: str) -> tuple[str | bytes, str]:
    how = _pick(
        rng,
        [
            "truncate",
            "tab",
            "bom",
            "utf8",
            "python-tag",
            "alias",
            "big-line",
            "dup-line",
            "utf16",
            "crlf",
            "nul",
            "bomb",
            "deep",
        ],
    )
    lines = text.splitlines(keepends=True) or ["\n"]
    i = int(rng.integers(len(lines)))
    if how == "truncate":
        return text[: int(rng.integers(len(text) + 1))], how
    if how == "tab":
        j = int(rng.integers(len(lines[i]) + 1))
        lines[i] = lines[i][:j] + "\t" + lines[i][j:]
        return "".join(lines), how
    if how == "bom":
        return "\ufeff" + text, how
    if how == "utf8":
        b = text.encode()
        j = int(rng.integers(len(b) + 1))
        return b[:j] + _pick(rng, [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"]) + b[j:], how
    if how == "python-tag":
        return text + "title: !!python/object/apply:os.system ['touch pwned']\n", how
    if how == "alias":
        # an anchored value reused: model as an alias of itself, or source of vocab
        if "vocab:" in text and "source:" in text:
            t = re.sub(r"^vocab:", "vocab: &v", text, count=1, flags=re.M)
            return re.sub(r"^source:.*$", "source: *v", t, count=1, flags=re.M), how
        return text + "extra: &x [1, 2]\nmore: *x\n", how
    if how == "big-line":
        return text + "title: '" + "x" * 10_000_000 + "'\n", how
    if how == "dup-line":
        lines.insert(i, lines[i])
        return "".join(lines), how
    if how == "utf16":
        return text.encode("utf-16"), how
    if how == "crlf":
        return text.replace("\n", "\r\n"), how
    if how == "nul":
        return text[:10] + "\x00" + text[10:], how
    if how == "bomb":
        return (
            'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
            + "".join(
                f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n"
                for p, c in zip("abcdefg", "bcdefgh", strict=True)
            )
            + text,
            how,
        )
    return text + "deep: " + "[" * 5000 + "]" * 5000 + "\n", how


# ---------------------------------------------------------------------------
# Command lines
# ---------------------------------------------------------------------------

STAGES = ["q", "k", "softmax", "scores", "qkv", "add_norm", "ffn", "cross", "attention", "logits"]
STAGES += ["embed", "pe", "mask", "rel_bias", "act", "nope", "*", "encoder.0.*", "decoder.9.*", ""]
ENTRIES = [
    "encoder.0.self_attn.h0.scores",
    "encoder.0.self_attn.h0.softmax",
    "encoder.0.self_attn.h1.q",
    "decoder.0.self_attn.h0.masked",
    "decoder.0.cross_attn.h0.context",
    "encoder.0.ffn.act",
    "encoder.0.ffn.norm",
    "encoder.pe",
    "decoder.mask",
    "logits",
    "probs",
    "attn.softmax",
    "norm.out",
    "pe",
    "encoder.7.ffn.act",
    "nope",
    "",
]
CELLS = ["0,0", "0,1", "1,0", "9,9", "-1,0", "a", "0", "0,0,0", "", "0,,1", " 0 , 1 "]
SET_VALUES = ["abc", "[[1]]", "[]", "{}", "null", "-1", "0", "1e400", ".nan", "[1, 2", "x: y", ""]


def _set_option(rng: np.random.Generator, data: Any) -> str:
    paths = [".".join(map(str, p)) for p, _ in _nodes(data) if p] if data is not None else []
    key = _pick(
        rng,
        [
            *(paths or ["model.d_model"]),
            "model.n_heads",
            "weights.encoder.0.ffn.W_1",
            "weights.encoder.0.ffn.W_1.0.9",
            "weights.encoder.0.ffn.W_1.99",
            "source.99",
            "model.nope",
            "vocab.100000000",
            "model",
            "",
            ".",
            "weights.decoder.0.cross_attn.heads.5.W_q",
        ],
    )
    if rng.integers(3) == 0:
        return key  # no '='
    if rng.integers(3) == 0:
        model_key = _pick(rng, list(MODEL_VALUES))
        return f"model.{model_key}={json.dumps(_pick(rng, MODEL_VALUES[model_key]))}"
    return f"{key}={_pick(rng, SET_VALUES)}"


HEAD_STEPS = ["q_raw", "k_raw", "q", "k", "v", "q_a", "k_a", "tanh", "q_b", "scores", "scaled"]
HEAD_STEPS += ["rel_bias", "biased", "masked", "softmax", "context"]
BLOCK_STEPS = ["concat", "wo", "residual", "norm", "norm.mean", "norm.var", "norm.rms"]
FFN_STEPS = ["hidden", "act", "up", "gated", "out", "residual", "norm", "norm.mean", "norm.rms"]
STACK_STEPS = ["embed", "pe", "input", "embed_norm", "embed_norm.mean", "embed_norm.rms"]
STACK_STEPS += ["mask", "cross_mask", "final_norm", "final_norm.var", "output"]


def entry(rng: np.random.Generator, enc: bool, dec: bool) -> str:
    """A step path a model of this kind may have (some it has not: an error to word)."""
    stack = _pick(rng, ["encoder"] * enc + ["decoder"] * dec or ["encoder"])
    where = int(rng.integers(6))
    if where == 0:
        return f"{stack}.{_pick(rng, STACK_STEPS)}"
    if where == 1 and dec:
        return str(_pick(rng, ["logits", "probs"]))
    layer = _pick(rng, [0, 0, 1])
    if where == 2:
        return f"{stack}.{layer}.ffn.{_pick(rng, FFN_STEPS)}"
    block = _pick(rng, ["self_attn"] * 3 + ["cross_attn"] * (stack == "decoder" and enc))
    if where == 3:
        return f"{stack}.{layer}.{block}.{_pick(rng, BLOCK_STEPS)}"
    return f"{stack}.{layer}.{block}.h{_pick(rng, [0, 0, 1, 3])}.{_pick(rng, HEAD_STEPS)}"


def cell(rng: np.random.Generator) -> str:
    n = _pick(rng, [2, 2, 2, 1, 3])
    return ",".join(str(_pick(rng, [0, 0, 1, 2, 3])) for _ in range(n))


def _kind(data: Any) -> tuple[str, bool, bool]:
    """The config's kind: an operation ('attention', 'norm', 'pe') or 'model', and for a
    model whether it has an encoder and a decoder (SPEC's defaults: 1 and 0 layers)."""
    if not isinstance(data, dict):
        return "model", True, False
    for op in ("attention", "norm", "pe"):
        if op in data:
            return op, False, False
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    enc, dec = model.get("encoder_layers", 1), model.get("decoder_layers", 0)
    return "model", bool(enc != 0), bool(dec != 0)


def valid_command(rng: np.random.Generator, data: Any) -> list[str]:
    """A command line the config's kind can serve, every option of a valid kind: the
    faults are then the file's alone."""
    kind, enc, dec = _kind(data)
    if kind != "model":
        calc = {"attention": "attend", "norm": "norm", "pe": "pe"}[kind]
        name = _pick(rng, [calc, calc, "check", "step"])
        args = [name, "{file}"]
        if name == "step":
            args += ["--stage", {"attend": "attention", "norm": "add_norm", "pe": "pe"}[calc]]
        fmt = _pick(rng, ["table", "json"] + (["npz"] if name != "check" else []))
    else:
        names = ["step", "explain", "weights", "cost", "diff", "check"]
        names += ["encode", "encode"] * enc + ["decode", "generate", "generate"] * dec
        name = _pick(rng, names)
        args = [name, "{file}"]
        stages = ["q", "k", "v", "scores", "softmax", "qkv", "add_norm", "ffn", "attention"]
        stages += ["embed", "input", "output", "act", "norm", "context", "concat", "wo"]
        stages += (["logits", "probs", "masked"] if dec else []) + (
            ["cross"] if enc and dec else []
        )
        entries = [entry(rng, enc, dec) for _ in range(4)]
        fmt = _pick(rng, ["table", "json"])
        if name == "step":
            args += ["--stage", _pick(rng, stages)]
            if rng.integers(3) == 0:
                args += ["--layer", "0"]
            if rng.integers(3) == 0:
                args += ["--head", "0"]
            fmt = _pick(rng, ["table", "json", "npz"])
            if rng.integers(5) == 0 and entries:
                args[3], fmt = _pick(rng, entries), "csv"
        elif name in ("encode", "decode"):
            fmt = _pick(rng, ["table", "json", "npz"])
        elif name == "generate":
            args += _pick(rng, [["--greedy"], ["--sample"], ["--beam", "2"]])
            args += ["--max-tokens", _pick(rng, ["1", "2", "4"])]
            if rng.integers(2):
                args.append(_pick(rng, ["--cache", "--no-cache"]))
            if rng.integers(3) == 0:
                t = f"t{_pick(rng, [0, 1])}." if rng.integers(2) else ""
                args += ["--explain", t + _pick(rng, entries), "--cell", cell(rng)]
            elif rng.integers(3) == 0:
                args += ["--trace", "--stage", _pick(rng, stages)]
                fmt = _pick(rng, ["table", "json", "npz"])
        elif name == "explain":
            args.insert(1, _pick(rng, entries))
            if rng.integers(4):
                args += ["--cell", cell(rng)]
        elif name == "cost" and rng.integers(2):
            args += ["--vary", _pick(rng, ["L=1,2", "D=2,4"]), "--repeat", "1"]
        elif name == "diff":
            args += [
                "--set-b",
                _pick(rng, ["model.seed=1", "model.scale=2", "model.temperature=2"]),
            ]
        if name not in ("check",) and rng.integers(5) == 0:
            args += ["--dtype", "float32"]
    if fmt != "table":
        args += ["--format", fmt]
        if fmt in ("npz", "csv") or rng.integers(4) == 0:
            args += ["--output", "{dir}/out." + fmt]
    if rng.integers(10) == 0:
        args += ["--strict"]
    if rng.integers(4) == 0:
        args += ["--precision", _pick(rng, ["0", "17"])]
    variants = data.get("variants") if isinstance(data, dict) else None
    if rng.integers(6) == 0 and name != "check" and isinstance(variants, dict) and variants:
        args += ["--variant", str(_pick(rng, list(variants)))]
    return args


MODEL_COMMANDS = ("encode", "decode", "step", "generate", "explain", "weights", "cost", "diff")


def wild_command(rng: np.random.Generator, data: Any) -> list[str]:
    """A command line, any command with any options, valid or not, as `--help` lists them."""
    kind = _pick(
        rng,
        [*MODEL_COMMANDS, "generate", "check", "attend", "norm", "pe", "stages"],
    )
    args: list[str]
    if kind == "step":
        args = ["step", "{file}", "--stage", _pick(rng, STAGES)]
        if rng.integers(2):
            args += ["--layer", _pick(rng, ["0", "1", "5", "-1", "x"])]
        if rng.integers(2):
            args += ["--head", _pick(rng, ["0", "1", "7", "-1"])]
        if rng.integers(4) == 0:
            args.append("--inputs")
    elif kind == "explain" or (kind == "generate" and rng.integers(2)):
        _, enc, dec = _kind(data)
        at = ["explain", entry(rng, enc, dec), "{file}"]
        if kind == "generate":
            at = ["generate", "{file}", "--explain", f"t{rng.integers(3)}." + at[1]]
        args = [*at, "--cell", _pick(rng, [*CELLS, cell(rng), cell(rng)])]
    elif kind == "generate":
        beam = ["--beam", _pick(rng, ["2", "2", "0", "100000"])]
        args = ["generate", "{file}", *_pick(rng, [["--greedy"], ["--sample"], beam])]
        args += ["--max-tokens", _pick(rng, ["1", "3", "0", "-1", "1000000", "x"])]
        if rng.integers(2):
            args.append(_pick(rng, ["--cache", "--no-cache"]))
        if rng.integers(3) == 0:
            args += ["--explain", _pick(rng, ENTRIES), "--cell", _pick(rng, CELLS)]
        elif rng.integers(3) == 0:
            args += ["--trace", "--stage", _pick(rng, STAGES)]
            if rng.integers(2):
                args += ["--layer", _pick(rng, ["0", "3"]), "--head", _pick(rng, ["0", "3"])]
        if rng.integers(3) == 0:
            args += [
                _pick(rng, ["--temperature", "--top-p", "--length-penalty"]),
                _pick(rng, ["0", "-1", "nan", "0.5", "1e400", "1e-400", "1.5"]),
            ]
        if rng.integers(4) == 0:
            args += ["--top-k", _pick(rng, ["0", "-1", "1", "1000"])]
        if rng.integers(4) == 0:
            args += ["--seed", _pick(rng, ["-1", "0", str(2**70)])]
        if rng.integers(4) == 0:
            args += ["--show", _pick(rng, ["1", "0", "1000000"])]
    elif kind == "cost":
        args = ["cost", "{file}"]
        if rng.integers(2):
            args += ["--vary", _pick(rng, ["L=2,3", "D=2,4", "L=0", "X=1", "L=a", "L=", "D=3"])]
            args += ["--repeat", _pick(rng, ["1", "1", "0", "101"])]
    elif kind == "diff":
        args = ["diff", "{file}"]
        if rng.integers(3):
            args += ["--set-b", _set_option(rng, data)]
        else:
            args.append(_pick(rng, ["hello", "{file}", "{dir}/w.npz"]))
        if rng.integers(3) == 0:
            args += _pick(rng, [["--exit-code"], ["--delta"], ["--brief"], ["--all"]])
        if rng.integers(4) == 0:
            args += ["--atol", _pick(rng, ["-1", "nan", "0", "1e400"])]
        if rng.integers(4) == 0:
            args += ["--variant-b", _pick(rng, ["v", "nope"])]
    elif kind == "stages":
        return ["stages", *(["--format", "json"] if rng.integers(2) else [])]
    elif kind in ("attend", "norm", "pe"):
        args = [kind, "{file}"]
        extra = {
            "attend": [
                ["--q", "1 2"],
                ["--k", "1; 2"],
                ["--mask", "0 -inf"],
                ["--scale", "0"],
                ["--score", "additive"],
                ["--w", "0"],
                ["--temperature", "0"],
            ],
            "norm": [["--x", "1 2; 3"], ["--kind", "instance"], ["--eps", "-1"], ["--gamma", "1"]],
            "pe": [["--length", "3"], ["--d-model", "1"], ["--kind", "rope"], ["--base", "1"]],
        }[kind]
        for _ in range(int(rng.integers(0, 3))):
            args += _pick(rng, extra)
    else:
        args = [kind, "{file}"]
    if kind in MODEL_COMMANDS and rng.integers(4) == 0:
        args += ["--dtype", _pick(rng, ["float32", "float16"])]
    if rng.integers(2) == 0:
        args += ["--set", _set_option(rng, data)]
    if rng.integers(6) == 0:
        args += ["--variant", _pick(rng, ["v", "nope"])]
    fmt = _pick(rng, ["table", "table", "json", "json", "npz", "csv"])
    if fmt != "table":
        args += ["--format", fmt]
        if fmt in ("npz", "csv") or rng.integers(4) == 0:
            args += ["--output", "{dir}/out." + fmt]
    if rng.integers(8) == 0:
        args += ["--max-elements", _pick(rng, ["1", "100", "1000000"])]
    if rng.integers(10) == 0:
        args += ["--strict"]
    return args


# ---------------------------------------------------------------------------
# A case, from a seed
# ---------------------------------------------------------------------------


def make_case(rng: np.random.Generator, sources: list[tuple[str, Any]]) -> Case:
    """A source (an example, or a random model one time in three) with one kind of fault,
    most often alone so that the rest is valid and the run gets past it: mutations of its
    data, a wild command line, a spoilt weights_file, raw text, or none at all (every
    command on every kind of valid model)."""
    if rng.integers(3) == 0:
        name, data = "random", random_model(rng)
    else:
        name, data = _pick(rng, sources)
        data = copy.deepcopy(data)
    case = Case("", [], [name])
    fault = _pick(rng, ["data", "data", "data", "model", "command", "npz", "raw", "none"])
    if fault == "npz" and _kind(data)[0] != "model":
        fault = "data"
    if fault == "model":
        case.what.append(m_redraw(rng, data))
    if fault == "data":
        for _ in range(int(rng.integers(1, 3))):
            case.what.append(_pick(rng, DATA_MUTATIONS)(rng, data))
    if fault == "npz":
        case.what.append(m_weights_file(rng, data, case))
    case.args = (wild_command if fault == "command" else valid_command)(rng, data)
    if fault == "npz" and rng.integers(3) == 0:  # an override over the npz's array
        name = case.what[-1].split()[1]
        where = _pick(rng, ["", ".0", ".0.0", ".9", ".0.9"])
        value = _pick(rng, ["1", "[1]", "[[1]]", "null", "{}", "abc"])
        case.args += [_pick(rng, ["--set", "--set"] + ["--set-b"] * (case.args[0] == "diff"))]
        key = name if name.startswith("embeddings.") else f"weights.{name}"
        case.args.append(f"{key}{where}={value}")
    text = dump(data)
    if fault == "raw":
        case.text, how = raw(rng, text)
        case.what.append(f"raw: {how}")
    else:
        case.text, case.data = text, data
    return case


# ---------------------------------------------------------------------------
# Running and the oracle
# ---------------------------------------------------------------------------


class Hang(BaseException):
    """A run over SECONDS (a BaseException: the CLI's guard must not catch it)."""


def _alarm(signum: int, frame: object) -> None:
    raise Hang


@dataclass
class Outcome:
    code: int | None
    stdout: str
    stderr: str
    seconds: float
    exception: BaseException | None = None


def _digest(path: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in path.rglob("*")
        if p.is_file() and not p.name.startswith("out.")
    }


def write_case(case: Case, where: Path) -> None:
    """The case's files in `where`, which is emptied first."""
    for p in sorted(where.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
    config = where / "c.yaml"
    config.write_bytes(case.text if isinstance(case.text, bytes) else case.text.encode())
    for name, blob in case.files.items():
        if blob is None:
            (where / name).mkdir()
        else:
            (where / name).write_bytes(blob)


def fill(args: list[str], where: Path) -> list[str]:
    return [a.replace("{file}", str(where / "c.yaml")).replace("{dir}", str(where)) for a in args]


_runner = CliRunner()


def run_inprocess(case: Case, where: Path) -> Outcome:
    write_case(case, where)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # numpy's RuntimeWarning, which a process prints once per place (and pytest
            # swallows), raised instead: exit 3, with where it came from
            warnings.simplefilter("error", RuntimeWarning)
            result = _runner.invoke(app, fill(case.args, where))
    except Hang as exc:
        return Outcome(None, "", "", time.perf_counter() - start, exc)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    exc = result.exception
    if isinstance(exc, SystemExit):
        exc = None
    return Outcome(result.exit_code, result.stdout, result.stderr, time.perf_counter() - start, exc)


def run_subprocess(case: Case, where: Path) -> Outcome:
    """The real entry point, as the user runs it."""
    write_case(case, where)
    exe = Path(sys.executable).with_name("trace-tf")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "trace_tf"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [*cmd, *fill(case.args, where)],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=SECONDS * 3,
            env={"PATH": "/usr/bin:/bin", "COLUMNS": "120", "LANG": "C.UTF-8"},
            cwd=where,
        )
    except subprocess.TimeoutExpired:
        return Outcome(None, "", "", time.perf_counter() - start, Hang())
    return Outcome(
        proc.returncode,
        proc.stdout.decode(errors="replace"),
        proc.stderr.decode(errors="replace"),
        time.perf_counter() - start,
    )


NOISE = [
    "Traceback",
    "<class",
    "np.float64(",
    "np.int64(",
    "array(",
    "KeyError",
    "TypeError",
    "ValueError",
    "IndexError",
    "AttributeError",
    "RuntimeWarning",
    "Exception",
    "dtype('",
    "object at 0x",
]


def _finite_json(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite_json(v) for v in value)
    if isinstance(value, dict):
        return all(_finite_json(v) for v in value.values())
    return True


def _no_constant(name: str) -> Any:
    raise ValueError(f"JSON constant {name}")


def template(message: str, where: Path) -> str:
    """A message's wording: the paths, quoted text and numbers blanked, for deduping."""
    m = message.replace(str(where), "DIR")
    m = re.sub(r"'[^']*'|\"[^\"]*\"", "Q", m)
    m = re.sub(r"\b[\w.]*\d[\w.]*\b", "N", m)
    return m[:160]


def oracle(case: Case, out: Outcome, where: Path, before: dict[str, str]) -> list[tuple[str, str]]:
    """The failures of one run, each as (kind, location-or-wording)."""
    cmd = case.args[0]
    failures: list[tuple[str, str]] = []
    if isinstance(out.exception, Hang):
        return [("hang", f"over {SECONDS} s")]
    if out.exception is not None:
        e = out.exception
        tb = e.__traceback__
        loc = "?"
        while tb is not None:
            if "trace_tf" in tb.tb_frame.f_code.co_filename:
                loc = f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}"
            tb = tb.tb_next
        return [(f"escaped {type(e).__name__}", loc)]
    allowed = {0, 2} | ({1} if cmd == "check" or "--exit-code" in case.args else set())
    if out.code == 3:
        failures.append(("exit 3", _internal_location(out.stderr)))
    elif out.code not in allowed:
        failures.append((f"exit {out.code}", out.stderr[-200:]))
    if out.seconds > SECONDS / 2:
        failures.append(("slow", f"{out.seconds:.1f} s"))
    if len(out.stdout) > MAX_OUTPUT:
        failures.append(("huge output", f"{len(out.stdout):,} characters"))
    for bad in NOISE:
        if bad in out.stderr:
            failures.append((f"noise {bad}", template(out.stderr.strip().splitlines()[-1], where)))
    if _digest(where) != before:
        failures.append(("input modified", ""))
    if (where / "pwned").exists():
        failures.append(("tag executed", ""))
    if out.code == 2:
        lines = [ln for ln in out.stderr.splitlines() if not ln.startswith("trace-tf: warning")]
        last = lines[-1] if lines else ""
        if len(lines) != 1 or not last.startswith("trace-tf: error: "):
            failures.append(("not one error line", template(out.stderr[-300:], where)))
        elif not _names_source(last, where):
            failures.append(("names no file or option", template(last, where)))
        elif str(where) in last and not _says_what(last):  # (an option's: typer's words)
            failures.append(("vague message", template(last, where)))
        if out.stdout and "--output" not in case.args:
            failures.append(("stdout on error", ""))
    if out.code == 0 and (
        "but the arithmetic gives" in out.stdout or '"agrees": false' in out.stdout
    ):
        failures.append(("explain disagrees", template(out.stdout[:300], where)))
    if out.code == 0 and "json" in case.args and "--output" not in case.args:
        try:
            parsed = json.loads(out.stdout, parse_constant=_no_constant)
        except ValueError as exc:
            failures.append(("bad json", str(exc)[:80]))
        else:
            if not _finite_json(parsed):
                failures.append(("non-finite json", ""))
    return failures


def _names_source(line: str, where: Path) -> bool:
    """The error names the config file, the npz, or a command-line option."""
    return (
        str(where) in line
        or "(packaged example)" in line
        or re.search(r"--[a-z]", line) is not None
        or "'--" in line
    )


def _says_what(line: str) -> bool:
    """More than a verdict: what was expected, found, or the valid choices."""
    words = ("expected", "found", "did you mean", "not a", "no such", "must", "unknown")
    words += ("first appears",)
    return any(w in line for w in words)


def _internal_location(stderr: str) -> str:
    return re.sub(r"\(.*\)", "(...)", stderr.strip().splitlines()[-1] if stderr.strip() else "")[
        :160
    ]


def debug_location(case: Case, where: Path) -> str:
    """Where a bug raised: rerun with --debug and take the last trace_tf frame."""
    out = run_inprocess(Case(case.text, [*case.args, "--debug"], files=case.files), where)
    frames = re.findall(r'File "([^"]*trace_tf[^"]*)", line (\d+), in (\w+)', out.stderr)
    exc = re.findall(r"^(\w+(?:Error|Exception)\w*):", out.stderr, flags=re.M)
    if not frames:
        return _internal_location(out.stderr)
    f, line, func = frames[-1]
    return f"{exc[-1] if exc else '?'} at {Path(f).name}:{line} {func}"


def check_case(case: Case, where: Path, sub: bool = False) -> tuple[Outcome, list[tuple[str, str]]]:
    write_case(case, where)
    before = _digest(where)
    out = (run_subprocess if sub else run_inprocess)(case, where)
    failures = oracle(case, out, where, before)
    if any(kind == "exit 3" for kind, _ in failures) and not sub:
        failures = [
            (k, debug_location(case, where) if k == "exit 3" else loc) for k, loc in failures
        ]
    return out, failures


# ---------------------------------------------------------------------------
# Minimising
# ---------------------------------------------------------------------------


def minimise(case: Case, key: tuple[str, str, str], where: Path, budget: int = 300) -> Case:
    """A smaller case with the same failure: keys, items and lines left out while it stays."""

    def same(c: Case) -> bool:
        nonlocal budget
        budget -= 1
        _, failures = check_case(c, where)
        return any((c.args[0], k, loc) == key for k, loc in failures)

    if case.data is not None:
        data = copy.deepcopy(case.data)
        changed = True
        while changed and budget > 0:
            changed = False
            for path, node in sorted(_nodes(data), key=lambda pn: len(pn[0])):
                if budget <= 0:
                    break
                if not isinstance(node, (dict, list)):
                    continue
                for k in list(node.keys() if isinstance(node, dict) else range(len(node)))[::-1]:
                    trial = copy.deepcopy(data)
                    parent = _get(trial, path)
                    if isinstance(parent, dict) and k not in parent:
                        continue
                    if isinstance(parent, list) and k >= len(parent):
                        continue
                    del parent[k]
                    c = Case(dump(trial), case.args, case.what, case.files, trial)
                    if same(c):
                        data, changed = trial, True
                        break
                if changed:
                    break
        return Case(dump(data), case.args, case.what, case.files, data)
    if isinstance(case.text, bytes):
        return case
    lines = case.text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and budget > 0:
        trial = lines[:i] + lines[i + 1 :]
        if same(Case("".join(trial), case.args, case.what, case.files)):
            lines = trial
        else:
            i += 1
    return Case("".join(lines), case.args, case.what, case.files)


# ---------------------------------------------------------------------------
# The campaign
# ---------------------------------------------------------------------------


def campaign(
    seed: int, seconds: float, where: Path, subprocess_every: int = 50, limit: int | None = None
) -> dict[tuple[str, str, str], tuple[Case, list[str]]]:
    """Run cases from `seed` for `seconds` (or `limit` cases): the first case of each
    failure class, with every failure of its run."""
    rng = np.random.default_rng(seed)
    sources = example_data()
    found: dict[tuple[str, str, str], tuple[Case, list[str]]] = {}
    start, n = time.monotonic(), 0
    while time.monotonic() - start < seconds and (limit is None or n < limit):
        n += 1
        case = make_case(rng, sources)
        sub = subprocess_every > 0 and n % subprocess_every == 0
        _, failures = check_case(case, where, sub=sub)
        for kind, loc in failures:
            key = (case.args[0], kind, loc)
            if key not in found:
                found[key] = (case, [f"{k}: {v}" for k, v in failures])
                print(f"[{n}] NEW {key}  ({'; '.join(case.what)})", file=sys.stderr)
    print(f"{n} cases, {len(found)} failure classes", file=sys.stderr)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subprocess-every", type=int, default=50)
    parser.add_argument(
        "--dir", default=None, help="a scratch directory (default: a temporary one)"
    )
    ns = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(ns.dir or tmp)
        where.mkdir(exist_ok=True)
        found = campaign(ns.seed, ns.minutes * 60, where, ns.subprocess_every)
        for key, (case, failures) in found.items():
            small = minimise(case, key, where)
            print(f"\n=== {key}\n    mutations: {'; '.join(case.what)}\n    all: {failures}")
            print(f"    args: {' '.join(small.args)}")
            if small.files:
                print(f"    files: { {k: (len(v) if v else v) for k, v in small.files.items()} }")
            text = small.text if isinstance(small.text, str) else repr(small.text[:400])
            print("    " + text[:1500].replace("\n", "\n    "))


if __name__ == "__main__":
    main()
