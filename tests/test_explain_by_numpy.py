"""`trace-tf explain` against a forward pass written here in numpy from the SPEC alone:
every weight drawn by SPEC §2's rule (`default_rng([seed, crc32(path)])`), the layers
of §1 and §3 computed here, not by trace-tf. For a sample of cells of every step of
encode and decode, the explanation's recorded value and its recomputed result are
this forward pass's entry, the numbers it substitutes are the right rows, columns
and entries of these arrays, and it names the steps and weights they come from."""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import config_from
from typer.testing import CliRunner

from trace_tf.cli import app
from trace_tf.config import Config
from trace_tf.explain import explain
from trace_tf.runner import run

runner = CliRunner()
Arrays = dict[str, np.ndarray]


class Reference:
    """The forward pass of SPEC §1-§3, every array kept by its step path."""

    def __init__(self, data: dict[str, Any]) -> None:
        m = data["model"]
        self.m = m
        self.seed = m.get("seed", 0)
        self.d = d = m["d_model"]
        self.H = m.get("n_heads", 1)
        self.dk = m.get("d_k", d // self.H)
        self.dv = m.get("d_v", self.dk)
        self.dff = m.get("d_ff", 4 * d)
        self.da = m.get("d_a", self.dk)
        self.score = m.get("score", "scaled_dot")
        self.pre = m.get("norm_position", "post") == "pre"
        self.final = m.get("final_norm", self.pre)
        self.rms = m.get("norm", "layer") == "rms"
        self.eps = m.get("norm_eps", 1e-5)
        self.T = m.get("temperature", 1.0)
        self.scale = m.get("scale", math.sqrt(self.dk) if self.score == "scaled_dot" else 1.0)
        self.pos = m.get("positional", "sinusoidal")
        self.base = m.get("pe_base", 10000)
        self.halves = m.get("rope_pairs", "adjacent") == "halves"
        self.vocab = data["vocab"]
        self.pad = data["tokens"].get("pad")
        self.w: Arrays = {}  # every weight, by its path below `weights`
        self.a: Arrays = {}  # every step
        self.tokens: dict[str, list[str]] = {}
        # each position's token type (model.token_types), by stack; None: every one 0
        self.types = {"encoder": data.get("source_types"), "decoder": data.get("target_types")}
        enc, dec = m.get("encoder_layers", 1), m.get("decoder_layers", 0)
        if enc:
            self.stack("encoder", data["source"], enc)
        if dec:
            self.stack("decoder", data.get("target", [data["tokens"]["bos"]]), dec)
        last = self.a["decoder.output" if dec else "encoder.output"]
        self.a["logits"] = last @ self.draw("output.W", (d, len(self.vocab)))
        self.a["probs"] = self.softmax(self.a["logits"], 1.0)

    def draw(self, path: str, shape: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([self.seed, zlib.crc32(path.encode())])
        self.w[path] = rng.standard_normal(shape) * self.m.get("init_std", 1.0)
        return self.w[path]

    @staticmethod
    def softmax(x: np.ndarray, T: float) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            z = np.exp((x - x.max(axis=-1, keepdims=True)) / T)
            return z / z.sum(axis=-1, keepdims=True)

    def norm(self, p: str, wpath: str, x: np.ndarray) -> np.ndarray:
        gamma, beta = np.ones(self.d), np.zeros(self.d)
        self.w[wpath + ".gamma"], self.w[wpath + ".beta"] = gamma, beta
        if self.rms:
            self.a[p + ".rms"] = np.sqrt((x**2).mean(axis=1, keepdims=True) + self.eps)
            out = x / self.a[p + ".rms"] * gamma + beta
        else:
            mean = self.a[p + ".mean"] = x.mean(axis=1, keepdims=True)
            var = self.a[p + ".var"] = ((x - mean) ** 2).mean(axis=1, keepdims=True)
            out = (x - mean) / np.sqrt(var + self.eps) * gamma + beta
        self.a[p] = out
        return out

    def pair(self, i: int) -> tuple[int, int]:
        """RoPE's pair i: columns (2i, 2i+1), or (i, i + d_k/2) with rope_pairs halves."""
        return (i, i + self.dk // 2) if self.halves else (2 * i, 2 * i + 1)

    def rope(self, x: np.ndarray) -> np.ndarray:
        out = x.copy()
        for i in range(self.dk // 2):
            theta = np.arange(len(x)) * self.base ** (-2 * i / self.dk)
            ca, cb = self.pair(i)
            a, b = x[:, ca], x[:, cb]
            out[:, ca] = a * np.cos(theta) - b * np.sin(theta)
            out[:, cb] = a * np.sin(theta) + b * np.cos(theta)
        return out

    def attention(
        self, p: str, x: np.ndarray, kv: np.ndarray, mask: np.ndarray | None, rope: bool
    ) -> list[np.ndarray]:
        heads = []
        for h in range(self.H):
            a, w = f"{p}.h{h}", f"{p}.heads.{h}"
            q = x @ self.draw(f"{w}.W_q", (self.d, self.dk))
            k = kv @ self.draw(f"{w}.W_k", (self.d, self.dk))
            if rope:  # recorded in this order: q_raw, q, k_raw, k
                self.a[f"{a}.q_raw"], self.a[f"{a}.q"] = q, self.rope(q)
                self.a[f"{a}.k_raw"], self.a[f"{a}.k"] = k, self.rope(k)
                q, k = self.a[f"{a}.q"], self.a[f"{a}.k"]
            self.a[f"{a}.q"], self.a[f"{a}.k"] = q, k
            v = self.a[f"{a}.v"] = kv @ self.draw(f"{w}.W_v", (self.d, self.dv))
            if self.score == "additive":
                qa = self.a[f"{a}.q_a"] = q @ self.draw(f"{w}.W_a_q", (self.dk, self.da))
                ka = self.a[f"{a}.k_a"] = k @ self.draw(f"{w}.W_a_k", (self.dk, self.da))
                t = self.a[f"{a}.tanh"] = np.tanh(qa[:, None, :] + ka[None, :, :])
                s = t @ self.draw(f"{w}.v_a", (self.da,))
            elif self.score == "bilinear":
                qb = self.a[f"{a}.q_b"] = q @ self.draw(f"{w}.W_b", (self.dk, self.dk))
                s = qb @ k.T
            elif self.score == "gaussian":
                wf = self.draw(f"{w}.w", ())
                s = -0.5 * (((q[:, None, :] - k[None, :, :]) * wf) ** 2).sum(axis=2)
            else:
                s = q @ k.T
            self.a[f"{a}.scores"] = s
            s = self.a[f"{a}.scaled"] = s / self.scale
            if mask is not None:
                s = self.a[f"{a}.masked"] = s + mask
            A = self.a[f"{a}.softmax"] = self.softmax(s, self.T)
            heads.append(A @ v)
            self.a[f"{a}.context"] = heads[-1]
        return heads

    def sublayer(self, p: str, x: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        wp = p.replace(".norm", "")
        if self.pre:
            r = self.a[p + ".residual"] = x + fn(self.norm(p + ".norm", wp + ".norm", x))
            return r
        r = self.a[p + ".residual"] = x + fn(x)
        return self.norm(p + ".norm", wp + ".norm", r)

    def block(self, p: str, kv_of: Callable[[np.ndarray], np.ndarray], mask: Any, rope: bool):  # type: ignore[no-untyped-def]
        def fn(x: np.ndarray) -> np.ndarray:
            heads: Any = self.attention(p, x, kv_of(x), mask, rope)
            c = self.a[p + ".concat"] = np.concatenate(heads, axis=1)
            self.a[p + ".wo"] = c @ self.draw(p + ".W_o", (self.H * self.dv, self.d))
            return self.a[p + ".wo"]

        return fn

    def encoded(self, _: np.ndarray) -> np.ndarray:
        """What cross-attention's keys and values read: the encoder's output."""
        return self.a["encoder.output"]

    def ffn(self, p: str) -> Callable[[np.ndarray], np.ndarray]:
        def fn(x: np.ndarray) -> np.ndarray:
            h = self.a[p + ".hidden"] = x @ self.draw(p + ".W_1", (self.d, self.dff))
            act = self.a[p + ".act"] = np.maximum(0, h)
            self.a[p + ".out"] = act @ self.draw(p + ".W_2", (self.dff, self.d))
            return self.a[p + ".out"]

        return fn

    def stack(self, name: str, toks: list[str], layers: int) -> None:
        L = len(toks)
        self.tokens[name] = toks
        emb = {t: self.draw(f"embeddings.{t}", (self.d,)) for t in dict.fromkeys(toks)}
        x = self.a[f"{name}.embed"] = np.array([emb[t] for t in toks])
        if self.m.get("embed_scale") == "sqrt_d_model":  # the paper's × √d_model
            x = x * math.sqrt(self.d)
        if self.pos == "sinusoidal":
            pe = np.zeros((L, self.d))
            for pos in range(L):
                for col in range(self.d):
                    angle = pos / self.base ** (2 * (col // 2) / self.d)
                    pe[pos, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            x = x + pe
            self.a[f"{name}.pe"] = pe
        elif self.pos == "learned":
            table = self.draw("positional", (self.m.get("max_len", 128), self.d))
            self.a[f"{name}.pe"] = table[:L]
            x = x + table[:L]
        if self.m.get("token_types"):  # row type_i of the token-type table
            table = self.draw("token_types", (self.m["token_types"], self.d))
            rows = table[self.types[name] or [0] * L]
            self.a[f"{name}.token_type"] = rows
            x = x + rows
        x = self.a[f"{name}.input"] = x
        pads = np.array([t == self.pad for t in toks])
        full = np.where(pads[None, :], -np.inf, 0.0) * np.ones((L, 1))  # pad keys
        if name == "decoder":  # and causal
            full = full + np.where(np.triu(np.ones((L, L)), 1) > 0, -np.inf, 0.0)
            if self.m.get("window"):  # a sliding window W: key j at distance i − j >= W hidden
                i, j = np.indices((L, L))
                full = full + np.where(i - j >= self.m["window"], -np.inf, 0.0)
        mask = None
        if name == "decoder" or pads.any():
            mask = self.a[f"{name}.mask"] = full
        cross = None
        if name == "decoder" and "encoder.output" in self.a:
            src_pads = np.array([t == self.pad for t in self.tokens["encoder"]])
            if src_pads.any():
                cross = self.a["decoder.cross_mask"] = np.where(src_pads, -np.inf, 0.0) * np.ones(
                    (L, 1)
                )
        for layer in range(layers):
            p = f"{name}.{layer}"
            rope = self.pos == "rope"
            x = self.sublayer(
                f"{p}.self_attn", x, self.block(f"{p}.self_attn", lambda y: y, mask, rope)
            )
            if name == "decoder" and "encoder.output" in self.a:
                x = self.sublayer(
                    f"{p}.cross_attn", x, self.block(f"{p}.cross_attn", self.encoded, cross, False)
                )
            x = self.sublayer(f"{p}.ffn", x, self.ffn(f"{p}.ffn"))
        if self.final:
            x = self.norm(f"{name}.final_norm", f"{name}_final_norm", x)
        self.a[f"{name}.output"] = x


def _case(model: dict[str, Any], src: list[str] | None, tgt: list[str] | None) -> dict[str, Any]:
    data: dict[str, Any] = {"model": {"seed": 7, **model}, "vocab": ["a", "b", "c", "P", "S", "E"],
                            "tokens": {"bos": "S", "eos": "E", "pad": "P"}}  # fmt: skip
    if src is not None:
        data["source"] = src
    if tgt is not None:
        data["target"] = tgt
    return data


CASES = {
    "post_sin_scaled_dot_pads": _case(
        {"d_model": 4, "n_heads": 2, "decoder_layers": 1, "d_ff": 6}, ["a", "P", "b"], ["S", "a", "P"]),
    "pre_rope_dot_temperature_final": _case(
        {"d_model": 6, "n_heads": 3, "decoder_layers": 1, "norm_position": "pre",
         "positional": "rope", "score": "dot", "temperature": 0.5, "d_k": 4},
        ["a", "b", "c", "P"], ["S", "b"]),
    "rms_learned_additive": _case(
        {"d_model": 4, "n_heads": 2, "decoder_layers": 1, "norm": "rms", "positional": "learned",
         "max_len": 6, "score": "additive", "d_a": 3}, ["a", "b"], ["S", "a", "b"]),
    "bilinear_none_encoder_only": _case(
        {"d_model": 4, "n_heads": 2, "encoder_layers": 2, "positional": "none",
         "score": "bilinear", "scale": 2.5}, ["a", "b", "P"], None),
    "gaussian_decoder_only_rope_odd_d_k": _case(
        {"d_model": 6, "n_heads": 2, "d_k": 3, "encoder_layers": 0, "decoder_layers": 2,
         "positional": "rope", "score": "gaussian"}, None, ["S", "a", "P", "b"]),
    "rope_halves_pre_rms_decoder_only": _case(
        {"d_model": 8, "n_heads": 2, "encoder_layers": 0, "decoder_layers": 2,
         "positional": "rope", "rope_pairs": "halves", "norm_position": "pre", "norm": "rms"},
        None, ["S", "a", "b", "c"]),
    "rope_halves_odd_d_k_cross": _case(
        {"d_model": 6, "n_heads": 2, "d_k": 5, "decoder_layers": 1, "positional": "rope",
         "rope_pairs": "halves", "pe_base": 10}, ["a", "b", "P"], ["S", "a", "b"]),
    "pre_no_final_norm_embed_scale": _case(
        {"d_model": 4, "n_heads": 2, "decoder_layers": 2, "encoder_layers": 2,
         "norm_position": "pre", "final_norm": False, "embed_scale": "sqrt_d_model"},
        ["b", "a"], ["S", "c", "a"]),
    "window_decoder_only_pads": _case(
        {"d_model": 4, "n_heads": 2, "encoder_layers": 0, "decoder_layers": 2, "window": 2},
        None, ["S", "a", "b", "P", "c"]),
}  # fmt: skip


def _cfg(data: dict[str, Any]) -> Config:
    cfg = config_from(data)
    assert isinstance(cfg, Config)
    return cfg


def _near(a: float, b: float) -> bool:
    if math.isnan(a) or math.isinf(a):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _rows_of(ref: Reference, path: str) -> list[str]:
    if path.startswith("encoder."):
        return ref.tokens["encoder"]
    if path.startswith("decoder.") or path in ("logits", "probs"):
        return ref.tokens.get("decoder", ref.tokens.get("encoder", []))
    return []


def _expected_operands(ref: Reference, path: str, stage: str, cell: tuple[int, ...],
                       inputs: tuple[str, ...]) -> dict[str, np.ndarray]:  # fmt: skip
    """The numbers an explanation must substitute, by the stage's symbols, from the
    reference arrays; the products by the row of their first input and the column
    of their second."""
    a, i = ref.a, cell[0]
    j = cell[-1]

    def arr(name: str) -> np.ndarray:
        return ref.w[name[len("weights."):]] if name.startswith("weights.") else a[name]  # fmt: skip

    if stage in ("q", "k", "v", "q_raw", "k_raw", "q_a", "k_a", "q_b", "hidden", "out", "wo",
                 "logits") and "rotates" not in stage:  # fmt: skip
        if stage in ("q", "k") and path + "_raw" in a:  # RoPE: the rotation of a pair
            raw = a[path + "_raw"][i]
            if j == ref.dk - 1 and ref.dk % 2:  # odd d_k: the last column is in no pair
                return {f"{stage}_raw[{i},{j}]": raw[j : j + 1]}
            n = next(n for n in range(ref.dk // 2) if j in ref.pair(n))  # the pair of column j
            ca, cb = ref.pair(n)
            theta = i * ref.base ** (-2 * n / ref.dk)
            return {"θ": np.array([theta]), f"{stage}_raw[{i},{ca}]": raw[ca:ca + 1],
                    f"{stage}_raw[{i},{cb}]": raw[cb:cb + 1]}  # fmt: skip
        x, w = arr(inputs[0]), arr(inputs[1])
        return {"row": x[i], "col": w[:, j]}
    if stage == "scores" and ref.score == "additive":
        tag = path.rsplit(".", 1)[0]
        return {"v_a": arr(inputs[1]), f"q_a{i}": a[tag + ".q_a"][i], f"k_a{j}": a[tag + ".k_a"][j]}
    if stage == "scores":
        q, k = arr(inputs[0]), arr(inputs[1])
        return {"row": q[i], "col": k[j]}
    if stage == "context":
        return {"row": a[inputs[0]][i], "col": a[inputs[1]][:, j]}
    if stage == "tanh":
        return {f"q_a[{i},{j}]": a[inputs[0]][i, j:j + 1],
                f"k_a[{cell[1]},{j}]": a[inputs[1]][cell[1], j:j + 1]}  # fmt: skip
    if stage in ("softmax", "probs"):
        row = a[inputs[0]][i]
        return {
            "row": row,
            "m": np.array([row.max()]),
            "T": np.array([ref.T if stage == "softmax" else 1.0]),
        }
    if stage in ("mean", "rms", "var"):
        return {f"x[{i},:]": a[inputs[0]][i]}

    def at(name: str) -> np.ndarray:
        return np.array([a[name][cell]])

    stats = path + (".rms" if ref.rms else ".mean")
    by_stage: dict[
        str, Callable[[], dict[str, np.ndarray]]
    ] = {  # elementwise steps: the one entry of each input, by its symbol
        "scaled": lambda: {"scores": at(inputs[0]), "scale": np.array([ref.scale])},
        "masked": lambda: {"scaled": at(inputs[0]), "M": at(inputs[1])},
        "act": lambda: {"H": at(inputs[0])},
        "residual": lambda: {"x": at(inputs[0]), "sublayer": at(inputs[1])},
        "input": lambda: (
            {"E": at(f"{path.split('.')[0]}.embed")}
            | (
                {"PE": at(f"{path.split('.')[0]}.pe")}
                if ref.pos in ("sinusoidal", "learned")
                else {}
            )
        ),
        "output": lambda: {inputs[0]: at(inputs[0])},
        "norm": lambda: (
            {"x": at(inputs[0]), ("rms" if ref.rms else "mean"): a[stats][i]}
            | ({} if ref.rms else {"var": a[path + ".var"][i]})
        ),
    }
    by_stage["final_norm"] = by_stage["norm"]
    if stage == "pe" and ref.pos == "sinusoidal":  # pos / base^(2i/d) of the pair of column j
        return {"angle": np.array([i / ref.base ** (2 * (j // 2) / ref.d)])}
    if stage == "pe":
        return {"positional": at(path)}
    return by_stage[stage]() if stage in by_stage else {}


def _check_operands(e: Any, want: dict[str, np.ndarray]) -> None:
    ops = {k: np.asarray(v, dtype=float) for k, v in e.operands.items()}
    names = list(ops)
    columns = [k for k in names if "[:," in k]
    for key, value in want.items():
        if key in ("row", "col"):  # x_i · W[:,j], A_i · V[:,j]; or q_i · k_j, in that order
            rows = [k for k in names if "[:," not in k]
            got_key = (rows[0] if key == "row" else columns[0]) if columns else names[key == "col"]
        elif key in ("m", "T"):
            got_key = key
        else:
            got_key = key
        assert got_key in ops, (e.path, key, names)
        got = ops[got_key].ravel()
        if key == "row" and len(want) == 3 and "m" in want:  # softmax: the row is the first
            got = ops[names[0]].ravel()
        np.testing.assert_allclose(got[: value.size], value.ravel(), rtol=1e-12, atol=1e-12,
                                   err_msg=f"{e.path}{list(e.cell)} {key}")  # fmt: skip


def _cells(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The first, the last and a middle cell, and the other corners (above and below
    the diagonal of a square one)."""
    first, last = tuple(0 for _ in shape), tuple(n - 1 for n in shape)
    cells = {first, last, tuple(n // 2 for n in shape), (*first[:-1], last[-1]),
             (last[0], *first[1:])}  # fmt: skip
    return sorted(cells)


@pytest.mark.parametrize("name", CASES)
def test_explanations_agree_with_a_numpy_forward_pass_written_from_the_spec(name: str) -> None:
    data = CASES[name]
    ref = Reference(data)
    cfg = _cfg(data)
    trace = run(cfg)
    assert [s.path for s in trace] == list(ref.a), name  # the same steps, in the same order
    for step in trace:
        want = ref.a[step.path]
        assert step.shape == want.shape, step.path
        for cell in _cells(step.shape):
            e = explain(cfg, trace, step, cell, 4)
            assert e.agrees, (step.path, cell)
            assert _near(float(want[cell]), e.value), (step.path, cell, want[cell], e.value)
            assert _near(float(want[cell]), e.result), (step.path, cell, want[cell], e.result)
            _check_operands(e, _expected_operands(ref, step.path, step.stage, cell, e.inputs))
            # the written left-hand side is the step and the cell asked for
            assert e.lines()[0].startswith(f"{step.path}[{','.join(map(str, cell))}] = ")
            _check_words(ref, step.path, step.stage, cell, e)


def _check_words(ref: Reference, path: str, stage: str, cell: tuple[int, ...], e: Any) -> None:
    """The text names the right inputs, rows, columns and tokens."""
    text = "\n".join([*e.lines(), *e.where])
    i, j = cell[0], cell[-1]
    rows = _rows_of(ref, path)
    block = path.rsplit(".", 1)[0]  # the head, for a head's step
    if stage in ("q", "k", "v", "q_raw", "k_raw") and not any(
        "_raw" in k or k == "θ" for k in e.operands
    ):
        layer_block, head = path.rsplit(".", 2)[0], path.rsplit(".", 2)[1]
        sub = "W_q" if stage.startswith("q") else "W_k" if stage.startswith("k") else "W_v"
        wname = f"weights.{layer_block}.heads.{head[1:]}.{sub}"
        assert f"column {j} of {wname}" in text, text
        source = e.inputs[0]
        if ".cross_attn." in path and stage != "q":
            assert source == "encoder.output", (path, source)
            tok = ref.tokens["encoder"][i]
        else:
            tok = rows[i]
        assert f"row {i} ({tok!r}) of {source}" in text, text
    if stage == "scores" and ref.score in ("scaled_dot", "dot", "gaussian"):
        assert e.inputs[:2] == (f"{block}.q", f"{block}.k"), e.inputs
        assert f"q{i}" in e.lines()[0] and f"k{j}" in e.lines()[0], e.lines()
    if stage == "context":
        assert e.inputs == (f"{block}.softmax", f"{block}.v"), e.inputs
        assert f"A{i} · V[:,{j}]" in text, text
        assert f"A{i} = row {i} ({rows[i]!r}) of {block}.softmax" in text, text
        assert f"V[:,{j}] = column {j} of {block}.v" in text, text
    keys = ref.tokens["encoder"] if ".cross_attn." in path else rows
    if stage == "scores" and ref.score == "additive":
        assert f"q_a{i} = row {i} ({rows[i]!r}) of {block}.q_a" in text, text
        assert f"k_a{j} = row {j} ({keys[j]!r}) of {block}.k_a" in text, text
    elif stage in ("scores", "softmax", "hidden", "out", "wo", "logits", "q_a", "q_b"):
        assert f"row {i} ({rows[i]!r}) of {e.inputs[0]}" in text, text
    if stage == "scores" and ref.score != "additive":
        assert f"k{j} = row {j} ({keys[j]!r}) of {block}.k" in text, text
    if stage == "concat":
        head, col = divmod(j, ref.dv)
        assert f"head {head}'s context[{i},{col}]" in text, text
        assert f"{path.rsplit('.', 1)[0]}.h{head}.context" in text
    if stage == "mask" or stage == "cross_mask":
        keys = ref.tokens["encoder" if stage == "cross_mask" else path.split(".")[0]]
        if keys[j] == ref.pad:
            assert f"key {j} is the pad token {ref.pad!r}" in text, text
        elif path.startswith("decoder.mask") and j > i:
            assert "causal" in text or "j > i" in text or "future" in text, text
        elif path.startswith("decoder.mask") and i - j >= ref.m.get("window", i + 1):
            assert f"not within its window of {ref.m['window']}" in text, text
    if stage == "embed":
        assert f"embedding[{rows[i]!r}]" in text, text
    if stage == "residual":
        want_x = _sublayer_input(ref, path)
        assert e.inputs[0] == want_x, (path, e.inputs, want_x)


def _sublayer_input(ref: Reference, path: str) -> str:
    """The step a sublayer reads x from, by the order of the stack."""
    stack, layer, sub = path.split(".")[:3]
    order = ["self_attn", "cross_attn", "ffn"] if f"{stack}.{layer}.cross_attn.wo" in ref.a \
        else ["self_attn", "ffn"]  # fmt: skip
    k = order.index(sub)
    if k == 0:
        if layer == "0":
            return f"{stack}.input"
        prev = f"{stack}.{int(layer) - 1}.ffn"
    else:
        prev = f"{stack}.{layer}.{order[k - 1]}"
    return f"{prev}.residual" if ref.pre else f"{prev}.norm"


def test_explain_command_names_the_cell_and_its_numbers_as_numpy_gives_them() -> None:
    data = CASES["post_sin_scaled_dot_pads"]
    ref = Reference(data)
    result = runner.invoke(app, ["explain", "decoder.0.cross_attn.h1.scores", "-", "--cell", "2,0",
                                 "--format", "json"], input=json.dumps(data))  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    q = ref.a["decoder.0.cross_attn.h1.q"][2]
    k = ref.a["decoder.0.cross_attn.h1.k"][0]
    assert out["cell"] == [2, 0] and math.isclose(out["value"], float(q @ k), rel_tol=1e-12)
    assert out["operands"] == {"q2": pytest.approx(list(q)), "k0": pytest.approx(list(k))}
    assert out["inputs"] == ["decoder.0.cross_attn.h1.q", "decoder.0.cross_attn.h1.k"]
    assert re.search(r"k0 = row 0 \('a'\) of decoder\.0\.cross_attn\.h1\.k", out["where"][1])
