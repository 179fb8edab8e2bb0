"""Every step of `encode`/`decode --format json`, and `generate`, against a second reference.

The reference below was written from SPEC.md sections 1-3 (and 000's RoPE) alone, without
reading trace_tf/ or tests/reference_torch.py, so that it does not share their reading of
the conventions. It covers what tests/test_engine_reference.py does not: weights drawn
by SPEC's formula (each from `default_rng([seed, crc32(path)])`), RoPE (with odd d_k and
any `pe_base`), every score function of `model.score`, `model.temperature`, `norm_eps`,
numeric `embed_scale`, numeric source and target matrices, an encoder-only model's
logits, and pads anywhere in source and target. Where SPEC is silent, the reference
follows README: RoPE rotates pairs (2i, 2i+1) of q and k by pos * pe_base^(-2i/d_k) in
self-attention only; the relative position bias adds B[i, j] = b[max_len - 1 + j - i]
to each self-attention head's scaled scores (test_relative_bias_with_...: with every
score function, model.temperature, drawn and fused tables, and generate's KV cache).
"""

from __future__ import annotations

import json
import math
import random
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from trace_tf.cli import app

T = torch.Tensor
F64 = torch.float64
POSITIONAL = ["sinusoidal", "learned", "rope", "none"]
SCORES = ["scaled_dot", "dot", "additive", "bilinear", "gaussian"]
KINDS = ["encoder-decoder", "decoder-only", "encoder-only"]
ACTIVATIONS = ["relu", "gelu", "gelu_tanh"]


def tensor(x: Any) -> T:
    return torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=F64)


class Reference:
    """The forward pass of SPEC sections 1-3, recording every step under its path."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        m = cfg["model"]
        self.D = m["d_model"]
        self.H = m.get("n_heads", 1)
        self.dk = m.get("d_k", self.D // self.H)
        self.dv = m.get("d_v", self.dk)
        self.dff = m.get("d_ff", 4 * self.D)
        self.n_enc = m.get("encoder_layers", 1)
        self.n_dec = m.get("decoder_layers", 0)
        self.positional = m.get("positional", "sinusoidal")
        self.base = m.get("pe_base", 10000)
        self.max_len = m.get("max_len", 128)
        es = m.get("embed_scale", 1)
        self.embed_scale = math.sqrt(self.D) if es == "sqrt_d_model" else float(es)
        self.pre = m.get("norm_position", "post") == "pre"
        self.final_norm = m.get("final_norm", self.pre)
        self.rms = m.get("norm", "layer") == "rms"
        self.eps = m.get("norm_eps", 1e-5)
        self.act = m.get("activation", "relu")
        self.score = m.get("score", "scaled_dot")
        scale = m.get("scale", "sqrt_dk" if self.score == "scaled_dot" else 1)
        self.scale = math.sqrt(self.dk) if scale == "sqrt_dk" else float(scale)
        self.temperature = float(m.get("temperature", 1))
        self.d_a = m.get("d_a", self.dk)
        self.seed = m.get("seed", 0)
        self.std = m.get("init_std", 1.0)
        self.vocab = [str(v) for v in cfg["vocab"]]
        self.pad = cfg["tokens"].get("pad")
        self.steps: dict[str, T] = {}

    # weights: given, else drawn (matrices), zero (biases, beta) or one (gamma)
    def draw(self, path: str, shape: tuple[int, ...]) -> T:
        rng = np.random.default_rng([self.seed, zlib.crc32(path.encode())])
        return tensor(rng.standard_normal(shape) * self.std)

    def given(self, keys: list[Any]) -> Any:
        node: Any = self.cfg.get("weights", {})
        for k in keys:
            in_list = isinstance(node, list) and isinstance(k, int) and k < len(node)
            if not (in_list or (isinstance(node, dict) and k in node)):
                return None
            node = node[k]
        return node

    def param(self, keys: list[Any], shape: tuple[int, ...], default: str = "draw") -> T:
        v = self.given(keys)
        if v is not None:
            return tensor(v).reshape(shape)
        if default == "draw":
            return self.draw(".".join(map(str, keys)), shape)
        return (torch.ones if default == "ones" else torch.zeros)(shape, dtype=F64)

    def head_param(self, keys: list[Any], h: int, name: str, width: int, bias: bool) -> T:
        fused = self.given([*keys, name])
        if fused is not None:
            return tensor(fused)[..., h * width : (h + 1) * width]
        shape = (width,) if bias else (self.D, width)
        return self.param([*keys, "heads", h, name], shape, "zeros" if bias else "draw")

    def embedding(self, token: str) -> T:
        given = self.cfg.get("embeddings", {})
        return (
            tensor(given[token]) if token in given else self.draw(f"embeddings.{token}", (self.D,))
        )

    # operations
    def rec(self, path: str, value: T) -> T:
        assert path not in self.steps, path
        self.steps[path] = value
        return value

    @staticmethod
    def softmax(x: T, temperature: float = 1.0) -> T:
        e = torch.exp((x - x.max(dim=-1, keepdim=True).values) / temperature)
        return e / e.sum(dim=-1, keepdim=True)

    def norm(self, path: str, x: T, keys: list[Any]) -> T:
        gamma = self.param([*keys, "gamma"], (self.D,), "ones")
        beta = self.param([*keys, "beta"], (self.D,), "zeros")
        if self.rms:
            rms = self.rec(path + ".rms", torch.sqrt((x**2).mean(-1, keepdim=True) + self.eps))
            return self.rec(path, x / rms * gamma + beta)
        mean = self.rec(path + ".mean", x.mean(-1, keepdim=True))
        var = self.rec(path + ".var", ((x - mean) ** 2).mean(-1, keepdim=True))
        return self.rec(path, (x - mean) / torch.sqrt(var + self.eps) * gamma + beta)

    def activation(self, x: T) -> T:
        if self.act == "relu":
            return torch.clamp(x, min=0.0)
        if self.act == "gelu":
            return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))

    def sinusoidal(self, L: int) -> T:
        pe = torch.zeros(L, self.D, dtype=F64)
        for pos in range(L):
            for c in range(self.D):
                angle = pos / self.base ** (2 * (c // 2) / self.D)
                pe[pos, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
        return pe

    def rope(self, x: T) -> T:
        """000: phi(x, pos) = x R_pos, R_pos,i = [[cos, sin], [-sin, cos]] on (x_2i, x_2i+1)."""
        out = x.clone()
        d = x.shape[1]
        for pos in range(x.shape[0]):
            for i in range(d // 2):
                th = pos * self.base ** (-2 * i / d)
                a, b = x[pos, 2 * i], x[pos, 2 * i + 1]
                out[pos, 2 * i] = a * math.cos(th) - b * math.sin(th)
                out[pos, 2 * i + 1] = a * math.sin(th) + b * math.cos(th)
        return out

    def scores(self, keys: list[Any], hp: str, h: int, q: T, k: T) -> T:
        def w(name: str, shape: tuple[int, ...]) -> T:
            return self.param([*keys, "heads", h, name], shape)

        if self.score in ("scaled_dot", "dot"):
            return q @ k.T
        if self.score == "bilinear":
            return self.rec(hp + ".q_b", q @ w("W_b", (self.dk, self.dk))) @ k.T
        if self.score == "additive":
            qa = self.rec(hp + ".q_a", q @ w("W_a_q", (self.dk, self.d_a)))
            ka = self.rec(hp + ".k_a", k @ w("W_a_k", (self.dk, self.d_a)))
            th = self.rec(hp + ".tanh", torch.tanh(qa[:, None, :] + ka[None, :, :]))
            return th @ w("v_a", (self.d_a,))
        given = self.given([*keys, "heads", h, "w"])  # gaussian: a number or one per feature
        ws = (
            tensor(given)
            if given is not None
            else self.draw(".".join(map(str, keys)) + f".heads.{h}.w", ())
        )
        return -0.5 * (((q[:, None, :] - k[None, :, :]) * ws) ** 2).sum(-1)

    def rel_bias(self, keys: list[Any], hp: str, h: int, n_q: int, n_k: int) -> T:
        """000 section 6.2 as README states it: B[i, j] = b[max_len - 1 + (j - i)], one
        table of 2 max_len - 1 per self-attention head (fused: row h of the block's)."""
        fused = self.given([*keys, "rel_bias"])
        n = 2 * self.max_len - 1
        table = (
            tensor(fused)[h]
            if fused is not None
            else self.param([*keys, "heads", h, "rel_bias"], (n,))
        )
        B = torch.tensor(
            [[table[self.max_len - 1 + j - i] for j in range(n_k)] for i in range(n_q)]
        )
        return self.rec(hp + ".rel_bias", B.to(F64))

    def attention(self, keys: list[Any], xq: T, xkv: T, mask: T | None) -> T:
        p = ".".join(map(str, keys))
        contexts = []
        for h in range(self.H):
            hp = f"{p}.h{h}"
            q = xq @ self.head_param(keys, h, "W_q", self.dk, False)
            q = q + self.head_param(keys, h, "b_q", self.dk, True)
            k = xkv @ self.head_param(keys, h, "W_k", self.dk, False)
            k = k + self.head_param(keys, h, "b_k", self.dk, True)
            v = xkv @ self.head_param(keys, h, "W_v", self.dv, False)
            v = v + self.head_param(keys, h, "b_v", self.dv, True)
            if self.positional == "rope" and keys[2] == "self_attn":
                q = self.rope(self.rec(hp + ".q_raw", q))
                k = self.rope(self.rec(hp + ".k_raw", k))
            self.rec(hp + ".q", q)
            self.rec(hp + ".k", k)
            self.rec(hp + ".v", v)
            s = self.rec(hp + ".scores", self.scores(keys, hp, h, q, k))
            s = self.rec(hp + ".scaled", s / self.scale)
            if self.positional == "relative" and keys[2] == "self_attn":
                s = self.rec(hp + ".biased", s + self.rel_bias(keys, hp, h, *s.shape))
            if mask is not None:
                s = self.rec(hp + ".masked", s + mask)
            a = self.rec(hp + ".softmax", self.softmax(s, self.temperature))
            contexts.append(self.rec(hp + ".context", a @ v))
        concat = self.rec(p + ".concat", torch.cat(contexts, dim=1))
        W_o = self.param([*keys, "W_o"], (self.H * self.dv, self.D))
        return self.rec(p + ".wo", concat @ W_o + self.param([*keys, "b_o"], (self.D,), "zeros"))

    def attention_sublayer(self, keys: list[Any], x: T, memory: T | None, mask: T | None) -> T:
        p = ".".join(map(str, keys))
        if self.pre:
            n = self.norm(p + ".norm", x, [*keys, "norm"])
            wo = self.attention(keys, n, n if memory is None else memory, mask)
            return self.rec(p + ".residual", x + wo)
        wo = self.attention(keys, x, x if memory is None else memory, mask)
        return self.norm(p + ".norm", self.rec(p + ".residual", x + wo), [*keys, "norm"])

    def ffn_sublayer(self, keys: list[Any], x: T) -> T:
        p = ".".join(map(str, keys))

        def ffn(x_in: T) -> T:
            W_1 = self.param([*keys, "W_1"], (self.D, self.dff))
            hidden = self.rec(
                p + ".hidden", x_in @ W_1 + self.param([*keys, "b_1"], (self.dff,), "zeros")
            )
            act = self.rec(p + ".act", self.activation(hidden))
            W_2 = self.param([*keys, "W_2"], (self.dff, self.D))
            return self.rec(p + ".out", act @ W_2 + self.param([*keys, "b_2"], (self.D,), "zeros"))

        if self.pre:
            return self.rec(p + ".residual", x + ffn(self.norm(p + ".norm", x, [*keys, "norm"])))
        return self.norm(p + ".norm", self.rec(p + ".residual", x + ffn(x)), [*keys, "norm"])

    # stacks
    def sequence(self, seq: Any) -> tuple[T, list[str] | None]:
        if isinstance(seq, str):
            seq = seq.split()
        if isinstance(seq[0], list):
            return tensor(seq), None
        return torch.stack([self.embedding(str(x)) for x in seq]), [str(x) for x in seq]

    def pad_columns(self, tokens: list[str] | None, n_rows: int) -> T | None:
        if tokens is None or self.pad is None or self.pad not in tokens:
            return None
        row = torch.tensor([-math.inf if x == self.pad else 0.0 for x in tokens], dtype=F64)
        return row[None, :].expand(n_rows, -1).clone()

    def stack(
        self, name: str, seq: Any, memory: T | None = None, src: list[str] | None = None
    ) -> T:
        emb, tokens = self.sequence(seq)
        x = self.rec(f"{name}.embed", emb) * self.embed_scale
        L = x.shape[0]
        if self.positional == "sinusoidal":
            x = x + self.rec(f"{name}.pe", self.sinusoidal(L))
        elif self.positional == "learned":
            x = x + self.rec(f"{name}.pe", self.param(["positional"], (self.max_len, self.D))[:L])
        x = self.rec(f"{name}.input", x)
        mask = self.pad_columns(tokens, L)
        if name == "decoder":
            causal = torch.triu(torch.full((L, L), -math.inf, dtype=F64), diagonal=1)
            mask = causal if mask is None else causal + mask
        if mask is not None:
            self.rec(f"{name}.mask", mask)
        cross_mask = self.pad_columns(src, L) if memory is not None else None
        if cross_mask is not None:
            self.rec("decoder.cross_mask", cross_mask)
        for layer in range(self.n_enc if name == "encoder" else self.n_dec):
            x = self.attention_sublayer([name, layer, "self_attn"], x, None, mask)
            if memory is not None:
                x = self.attention_sublayer([name, layer, "cross_attn"], x, memory, cross_mask)
            x = self.ffn_sublayer([name, layer, "ffn"], x)
        if self.final_norm:
            x = self.norm(f"{name}.final_norm", x, [f"{name}_final_norm"])
        return self.rec(f"{name}.output", x)

    def head(self, out: T) -> None:
        if self.cfg["model"].get("tie_embeddings"):
            W = torch.stack([self.embedding(v) for v in self.vocab]).T
        else:
            W = self.param(["output", "W"], (self.D, len(self.vocab)))
        logits = self.rec(
            "logits", out @ W + self.param(["output", "b"], (len(self.vocab),), "zeros")
        )
        self.rec("probs", self.softmax(logits))

    def encode(self) -> T:
        return self.stack("encoder", self.cfg["source"])

    def decode(self, target: list[str] | None = None) -> None:
        if target is None:
            target = self.cfg.get("target") or [self.cfg["tokens"]["bos"]]
        memory, src = None, None
        if self.n_enc:
            memory = self.encode()
            src = self.sequence(self.cfg["source"])[1]
        self.head(self.stack("decoder", target, memory, src))


# random configs: every option of SPEC section 2 (and model.score/temperature)


def random_config(i: int) -> dict[str, Any]:
    r = random.Random(i)

    def mat(a: int, b: int) -> list[list[float]]:
        return [[round(r.gauss(0, 1), 3) for _ in range(b)] for _ in range(a)]

    def vec(a: int) -> list[float]:
        return [round(r.gauss(0, 1), 3) for _ in range(a)]

    def maybe(p: float) -> bool:
        return r.random() < p

    D, H = r.randint(1, 6), r.randint(1, 3)
    m: dict[str, Any] = {"d_model": D, "n_heads": H}
    if D % H or maybe(0.4):
        m["d_k"] = r.randint(1, 4)
    if maybe(0.4):
        m["d_v"] = r.randint(1, 4)
    dk, score = m.get("d_k", D // H), SCORES[i % 5]
    dv = m.get("d_v", dk)
    if maybe(0.5):
        m["d_ff"] = r.randint(1, 7)
    dff, kind = m.get("d_ff", 4 * D), KINDS[i % 3]
    ne = 0 if kind == "decoder-only" else r.randint(1, 2)
    nd = 0 if kind == "encoder-only" else r.randint(1, 2)
    m |= {"encoder_layers": ne, "decoder_layers": nd, "positional": POSITIONAL[i % 4]}
    m["activation"], m["score"] = ACTIVATIONS[(i // 3) % 3], score
    for key, p, values in [
        ("pe_base", 0.5, [100, 7.5, 2]),
        ("max_len", 0.3, [9]),
        ("embed_scale", 0.6, [2.5, "sqrt_d_model", 0.5]),
        ("norm_position", 0.6, ["pre", "post"]),
        ("final_norm", 0.4, [True, False]),
        ("norm", 0.6, ["rms", "layer"]),
        ("norm_eps", 0.5, [1e-3, 0.1]),
        ("scale", 0.3, [30, 0.7, "sqrt_dk"]),
        ("temperature", 0.4, [0.5, 2.0]),
        ("d_a", 0.4 if score == "additive" else 0.0, [1, 3]),
        ("seed", 0.6, [7, 123, 2**40]),
        ("init_std", 0.5, [0.5, 0.3, 30.0]),
        ("tie_embeddings", 0.3, [True]),
    ]:
        if maybe(p):
            m[key] = r.choice(values)
    pre = m.get("norm_position") == "pre"
    vocab = ["a", "b", "c", "d", "SOS", "EOS", "PAD"]
    r.shuffle(vocab)
    pad = maybe(0.7)
    cfg: dict[str, Any] = {"model": m, "vocab": vocab}
    cfg["tokens"] = {"bos": "SOS", "eos": "EOS", "pad": "PAD" if pad else None}
    cfg["embeddings"] = {v: vec(D) for v in vocab if maybe(0.3)}
    words = ["a", "b", "c", "d", "SOS", "EOS"] + (["PAD"] * 2 if pad else [])
    if ne:
        src = [r.choice(words) for _ in range(r.randint(1, 6))]
        src[-1] = "a" if src.count("PAD") == len(src) else src[-1]
        form = r.random()
        cfg["source"] = mat(len(src), D) if form < 0.15 else " ".join(src) if form < 0.3 else src
    if nd and maybe(0.85):
        tgt = ["SOS"] + [r.choice(words) for _ in range(r.randint(0, 4))]
        cfg["target"] = mat(len(tgt), D) if maybe(0.15) else tgt

    def attention_block() -> dict[str, Any]:
        b: dict[str, Any] = {}
        if maybe(0.4):
            b |= {"W_q": mat(D, H * dk), "W_k": mat(D, H * dk), "W_v": mat(D, H * dv)}
            b |= {"b_q": vec(H * dk), "b_v": vec(H * dv)} if maybe(0.5) else {}
        elif maybe(0.6):
            b["heads"] = [
                {k: v for k, v in
                 [("W_q", mat(D, dk)), ("W_k", mat(D, dk)), ("W_v", mat(D, dv)),
                  ("b_q", vec(dk)), ("b_k", vec(dk)), ("b_v", vec(dv))] if maybe(0.5)}
                for _ in range(H)
            ]  # fmt: skip
        if maybe(0.5) and score in ("bilinear", "additive", "gaussian"):
            extra = {
                "bilinear": lambda: {"W_b": mat(dk, dk)},
                "additive": lambda: {
                    "W_a_q": mat(dk, m.get("d_a", dk)),
                    "v_a": vec(m.get("d_a", dk)),
                },
                "gaussian": lambda: {"w": r.choice([round(r.gauss(0, 1), 3), vec(dk)])},
            }[score]
            heads = b.setdefault("heads", [{} for _ in range(H)])
            for head in heads:
                head |= extra()
        b |= {"W_o": mat(H * dv, D)} if maybe(0.5) else {}
        b |= {"b_o": vec(D)} if maybe(0.4) else {}
        b |= {"norm": {"gamma": vec(D), "beta": vec(D)}} if maybe(0.4) else {}
        return b

    def ffn_block() -> dict[str, Any]:
        f = {
            k: v
            for k, v in [
                ("W_1", mat(D, dff)),
                ("b_1", vec(dff)),
                ("W_2", mat(dff, D)),
                ("b_2", vec(D)),
            ]
            if maybe(0.5)
        }
        return f | ({"norm": {"beta": vec(D)}} if maybe(0.4) else {})

    w: dict[str, Any] = {}
    if ne and maybe(0.7):
        w["encoder"] = [
            {"self_attn": attention_block(), "ffn": ffn_block()} for _ in range(r.randint(1, ne))
        ]
    if nd and maybe(0.7):
        w["decoder"] = [
            {"self_attn": attention_block(), "ffn": ffn_block()}
            | ({"cross_attn": attention_block()} if ne else {})
            for _ in range(r.randint(1, nd))
        ]
    if m.get("final_norm", pre) and maybe(0.5):
        w |= {
            f"{s}_final_norm": {"gamma": vec(D), "beta": vec(D)}
            for s, n in [("encoder", ne), ("decoder", nd)]
            if n
        }
    if m["positional"] == "learned" and maybe(0.4):
        w["positional"] = mat(m.get("max_len", 128), D)
    output = {k: v for k, v in [("W", mat(D, len(vocab))), ("b", vec(len(vocab)))] if maybe(0.4)}
    if m.get("tie_embeddings"):
        output.pop("W", None)
    w |= {"output": output} if output else {}
    cfg["weights"] = w
    return cfg


CONFIGS = [random_config(i) for i in range(30)]


def test_the_configs_cover_every_option() -> None:
    seen = {(k, str(v)) for c in CONFIGS for k, v in c["model"].items()}
    for key, values in [
        ("positional", POSITIONAL), ("score", SCORES), ("activation", ACTIVATIONS),
        ("norm", ["rms", "layer"]), ("norm_position", ["pre", "post"]), ("final_norm", [True, False]),
        ("embed_scale", [2.5, "sqrt_d_model"]), ("tie_embeddings", [True]), ("encoder_layers", [0, 2]),
        ("decoder_layers", [0, 2]),
    ]:  # fmt: skip
        for v in values:
            assert (key, str(v)) in seen, (key, v)
    for key in [
        "pe_base",
        "max_len",
        "norm_eps",
        "scale",
        "temperature",
        "d_a",
        "seed",
        "init_std",
        "d_v",
    ]:
        assert any(k == key for k, _ in seen), key
    assert any(isinstance(c.get("source"), str) for c in CONFIGS)
    assert any(isinstance(c.get("source", [""])[0], list) for c in CONFIGS)
    assert any(isinstance(c.get("target", [""])[0], list) for c in CONFIGS)


runner = CliRunner()


def run_json(tmp_path: Path, cfg: dict[str, Any], *args: str) -> dict[str, Any]:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    result = runner.invoke(app, [args[0], str(path), *args[1:], "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def number(x: Any) -> Any:
    return [number(y) for y in x] if isinstance(x, list) else float(x)


def assert_steps_equal(steps: list[dict[str, Any]], expected: dict[str, T]) -> None:
    got = {s["path"]: np.asarray(number(s["value"]), dtype=np.float64) for s in steps}
    assert list(got) == [p for p in got if p in expected], set(got) - set(expected)
    assert set(expected) <= set(got), set(expected) - set(got)
    for path, value in expected.items():
        want = value.numpy()
        scale = max(1.0, float(np.abs(want[np.isfinite(want)]).max(initial=0.0)))
        np.testing.assert_allclose(got[path], want, rtol=1e-10, atol=1e-10 * scale, err_msg=path)


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_every_step_matches_the_spec_reference(i: int, tmp_path: Path) -> None:
    cfg = CONFIGS[i]
    if cfg["model"]["encoder_layers"]:
        ref = Reference(cfg)
        out = ref.encode()
        if not cfg["model"]["decoder_layers"]:
            ref.head(out)  # an encoder-only model's last stack is the encoder
        assert_steps_equal(run_json(tmp_path, cfg, "encode")["steps"], ref.steps)
    if cfg["model"]["decoder_layers"]:
        ref = Reference(cfg)
        ref.decode()
        assert_steps_equal(run_json(tmp_path, cfg, "decode")["steps"], ref.steps)


def sampling_distribution(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float
) -> np.ndarray:
    """SPEC section 4: temperature; top-k; top-p on what top-k left (not renormalised); renormalise."""
    z = np.exp((logits - logits.max()) / temperature)
    p = z / z.sum()
    order = np.argsort(-p, kind="stable")  # ties: the earlier vocabulary entry
    kept, total = [], 0.0
    for j in order[:top_k]:
        kept.append(j)
        total += p[j]
        if total >= top_p:
            break
    q = np.zeros_like(p)
    q[kept] = p[kept]
    return q / q.sum()


@pytest.mark.parametrize(
    "i", [i for i, c in enumerate(CONFIGS) if c["model"]["decoder_layers"]][:8]
)
@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_generation_matches_the_spec_reference(i: int, mode: str, tmp_path: Path) -> None:
    cfg = CONFIGS[i]
    if isinstance(cfg.get("target", [""])[0], list):
        cfg = {k: v for k, v in cfg.items() if k != "target"}
    check_generation(cfg, i, mode, tmp_path)


def check_generation(cfg: dict[str, Any], i: int, mode: str, tmp_path: Path) -> None:
    """`generate` (KV cache on) against the reference's `decode` of each whole prefix."""
    options = ["--max-tokens", "3"]
    temperature, top_k, top_p = [0.7, 1.5][i % 2], 2 + i % 4, [0.6, 0.9][i % 2]
    if mode == "sample":
        options += ["--temperature", str(temperature), "--top-k", str(top_k), "--top-p", str(top_p)]
        options += ["--seed", str(i)]
    got = run_json(tmp_path, cfg, "generate", f"--{mode}", *options)
    rng = np.random.default_rng(i)
    vocab, prefix = [str(v) for v in cfg["vocab"]], list(cfg.get("target") or ["SOS"])
    for it in got["iterations"]:
        ref = Reference(cfg)
        ref.decode(prefix)
        assert it["prefix"] == prefix
        if mode == "greedy":
            p = ref.steps["probs"][-1].numpy()
            choice = int(np.flatnonzero(p == p.max())[0])
        else:
            p = sampling_distribution(ref.steps["logits"][-1].numpy(), temperature, top_k, top_p)
            choice = int(rng.choice(len(vocab), p=p))
        np.testing.assert_allclose([it["probs"][v] for v in vocab], p, rtol=1e-10, atol=1e-14)
        assert it["next"] == vocab[choice]
        prefix.append(vocab[choice])
    assert got["generated"] == prefix[len(prefix) - len(got["iterations"]) :]


# Relative position bias (000 section 6.2) with the options test_engine_reference.py's
# relative shapes leave at their defaults: every score function, model.temperature, drawn
# tables (SPEC's rule, per head), fused tables, pads, and generate's KV cache, whose new
# row must take the last row of B.
RELATIVE = [
    {"score": "additive", "d_a": 3, "temperature": 0.5, "norm_position": "pre", "norm": "rms"},
    {"encoder_layers": 0, "score": "gaussian", "temperature": 2.0, "n_heads": 3, "d_k": 3},
    {"decoder_layers": 0, "score": "bilinear", "scale": 0.7, "activation": "gelu_tanh"},
    {"score": "dot", "decoder_layers": 2, "tie_embeddings": True, "embed_scale": "sqrt_d_model"},
    {"encoder_layers": 0, "decoder_layers": 2, "temperature": 0.5, "seed": 5, "fused": True},
]


@pytest.mark.parametrize(
    "options", RELATIVE, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
)
def test_relative_bias_with_scores_temperature_and_the_cache(
    options: dict[str, Any], tmp_path: Path
) -> None:
    options = dict(options)
    fused = options.pop("fused", False)
    m = {"d_model": 6, "n_heads": 2, "decoder_layers": 1, "positional": "relative", "max_len": 9}
    m |= options
    cfg: dict[str, Any] = {"model": m, "vocab": ["a", "b", "PAD", "SOS", "EOS"]}
    cfg["tokens"] = {"bos": "SOS", "eos": "EOS", "pad": "PAD"}
    if m.get("encoder_layers", 1):
        cfg["source"] = ["a", "PAD", "b", "b"]
    if m["decoder_layers"]:
        cfg["target"] = ["SOS", "b", "PAD", "a"]
    if fused:  # row h of a block's table is head h's; the other block's tables are drawn
        table = (np.arange(34.0).reshape(2, 17) % 7 - 3).tolist()
        cfg["weights"] = {"decoder": [{"self_attn": {"rel_bias": table}}]}
    commands = [
        c for c, n in [("encode", "encoder_layers"), ("decode", "decoder_layers")] if m.get(n, 1)
    ]
    for command in commands:
        ref = Reference(cfg)
        if command == "decode":
            ref.decode()
        elif not m["decoder_layers"]:  # an encoder-only model's last stack is the encoder
            ref.head(ref.encode())
        else:
            ref.encode()
        assert any(p.endswith(".rel_bias") for p in ref.steps)
        assert_steps_equal(run_json(tmp_path, cfg, command)["steps"], ref.steps)
    if m["decoder_layers"]:
        check_generation(cfg, 0, "greedy", tmp_path)
