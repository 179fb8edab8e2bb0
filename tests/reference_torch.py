"""An independent float64 PyTorch reference of the trace-tf forward pass.

Written from /work/shared/SPEC.md (sections 1-3) alone, without importing
trace_tf, so that the engine can be tested against a second implementation.
`reference_forward(cfg)` runs the model a config describes and returns every
intermediate under its SPEC section 3 step path, in execution order.

The config must give every array explicitly (nothing is drawn from the seed):
this reference checks the arithmetic, not the initialisation. Each head's
context is computed twice, once step by step (paper eq. 1) and once with
`torch.nn.functional.scaled_dot_product_attention`, and the two must agree
within 1e-10, so the reference is itself checked against torch's attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

Tensor = torch.Tensor
DTYPE = torch.float64
SDPA_ATOL = {torch.float64: 1e-10, torch.float32: 1e-5}  # (DTYPE may be set to float32)


# ---------------------------------------------------------------- the config


@dataclass(frozen=True)
class Hyper:
    """The `model` section with SPEC section 2 defaults filled in."""

    d_model: int
    n_heads: int
    n_kv_heads: int  # grouped-query attention: query head h reads K/V head h // (H / H_kv)
    d_k: int
    d_v: int
    d_ff: int
    encoder_layers: int
    decoder_layers: int
    positional: str
    pe_base: float
    rope_pairs: str  # positional rope: columns (2i, 2i+1) "adjacent" or (i, i + d_k/2) "halves"
    max_len: int
    embed_scale: float
    norm_position: str
    final_norm: bool
    embed_norm: bool  # the norm of the embeddings before layer 0 (BERT)
    token_types: int  # rows of the token-type table (BERT's segments); 0: none
    norm: str
    norm_eps: float
    activation: str
    scale: float  # scores are divided by this
    window: int  # sliding window (Mistral): query i sees keys i − window < j <= i; 0 unlimited
    # model.window as a list: decoder layer l's own window (0, null: full attention), as
    # Gemma 2's layer_types alternate sliding_attention and full_attention; None: `window`
    layer_windows: tuple[int, ...] | None
    attn_softcap: float | None  # Gemma 2's attn_logit_softcapping: c · tanh(scaled / c)
    logit_softcap: float | None  # Gemma 2's final_logit_softcapping: c · tanh(logits / c)
    logit_scale: float | None  # Cohere's logit_scale: s · logits (then capped, with both)
    attn_sinks: bool  # GPT-OSS: each self-attention head's sink logit joins the softmax row
    rope_scaling: dict[str, Any] | None  # positional rope: model.rope_scaling (linear, llama3)
    # model.pe_base, model.rope_scaling as lists: decoder layer l's own RoPE base and
    # scaling, as Gemma 3's sliding and full layers have (rope_parameters by layer type);
    # None: pe_base and rope_scaling for every layer; a None base: no RoPE in that layer
    # (Cohere 2's full layers, NoPE)
    layer_pe_bases: tuple[float | None, ...] | None
    layer_rope_scalings: tuple[dict[str, Any] | None, ...] | None
    rope_dims: int  # positional rope: the leading columns turned (GPT-NeoX's rotary_ndims)
    parallel: str  # none, or separate / shared: x + attn(norm(x)) + ffn(norm(x)) (GPT-NeoX, GPT-J)
    qk_norm: str  # "head": each head's q and k normalised over d_k before RoPE (Qwen3);
    # "projection": all of q_proj(x) normalised over H·d_k, k_proj(x) over H_kv·d_k (OLMo 2)
    # a mixture of experts (Mixtral): E experts (0: a dense FFN), each token to its top k,
    # their probabilities renormalised to sum to 1 when experts_normalize; a list, each
    # decoder layer's (0, null in the config: that layer's FFN dense)
    experts: int | tuple[int, ...] = 0
    experts_top_k: int = 0
    experts_normalize: bool = True
    # a shared expert (Qwen2-MoE's, "gated": sigmoid(x w_g) times it; DeepSeek's "plain"),
    # of width shared_expert_d_ff, on every token, added to the routed sum
    shared_expert: str = "none"
    shared_expert_d_ff: int = 0
    # GPT-OSS's clamped SwiGLU (activation swiglu_oss): its limit and gain
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702


def hyper(model: dict[str, Any]) -> Hyper:
    """Read `model`, applying the defaults of SPEC section 2."""
    d_model = int(model["d_model"])
    n_heads = int(model.get("n_heads", 1))
    if "d_k" in model:
        d_k = int(model["d_k"])
    elif d_model % n_heads == 0:
        d_k = d_model // n_heads
    else:
        raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
    norm_position = model.get("norm_position", "post")
    embed_scale = model.get("embed_scale", 1)
    scale = model.get("scale", "sqrt_dk")
    window = model.get("window")
    bases, scalings = model.get("pe_base", 10000), model.get("rope_scaling")
    by_layer = isinstance(bases, list) or isinstance(scalings, list)
    n_dec = int(model.get("decoder_layers", 0))
    return Hyper(
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(model.get("n_kv_heads", n_heads)),
        d_k=d_k,
        d_v=int(model.get("d_v", d_k)),
        d_ff=int(model.get("d_ff", 4 * d_model)),
        encoder_layers=int(model.get("encoder_layers", 1)),
        decoder_layers=int(model.get("decoder_layers", 0)),
        positional=model.get("positional", "sinusoidal"),
        pe_base=float(
            next(b for b in bases if b is not None) if isinstance(bases, list) else bases
        ),
        rope_pairs=model.get("rope_pairs", "adjacent"),
        max_len=int(model.get("max_len", 128)),
        embed_scale=math.sqrt(d_model) if embed_scale == "sqrt_d_model" else float(embed_scale),
        norm_position=norm_position,
        final_norm=bool(model.get("final_norm", norm_position != "post")),
        embed_norm=bool(model.get("embed_norm", False)),
        token_types=int(model.get("token_types", 0)),
        norm=model.get("norm", "layer"),
        norm_eps=float(model.get("norm_eps", 1e-5)),
        activation=model.get("activation", "relu"),
        scale=math.sqrt(d_k) if scale == "sqrt_dk" else float(scale),
        window=0 if isinstance(window, list) else int(window or 0),
        layer_windows=tuple(int(w or 0) for w in window) if isinstance(window, list) else None,
        attn_softcap=model.get("attn_softcap"),
        logit_softcap=model.get("logit_softcap"),
        logit_scale=model.get("logit_scale"),
        attn_sinks=bool(model.get("attn_sinks", False)),
        rope_scaling=scalings[0] if isinstance(scalings, list) else scalings,
        layer_pe_bases=tuple(
            None if b is None else float(b)
            for b in (bases if isinstance(bases, list) else [bases] * n_dec)
        )
        if by_layer
        else None,
        layer_rope_scalings=tuple(scalings if isinstance(scalings, list) else [scalings] * n_dec)
        if by_layer
        else None,
        rope_dims=int(model.get("rope_dims") or d_k),
        parallel=model.get("parallel", "none"),
        qk_norm=model.get("qk_norm", "none"),
        experts=tuple(int(e or 0) for e in experts)
        if isinstance(experts := model.get("experts"), list)
        else int(experts or 0),
        experts_top_k=int(model.get("experts_top_k") or 0),
        experts_normalize=bool(model.get("experts_normalize", True)),
        shared_expert=model.get("shared_expert", "none"),
        shared_expert_d_ff=int(model.get("shared_expert_d_ff") or model.get("d_ff", 4 * d_model)),
        swiglu_limit=float(model.get("swiglu_limit", 7.0)),
        swiglu_alpha=float(model.get("swiglu_alpha", 1.702)),
    )


def tensor(value: Any) -> Tensor:
    """A config array (nested lists) as a float64 tensor."""
    return torch.tensor(value, dtype=DTYPE)


def param(
    block: dict[str, Any], key: str, shape: tuple[int, ...], default: float | None = None
) -> Tensor:
    """`block[key]` with its shape checked; a missing bias is zeros, a missing gamma ones."""
    if key not in block:
        if default is None:
            raise KeyError(f"missing weight {key!r}")
        return torch.full(shape, default, dtype=DTYPE)
    value = tensor(block[key])
    if tuple(value.shape) != shape:
        raise ValueError(f"{key}: expected shape {shape}, found {tuple(value.shape)}")
    return value


class Trace:
    """Ordered path -> value; `rec` stores a copy and returns the value unchanged."""

    def __init__(self) -> None:
        self.steps: dict[str, Tensor] = {}

    def rec(self, path: str, value: Tensor) -> Tensor:
        self.steps[path] = value.detach().clone()
        return value


# ---------------------------------------------------------------- the operations


def sinusoidal(length: int, d: int, base: float = 10000.0) -> Tensor:
    """PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(same) (paper 3.5). [length, d]

    For an odd d the last column (index d-1, even) is a sine.
    """
    pos = torch.arange(length, dtype=DTYPE)[:, None]  # [length, 1]
    col = torch.arange(d)
    two_i = (col // 2 * 2).to(DTYPE)  # 0, 0, 2, 2, 4, ...: the 2i shared by a sin/cos pair
    angle = pos / base ** (two_i / d)  # [length, d]
    return torch.where(col % 2 == 0, torch.sin(angle), torch.cos(angle))


def rotate_half(x: Tensor) -> Tensor:
    """[-x2, x1] for x = [x1, x2] split into halves (Hugging Face's `rotate_half`). [n, 2h]"""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def scaled_frequencies(inv_freq: Tensor, scaling: dict[str, Any]) -> Tensor:
    """inv_freq rescaled: linear (position interpolation, Chen et al. 2023) divides each
    by the factor; llama3 is Meta's `apply_scaling` (llama-models, LLaMA 3.1), pair by pair:
    by wavelength 2π / f, kept below old_context_len / high_freq_factor, f / factor above
    old_context_len / low_freq_factor, and between smoothed."""
    factor = float(scaling["factor"])
    if scaling["type"] == "linear":
        return inv_freq / factor
    if scaling["type"] != "llama3":
        raise ValueError(f"the reference has no RoPE scaling {scaling['type']!r}")
    old_context_len = float(scaling["original_max_len"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    new_freqs = []
    for freq in inv_freq.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old_context_len / high:
            new_freqs.append(freq)
        elif wavelen > old_context_len / low:
            new_freqs.append(freq / factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            new_freqs.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(new_freqs, dtype=inv_freq.dtype)


def rope(x: Tensor, base: float, pairs: str, scaling: dict[str, Any] | None = None) -> Tensor:
    """Row pos of x turned by RoPE (RoFormer, Su et al. 2021), angle θ_i = pos / base^(2i/d)
    for pair i < d // 2 (Hugging Face's inv_freq); an odd d's last column unturned. [n, d]

    adjacent: columns (2i, 2i+1) as the complex number x_2i + i·x_2i+1, times e^(iθ_i)
    (RoFormer section 3.4.2; Meta's LLaMA reference code). halves: columns (i, i + d/2), as
    Hugging Face's apply_rotary_pos_emb, x·cos + rotate_half(x)·sin with cos and sin of
    [θ, θ] (GPT-NeoX, LlamaForCausalLM)."""
    n, d = x.shape
    h = d // 2
    inv_freq = 1.0 / base ** (torch.arange(0, 2 * h, 2, dtype=DTYPE) / d)
    if scaling is not None:
        inv_freq = scaled_frequencies(inv_freq, scaling)
    theta = torch.arange(n, dtype=DTYPE)[:, None] * inv_freq[None, :]  # [n, h]
    turned, rest = x[:, : 2 * h], x[:, 2 * h :]
    if pairs == "adjacent":
        z = torch.view_as_complex(turned.reshape(n, h, 2).contiguous())
        out = torch.view_as_real(z * torch.polar(torch.ones_like(theta), theta)).reshape(n, 2 * h)
    elif pairs == "halves":
        emb = torch.cat((theta, theta), dim=-1)  # [n, 2h]
        out = turned * emb.cos() + rotate_half(turned) * emb.sin()
    else:
        raise ValueError(f"unknown rope_pairs {pairs!r}")
    return torch.cat((out, rest), dim=1)


def partial_rope(x: Tensor, hp: Hyper) -> Tensor:
    """GPT-NeoX's partial rotary (apply_rotary_pos_emb's q_rot, q_pass): the first
    rope_dims columns turned as a RoPE of that width (its pairs and inv_freq over
    rope_dims, not d_k), the others passed through. [n, d_k]"""
    r = hp.rope_dims
    turned = rope(x[:, :r], hp.pe_base, hp.rope_pairs, hp.rope_scaling)
    return torch.cat((turned, x[:, r:]), dim=-1)


def additive_mask(n_q: int, key_is_pad: list[bool], causal: bool, window: int = 0) -> Tensor:
    """0 where a query may look, -inf where it may not (SPEC 1): pad keys, and later positions
    when causal; with a sliding `window` W also the keys W or more positions back (query i
    sees the W keys i − W < j <= i). Query rows are never masked. [n_q, n_k]"""
    n_k = len(key_is_pad)
    blocked = torch.tensor(key_is_pad, dtype=torch.bool)[None, :].expand(n_q, n_k)
    if causal:  # position i sees positions 0..i only
        blocked = blocked | torch.ones(n_q, n_k, dtype=torch.bool).triu(diagonal=1)
    if window:  # the distance i − j of a visible key is below W
        i, j = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
        blocked = blocked | (i - j >= window)
    return torch.zeros(n_q, n_k, dtype=DTYPE).masked_fill(blocked, -math.inf)


def normalise(x: Tensor, params: dict[str, Any], hp: Hyper, d: int | None = None) -> Tensor:
    """Per row: LayerNorm (x - mean) / sqrt(var + eps) * gamma + beta (biased variance),
    or RMSNorm x / sqrt(mean(x^2) + eps) * gamma + beta (SPEC 1), over the last d columns
    (d_model unless given: QK-norm's are d_k wide). [n, d] -> [n, d]"""
    d = hp.d_model if d is None else d
    gamma = param(params, "gamma", (d,), 1.0)
    beta = param(params, "beta", (d,), 0.0)
    if hp.norm == "layer":
        return F.layer_norm(x, (d,), weight=gamma, bias=beta, eps=hp.norm_eps)
    if hp.norm == "rms":
        return F.rms_norm(x, (d,), weight=gamma, eps=hp.norm_eps) + beta
    raise ValueError(f"unknown norm {hp.norm!r}")


# The gated FFNs (Shazeer 2020, "GLU Variants Improve Transformer") and their gate.
GATES = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}


def activation(x: Tensor, name: str) -> Tensor:
    """relu, exact (erf) gelu, the tanh approximation of gelu, or silu (x sigmoid(x))."""
    if name == "relu":
        return F.relu(x)
    if name == "gelu":
        return F.gelu(x, approximate="none")
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "silu":
        return F.silu(x)
    raise ValueError(f"unknown activation {name!r}")


# ---------------------------------------------------------------- attention


def head_weights(block: dict[str, Any], hp: Hyper) -> list[dict[str, Tensor]]:
    """Each head's W_q, W_k, W_v, b_q, b_k, b_v, from the per-head or the fused form (SPEC 2)."""
    d, dk, dv, n_heads = hp.d_model, hp.d_k, hp.d_v, hp.n_heads
    widths = {"q": dk, "k": dk, "v": dv}
    if hp.n_kv_heads < n_heads:  # grouped-query attention: K and V are the K/V heads'
        widths = {"q": dk}
    if "heads" in block:
        if len(block["heads"]) != n_heads:
            raise ValueError(f"expected {n_heads} heads, found {len(block['heads'])}")
        return [
            {
                **{f"W_{p}": param(head, f"W_{p}", (d, w)) for p, w in widths.items()},
                **{f"b_{p}": param(head, f"b_{p}", (w,), 0.0) for p, w in widths.items()},
            }
            for head in block["heads"]
        ]
    # Fused: head h owns columns h*w..(h+1)*w, i.e. index h of a [d, H, w] view.
    fused_w = {
        p: param(block, f"W_{p}", (d, n_heads * w)).reshape(d, n_heads, w)
        for p, w in widths.items()
    }
    fused_b = {
        p: param(block, f"b_{p}", (n_heads * w,), 0.0).reshape(n_heads, w)
        for p, w in widths.items()
    }
    return [
        {
            **{f"W_{p}": fused_w[p][:, h, :] for p in widths},
            **{f"b_{p}": fused_b[p][h] for p in widths},
        }
        for h in range(n_heads)
    ]


def kv_projections(x_kv: Tensor, block: dict[str, Any], hp: Hyper) -> tuple[Tensor, Tensor]:
    """Grouped-query attention, as Hugging Face's LlamaAttention: K and V of the n_kv_heads
    K/V heads (per K/V head in `kv_heads`, or fused n_kv_heads·d_k wide), then repeat_kv:
    each repeated for the H / H_kv query heads of its group. -> [H, n_kv, d_k], [H, n_kv, d_v]"""
    d, dk, dv, n = hp.d_model, hp.d_k, hp.d_v, hp.n_kv_heads
    if "kv_heads" in block:
        k = torch.stack(
            [
                x_kv @ param(e, "W_k", (d, dk)) + param(e, "b_k", (dk,), 0.0)
                for e in block["kv_heads"]
            ]
        )
        v = torch.stack(
            [
                x_kv @ param(e, "W_v", (d, dv)) + param(e, "b_v", (dv,), 0.0)
                for e in block["kv_heads"]
            ]
        )
    else:  # [n_kv, n·w] -> [n, n_kv, w], as HF's .view(..., n, head_dim).transpose(1, 2)
        k = x_kv @ param(block, "W_k", (d, n * dk)) + param(block, "b_k", (n * dk,), 0.0)
        v = x_kv @ param(block, "W_v", (d, n * dv)) + param(block, "b_v", (n * dv,), 0.0)
        k = k.view(-1, n, dk).transpose(0, 1)
        v = v.view(-1, n, dv).transpose(0, 1)
    group = hp.n_heads // n  # repeat_kv: [n, L, w] -> [n·group, L, w], kv head j at j·group..
    return k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)


def relative_bias_table(block: dict[str, Any], hp: Hyper) -> list[Tensor]:
    """Each head's relative position biases b (lecture 000 section 6.2), 2·max_len − 1
    of them: per head `rel_bias`, or row h of the block's fused n_heads x (2·max_len − 1)."""
    n = 2 * hp.max_len - 1
    if "heads" in block:
        return [param(head, "rel_bias", (n,)) for head in block["heads"]]
    fused = param(block, "rel_bias", (hp.n_heads, n))
    return [fused[h] for h in range(hp.n_heads)]


def sink_logits(block: dict[str, Any], hp: Hyper) -> list[Tensor]:
    """Each head's sink logit (GPT-OSS's GptOssAttention.sinks): per head `sink`, or entry
    h of the block's fused `sinks` of n_heads numbers."""
    if "heads" in block:
        return [param(head, "sink", ()) for head in block["heads"]]
    fused = param(block, "sinks", (hp.n_heads,))
    return [fused[h] for h in range(hp.n_heads)]


def relative_bias(b: Tensor, n_q: int, n_k: int, max_len: int) -> Tensor:
    """B[i,j] = b[(j − i) + max_len − 1]: the bias of query i looking at key j depends on
    the offset j − i alone. [n_q, n_k]"""
    offset = torch.arange(n_k)[None, :] - torch.arange(n_q)[:, None]  # j − i
    return b[offset + (max_len - 1)]


def alibi_slopes(n: int) -> list[float]:
    """ALiBi's head slopes as the paper's code writes them (ofirpress/attention_with_linear_
    biases, get_slopes): a geometric sequence starting at, and with ratio, 2^(−8/n) for n a
    power of two; otherwise the closest power of two's, then every other one of twice it."""
    if math.log2(n).is_integer():
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    below = 2 ** math.floor(math.log2(n))
    return alibi_slopes(below) + alibi_slopes(2 * below)[0::2][: n - below]


def alibi_bias(slope: float, n_q: int, n_k: int, causal: bool) -> Tensor:
    """ALiBi's B[i,j] = slope · (j − i) (the paper's −m·(i − j)) for a causal decoder;
    −slope · |j − i| for a bidirectional encoder (MosaicBERT's symmetric form). [n_q, n_k]"""
    offset = (torch.arange(n_k)[None, :] - torch.arange(n_q)[:, None]).to(DTYPE)  # j − i
    return slope * (offset if causal else -offset.abs())


def check_against_sdpa(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, context: Tensor
) -> None:
    """Recompute the head with torch's fused attention; rows with no visible key are skipped
    (there the step-by-step softmax is NaN, as SPEC 1 asks, while SDPA returns zeros)."""
    # SDPA's `scale` multiplies the scores; ours divides them.
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / scale)
    rows = (
        torch.ones(q.shape[0], dtype=torch.bool)
        if mask is None
        else torch.isfinite(mask).any(dim=1)
    )
    error = (sdpa[rows] - context[rows]).abs().max().item() if rows.any() else 0.0
    if not error <= SDPA_ATOL[q.dtype]:
        raise AssertionError(f"attention disagrees with F.scaled_dot_product_attention by {error}")


def check_against_gemma2(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, hp: Hyper, context: Tensor
) -> None:
    """Recompute a soft-capped head with Hugging Face's Gemma 2 eager attention, which caps
    Q Kᵀ · scaling and then adds the mask (here B + M, both added after the cap); rows with
    no visible key are skipped, as in check_against_sdpa. Its softmax runs in float32
    (softmax(..., dtype=torch.float32)), hence the tolerance of float32's rounding."""
    from types import SimpleNamespace

    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    module = SimpleNamespace(num_key_value_groups=1, training=False, head_dim=q.shape[-1])
    out, _ = eager_attention_forward(
        module,  # type: ignore[arg-type]
        q[None, None],
        k[None, None],
        v[None, None],
        None if mask is None else mask[None, None],
        scaling=1.0 / hp.scale,
        softcap=hp.attn_softcap,
    )
    hf = out[0, :, 0]  # [1, n_q, 1, d_v] -> [n_q, d_v]
    rows = (
        torch.ones(q.shape[0], dtype=torch.bool)
        if mask is None
        else torch.isfinite(mask).any(dim=1)
    )
    error = (hf[rows] - context[rows]).abs().max().item() if rows.any() else 0.0
    if not error <= SDPA_ATOL[torch.float32]:
        raise AssertionError(f"attention disagrees with Hugging Face's Gemma 2 by {error}")


def check_against_gpt_oss(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, sink: Tensor, hp: Hyper, context: Tensor
) -> None:
    """Recompute a head with a sink by Hugging Face's GPT-OSS eager attention (the sink a
    last column of Q Kᵀ · scaling + mask, the max subtracted, softmax, the column dropped),
    in float64; every row, a fully masked one included (all its weight the sink's: zeros)."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = SimpleNamespace(num_key_value_groups=1, training=False, sinks=sink.reshape(1))
    out, _ = eager_attention_forward(
        module,  # type: ignore[arg-type]
        q[None, None],
        k[None, None],
        v[None, None],
        None if mask is None else mask[None, None],
        scaling=1.0 / hp.scale,
    )
    error = (out[0, :, 0] - context).abs().max().item()  # [1, n_q, 1, d_v] -> [n_q, d_v]
    if not error <= SDPA_ATOL[q.dtype]:
        raise AssertionError(f"attention disagrees with Hugging Face's GPT-OSS by {error}")


def attention_head(
    x_q: Tensor,
    x_kv: Tensor,
    w: dict[str, Tensor],
    mask: Tensor | None,
    hp: Hyper,
    tr: Trace,
    path: str,
    rel: Tensor | None = None,
    rotary: bool = False,
    kv: tuple[Tensor, Tensor] | None = None,
    alibi: tuple[float, bool] | None = None,
    qk_norm: tuple[dict[str, Any], dict[str, Any]] | None = None,
    q_given: Tensor | None = None,
    sink: Tensor | None = None,
) -> Tensor:
    """softmax(Q K^T / scale + B + mask) V (paper eq. 1; B, with `rel` a table of relative
    position biases, lecture 000 section 6.2, or with `alibi` (slope, causal) ALiBi's;
    `rotary`: q and k turned by RoPE, the query and key rows at positions 0, 1, ...;
    `qk_norm`: the block's (q_norm, k_norm) weights, each row of q and k normalised over
    its d_k columns first, as Qwen3's q_norm and k_norm); `q_given`: the head's q, already
    projected and normalised (OLMo 2's whole-projection QK-norm, as its k in `kv`); `sink`:
    the head's sink logit s (GPT-OSS), A = e^S / (Σ e^S + e^s), the sink's share recorded.
    [n_q, d_model] x [n_kv, d_model] -> [n_q, d_v]"""
    q = x_q @ w["W_q"] + w["b_q"] if q_given is None else q_given  # [n_q, d_k]
    k = x_kv @ w["W_k"] + w["b_k"] if kv is None else kv[0]  # [n_kv, d_k]
    if qk_norm is not None:  # named q_norm / k_norm when RoPE follows, else they are q, k
        q = normalise(tr.rec(f"{path}.q_raw", q), qk_norm[0], hp, hp.d_k)
        k = normalise(tr.rec(f"{path}.k_raw", k), qk_norm[1], hp, hp.d_k)
        if rotary:
            q, k = tr.rec(f"{path}.q_norm", q), tr.rec(f"{path}.k_norm", k)
    if rotary:
        if qk_norm is None and q_given is None:
            q, k = tr.rec(f"{path}.q_raw", q), tr.rec(f"{path}.k_raw", k)
        q, k = partial_rope(q, hp), partial_rope(k, hp)
    q, k = tr.rec(f"{path}.q", q), tr.rec(f"{path}.k", k)
    v = tr.rec(f"{path}.v", x_kv @ w["W_v"] + w["b_v"] if kv is None else kv[1])  # [n_kv, d_v]
    scores = tr.rec(f"{path}.scores", q @ k.T)  # [n_q, n_kv]
    scaled = tr.rec(f"{path}.scaled", scores / hp.scale)
    if hp.attn_softcap is not None:  # Gemma 2: capped before any mask (or bias) is added
        c = float(hp.attn_softcap)
        scaled = tr.rec(f"{path}.capped", torch.tanh(scaled / c) * c)
    sdpa_mask = mask
    if rel is not None or alibi is not None:
        B = tr.rec(
            f"{path}.rel_bias",
            relative_bias(rel, q.shape[0], k.shape[0], hp.max_len)
            if rel is not None
            else alibi_bias(alibi[0], q.shape[0], k.shape[0], alibi[1]),  # type: ignore[index]
        )
        scaled = tr.rec(f"{path}.biased", scaled + B)
        sdpa_mask = B if mask is None else B + mask  # SDPA adds a float mask to the scores
    if mask is not None:
        scaled = tr.rec(f"{path}.masked", scaled + mask)
    # torch.softmax is the stable one (it subtracts the row max); a fully masked row is NaN.
    if sink is None:
        weights = tr.rec(f"{path}.softmax", torch.softmax(scaled, dim=-1))
    else:  # e^s joins each row's sum: the exponentials over their sum with e^s, by hand
        top = torch.maximum(scaled.max(dim=-1, keepdim=True).values, sink)
        e, e_sink = torch.exp(scaled - top), torch.exp(sink - top)
        total = e.sum(dim=-1, keepdim=True) + e_sink
        weights = tr.rec(f"{path}.softmax", e / total)
        tr.rec(f"{path}.sink", e_sink / total)
    context = tr.rec(f"{path}.context", weights @ v)  # [n_q, d_v]
    if sink is not None and hp.attn_softcap is None:  # SDPA has no sink: GPT-OSS has
        check_against_gpt_oss(q, k, v, sdpa_mask, sink, hp, context)
    elif sink is not None:
        pass  # no library caps and sinks both: the step-by-step softmax above alone
    elif hp.attn_softcap is None:
        check_against_sdpa(q, k, v, sdpa_mask, hp.scale, context)
    else:  # SDPA has no soft cap: Hugging Face's Gemma 2 eager attention has
        check_against_gemma2(q, k, v, sdpa_mask, hp, context)
    return context


def whole_projection_qk(
    x_q: Tensor, x_kv: Tensor, block: dict[str, Any], hp: Hyper, tr: Trace, path: str
) -> tuple[list[Tensor | None], list[tuple[Tensor, Tensor] | None]]:
    """OLMo 2's QK-norm (Olmo2Attention): q_norm(q_proj(x)) over all H·d_k columns at once,
    k_norm(k_proj(x)) over all H_kv·d_k, then .view(…, heads, d_k).transpose: each query
    head's q, and each query head's (k, v) (its K/V head's under grouped-query attention)."""
    H, n, dk, dv, d = hp.n_heads, hp.n_kv_heads, hp.d_k, hp.d_v, hp.d_model
    heads = head_weights(block, hp)
    q_proj = torch.cat([w["W_q"] for w in heads], dim=1)  # [d, H·d_k], as nn.Linear's weightᵀ
    q = tr.rec(f"{path}.q_raw", x_q @ q_proj + torch.cat([w["b_q"] for w in heads]))
    q = tr.rec(f"{path}.q_norm", normalise(q, block.get("q_norm", {}), hp, H * dk))
    if n < H:  # k_proj(x) and v_proj(x): the K/V heads' side by side
        k_rep, v_rep = kv_projections(x_kv, block, hp)
        k_heads, v_heads = k_rep[:: H // n], v_rep[:: H // n]  # [n, L, w] before repeat_kv
    else:
        k_heads = torch.stack([x_kv @ w["W_k"] + w["b_k"] for w in heads])
        v_heads = torch.stack([x_kv @ w["W_v"] + w["b_v"] for w in heads])
    k = tr.rec(f"{path}.k_raw", k_heads.transpose(0, 1).reshape(-1, n * dk))
    k = tr.rec(f"{path}.k_norm", normalise(k, block.get("k_norm", {}), hp, n * dk))
    q_split = q.view(-1, H, dk).transpose(0, 1)  # [H, L_q, d_k]
    k_split = k.view(-1, n, dk).transpose(0, 1).repeat_interleave(H // n, dim=0)
    v_split = v_heads.repeat_interleave(H // n, dim=0)
    assert v_split.shape[-1] == dv and q_proj.shape[0] == d
    return list(q_split), [(k_split[h], v_split[h]) for h in range(H)]


def multi_head_attention(
    x_q: Tensor,
    x_kv: Tensor,
    block: dict[str, Any],
    mask: Tensor | None,
    hp: Hyper,
    tr: Trace,
    path: str,
) -> Tensor:
    """Concat(head_1..head_H) W_o + b_o (paper 3.2.2); one function for self- and cross-attention.
    [n_q, d_model] x [n_kv, d_model] -> [n_q, d_model]"""
    # relative position biases in self-attention only: cross-attention's keys are another
    # sequence, with no offset j − i to the queries
    relative = hp.positional == "relative" and path.endswith("self_attn")
    tables = relative_bias_table(block, hp) if relative else [None] * hp.n_heads
    rotary = hp.positional == "rope" and path.endswith("self_attn")  # RoPE, likewise
    # ALiBi, likewise: causal in the decoder's self-attention, symmetric in the encoder's
    slopes: list[tuple[float, bool] | None] = [None] * hp.n_heads
    if hp.positional == "alibi" and path.endswith("self_attn"):
        slopes = [(m, path.startswith("decoder")) for m in alibi_slopes(hp.n_heads)]
    if hp.n_kv_heads < hp.n_heads:  # grouped-query attention: K, V per K/V head, repeated
        k, v = kv_projections(x_kv, block, hp)
        kvs: list[tuple[Tensor, Tensor] | None] = [(k[n], v[n]) for n in range(hp.n_heads)]
    else:
        kvs = [None] * hp.n_heads
    # QK-norm in every attention block, one q_norm and one k_norm shared by its heads
    qk = (block.get("q_norm", {}), block.get("k_norm", {})) if hp.qk_norm == "head" else None
    qs: list[Tensor | None] = [None] * hp.n_heads
    # attention sinks (GPT-OSS) in self-attention only, as trace-tf keeps them
    sinks: list[Tensor | None] = [None] * hp.n_heads
    if hp.attn_sinks and path.endswith("self_attn"):
        sinks = list(sink_logits(block, hp))
    if hp.qk_norm == "projection":
        qs, kvs = whole_projection_qk(x_q, x_kv, block, hp, tr, path)
    heads = [
        attention_head(
            x_q,
            x_kv,
            w,
            mask,
            hp,
            tr,
            f"{path}.h{n}",
            tables[n],
            rotary,
            kvs[n],
            slopes[n],
            qk,
            qs[n],
            sinks[n],
        )
        for n, w in enumerate(head_weights(block, hp))
    ]
    concat = tr.rec(f"{path}.concat", torch.cat(heads, dim=1))  # [n_q, H*d_v]
    w_o = param(block, "W_o", (hp.n_heads * hp.d_v, hp.d_model))
    b_o = param(block, "b_o", (hp.d_model,), 0.0)
    return tr.rec(f"{path}.wo", concat @ w_o + b_o)


# ---------------------------------------------------------------- layers and stacks


def feed_forward(
    x: Tensor, ffn: dict[str, Any], hp: Hyper, tr: Trace, path: str, d_ff: int | None = None
) -> Tensor:
    """act(x W_1 + b_1) W_2 + b_2 (paper 3.3); gated, as Meta's llama
    w2(silu(w1(x)) * w3(x)): (act(x W_1 + b_1) * (x W_3 + b_3)) W_2 + b_2; of width d_ff
    (a shared expert's), else hp.d_ff. [n, d_model] -> [n, d_model]"""
    d, d_ff = hp.d_model, d_ff or hp.d_ff
    hidden = tr.rec(
        f"{path}.hidden", x @ param(ffn, "W_1", (d, d_ff)) + param(ffn, "b_1", (d_ff,), 0.0)
    )
    if hp.activation == "swiglu_oss":  # as Hugging Face's GptOssExperts._apply_gate
        gate = tr.rec(f"{path}.gate_clamp", hidden.clamp(min=None, max=hp.swiglu_limit))
        glu = tr.rec(f"{path}.act", gate * torch.sigmoid(gate * hp.swiglu_alpha))
        up = tr.rec(
            f"{path}.up", x @ param(ffn, "W_3", (d, d_ff)) + param(ffn, "b_3", (d_ff,), 0.0)
        )
        up1 = tr.rec(f"{path}.up_clamp", up.clamp(min=-hp.swiglu_limit, max=hp.swiglu_limit) + 1)
        gated = tr.rec(f"{path}.gated", up1 * glu)
        return tr.rec(
            f"{path}.out", gated @ param(ffn, "W_2", (d_ff, d)) + param(ffn, "b_2", (d,), 0.0)
        )
    act = tr.rec(f"{path}.act", activation(hidden, GATES.get(hp.activation, hp.activation)))
    if hp.activation in GATES:
        up = tr.rec(
            f"{path}.up", x @ param(ffn, "W_3", (d, d_ff)) + param(ffn, "b_3", (d_ff,), 0.0)
        )
        act = tr.rec(f"{path}.gated", act * up)
    return tr.rec(f"{path}.out", act @ param(ffn, "W_2", (d_ff, d)) + param(ffn, "b_2", (d,), 0.0))


def ffn_sublayer(x: Tensor, ffn: dict[str, Any], hp: Hyper, tr: Trace, path: str) -> Tensor:
    """The FFN sublayer: dense, or a sparse mixture of experts (Mixtral's sparse MoE block,
    written as Hugging Face writes it): router logits x W_r, softmax, torch.topk, the k
    weights renormalised (experts_normalize), each expert on its tokens' rows only, their
    weighted outputs added with index_add_ in expert order. [n, d_model] -> [n, d_model]"""
    # (a list: the layer's own, `decoder.<l>.ffn`'s entry)
    E = hp.experts[int(path.split(".")[1])] if isinstance(hp.experts, tuple) else hp.experts
    if not E:
        return feed_forward(x, ffn, hp, tr, path)
    k = hp.experts_top_k
    logits = tr.rec(
        f"{path}.router",
        x @ param(ffn, "router", (hp.d_model, E)) + param(ffn, "router_bias", (E,), 0.0),
    )
    probs = tr.rec(f"{path}.route_prob", torch.softmax(logits, dim=-1))
    top, chosen = torch.topk(probs, k, dim=-1)
    if hp.experts_normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    tr.rec(f"{path}.routed", torch.zeros_like(probs).scatter(1, chosen, top))
    out = torch.zeros_like(x)
    for e in range(E):
        token, slot = torch.where(chosen == e)
        if len(token) == 0:
            continue
        order = torch.argsort(token)  # (the tokens in order, as the steps' rows)
        token, slot = token[order], slot[order]
        x_e = tr.rec(f"{path}.e{e}.x", x[token])
        y = feed_forward(x_e, ffn["experts"][e], hp, tr, f"{path}.e{e}")
        out.index_add_(0, token, y * top[token, slot, None])
    if hp.shared_expert != "none":  # as Qwen2MoeSparseMoeBlock: expert_output + shared
        shared = feed_forward(x, ffn["shared"], hp, tr, f"{path}.shared", hp.shared_expert_d_ff)
        if hp.shared_expert == "gated":
            w_g = param(ffn, "shared_gate", (hp.d_model, 1))
            shared = tr.rec(f"{path}.shared.gate", torch.sigmoid(x @ w_g)) * shared
        out = out + shared
    return tr.rec(f"{path}.out", out)


def sublayer_input(x: Tensor, block: dict[str, Any], hp: Hyper, tr: Trace, path: str) -> Tensor:
    """What a sublayer reads: x with post-norm (the paper, 3.1) and OLMo 2's output norm,
    Norm(x) with pre-norm and Gemma 2's sandwich (its input_layernorm). [n, d]"""
    if hp.norm_position in ("post", "output"):
        return x
    if hp.norm_position in ("pre", "sandwich"):
        return tr.rec(f"{path}.norm", normalise(x, block.get("norm", {}), hp))
    raise ValueError(f"unknown norm_position {hp.norm_position!r}")


def sublayer_output(
    x: Tensor, y: Tensor, block: dict[str, Any], hp: Hyper, tr: Trace, path: str
) -> Tensor:
    """Add & Norm, y the sublayer's output: post-norm Norm(x + y), pre-norm x + y; sandwich
    x + post_norm(y) (Gemma2DecoderLayer's post_attention_layernorm); output x + norm(y)
    (Olmo2DecoderLayer: residual + post_attention_layernorm(attn)). [n, d]"""
    if hp.norm_position == "sandwich":
        y = tr.rec(f"{path}.post_norm", normalise(y, block.get("post_norm", {}), hp))
    elif hp.norm_position == "output":
        y = tr.rec(f"{path}.norm", normalise(y, block.get("norm", {}), hp))
    residual = tr.rec(f"{path}.residual", x + y)
    if hp.norm_position == "post":
        return tr.rec(f"{path}.norm", normalise(residual, block.get("norm", {}), hp))
    return residual


def parallel_layer(
    x: Tensor,
    attn: dict[str, Any],
    ffn: dict[str, Any],
    mask: Tensor | None,
    hp: Hyper,
    tr: Trace,
    path: str,
) -> Tensor:
    """GPTNeoXLayer with use_parallel_residual: mlp(ln2(x)) + attention(ln1(x)) + x; with
    a shared norm (GPT-J's GPTJBlock) both read ln_1(x). No cross-attention. [n, d]"""
    if hp.norm_position != "pre":
        raise ValueError("parallel layers are pre-norm")
    ln1 = tr.rec(f"{path}.self_attn.norm", normalise(x, attn.get("norm", {}), hp))
    attn_out = multi_head_attention(ln1, ln1, attn, mask, hp, tr, f"{path}.self_attn")
    if hp.parallel == "shared":
        ln2 = ln1
    else:
        ln2 = tr.rec(f"{path}.ffn.norm", normalise(x, ffn.get("norm", {}), hp))
    mlp_out = ffn_sublayer(ln2, ffn, hp, tr, f"{path}.ffn")
    return tr.rec(f"{path}.ffn.residual", mlp_out + attn_out + x)


def layer_rope(hp: Hyper, n: int) -> Hyper:
    """hp as decoder layer n computes: its own RoPE base and scaling, with lists of them;
    no positions in its attention where its base is None (Cohere2's NoPE layers)."""
    if hp.layer_pe_bases is None or hp.layer_rope_scalings is None:
        return hp
    base = hp.layer_pe_bases[n]
    if base is None:
        return replace(hp, positional="none", rope_scaling=None)
    return replace(hp, pe_base=base, rope_scaling=hp.layer_rope_scalings[n])


def run_stack(
    name: str,
    x: Tensor,
    weights: dict[str, Any],
    n_layers: int,
    self_mask: Tensor | None,
    hp: Hyper,
    tr: Trace,
    memory: Tensor | None = None,
    cross_mask: Tensor | None = None,
    layer_masks: dict[int, Tensor] | None = None,
) -> Tensor:
    """N layers of self-attention, cross-attention (when `memory`, the encoder output, is
    given) and FFN, each with its Add & Norm; then the final norm when on. Layer n's
    self-attention reads layer_masks[n] where given (a sliding layer's), else `self_mask`.
    [n, d] -> [n, d]"""
    layers = weights[name]
    if len(layers) != n_layers:
        raise ValueError(f"weights.{name}: expected {n_layers} layers, found {len(layers)}")
    for n, layer in enumerate(layers):
        path = f"{name}.{n}"
        # a decoder layer's own RoPE (model.pe_base or rope_scaling a list)
        lhp = layer_rope(hp, n) if name == "decoder" else hp
        self_mask_n = (layer_masks or {}).get(n, self_mask)
        attn, ffn = layer["self_attn"], layer["ffn"]
        if lhp.parallel != "none":
            x = parallel_layer(x, attn, ffn, self_mask_n, lhp, tr, path)
            continue
        h = sublayer_input(x, attn, lhp, tr, f"{path}.self_attn")
        y = multi_head_attention(h, h, attn, self_mask_n, lhp, tr, f"{path}.self_attn")
        x = sublayer_output(x, y, attn, lhp, tr, f"{path}.self_attn")
        if memory is not None:  # queries from the decoder, keys and values from the encoder output
            cross = layer["cross_attn"]
            h = sublayer_input(x, cross, lhp, tr, f"{path}.cross_attn")
            y = multi_head_attention(h, memory, cross, cross_mask, lhp, tr, f"{path}.cross_attn")
            x = sublayer_output(x, y, cross, lhp, tr, f"{path}.cross_attn")
        h = sublayer_input(x, ffn, lhp, tr, f"{path}.ffn")
        y = ffn_sublayer(h, ffn, lhp, tr, f"{path}.ffn")
        x = sublayer_output(x, y, ffn, lhp, tr, f"{path}.ffn")
    if hp.final_norm:
        x = tr.rec(f"{name}.final_norm", normalise(x, weights.get(f"{name}_final_norm", {}), hp))
    return tr.rec(f"{name}.output", x)


# ---------------------------------------------------------------- inputs and outputs


def token_list(sequence: Any) -> list[str] | None:
    """A token list or a whitespace-separated string as token names; None for a numeric matrix."""
    if isinstance(sequence, str):
        return sequence.split()
    if all(isinstance(row, list) for row in sequence):
        return None
    return [str(token) for token in sequence]


def embed_sequence(
    name: str, sequence: Any, cfg: dict[str, Any], hp: Hyper, tr: Trace
) -> tuple[Tensor, list[bool]]:
    """Embedding lookup (or the given numeric matrix) x embed_scale + positions (paper 3.4, 3.5).
    Returns what layer 0 sees [n, d_model] (with embed_norm: the input normalised, as
    BERT's embedding LayerNorm) and which positions hold the pad token."""
    tokens = token_list(sequence)
    if tokens is None:
        embed = tensor(sequence)
        is_pad = [False] * embed.shape[0]
    else:
        table = {str(token): vector for token, vector in cfg.get("embeddings", {}).items()}
        embed = torch.stack([param(table, token, (hp.d_model,)) for token in tokens])
        pad = (cfg.get("tokens") or {}).get("pad")
        is_pad = [pad is not None and token == str(pad) for token in tokens]
    tr.rec(f"{name}.embed", embed)
    x = embed * hp.embed_scale
    length = embed.shape[0]
    if hp.positional == "sinusoidal":
        x = x + tr.rec(f"{name}.pe", sinusoidal(length, hp.d_model, hp.pe_base))
    elif hp.positional == "learned":  # rows 0..L-1 of the table both stacks share
        x = x + tr.rec(f"{name}.pe", tensor(cfg["weights"]["positional"])[:length])
    elif hp.positional not in (
        "none",
        "relative",
        "alibi",
        "rope",
    ):  # the others act in self-attention
        raise NotImplementedError(f"positional {hp.positional!r} is not in the reference")
    if hp.token_types:  # BERT's segment embedding: row type_i of the table (default type 0)
        sequence_name = "source" if name == "encoder" else "target"
        types = cfg.get(f"{sequence_name}_types", [0] * length)
        x = x + tr.rec(f"{name}.token_type", tensor(cfg["weights"]["token_types"])[types])
    x = tr.rec(f"{name}.input", x)
    if hp.embed_norm:
        norm = cfg.get("weights", {}).get(f"{name}_embed_norm", {})
        x = tr.rec(f"{name}.embed_norm", normalise(x, norm, hp))
    return x, is_pad


def output_weight(cfg: dict[str, Any], hp: Hyper) -> Tensor:
    """output.W, or with tied embeddings the unscaled embedding table of the vocab,
    transposed (weight tying, as in the paper 3.4). [d_model, V]"""
    if cfg["model"].get("tie_embeddings", False):
        table = {str(token): vector for token, vector in cfg["embeddings"].items()}
        return torch.stack([param(table, str(token), (hp.d_model,)) for token in cfg["vocab"]]).T
    return param(cfg["weights"]["output"], "W", (hp.d_model, len(cfg["vocab"])))


def reference_forward(cfg: dict[str, Any]) -> dict[str, np.ndarray]:
    """Run the model `cfg` describes (SPEC section 2 format, every array given) and return
    every step under its SPEC section 3 path, as float64 numpy arrays in execution order."""
    hp = hyper(cfg["model"])
    if hp.encoder_layers == 0 and hp.decoder_layers == 0:
        raise ValueError("a model needs at least one encoder or decoder layer")
    weights = cfg.get("weights", {})
    tr = Trace()
    last: Tensor
    memory: Tensor | None = None
    source_pads: list[bool] = []
    if hp.encoder_layers > 0:
        x, source_pads = embed_sequence("encoder", cfg["source"], cfg, hp, tr)
        n_src = len(source_pads)
        enc_mask = None
        if any(source_pads):
            enc_mask = tr.rec("encoder.mask", additive_mask(n_src, source_pads, causal=False))
        memory = last = run_stack("encoder", x, weights, hp.encoder_layers, enc_mask, hp, tr)
    if hp.decoder_layers > 0:
        bos = (cfg.get("tokens") or {}).get("bos")
        y, target_pads = embed_sequence("decoder", cfg.get("target", [bos]), cfg, hp, tr)
        n_tgt = len(target_pads)
        # a list of windows: decoder.mask is the full-attention layers' when they differ
        # (the list's one window when they do not), and each sliding layer has its own
        windows = hp.layer_windows or ()
        shared = windows[0] if len(set(windows)) == 1 else hp.window
        dec_mask = tr.rec("decoder.mask", additive_mask(n_tgt, target_pads, True, shared))
        cross_mask = None
        if memory is not None and any(source_pads):
            cross_mask = tr.rec(
                "decoder.cross_mask", additive_mask(n_tgt, source_pads, causal=False)
            )
        layer_masks: dict[int, Tensor] = {}
        if len(set(windows)) > 1:
            for n, w in enumerate(windows):
                if w:
                    layer_masks[n] = tr.rec(
                        f"decoder.{n}.self_attn.mask", additive_mask(n_tgt, target_pads, True, w)
                    )
        last = run_stack(
            "decoder",
            y,
            weights,
            hp.decoder_layers,
            dec_mask,
            hp,
            tr,
            memory,
            cross_mask,
            layer_masks,
        )
    if "vocab" in cfg:
        output = weights.get("output", {})
        b = param(output, "b", (len(cfg["vocab"]),), 0.0)
        logits = last @ output_weight(cfg, hp) + b  # [n, V]
        if hp.logit_softcap is not None or hp.logit_scale is not None:
            logits = tr.rec("logits_raw", logits)
        if hp.logit_scale is not None:  # CohereForCausalLM's logit_scale
            logits = logits * float(hp.logit_scale)
        if hp.logit_softcap is not None:  # Gemma2ForCausalLM's final_logit_softcapping
            c = float(hp.logit_softcap)
            logits = torch.tanh(logits / c) * c
        logits = tr.rec("logits", logits)
        tr.rec("probs", torch.softmax(logits, dim=-1))
    return {path: value.numpy() for path, value in tr.steps.items()}
