"""Random trace-tf configs (SPEC section 2) with every array given explicitly.

`random_config` builds a small model of any shape SPEC allows, so the engine
and tests/reference_torch.py can be run on the same file and compared.
Weights are scaled by 1/sqrt(fan_in) so activations stay of order one and
the softmaxes are not saturated; gamma and beta are random too, so the norm
parameters are exercised. All values are plain Python lists (YAML and JSON
serialisable). `to_per_head` turns fused attention weights into the per-head
form.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

# The SPEC section 2 defaults: keys equal to these are left out of `model`, so
# the generated files also exercise the defaults of whatever reads them.
DEFAULTS: dict[str, Any] = {
    "positional": "sinusoidal",
    "rope_pairs": "adjacent",
    "norm_position": "post",
    "norm": "layer",
    "activation": "relu",
    "embed_scale": 1,
    "tie_embeddings": False,
    "embed_norm": False,
    "parallel": "none",
}
WORDS = [f"t{i}" for i in range(6)]
BOS, EOS, PAD = "t0", "t1", "PAD"


# LLaMA's conventions: pre-norm RMSNorm, RoPE by halves (Hugging Face's rotate_half), SwiGLU
LLAMA: dict[str, Any] = dict(
    norm_position="pre", norm="rms", positional="rope", rope_pairs="halves", activation="swiglu"
)


def random_config(
    rng: np.random.Generator,
    *,
    d_model: int,
    n_heads: int,
    n_kv_heads: int | None = None,
    d_k: int | None = None,
    d_v: int | None = None,
    d_ff: int | None = None,
    encoder_layers: int = 1,
    decoder_layers: int = 0,
    norm_position: str = "post",
    norm: str = "layer",
    activation: str = "relu",
    positional: str = "sinusoidal",
    rope_pairs: str = "adjacent",
    biases: bool = True,
    fused: bool = False,
    src_len: int = 3,
    tgt_len: int = 2,
    pad: bool = False,
    tie_embeddings: bool = False,
    embed_scale: float | str = 1,
    final_norm: bool | None = None,
    embed_norm: bool = False,
    scale: float | str | None = None,
    max_len: int | None = None,
    window: int | list[int | None] | None = None,
    token_types: int = 0,
    pe_base: float | list[float | None] | None = None,
    rope_scaling: dict[str, Any] | list[dict[str, Any] | None] | None = None,
    rope_dims: int | None = None,
    parallel: str = "none",
    qk_norm: str = "none",
    attn_softcap: float | None = None,
    logit_softcap: float | None = None,
    logit_scale: float | None = None,
    attn_sinks: bool = False,
    experts: int | list[int | None] | None = None,
    experts_top_k: int | None = None,
    experts_normalize: bool | None = None,
    router_bias: bool = False,
    shared_expert: str | None = None,
    shared_expert_d_ff: int | None = None,
    swiglu_limit: float | None = None,
) -> dict[str, Any]:
    """A config for the model described by the arguments, every array drawn from `rng`.

    `src_len` and `tgt_len` are the sequence lengths including trailing pads
    (pad=True pads about a third of each sequence, never its first token).
    `source` is present when there is an encoder, `target` (starting with the
    bos token t0) when there is a decoder. None means "leave it to SPEC's default".
    With positional learned or relative, `max_len` (default: 2 more than the longer
    sequence) sets the rows of the learned table or the reach of the relative offsets;
    relative gives each self-attention head a table of 2·max_len − 1 biases.
    `n_kv_heads` below n_heads: grouped-query attention, W_k/W_v/b_k/b_v fused
    n_kv_heads heads wide, or per K/V head in `kv_heads`.
    `embed_norm` normalises each stack's embeddings before its first layer.
    `window` (decoder-only): sliding-window self-attention over the last `window` keys;
    a list: each decoder layer's (None: full attention), as Gemma 2's.
    `attn_softcap`, `logit_softcap`: model's soft caps as given (no array depends on them);
    `logit_scale` likewise.
    `token_types` >= 1: a token-type table of that many rows (BERT's segments) and a
    random type for each position of source and target (drawn last: the other arrays
    are those of the same call without token types).
    `rope_scaling` (positional rope): model.rope_scaling as given; `rope_dims` likewise;
    `pe_base`, `rope_scaling` lists (decoder-only): each decoder layer's, as Gemma 3's (a
    None base: no RoPE in that layer, as Cohere 2's full ones).
    `parallel` (pre-norm): separate or shared; with shared, the FFN has no norm of its own.
    `qk_norm` head: QK-norm, each attention block's q_norm and k_norm (γ, β of d_k) drawn
    after its W_o and norm (the other arrays are those of the same call without it);
    projection: over the whole projection, γ, β of n_heads·d_k and n_kv_heads·d_k.
    `norm_position` sandwich: each sublayer's post_norm drawn after everything else of it.
    `attn_sinks`: each self-attention head's sink logit, N(1, 1) (GPT-OSS's sinks take a
    good share), drawn after everything else of the block: fused `sinks` or per-head `sink`.
    `experts` E: each FFN a mixture of experts (model.experts, experts_top_k, and
    experts_normalize when given), its router [d_model, E] and then each expert's
    weights, as a dense FFN's, drawn in place of the dense FFN's (then its norms);
    `router_bias`: GPT-OSS's ffn.router_bias [E], drawn after the experts. A list of
    experts: each decoder layer's E, or None for a dense FFN (Qwen-MoE's mlp_only_layers).
    `shared_expert` gated or plain: each mixture's shared FFN (of `shared_expert_d_ff`,
    else d_ff) drawn after its experts, then (gated) its shared_gate [d_model, 1].
    `swiglu_limit`: model.swiglu_limit (activation swiglu_oss; small, so that it clamps).
    """
    if d_k is None and d_model % n_heads:
        raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
    dk = d_k if d_k is not None else d_model // n_heads
    dv = d_v if d_v is not None else dk
    dff = d_ff if d_ff is not None else 4 * d_model
    final_on = final_norm if final_norm is not None else norm_position != "post"
    rows = max_len if max_len is not None else max(src_len, tgt_len) + 2

    def matrix(n_in: int, n_out: int) -> list[list[float]]:
        values: list[list[float]] = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).tolist()
        return values

    def vector(n: int, mean: float = 0.0) -> list[float]:
        values: list[float] = (mean + 0.2 * rng.standard_normal(n)).tolist()
        return values

    def norm_params() -> dict[str, Any]:
        return {"gamma": vector(d_model, mean=1.0), "beta": vector(d_model)}

    def rel_bias() -> list[float]:
        values: list[float] = (0.5 * rng.standard_normal(2 * rows - 1)).tolist()
        return values

    n_kv = n_kv_heads if n_kv_heads is not None else n_heads
    grouped = n_kv < n_heads

    def grouped_projections() -> dict[str, Any]:
        """W_q (b_q) of the n_heads query heads, W_k, W_v (b_k, b_v) of the n_kv K/V heads:
        fused, n_heads or n_kv heads wide, or per head in `heads` and `kv_heads`."""
        block: dict[str, Any] = {}
        for listed, n, widths in (
            ("heads", n_heads, {"q": dk}),
            ("kv_heads", n_kv, {"k": dk, "v": dv}),
        ):
            if fused:
                for p, w in widths.items():
                    block[f"W_{p}"] = matrix(d_model, n * w)
                    if biases:
                        block[f"b_{p}"] = vector(n * w)
                continue
            heads = []
            for _ in range(n):
                head: dict[str, Any] = {f"W_{p}": matrix(d_model, w) for p, w in widths.items()}
                if biases:
                    head.update({f"b_{p}": vector(w) for p, w in widths.items()})
                heads.append(head)
            block[listed] = heads
        return block

    def attention_block(relative: bool = False, sinks: bool = False) -> dict[str, Any]:
        widths = {"q": dk, "k": dk, "v": dv}
        block: dict[str, Any] = {}
        if grouped:  # the query heads' W_q, the K/V heads' W_k and W_v (and rel_bias after)
            block = grouped_projections()
            if relative and fused:
                block["rel_bias"] = [rel_bias() for _ in range(n_heads)]
            elif relative:
                for head in block["heads"]:
                    head["rel_bias"] = rel_bias()
        elif fused:
            for p, w in widths.items():
                block[f"W_{p}"] = matrix(d_model, n_heads * w)
                if biases:
                    block[f"b_{p}"] = vector(n_heads * w)
            if relative:  # row h for head h
                block["rel_bias"] = [rel_bias() for _ in range(n_heads)]
        else:
            heads = []
            for _ in range(n_heads):
                head: dict[str, Any] = {f"W_{p}": matrix(d_model, w) for p, w in widths.items()}
                if biases:
                    head.update({f"b_{p}": vector(w) for p, w in widths.items()})
                if relative:
                    head["rel_bias"] = rel_bias()
                heads.append(head)
            block["heads"] = heads
        block["W_o"] = matrix(n_heads * dv, d_model)
        if biases:
            block["b_o"] = vector(d_model)
        block["norm"] = norm_params()
        if qk_norm != "none":
            whole = qk_norm == "projection"  # over every head's columns
            for name, n in (("q_norm", n_heads), ("k_norm", n_kv)):
                width = n * dk if whole else dk
                block[name] = {"gamma": vector(width, mean=1.0), "beta": vector(width)}
        if norm_position == "sandwich":
            block["post_norm"] = norm_params()
        if sinks:
            logits = (1.0 + rng.standard_normal(n_heads)).tolist()
            if "heads" in block:
                for head, sink in zip(block["heads"], logits, strict=True):
                    head["sink"] = sink
            else:
                block["sinks"] = logits
        return block

    def dense_ffn(width: int | None = None) -> dict[str, Any]:
        ff = width or dff
        ffn: dict[str, Any] = {"W_1": matrix(d_model, ff), "W_2": matrix(ff, d_model)}
        if biases:
            ffn["b_1"], ffn["b_2"] = vector(ff), vector(d_model)
        if activation in ("swiglu", "geglu", "geglu_tanh", "swiglu_oss"):  # an up projection
            ffn["W_3"] = matrix(d_model, ff)
            if biases:
                ffn["b_3"] = vector(ff)
        return ffn

    def ffn_block(E: int | None) -> dict[str, Any]:
        if E is None:
            ffn = dense_ffn()
        else:  # (a router of larger logits, so that the choice is clear-cut)
            ffn = {"router": (2 * np.array(matrix(d_model, E))).tolist()}
            ffn["experts"] = [dense_ffn() for _ in range(E)]
            if router_bias:  # GPT-OSS's
                ffn["router_bias"] = vector(E)
            if shared_expert is not None:  # Qwen2-MoE's, DeepSeek's
                ffn["shared"] = dense_ffn(shared_expert_d_ff)
                if shared_expert == "gated":
                    ffn["shared_gate"] = matrix(d_model, 1)
        if parallel != "shared":
            ffn["norm"] = norm_params()
        if norm_position == "sandwich":
            ffn["post_norm"] = norm_params()
        return ffn

    def layer(cross: bool, l: int) -> dict[str, Any]:
        block = {"self_attn": attention_block(positional == "relative", attn_sinks)}
        if cross:
            block["cross_attn"] = attention_block()
        block["ffn"] = ffn_block(experts[l] if isinstance(experts, list) else experts)
        return block

    def sequence(length: int, first: str | None = None) -> list[str]:
        n_pad = max(1, length // 3) if pad and length >= 2 else 0
        words = [str(w) for w in rng.choice(WORDS, size=length - n_pad)]
        if first is not None and words:
            words[0] = first
        return words + [PAD] * n_pad

    vocab = WORDS + ([PAD] if pad else [])
    model: dict[str, Any] = {
        "d_model": d_model,
        "n_heads": n_heads,
        **({"n_kv_heads": n_kv} if n_kv_heads is not None else {}),
        "encoder_layers": encoder_layers,
        "decoder_layers": decoder_layers,
    }
    given = {
        "d_k": d_k,
        "d_v": d_v,
        "d_ff": d_ff,
        "final_norm": final_norm,
        "scale": scale,
        "window": window,
        "pe_base": pe_base,
        "rope_scaling": rope_scaling,
        "rope_dims": rope_dims,
        "qk_norm": None if qk_norm == "none" else qk_norm,
        "attn_softcap": attn_softcap,
        "logit_softcap": logit_softcap,
        "logit_scale": logit_scale,
        "attn_sinks": attn_sinks or None,
        "experts": experts,
        "experts_top_k": experts_top_k,
        "experts_normalize": experts_normalize,
        "shared_expert": shared_expert,
        "shared_expert_d_ff": shared_expert_d_ff,
        "swiglu_limit": swiglu_limit,
    }
    model.update({key: value for key, value in given.items() if value is not None})
    chosen = {
        "positional": positional,
        "rope_pairs": rope_pairs,
        "norm_position": norm_position,
        "norm": norm,
        "activation": activation,
        "embed_scale": embed_scale,
        "tie_embeddings": tie_embeddings,
        "embed_norm": embed_norm,
        "parallel": parallel,
    }
    model.update({key: value for key, value in chosen.items() if value != DEFAULTS[key]})

    weights: dict[str, Any] = {}
    if encoder_layers:
        weights["encoder"] = [layer(cross=False, l=l) for l in range(encoder_layers)]
    if decoder_layers:
        weights["decoder"] = [layer(cross=encoder_layers > 0, l=l) for l in range(decoder_layers)]
    if final_on:
        for stack, n_layers in (("encoder", encoder_layers), ("decoder", decoder_layers)):
            if n_layers:
                weights[f"{stack}_final_norm"] = norm_params()
    if embed_norm:
        for stack, n_layers in (("encoder", encoder_layers), ("decoder", decoder_layers)):
            if n_layers:
                weights[f"{stack}_embed_norm"] = norm_params()
    if positional in ("learned", "relative"):
        model["max_len"] = rows  # more than used: only rows 0..L-1, offsets ±(L-1) are read
    if positional == "learned":
        weights["positional"] = (0.5 * rng.standard_normal((model["max_len"], d_model))).tolist()
    output: dict[str, Any] = {} if tie_embeddings else {"W": matrix(d_model, len(vocab))}
    if biases:
        output["b"] = vector(len(vocab))
    if output:
        weights["output"] = output

    cfg: dict[str, Any] = {
        "title": "random config",
        "model": model,
        "vocab": vocab,
        "tokens": {"bos": BOS, "eos": EOS, "pad": PAD if pad else None},
        "embeddings": {token: rng.standard_normal(d_model).tolist() for token in vocab},
    }
    if encoder_layers:
        cfg["source"] = sequence(src_len)
    if decoder_layers:
        cfg["target"] = sequence(tgt_len, first=BOS)
    cfg["weights"] = weights
    if token_types:
        model["token_types"] = token_types
        weights["token_types"] = (0.5 * rng.standard_normal((token_types, d_model))).tolist()
        for name in ("source", "target"):
            if name in cfg:
                types = rng.integers(token_types, size=len(cfg[name]))
                cfg[f"{name}_types"] = [int(t) for t in types]
    return cfg


def to_per_head(cfg: dict[str, Any]) -> dict[str, Any]:
    """A copy of `cfg` with every fused attention block in per-head form:
    head h takes columns h*d_k..(h+1)*d_k of W_q, W_k, b_q, b_k (h*d_v.. for W_v, b_v)
    and row h of rel_bias, entry h of sinks; under grouped-query attention K/V head j (in `kv_heads`)
    takes columns j*d_k.. of W_k, b_k (j*d_v.. of W_v, b_v)."""
    cfg = copy.deepcopy(cfg)
    model = cfg["model"]
    n_heads = int(model.get("n_heads", 1))
    n_kv = int(model.get("n_kv_heads", n_heads))
    d_k = int(model.get("d_k", model["d_model"] // n_heads))
    d_v = int(model.get("d_v", d_k))
    widths = {"q": d_k, "k": d_k, "v": d_v}
    for stack in ("encoder", "decoder"):
        for layer in cfg.get("weights", {}).get(stack, []):
            for name in ("self_attn", "cross_attn"):
                block = layer.get(name)
                if block is None or "heads" in block:
                    continue
                heads: list[dict[str, Any]] = [{} for _ in range(n_heads)]
                kv_heads: list[dict[str, Any]] = [{} for _ in range(n_kv)]
                for p, w in widths.items():
                    # grouped-query attention: K/V head j's columns of W_k, W_v to kv_heads
                    into = kv_heads if p in ("k", "v") and n_kv < n_heads else heads
                    for kind in ("W", "b"):
                        key = f"{kind}_{p}"
                        if key not in block:
                            continue
                        fused = np.asarray(block.pop(key), dtype=float)
                        for h, head in enumerate(into):
                            head[key] = fused[..., h * w : (h + 1) * w].tolist()
                if "rel_bias" in block:  # row h of the fused table
                    for h, row in enumerate(block.pop("rel_bias")):
                        heads[h]["rel_bias"] = row
                if "sinks" in block:  # entry h of the fused sinks
                    for h, sink in enumerate(block.pop("sinks")):
                        heads[h]["sink"] = sink
                kv = {"kv_heads": kv_heads} if n_kv < n_heads else {}
                layer[name] = {"heads": heads, **kv, **block}
    return cfg
