"""Every stage the engine records: its path(s), formula, shape and meaning, in one registry.

`trace-tf stages` prints this table, `explain` dispatches on it, and a test runs
several configs and checks that every recorded path matches exactly one entry, so
the registry cannot drift from what the engine records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

# Placeholders in path templates, as in SPEC section 3.
PLACEHOLDERS = {
    "<stack>": "(?:encoder|decoder)",
    "<l>": r"\d+",
    "<block>": "(?:self_attn|cross_attn)",
    "<sub>": "(?:self_attn|cross_attn|ffn)",
    "<n>": r"\d+",
}
_ITERATION = re.compile(r"^t\d+\.(?:b\d+\.)?")  # generate --trace: t<i>. (beam: t<i>.b<j>.)


@dataclass(frozen=True)
class Stage:
    """One kind of step: where it is recorded, how it is computed and what it means."""

    key: str  # unique in the registry
    paths: tuple[str, ...]  # path templates (placeholders above)
    formula: str
    shape: str
    meaning: str
    # What makes a config record it, when not every model does: completes
    # "stage 'x' exists, but this config does not record it (it appears ...)".
    appears: str = ""

    @property
    def name(self) -> str:
        """The last part of the path: what `--stage` selects."""
        return self.paths[0].rsplit(".", 1)[-1]

    @cached_property
    def _regex(self) -> re.Pattern[str]:
        alternatives = []
        for template in self.paths:
            pattern = re.escape(template)
            for placeholder, regex in PLACEHOLDERS.items():
                pattern = pattern.replace(re.escape(placeholder), regex)
            alternatives.append(pattern)
        return re.compile("^(?:" + "|".join(alternatives) + ")$")

    def matches(self, path: str) -> bool:
        return bool(self._regex.match(_ITERATION.sub("", path)))


_HEAD = "<stack>.<l>.<block>.h<n>"
_MOE = "with model.experts (a mixture of experts; a list's: in the layers of experts only)"
_BLOCK = "<stack>.<l>.<block>"  # model.qk_norm projection's steps: the block's, all heads'

STAGES: tuple[Stage, ...] = (
    Stage(
        "embed",
        ("<stack>.embed",),
        "E = embedding[token]  (a numeric sequence: the given matrix)",
        "L × d_model",
        "the tokens as vectors, before scaling and positions",
    ),
    Stage(
        "pe",
        ("<stack>.pe",),
        "PE[pos,2i] = sin(pos / base^(2i/d)), PE[pos,2i+1] = cos(…); learned: positional[pos]",
        "L × d_model",
        "where each token stands, added to its embedding (absent for relative, rope and none)",
        "with model.positional: sinusoidal, the default, or learned",
    ),
    Stage(
        "token_type",
        ("<stack>.token_type",),
        "T = token_types[type]  (each position's type: source_types, target_types; default 0)",
        "L × d_model",
        "the row of each position's token type (BERT's segment embedding), added to its embedding",
        "with model.token_types >= 1",
    ),
    Stage(
        "input",
        ("<stack>.input",),
        "X = E · embed_scale + PE + T",
        "L × d_model",
        "what layer 0 reads (with model.embed_norm: what embed_norm normalises for it); PE "
        "and T only where the model adds them",
    ),
    Stage(
        "embed_norm",
        ("<stack>.embed_norm",),
        "Norm(X)",
        "L × d_model",
        "the embeddings normalised before the first layer (BERT), what layer 0 reads",
        "with model.embed_norm: true",
    ),
    Stage(
        "mask",
        ("<stack>.mask", "decoder.<l>.self_attn.mask"),
        "M[i,j] = −inf where query i may not see key j (decoder: j > i, and j ≤ i − W under "
        "model.window W; pad keys), else 0",
        "L × L",
        "the additive mask of the self-attention; with model.window a list of different "
        "windows, <stack>.mask is the full-attention layers' and each sliding layer records "
        "its own in its self_attn",
        "in a decoder (causal), or with a tokens.pad token in the source",
    ),
    Stage(
        "cross_mask",
        ("decoder.cross_mask",),
        "M[i,j] = −inf where source key j is a pad, else 0",
        "L_tgt × L_src",
        "the additive mask of the cross-attention",
        "in an encoder-decoder model with a tokens.pad token in the source",
    ),
    Stage(
        "q_raw",
        (f"{_HEAD}.q_raw", f"{_BLOCK}.q_raw"),
        "X W_q + b_q  (qk_norm projection: the block's, every head's columns side by side, "
        "X [W_q,0 | … | W_q,H−1])",
        "L × d_k  (the block's: L × H·d_k)",
        "rope: the queries before their rotation; qk_norm: before their norm",
        "with model.positional: rope (self-attention; not a layer whose model.pe_base entry "
        "is null) or model.qk_norm: head (per head), or model.qk_norm: projection (the block's)",
    ),
    Stage(
        "k_raw",
        (f"{_HEAD}.k_raw", f"{_BLOCK}.k_raw"),
        "X W_k + b_k  (a KV-cached step: the new rows only; qk_norm projection: the block's, "
        "every K/V head's columns side by side)",
        "L × d_k  (the block's: L × H_kv·d_k)",
        "rope: the keys before their rotation; qk_norm: before their norm",
        "with model.positional: rope (self-attention; not a layer whose model.pe_base entry "
        "is null) or model.qk_norm: head (per head), or model.qk_norm: projection (the block's)",
    ),
    Stage(
        "q_norm",
        (f"{_HEAD}.q_norm", f"{_BLOCK}.q_norm"),
        "Norm(q_raw) over each row's d_k entries, γ and β of the block's q_norm (model.norm, "
        "model.norm_eps)  (qk_norm projection: over each row's H·d_k entries, every head's, "
        "γ and β of H·d_k)",
        "L_q × d_k  (the block's: L_q × H·d_k)",
        "QK-norm: the queries normalised before RoPE turns them (qk_norm head without RoPE: "
        "the norm is q itself; projection: each head's q is its columns)",
        "with model.qk_norm: head and model.positional: rope, in self-attention; with "
        "model.qk_norm: projection, in every attention block",
    ),
    Stage(
        "k_norm",
        (f"{_HEAD}.k_norm", f"{_BLOCK}.k_norm"),
        "Norm(k_raw) over each row's d_k entries, γ and β of the block's k_norm  (a KV-cached "
        "step: the new rows only; qk_norm projection: over each row's H_kv·d_k entries)",
        "L × d_k  (the block's: L × H_kv·d_k)",
        "QK-norm: the keys normalised before RoPE turns them, once per K/V head (qk_norm head "
        "without RoPE: the norm is k itself; projection: once per block, each K/V head's k "
        "its columns)",
        "with model.qk_norm: head and model.positional: rope, in self-attention; with "
        "model.qk_norm: projection, in every attention block (a cross-attention's once)",
    ),
    Stage(
        "q",
        (f"{_HEAD}.q",),
        "X W_q + b_q  (rope: RoPE(q_raw, pos), pair (2i, 2i+1), or (i, i+d_k/2) with rope_pairs "
        "halves, turned by pos · base^(−2i/d_k), or by pos · that frequency as the model's "
        "rope_scaling rescales it: linear, llama3 or yarn (model.pe_base or rope_scaling a "
        "list: the decoder layer's own base and scaling, a null base none: X W_q + b_q); with "
        "rope_dims r only columns "
        "0..r−1 turn, pairs and frequencies over r; qk_norm: Norm(q_raw), or "
        "RoPE(q_norm, pos); qk_norm projection: the head's columns of the block's q_norm, "
        "turned by RoPE)",
        "L_q × d_k",
        "what each position looks for (one head)",
    ),
    Stage(
        "k",
        (f"{_HEAD}.k",),
        "X W_k + b_k  (cross-attention: X = encoder.output; rope: rotated as q is, by the "
        "layer's RoPE; qk_norm: "
        "Norm(k_raw), or RoPE(k_norm, pos); qk_norm projection: the K/V head's columns of the "
        "block's k_norm, turned by RoPE)",
        "L_k × d_k",
        "what each position is found by (with model.n_kv_heads: its K/V head's, shared)",
    ),
    Stage(
        "v",
        (f"{_HEAD}.v",),
        "X W_v + b_v  (cross-attention: X = encoder.output)",
        "L_k × d_v",
        "what each position hands over when attended to (with model.n_kv_heads: shared)",
    ),
    Stage(
        "q_a",
        (f"{_HEAD}.q_a", "attn.q_a"),
        "Q W_a_q",
        "L_q × d_a",
        "score additive: the queries in the hidden layer",
        "with model.score: additive",
    ),
    Stage(
        "k_a",
        (f"{_HEAD}.k_a", "attn.k_a"),
        "K W_a_k",
        "L_k × d_a",
        "score additive: the keys in the hidden layer",
        "with model.score: additive",
    ),
    Stage(
        "tanh",
        (f"{_HEAD}.tanh", "attn.tanh"),
        "tanh(q_a[i] + k_a[j])",
        "L_q × L_k × d_a",
        "score additive: the hidden features of each query-key pair (003's one-layer MLP)",
        "with model.score: additive",
    ),
    Stage(
        "q_b",
        (f"{_HEAD}.q_b", "attn.q_b"),
        "Q W_b",
        "L_q × d_k",
        "score bilinear: the queries through W_b",
        "with model.score: bilinear",
    ),
    Stage(
        "scores",
        (f"{_HEAD}.scores", "attn.scores"),
        "S = Q Kᵀ (dot, scaled_dot) | v_aᵀ tanh(q W_a_q + k W_a_k) (additive) | "
        "Q W_b Kᵀ (bilinear) | −½ Σ_f ((q_f − k_f) w_f)² (gaussian)",
        "L_q × L_k",
        "how well each query matches each key",
    ),
    Stage(
        "scaled",
        (f"{_HEAD}.scaled", "attn.scaled"),
        "S / scale  (√d_k for scaled_dot; 1, i.e. unchanged, for the others unless given)",
        "L_q × L_k",
        "the scores brought to a size the softmax does not saturate on",
    ),
    Stage(
        "capped",
        (f"{_HEAD}.capped", "attn.capped"),
        "S_c = c · tanh((S / scale) / c)",
        "L_q × L_k",
        "the scaled scores soft-capped to (−c, c) (Gemma 2's), before the position bias "
        "and the mask",
        "with the model's attn_softcap (attend: softcap)",
    ),
    Stage(
        "rel_bias",
        ("<stack>.<l>.self_attn.h<n>.rel_bias",),
        "B[i,j] = b_rel[j − i] = rel_bias[max_len − 1 + j − i]; alibi: B[i,j] = −m·(i − j), "
        "the encoder's −m·|i − j|, m = 2^(−8(h+1)/H) or as given (alibi_slopes)  (a KV-cached "
        "row i: position start + i)",
        "L_q × L_k",
        "relative: the learned bias of each query-key offset j − i (000 §6.2); alibi: "
        "ALiBi's fixed linear penalty of the distance, one slope per head (no weights); "
        "constant along each diagonal",
        "with model.positional: relative or alibi",
    ),
    Stage(
        "biased",
        ("<stack>.<l>.self_attn.h<n>.biased",),
        "S / scale + B  (soft-capped: S_c + B)",
        "L_q × L_k",
        "relative, alibi: the scaled (and capped) scores with the position bias added, "
        "before the mask",
        "with model.positional: relative or alibi",
    ),
    Stage(
        "masked",
        (f"{_HEAD}.masked", "attn.masked"),
        "S / scale + M  (relative, alibi: S / scale + B + M; soft-capped: S_c for S / scale)",
        "L_q × L_k",
        "the scaled scores with the hidden keys at −inf (only when a mask applies)",
        "where a mask applies: in a decoder, or with a tokens.pad token in a sequence",
    ),
    Stage(
        "softmax",
        (f"{_HEAD}.softmax", "attn.softmax"),
        "A = softmax(row / T): e^((s_j − m)/T) / Σ_k e^((s_k − m)/T), m the row max  "
        "(attn_sinks: + e^((s_h − m)/T) in the denominator, m = max(row max, s_h))",
        "L_q × L_k",
        "attention weights: how much each query takes from each key; rows sum to 1 (with a "
        "sink, to 1 − sink)",
    ),
    Stage(
        "sink",
        ("<stack>.<l>.self_attn.h<n>.sink",),
        "e^((s_h − m)/T) / (Σ_k e^((s_k − m)/T) + e^((s_h − m)/T)) = 1 − Σ_j A[i,j]",
        "L_q × 1",
        "the weight each query row gave the head's sink logit s_h (GPT-OSS), attending to "
        "nothing; a fully masked row gives it 1",
        "with model.attn_sinks: true (self-attention)",
    ),
    Stage(
        "context",
        (f"{_HEAD}.context", "attn.context"),
        "A V",
        "L_q × d_v",
        "each query's weighted mix of the values: the head's output",
    ),
    Stage(
        "concat",
        ("<stack>.<l>.<block>.concat",),
        "[head_0 | … | head_H−1]",
        "L_q × H·d_v",
        "the heads' outputs side by side",
    ),
    Stage(
        "wo",
        ("<stack>.<l>.<block>.wo",),
        "concat W_o + b_o",
        "L_q × d_model",
        "the heads mixed back into d_model",
    ),
    Stage(
        "residual",
        ("<stack>.<l>.<sub>.residual",),
        "x + sublayer(x)  (pre-norm: x + sublayer(Norm(x)); sandwich: x + "
        "Norm_post(sublayer(Norm(x))); output: x + Norm(sublayer(x)); model.parallel: "
        "ffn.residual only, x + self_attn(Norm₁(x)) + ffn(Norm₂(x)), with shared one Norm)",
        "L × d_model",
        "the skip connection: the input plus what the sublayer adds (a parallel layer's: "
        "its input plus what both add, the layer's output)",
    ),
    Stage(
        "norm",
        ("<stack>.<l>.<sub>.norm",),
        "(x − mean) / √(var + ε) · γ + β  (RMSNorm: x / rms · γ + β)",
        "L × d_model",
        "post-norm: the sublayer's output, norm(residual); output: the norm of the "
        "sublayer's output, added by the residual; pre-norm, sandwich: what the sublayer "
        "reads (model.parallel shared: self_attn.norm only, which the FFN reads too)",
    ),
    Stage(
        "post_norm",
        ("<stack>.<l>.<sub>.post_norm",),
        "(y − mean) / √(var + ε) · γ + β  (RMSNorm: y / rms · γ + β), y the sublayer's output",
        "L × d_model",
        "sandwich: the norm of what the sublayer computed (Gemma 2's second norm in each "
        "sublayer), which the residual adds",
        "with model.norm_position: sandwich",
    ),
    Stage(
        "mean",
        (
            "<stack>.<l>.<sub>.norm.mean",
            "<stack>.<l>.<sub>.post_norm.mean",
            f"{_BLOCK}.q_norm.mean",
            f"{_BLOCK}.k_norm.mean",
            f"{_HEAD}.q_norm.mean",
            f"{_HEAD}.k_norm.mean",
            f"{_HEAD}.q.mean",
            f"{_HEAD}.k.mean",
            "<stack>.embed_norm.mean",
            "<stack>.final_norm.mean",
            "norm.mean",
        ),
        "mean over the normalised axis",
        "L × 1 (batch: 1 × d, instance: B × C × 1)",
        "the centre the norm subtracts: a row's features (layer), a column (batch)",
        "with model.norm: layer, the default",
    ),
    Stage(
        "var",
        (
            "<stack>.<l>.<sub>.norm.var",
            "<stack>.<l>.<sub>.post_norm.var",
            f"{_BLOCK}.q_norm.var",
            f"{_BLOCK}.k_norm.var",
            f"{_HEAD}.q_norm.var",
            f"{_HEAD}.k_norm.var",
            f"{_HEAD}.q.var",
            f"{_HEAD}.k.var",
            "<stack>.embed_norm.var",
            "<stack>.final_norm.var",
            "norm.var",
        ),
        "mean((x − mean)²) over the normalised axis (biased: ÷ n)",
        "L × 1 (batch: 1 × d, instance: B × C × 1)",
        "the spread the norm divides by (after ε and the square root)",
        "with model.norm: layer, the default",
    ),
    Stage(
        "rms",
        (
            "<stack>.<l>.<sub>.norm.rms",
            "<stack>.<l>.<sub>.post_norm.rms",
            f"{_BLOCK}.q_norm.rms",
            f"{_BLOCK}.k_norm.rms",
            f"{_HEAD}.q_norm.rms",
            f"{_HEAD}.k_norm.rms",
            f"{_HEAD}.q.rms",
            f"{_HEAD}.k.rms",
            "<stack>.embed_norm.rms",
            "<stack>.final_norm.rms",
            "norm.rms",
        ),
        "√(mean(x²) + ε)",
        "L × 1",
        "RMSNorm: the size each row is divided by",
        "with model.norm: rms",
    ),
    Stage(
        "centered",
        ("norm.centered",),
        "x − mean",
        "as x",
        "calculator: the values around their mean",
        "only in the norm calculator, trace-tf norm or a file with a norm: section; "
        "a model's norms record mean and var, or rms",
    ),
    Stage(
        "norm_out",
        ("norm.out",),
        "(x − mean) / √(var + ε) · γ + β  (rms: x / rms · γ + β)",
        "as x",
        "calculator: the normalised values",
    ),
    Stage(
        "router",
        ("<stack>.<l>.ffn.router",),
        "R = X W_r + b_r (b_r: ffn.router_bias, where given)",
        "L × E",
        "a mixture of experts' router: a logit per token (row) and expert (column, e0..)",
        _MOE,
    ),
    Stage(
        "route_prob",
        ("<stack>.<l>.ffn.route_prob",),
        "P = softmax(R) over the experts",
        "L × E",
        "each token's probability of each expert",
        _MOE,
    ),
    Stage(
        "routed",
        ("<stack>.<l>.ffn.routed",),
        "P[i,e] of the k experts of largest P[i,·], ties to the lowest index (divided by "
        "their sum with experts_normalize true), 0 for the others",
        "L × E",
        "each token's weight of each expert in its output: its k chosen experts' only",
        _MOE,
    ),
    Stage(
        "x",
        ("<stack>.<l>.ffn.e<n>.x",),
        "X_e = the rows of X routed to expert e",
        "L_e × d_model",
        "what expert e reads: the tokens whose k chosen experts include it (an expert no "
        "token chose records nothing)",
        _MOE,
    ),
    Stage(
        "hidden",
        ("<stack>.<l>.ffn.hidden", "<stack>.<l>.ffn.e<n>.hidden", "<stack>.<l>.ffn.shared.hidden"),
        "H = X W_1 + b_1",
        "L × d_ff",
        "the feed-forward layer's widened features",
    ),
    Stage(
        "gate_clamp",
        (
            "<stack>.<l>.ffn.gate_clamp",
            "<stack>.<l>.ffn.e<n>.gate_clamp",
            "<stack>.<l>.ffn.shared.gate_clamp",
        ),
        "G = min(H, limit)",
        "L × d_ff",
        "GPT-OSS's gate, clamped from above at the model key swiglu_limit (default 7)",
        "with model.activation: swiglu_oss",
    ),
    Stage(
        "act",
        ("<stack>.<l>.ffn.act", "<stack>.<l>.ffn.e<n>.act", "<stack>.<l>.ffn.shared.act"),
        "ReLU(H) = max(0, H)  |  GELU(H) = H Φ(H)  |  GELU tanh approximation  |  SiLU(H) = H σ(H)"
        "  |  swiglu_oss: G σ(α G)",
        "L × d_ff",
        "the non-linearity (of a gated FFN: its gate, SiLU for swiglu, GELU for geglu, "
        "GELU tanh approximation for geglu_tanh, Swish of gain α = the model key swiglu_alpha "
        "(default 1.702) of the clamped gate for swiglu_oss)",
    ),
    Stage(
        "up",
        ("<stack>.<l>.ffn.up", "<stack>.<l>.ffn.e<n>.up", "<stack>.<l>.ffn.shared.up"),
        "U = X W_3 + b_3",
        "L × d_ff",
        "a gated FFN's up projection, the features the gate scales",
        "with model.activation: swiglu, geglu, geglu_tanh or swiglu_oss",
    ),
    Stage(
        "up_clamp",
        (
            "<stack>.<l>.ffn.up_clamp",
            "<stack>.<l>.ffn.e<n>.up_clamp",
            "<stack>.<l>.ffn.shared.up_clamp",
        ),
        "U' = clamp(U, −limit, limit) + 1",
        "L × d_ff",
        "GPT-OSS's up projection clamped to [−limit, limit], limit the model key "
        "swiglu_limit (default 7), plus 1",
        "with model.activation: swiglu_oss",
    ),
    Stage(
        "gated",
        ("<stack>.<l>.ffn.gated", "<stack>.<l>.ffn.e<n>.gated", "<stack>.<l>.ffn.shared.gated"),
        "act ⊙ U  (swiglu_oss: act ⊙ U')",
        "L × d_ff",
        "a gated FFN's gate times its up projection, entry by entry",
        "with model.activation: swiglu, geglu, geglu_tanh or swiglu_oss",
    ),
    Stage(
        "out",
        ("<stack>.<l>.ffn.out", "<stack>.<l>.ffn.e<n>.out", "<stack>.<l>.ffn.shared.out"),
        "act W_2 + b_2  (gated: gated W_2 + b_2); a mixture of experts' ffn.out: Σ_e "
        "routed[i,e] · e<e>.out (+ shared.gate ⊙ shared.out, or + shared.out)",
        "L × d_model",
        "the feed-forward output, back in d_model (an expert's: of its L_e tokens' rows; "
        "the shared expert's, ffn.shared.out, of every token)",
    ),
    Stage(
        "gate",
        ("<stack>.<l>.ffn.shared.gate",),
        "g = σ(X w_g)  (w_g: the weight shared_gate)",
        "L × 1",
        "a gated shared expert's weight of each token (Qwen2-MoE's): ffn.out adds g ⊙ "
        "shared.out to the routed sum",
        "with model.shared_expert: gated",
    ),
    Stage(
        "final_norm",
        ("<stack>.final_norm",),
        "Norm(x)",
        "L × d_model",
        "the last norm of a stack (on by default for pre-norm, sandwich and output)",
        "with model.norm_position: pre, sandwich or output, or model.final_norm: true",
    ),
    Stage(
        "output",
        ("<stack>.output",),
        "the last layer's output (after the final norm, if any)",
        "L × d_model",
        "what the stack hands on; cross-attention reads encoder.output",
    ),
    Stage(
        "logits_raw",
        ("logits_raw",),
        "out W + b  (tied: W = embeddingsᵀ)",
        "L × V",
        "the logits before their soft cap or scale",
        "with the model's logit_softcap or logit_scale",
    ),
    Stage(
        "logits",
        ("logits",),
        "out W + b  (tied: W = embeddingsᵀ); soft-capped: c · tanh(logits_raw / c); scaled: "
        "s · logits_raw; both: c · tanh(s · logits_raw / c)",
        "L × V",
        "a score for every vocabulary word, at every position: what probs and generate read",
    ),
    Stage(
        "probs",
        ("probs",),
        "P = softmax(logits)",
        "L × V",
        "the next-token distribution",
    ),
    Stage(
        "pe_table",
        ("pe",),
        "sinusoidal: PE[pos,2i] = sin(pos / base^(2i/d)), PE[pos,2i+1] = cos(…); "
        "rope: θ[pos,i] = pos · base^(−2i/d)",
        "L × d  (rope: L × d/2)",
        "calculator: the positional encoding, or RoPE's rotation angles",
    ),
)

# What each group of SPEC section 3 selects (trace.GROUPS holds the predicates).
GROUP_MEANINGS = {
    "qkv": "q, k, v of every head (and q_raw, k_raw with rope or qk_norm; q_norm, k_norm and "
    "the statistics of QK-norm with qk_norm, the block's with qk_norm projection)",
    "add_norm": "residual, norm and post_norm, with the norms' mean, var or rms; embed_norm and "
    "final_norm; all of `norm`'s steps",
    "ffn": "everything under <stack>.<l>.ffn",
    "cross": "everything under decoder.<l>.cross_attn",
    "attention": "everything under self_attn, cross_attn and attn, and the masks",
}


def stage_of(path: str) -> Stage | None:
    """The registry entry a recorded path belongs to."""
    return next((s for s in STAGES if s.matches(path)), None)
