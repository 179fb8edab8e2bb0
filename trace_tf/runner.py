"""From a loaded config to a trace: which parts run for which command, the
conventions in force, and the `expect` checks. No printing here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from trace_tf import model, ops
from trace_tf.calc import attention_labels, op_arrays, run_op
from trace_tf.config import (
    OP_COMMANDS,
    ROPE_PAIRS,
    TIED_OUTPUT,
    Config,
    Document,
    ModelConfig,
    OpConfig,
    Source,
    build,
)
from trace_tf.errors import InputError, quoted, suggest_path
from trace_tf.text import counted, exact, shape_text, spaced
from trace_tf.trace import Shown, Step, Trace, Tracer

COMMANDS = ("encode", "decode", "full")
# model.parallel's layers, as the header says them
PARALLEL_TEXT = {
    "separate": "each layer x + self_attn(Norm₁(x)) + ffn(Norm₂(x)), both sublayers reading its "
    "input, each through its own norm (GPT-NeoX's use_parallel_residual), summed in ffn.residual",
    "shared": "each layer x + self_attn(Norm(x)) + ffn(Norm(x)), both sublayers reading its "
    "input through one norm, self_attn.norm (GPT-J, Phi, Falcon), summed in ffn.residual",
}
_Axis = tuple[str, ...] | None  # an axis's labels (a Step's rows or cols)


def named_arrays(cfg: Config | OpConfig) -> dict[str, np.ndarray]:
    """Every weight or given array a step can name as an input."""
    if isinstance(cfg, OpConfig):
        return op_arrays(cfg.kind, cfg.params)
    arrays = cfg.named_arrays()
    if cfg.model.tie_embeddings:
        arrays[TIED_OUTPUT] = model.output_weights(cfg)[0]
    return arrays


def input_steps(cfg: Config | OpConfig) -> dict[str, Step]:
    """The arrays of `named_arrays` as steps to show beside those computed from them,
    labelled where an axis has a meaning, as the steps made from them are: the output
    weight's columns by the vocabulary (as the logits'), a relative bias table's
    entries by their offset j − i, an attention's Q rows and K, V rows by q0.., k0...
    A weight is titled with where it came from (Config.sources)."""
    labels: dict[str, tuple[_Axis, _Axis]] = {}
    if isinstance(cfg, OpConfig):
        if cfg.kind == "attention":
            q, k = attention_labels(cfg.params)
            labels = {"Q": (q, None), "K": (k, None), "V": (k, None), "mask": (q, k)}
    else:
        labels = {"weights.output.W": (None, cfg.vocab), TIED_OUTPUT: (None, cfg.vocab)}
    out: dict[str, Step] = {}
    for name, value in named_arrays(cfg).items():
        rows, cols = labels.get(name, (None, None))
        if name.endswith(".rel_bias") and value.ndim == 1:
            reach = ops.offset_zero(value)  # max_len − 1
            cols = tuple(f"{o:+d}" if o else "0" for o in range(-reach, reach + 1))
        what = "given" if isinstance(cfg, OpConfig) else _weight_title(cfg, name)
        out[name] = Step(name, what, value, rows=rows, cols=cols)
    return out


def inputs_of(
    steps: Sequence[Step], lookup: Mapping[str, Step], weights: Mapping[str, Step]
) -> list[Step]:
    """The inputs `steps` were computed from that are not among them, each once, in the
    order the steps name them: earlier steps (in `lookup`) and weights or given arrays
    (`weights`: input_steps). What `step --inputs` writes beside the steps."""
    seen = {s.path for s in steps}
    out = []
    for s in steps:
        for name in s.inputs:
            given = lookup[name] if name in lookup else weights.get(name)
            if name not in seen and given is not None:
                seen.add(name)
                out.append(given)
    return out


def _weight_title(cfg: Config, name: str) -> str:
    """'weight (where it came from)': an input step's title (Config.sources)."""
    src = cfg.sources.get(name)
    return "weight" + (f" ({src.text})" if src is not None else "")


def weights(cfg: Config) -> list[tuple[str, tuple[int, ...], Source]]:
    """Every weight the engine reads, by key path: its shape and where it came from."""
    return [(k, v.shape, cfg.sources[k]) for k, v in named_arrays(cfg).items()]


def run(
    cfg: Config | OpConfig,
    command: str = "full",
    keep: Callable[[str], bool] | None = None,
    with_inputs: bool = False,
    part: Callable[[np.ndarray], np.ndarray | Shown] | None = None,
) -> Trace:
    """Trace what `command` computes: encode, decode, or everything the config holds.

    `keep`: store only the steps it accepts (and, `with_inputs`, what they were made from).
    `part`: store only this of each (what its table shows: render.View.part).
    numpy's own overflow and invalid-value warnings are silenced: the tracer reports
    the step where a NaN or infinity first appears instead (trace.warnings)."""
    tr = Tracer(keep=keep, with_inputs=with_inputs, part=part)
    tr.trace.warnings.extend(cfg.notes)  # given numbers stored with fewer digits: first
    with np.errstate(all="ignore"):
        if isinstance(cfg, OpConfig):
            run_op(cfg, tr)
            return tr.trace
        tr.name_all(cfg.named_arrays())
        if command == "encode":
            model.run_encode(cfg, tr)
        elif command == "decode":
            model.run_decode(cfg, tr)
        else:
            model.run_full(cfg, tr)
    return tr.trace


def require_model(cfg: Config | OpConfig, command: str) -> Config:
    if isinstance(cfg, OpConfig):
        raise InputError(
            f"{command} needs a model config, and this file holds a single {cfg.kind} "
            f"operation (trace-tf {OP_COMMANDS[cfg.kind]} runs this file)",
            file=cfg.file,
            expected="a config with a 'model:' section",
            found=f"'{cfg.kind}:'",
        )
    return cfg


def rope_text(m: ModelConfig) -> str:
    """RoPE as the header says it: its pairs and frequencies, over d_k or, with rope_dims
    r (partial rotary), over the r columns it turns, and any scaling of them; with a RoPE
    by layer (model.pe_base or model.rope_scaling a list), each layer's base and scaling."""
    over = "r" if m.rope_dims else "d_k"
    kept = m.rope_dims < m.d_k
    if m.mixed_rope:
        base, turned = ", base and scaling by layer", "pos · θ_i"
    else:
        base = f", base {exact(m.pe_base)}"
        turned = f"pos · {exact(m.pe_base)}^(−2i/{over})" if m.rope_scaling is None else "pos · θ_i"
    return (
        f"RoPE on q and k in self-attention{base}: pair "
        f"{ROPE_PAIRS[m.rope_pairs].replace('d_k', over)} turned by {turned} radians"
        + (" (halves: Hugging Face's rotate_half)" if m.rope_pairs == "halves" else "")
        + (
            f"; partial rotary: the first r = rope_dims {m.rope_dims} columns of each head's "
            f"{m.d_k} turned, pairs and frequencies counted over r"
            + (f", columns {m.rope_dims}..{m.d_k - 1} kept as they are" if kept else "")
            if m.rope_dims
            else ""
        )
        + ("; odd d_k: the last column is not turned" if m.rotary_dims % 2 else "")
        + (rope_layers_text(m, over) if m.mixed_rope else scaling_text(m, over))
    )


def scaling_text(m: ModelConfig, over: str) -> str:
    """`; θ_i = 10000^(−2i/d_k) scaled, linear ...`: the RoPE scaling `m` has, if any."""
    if m.rope_scaling is None:
        return ""
    return f"; θ_i = {exact(m.pe_base)}^(−2i/{over}) scaled, " + model.rope_scaling_text(
        m.rope_scaling, m.rotary_dims, m.pe_base
    )


def rope_layers_text(m: ModelConfig, over: str) -> str:
    """`; θ_i = base^(−2i/d_k), by layer (...): base 10000 in layers 0, 1; base 1000000
    scaled, linear ... in layer 2`: each decoder layer's base and scaling (model.pe_base.<l>,
    model.rope_scaling.<l>), the layers of the same RoPE together (Gemma 3's local and
    global ones)."""
    layers: dict[tuple[float | None, ops.RopeScaling | None], list[int]] = {}
    for l, key in enumerate(zip(m.layer_pe_bases, m.layer_rope_scalings, strict=True)):
        layers.setdefault(key, []).append(l)
    said = []
    for (base, scaling), ls in layers.items():
        where = f" in {'layer' if len(ls) == 1 else 'layers'} " + ", ".join(map(str, ls))
        if base is None:  # (model.pe_base.<l> null: Cohere 2's full layers)
            said.append("no RoPE (model.pe_base.<l> null: q and k as projected)" + where)
            continue
        scaled = ""
        if scaling is not None:
            scaled = " scaled, " + model.rope_scaling_text(scaling, m.rotary_dims, base)
        said.append(f"base {exact(base)}{scaled}{where}")
    by = "by layer (model.pe_base.<l>, model.rope_scaling.<l>)"
    return f"; θ_i = base^(−2i/{over}), {by}: " + "; ".join(said)


# model.norm's formula, as the header's norm row and QK-norm's row state it
NORM_TEXT = {"layer": "LayerNorm (x−mean)/√(var+ε)·γ+β", "rms": "RMSNorm x/√(mean(x²)+ε)·γ+β"}


def conventions(cfg: Config | OpConfig) -> list[tuple[str, str]]:
    """Every convention behind the numbers, stated (the README explains each)."""
    if isinstance(cfg, OpConfig):
        p = cfg.params
        if cfg.kind == "attention":
            masked = isinstance(p["mask"], np.ndarray)
            cap = p.get("softcap")
            return [
                (
                    "operation",
                    "attention: softmax(("
                    + ("S / scale" if cap is None else "c · tanh((S / scale) / c)")
                    + (" + M" if masked else "")
                    + ") / T) V, row softmax, stable",
                ),
                ("score", score_text(str(p["score"]), p["W_a_q"].shape[1] if "W_a_q" in p else 0)),
                ("scale", str(p["scale_text"])),
                *(
                    [("soft cap", softcap_text(cap, "S_c", "(S / scale)") + ", before M")]
                    if cap
                    else []
                ),
                (
                    "temperature",
                    f"{exact(p['temperature'])} (divides the scaled scores inside the softmax only)",
                ),
                (
                    "mask",
                    "M (attention.mask), added to the scaled scores: 0 may look, −inf may not, "
                    "another number is a bias"
                    if masked
                    else "none",
                ),
            ]
        if cfg.kind == "norm":
            from trace_tf.calc import NORM_AXES, norm_axes_text

            return [
                ("operation", f"{p['kind']} norm over {NORM_AXES[str(p['kind'])][1]}"),
                ("axes", norm_axes_text(str(p["kind"]), p["x"].shape)),
                (
                    "eps",
                    f"{exact(p['eps'])}, inside the square root"
                    + ("" if p["kind"] == "rms" else "; biased variance"),
                ),
            ]
        if p["kind"] == "rope":
            scaling, d = p.get("rope_scaling"), int(p["d_model"])
            r = int(p.get("rope_dims") or d)
            over = "d" if r == d else f"r, r = rope_dims {r} of d {d} (columns {r}.. not turned)"
            frequency = f"{exact(p['base'])}^(−2i/{over})" + (", scaled (below)" if scaling else "")
            rows = [
                (
                    "operation",
                    f"RoPE rotation angles θ[pos,i] = pos · {frequency} in radians: "
                    "pair i of q and k turns by θ, columns (2i, 2i+1), or "
                    f"(i, i+{'d' if r == d else 'r'}/2) with model.rope_pairs: halves",
                )
            ]
            if scaling is not None:
                base = float(p["base"])
                rows.append(("rope scaling", model.rope_scaling_text(scaling, r, base)))
            return rows
        return [("operation", f"{p['kind']} positional encoding, base {exact(p['base'])}")]
    m = cfg.model
    norm_kind = NORM_TEXT[m.norm] + (", biased var" if m.norm == "layer" else "")
    masks = []
    if m.decoder_layers:
        masks.append("decoder self-attention causal" + window_text(m))
    if cfg.tokens.pad is not None:  # ("" is a token too)
        masks.append(f"pad token {quoted(cfg.tokens.pad)} masked as a key")
    pos = {
        "sinusoidal": f"sinusoidal, added to the embeddings, base {exact(m.pe_base)}",
        "learned": f"learned table weights.positional ({counted(m.max_len, 'row')}), added",
        "rope": rope_text(m),
        "relative": "relative bias B[i,j] = b_rel[j − i] added to the scaled scores, "
        "its own table per layer and head (rel_bias), self-attention only, offsets "
        f"±{m.max_len - 1} (max_len − 1)",
        "alibi": "ALiBi (Press et al. 2022), fixed, no weights: B[i,j] = −m_h·(i − j) added "
        "to the scaled scores in causal (decoder) self-attention, −m_h·|i − j| in the "
        "bidirectional encoder's (MosaicBERT's symmetric form), none in cross-attention; "
        f"slopes m_h {model.alibi_rule(m)}: {spaced([exact(x) for x in model.alibi_slopes(m)])}",
        "none": "none",
    }[m.positional]
    drawn = _summarize(cfg.drawn)
    rows = [
        (
            "model",
            f"d_model {m.d_model}, {heads_text(m)} of d_k {m.d_k} / d_v {m.d_v}, d_ff {m.d_ff}, "
            f"{m.encoder_layers} encoder + {m.decoder_layers} decoder layer(s)"
            + (f"; parallel: {PARALLEL_TEXT[m.parallel]}" if m.parallel != "none" else ""),
        ),
        (
            "norm",
            f"{m.norm_position}-norm{NORM_POSITION_TEXT.get(m.norm_position, '')}, {norm_kind}, "
            f"ε = {exact(m.norm_eps)}"
            + (", embedding norm on" if m.embed_norm else "")
            + (", final norm on" if m.final_norm else ""),
        ),
        *([("qk norm", qk_norm_text(m))] if m.qk_norm != "none" else []),
        (
            "attention",
            score_text(m.score, m.d_a)
            + "; scores / {}{}".format(*model.named(m.scale_text))
            + (f", softmax temperature {exact(m.temperature)}" if m.temperature != 1 else "")
            + "; stable row softmax",
        ),
        *([("soft caps", softcaps_text(m))] if m.attn_softcap or m.logit_softcap else []),
        *([("logit scale", logit_scale_text(m))] if m.logit_scale is not None else []),
        *([("sinks", SINKS_TEXT)] if m.attn_sinks else []),
        ("positions", pos),
        *([("token types", types_text(cfg))] if m.token_types else []),
        (
            "embeddings",
            f"scaled by {m.embed_scale_text}"
            + ("; output tied to the embeddings (unscaled)" if m.tie_embeddings else ""),
        ),
        (
            "activation",
            {
                "relu": "ReLU",
                "gelu": "GELU (exact, erf)",
                "gelu_tanh": "GELU (tanh approximation)",
                "silu": "SiLU, x σ(x)",
                "swiglu": "SwiGLU, gated: (SiLU(x W_1 + b_1) ⊙ (x W_3 + b_3)) W_2 + b_2",
                "geglu": "GeGLU, gated: (GELU(x W_1 + b_1) ⊙ (x W_3 + b_3)) W_2 + b_2, "
                "GELU exact (erf)",
                "geglu_tanh": "GeGLU, gated: (GELU(x W_1 + b_1) ⊙ (x W_3 + b_3)) W_2 + b_2, "
                "GELU tanh approximation",
                "swiglu_oss": "GPT-OSS's clamped SwiGLU, gated: ((clamp(x W_3 + b_3, "
                f"−{exact(m.swiglu_limit)}, {exact(m.swiglu_limit)}) + 1) ⊙ G σ("
                f"{exact(m.swiglu_alpha)} G)) W_2 + b_2, G = min(x W_1 + b_1, "
                f"{exact(m.swiglu_limit)}) (swiglu_limit {exact(m.swiglu_limit)}, "
                f"swiglu_alpha {exact(m.swiglu_alpha)})",
            }[m.activation],
        ),
        *([("experts", experts_text(m))] if m.experts else []),
        (
            "masks",
            "additive, 0 where attention may look, −inf where it may not: " + "; ".join(masks)
            if masks
            else "none",
        ),
        (
            "weights",
            (
                f"given in {cfg.weights_file} ({cfg.weights_file_arrays}); "
                if cfg.weights_file is not None
                else ""
            )
            + (
                f"drawn with seed {m.seed}, N(0, {exact(m.init_std)}²): {drawn}"
                if cfg.drawn
                else "none drawn"
            )
            + "; biases 0, γ 1, β 0 where not given",
        ),
        (
            "numbers",
            f"{m.dtype}"
            + (" (about 7 significant digits)" if m.dtype == "float32" else "")
            + "; rows are tokens (x W + b, row vectors)",
        ),
    ]
    if cfg.variant or cfg.overrides:
        variant = f"variant {quoted(cfg.variant)}; " if cfg.variant is not None else ""
        rows.append(("overrides", variant + "keys set: " + ", ".join(cfg.overrides)))
    return rows


# What the new placements do, after `sandwich-norm` / `output-norm` in the header's norm row
NORM_POSITION_TEXT = {
    "sandwich": " (each sublayer x + Norm_post(F(Norm(x))): norm on its input, post_norm on "
    "its output)",
    "output": " (each sublayer x + Norm(F(x)): norm on its output, none on its input)",
}


def experts_text(m: ModelConfig) -> str:
    """A mixture of experts' conventions: the router, top-k and its ties, the weights."""
    k = m.experts_top_k
    if m.layer_experts:  # (model.experts a list: some layers dense, or of other numbers)
        each = ", ".join(
            f"layer {l} " + (f"{e} experts" if e else "dense (one FFN)")
            for l, e in enumerate(m.layer_experts)
        )
        mixture = f"by layer: {each}; a mixture's experts"
    else:
        mixture = f"mixture of {m.experts} experts"
    weights = (
        "their probabilities renormalised to sum to 1 (experts_normalize)"
        if m.experts_normalize
        else "their probabilities as they are, not renormalised (experts_normalize false)"
    )
    return (
        f"{mixture}, each an FFN of the activation above: router logits X W_r "
        f"(+ b_r where ffn.router_bias is given), softmax over the experts, each token sent to the {k} of largest "
        f"probability (ties: the lowest index), {weights}; out = Σ of the weight times each "
        "chosen expert's out, the experts in index order; an expert computes only its "
        "tokens' rows (e<e>.*), and one no token chose records nothing" + shared_text(m)
    )


def shared_text(m: ModelConfig) -> str:
    """A mixture's shared expert (model.shared_expert), after experts_text's conventions."""
    if m.shared_expert == "none":
        return ""
    added = (
        "g ⊙ its out added, g = σ(X w_g) a weight per token (shared.gate)"
        if m.shared_expert == "gated"
        else "its out added as it is (no gate)"
    )
    return (
        f"; a shared expert, an FFN of width {m.shared_expert_d_ff} (shared_expert_d_ff) on "
        f"every token (shared.*), {added} to the routed sum"
    )


def qk_norm_text(m: ModelConfig) -> str:
    """What QK-norm (model.qk_norm head or projection) computes, for the header."""
    rope = m.positional == "rope"
    if m.qk_norm == "projection":
        q, k = m.qk_norm_width
        return (
            f"over the whole projection, {NORM_TEXT[m.norm]}, ε = {exact(m.norm_eps)}, of each "
            f"row's n_heads·d_k = {q} entries of Q_raw = X W_q + b_q (all heads' columns) and "
            f"n_kv_heads·d_k = {k} of K_raw = X W_k + b_k, then split into heads"
            + ("; before RoPE" if rope else "")
            + f"; γ and β of {q} (q_norm) and {k} (k_norm) per block; in every attention "
            "block, cross-attention too"
        )
    return (
        f"per head {NORM_TEXT[m.norm]}, ε = {exact(m.norm_eps)}, of each row's d_k = {m.d_k} "
        "entries of Q_raw = X W_q + b_q and K_raw = X W_k + b_k"
        + (" (once per K/V head)" if m.grouped else "")
        + ("; before RoPE" if rope else "")
        + "; γ and β of d_k shared by every head of a block (its q_norm, k_norm); in every "
        "attention block, cross-attention too"
    )


def types_text(cfg: Config) -> str:
    """The token-type table and each sequence's types, for the header (model.token_types)."""
    m = cfg.model
    parts = [
        f"table weights.token_types ({counted(m.token_types, 'row')}): row type_i added to "
        "position i's embedding (BERT's token_type_embeddings)"
    ]
    for name, seq in (("source", cfg.source), ("target", cfg.target)):
        if seq is not None and seq.types is not None:
            parts.append(f"{name} types {spaced(seq.types)}")
    if m.decoder_layers:
        if cfg.target is None:
            parts.append("no target: [tokens.bos], type 0")
        parts.append("generate: a new token takes the type of the position before it")
    return "; ".join(parts)


def heads_text(m: ModelConfig) -> str:
    """`2 head(s)`; under grouped-query attention which K/V head each query head reads:
    `4 heads, 2 K/V heads (grouped: h0,h1 → kv0; h2,h3 → kv1)`."""
    if not m.grouped:
        return f"{m.n_heads} head(s)"
    if m.n_heads <= 8:
        groups = "; ".join(
            ",".join(f"h{h}" for h in range(j * m.group, (j + 1) * m.group)) + f" → kv{j}"
            for j in range(m.n_kv_heads)
        )
    else:  # too many to list: the rule
        groups = f"head h → K/V head h // {m.group}"
    return f"{m.n_heads} heads, {counted(m.n_kv_heads, 'K/V head')} (grouped: {groups})"


def window_text(m: ModelConfig) -> str:
    """The decoder's sliding window(s) (model.window), for the header's masks: one for every
    layer, or by layer (a list: Gemma 2's alternating sliding and full layers)."""
    if m.mixed_windows:
        by_layer = ", ".join(
            f"layer {l} " + (f"window {w}" if w else "full") for l, w in enumerate(m.layer_windows)
        )
        return (
            f"; sliding windows by layer: {by_layer} (a layer of window W: query i sees keys "
            "i − W < j ≤ i; its own mask decoder.<l>.self_attn.mask)"
        )
    if not m.window:
        return ""
    every = " in every layer" if m.layer_windows else ""
    return f", sliding window {m.window}{every}: query i sees keys i − {m.window} < j ≤ i"


# model.attn_sinks (GPT-OSS), for the header
SINKS_TEXT = (
    "each self-attention head's learned sink logit s_h joins every softmax row's denominator, "
    "A[i,j] = e^(S[i,j]/T) / (Σ_k e^(S[i,k]/T) + e^(s_h/T)), then is dropped: a row sums to "
    "1 − sink (step sink), a fully masked row gives all to the sink; m = max(row, s_h) "
    "subtracted; not in cross-attention"
)


def softcap_text(cap: float, capped: str, of: str) -> str:
    """One soft cap, `capped` = c · tanh(`of` / c) with c as given (Gemma 2's), for the header."""
    return f"{capped} = c · tanh({of} / c), c = {exact(cap)}, each in (−c, c)"


def logit_scale_text(m: ModelConfig) -> str:
    """model.logit_scale (Cohere's), for the header: the logits' multiplier, and its order
    beside a logit soft cap (the cap bounds the scaled logits)."""
    return f"logits = s · logits_raw (out W + b), s = {exact(m.logit_scale or 0)}" + (
        ", then soft-capped (soft caps)" if m.logit_softcap else ", what probs and generate read"
    )


def softcaps_text(m: ModelConfig) -> str:
    """model.attn_softcap and model.logit_softcap (Gemma 2, Grok-1), each on or off."""
    attn, logits = m.attn_softcap, m.logit_softcap
    return (
        "scores: "
        + (
            softcap_text(attn, "S_c", "(S / scale)")
            + " (step capped), before the position bias and the mask, in every attention block"
            if attn
            else "off"
        )
        + "; logits: "
        + (
            softcap_text(logits, "logits", "s · logits_raw" if m.logit_scale else "logits_raw")
            + ", what probs and generate read"
            if logits
            else "off"
        )
    )


def score_text(score: str, d_a: int) -> str:
    """The score function in words, for the conventions header."""
    return {
        "scaled_dot": "S = Q Kᵀ (scaled dot product)",
        "dot": "S = Q Kᵀ (dot product)",
        "additive": f"S[i,j] = v_aᵀ tanh(q_i W_a_q + k_j W_a_k) (additive, d_a {d_a})",
        "bilinear": "S = Q W_b Kᵀ (bilinear)",
        "gaussian": "S[i,j] = −½ Σ_f ((q_if − k_jf) w_f)² (Gaussian kernel)",
    }[score]


def _summarize(paths: Sequence[str], limit: int = 6) -> str:
    """A short list of drawn arrays, grouped by their kind."""
    groups: dict[str, int] = {}
    for p in paths:
        parts = p.split(".")
        key = (
            parts[0] if parts[0] in ("embeddings", "positional", "output") else ".".join(parts[:3])
        )
        groups[key] = groups.get(key, 0) + 1
    items = [f"{k} ({n})" if n > 1 else k for k, n in groups.items()]
    return ", ".join(items[:limit]) + (
        f", … {len(items) - limit} more" if len(items) > limit else ""
    )


@dataclass(frozen=True)
class DocumentError:
    """A number the document prints against what its own formula gives: the largest
    |printed - computed| and the cell where it is, with both values there."""

    max_abs_error: float
    atol: float  # the printed precision: within it the document would be right
    at: tuple[int, ...]
    printed: float
    computed: float
    cells_wrong: int  # cells off by more than atol
    cells: int


@dataclass(frozen=True)
class CheckResult:
    config: str
    step: str
    variant: str | None
    ok: bool
    max_abs_error: float | None  # None when the step is missing or the shape differs
    atol: float
    note: str
    problem: str = ""
    warnings: tuple[str, ...] = ()  # NaN or overflow in the run this entry was checked on
    rtol: float = 0.0
    document: DocumentError | None = None  # where the entry records a document's error


def abs_difference(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """|actual - expected| per cell; equal infinities and NaN against NaN count as 0,
    NaN against a number (or unequal infinities) as inf."""
    same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
    with np.errstate(invalid="ignore", over="ignore"):  # beyond float64 apart: inf
        diff = np.where(same, 0.0, np.abs(actual - expected))
    return np.where(np.isnan(diff), np.inf, diff)


def max_abs_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """Largest |actual - expected|, as abs_difference counts it."""
    diff = abs_difference(actual, expected)
    return float(diff.max()) if diff.size else 0.0


def within(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """Per cell: |actual - expected| <= atol + rtol * |expected| (numpy.isclose's rule,
    the expected value as reference). A non-finite value on either side is met only by
    the same value (an infinity or NaN never passes a finite expectation, however wide
    its tolerance); where the difference or the tolerance of two finite values lies
    beyond float64, both sides are compared halved (exact: they are that large)."""
    diff = abs_difference(actual, expected)
    finite = np.isfinite(actual) & np.isfinite(expected)
    scale = np.where(finite, np.abs(expected), 0.0)
    with np.errstate(over="ignore"):
        tol = atol + rtol * scale
        ok = np.where(finite, diff <= tol, diff == 0)
        big = finite & (np.isinf(diff) | np.isinf(tol))
        if big.any():
            a, e = actual[big] / 2, expected[big] / 2
            ok[big] = np.abs(a - e) <= atol / 2 + rtol * np.abs(e)
    return np.asarray(ok)


def document_error(actual: np.ndarray, printed: np.ndarray, atol: float) -> DocumentError:
    """How far the document's printed value is from the computed one, and where."""
    diff = abs_difference(actual, printed)
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    wrong = int((~within(actual, printed, atol, 0.0)).sum())
    return DocumentError(
        float(diff[at]), atol, at, float(printed[at]), float(actual[at]), wrong, diff.size
    )


def _unit_axes_apart(given: tuple[int, ...], step: tuple[int, ...]) -> bool:
    """Whether an expected value's shape is the step's with axes of length 1 left out
    (a vector given for a 1 x n or n x 1 step, a number for a 1 x 1 one): the same
    cells in the same order. A 2 x 2 step is not a vector of 4."""
    return len(given) < len(step) and [n for n in given if n != 1] == [n for n in step if n != 1]


def check(
    doc: Document, sets: Sequence[tuple[str, object]] = (), max_elements: int = 2**28
) -> list[CheckResult]:
    """Evaluate every `expect` entry of a document, each on its own variant. An entry
    with a `document` value that passes also checks that the document's number is wrong:
    it must differ from the result by more than `document_atol` in some cell, or the
    entry fails (a document error claimed where there is none). An entry that fails on
    its own value (a run varied by --set) judges no document error either way."""
    base = build(doc, sets, None, max_elements)
    results: list[CheckResult] = []
    # Each variant's run stores only the steps its entries check.
    checked: dict[str | None, set[str]] = {}
    for e in base.expect:
        checked.setdefault(e.variant, set()).add(e.step)
    configs: dict[str | None, Config | OpConfig] = {}
    traces: dict[str | None, Trace] = {}
    every: dict[str | None, list[str]] = {}  # a variant's every step (misspelt entries)
    for e in base.expect:
        if e.variant not in traces:
            cfg = base if e.variant is None else build(doc, sets, e.variant, max_elements)
            configs[e.variant] = cfg
            traces[e.variant] = run(cfg, "full", keep=checked[e.variant].__contains__)
        trace = traces[e.variant]
        warned = tuple(trace.warnings)
        entry = CheckResult(
            doc.file, e.step, e.variant, False, None, e.atol, e.note, "", warned, rtol=e.rtol
        )
        if e.step not in trace:
            # the nearest of every step, in the order computed (one run that stores none,
            # for every misspelt entry of the variant)
            if e.variant not in every:
                every[e.variant] = list(run(configs[e.variant], keep=lambda path: False).unstored)
            suggestion = suggest_path(e.step, every[e.variant])
            results.append(replace(entry, problem="no such step" + suggestion))
            continue
        actual = trace.value(e.step)
        expected, printed = e.value, e.document
        if expected.shape != actual.shape:
            if _unit_axes_apart(expected.shape, actual.shape):  # [a, b] for 1 x 2 or 2 x 1
                expected = expected.reshape(actual.shape)
                printed = None if printed is None else printed.reshape(actual.shape)
            else:
                problem = (
                    f"shape {shape_text(actual.shape, 'x')} but expected "
                    f"{shape_text(expected.shape, 'x')}"
                )
                results.append(replace(entry, problem=problem))
                continue
        ok = bool(within(actual, expected, e.atol, e.rtol).all())
        entry = replace(entry, ok=ok, max_abs_error=max_abs_error(actual, expected))
        # The result is the formula's only where the entry passes: a run varied by --set
        # (another scale, say) that misses the entry's value says nothing of the document.
        if printed is not None and ok:
            wrong = document_error(actual, printed, e.document_atol) if printed.size else None
            entry = replace(entry, document=wrong)
            if wrong is None or not wrong.cells_wrong:
                entry = replace(
                    entry,
                    ok=False,
                    problem="the document's value agrees with the result within "
                    f"document_atol {exact(e.document_atol)}: no document error to record",
                )
        results.append(entry)
    return results
