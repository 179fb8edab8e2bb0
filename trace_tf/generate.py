"""Autoregressive decoding over model.py: greedy, sampling and beam search, with a KV cache.

The encoder runs once. Each iteration runs the decoder on the prefix under the
causal mask (section 3.2.3 of the paper: the decoder sees every token produced so
far and cross-attends to the encoder output) and turns the last row of the
logits into the next token. With the KV cache (`model.KVCache`), an iteration
feeds only the tokens the cache has not seen, so it computes one new row per
layer and attends it over the cached keys and values; without it, the whole
prefix is recomputed, as `decode` would. Both use the same functions of
model.py, so they give the same numbers.

The decoding rules (SPEC section 4, stated here once):

- greedy: the most probable token; a tie goes to the earlier vocabulary entry.
- sample: softmax(logits / T); then top-k (the k most probable, ties to the
  earlier vocabulary entry); then top-p over what is left, as it is (sort by
  probability, keep the smallest prefix whose total reaches p, the token that
  crosses p included); then renormalise, once (SPEC section 4's order: where
  top-k keeps less than p, top-p keeps all it kept; Hugging Face and vLLM
  renormalise before top-p instead, which differs only when both are given).
  One generator for the whole run, `numpy.random.default_rng(seed)`; each
  iteration draws u = rng.random() and takes the first token, in vocabulary
  order, whose cumulative probability exceeds u x (the total).
- beam (Jurafsky & Martin, 3rd ed., section 10.4): every extension of every
  live beam is ranked by its cumulative log-probability (ties: the earlier
  beam, then the earlier vocabulary entry); the best `slots` are kept, with
  slots = width - finished; a kept extension that ends in eos is set aside as
  finished, so the beam narrows by one. The search ends when the beam is empty
  or at --max-tokens. The result is the hypothesis with the best score
  logP / ((5 + n) / 6)^alpha (Wu et al. 2016, n = its produced tokens, eos
  included; alpha = --length-penalty, default 0: plain logP) among the finished
  ones and, when the search stops at --max-tokens, the live beams cut there
  (unfinished; fairseq and Hugging Face count them too), so a search never
  returns a worse sequence than one it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from trace_tf import model, ops
from trace_tf.config import (
    BOUNDED_POSITIONAL,
    Config,
    Low,
    Sequence_,
    below_normal,
    option_number,
    outside_float32,
    trace_size,
    within_float64,
)
from trace_tf.errors import InputError, InputNote, quoted
from trace_tf.model import KVCache
from trace_tf.text import exact, typed
from trace_tf.trace import NULL_TRACER, Tracer

Array = np.ndarray

STRATEGIES = ("greedy", "sample", "beam")


# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """How to decode: the strategy and its parameters, the limit, the cache."""

    strategy: str = "greedy"  # greedy | sample | beam
    max_tokens: int = 20  # produced tokens, eos included
    temperature: float = 1.0  # sample
    top_k: int | None = None  # sample
    top_p: float | None = None  # sample
    seed: int = 0  # sample
    width: int = 1  # beam
    length_penalty: float = 0.0  # beam: alpha of ((5 + n) / 6)^alpha
    cache: bool = True
    unused: tuple[str, ...] = ()  # what was given for another strategy, said in a warning


def settings(
    *,
    greedy: bool = False,
    sample: bool = False,
    beam: int | None = None,
    max_tokens: int = 20,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    length_penalty: float | None = None,
    cache: bool = True,
) -> Settings:
    """Validated settings from the command-line options; greedy when no strategy is named.
    An option of another strategy is validated too, then left unused, and `unused` says so."""
    chosen = [
        name
        for name, on in (("--greedy", greedy), ("--sample", sample), ("--beam", beam is not None))
        if on
    ]
    if len(chosen) > 1:
        raise InputError(
            "conflicting strategies " + " and ".join(chosen),
            expected="one of --greedy, --sample, --beam N",
            found=" ".join(chosen),
        )
    strategy = "sample" if sample else "beam" if beam is not None else "greedy"
    if max_tokens < 1:
        raise InputError(
            "--max-tokens must be at least 1", expected="an integer >= 1", found=str(max_tokens)
        )
    unused: list[str] = []
    for option, value, needs in (
        ("--temperature", temperature, "sample"),
        ("--top-k", top_k, "sample"),
        ("--top-p", top_p, "sample"),
        ("--seed", seed, "sample"),
        ("--length-penalty", length_penalty, "beam"),
    ):
        if value is not None and strategy != needs:  # as Hugging Face does: said, not used
            unused.append(f"{option} applies to --{needs} only: unused by --{strategy}")
    if temperature is not None:
        option_number(temperature, "--temperature", positive=True)
    if seed is not None and seed < 0:  # numpy's generators take no negative seed
        raise InputError("--seed must be at least 0", expected="an integer >= 0", found=str(seed))
    if top_k is not None and top_k < 1:
        raise InputError("--top-k must be at least 1", expected="an integer >= 1", found=str(top_k))
    if top_p is not None and not 0 < within_float64(top_p, "--top-p") <= 1:
        raise InputError("--top-p must lie in (0, 1]", expected="0 < p <= 1", found=typed(top_p))
    if beam is not None and beam < 1:
        raise InputError(
            "--beam width must be at least 1", expected="an integer >= 1", found=str(beam)
        )
    if length_penalty is not None:
        option_number(length_penalty, "--length-penalty")
    if length_penalty:  # ((5 + n) / 6)^alpha must stay a positive float for every n
        with np.errstate(over="ignore", under="ignore"):
            ends = np.float64((5 + max_tokens) / 6) ** np.array([length_penalty, -length_penalty])
        if not (np.isfinite(ends).all() and (ends > 0).all()):
            raise InputError(
                f"--length-penalty {typed(length_penalty)} overflows the length penalty "
                f"((5 + n) / 6)^alpha for {max_tokens} token(s)",
                expected="a length penalty alpha of moderate size (GNMT uses 0.6 to 0.7)",
                found=typed(length_penalty),
            )
    return Settings(
        strategy=strategy,
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,  # (as typed: given_lows)
        top_k=top_k,
        top_p=top_p,
        seed=0 if seed is None else seed,
        width=beam if beam is not None else 1,
        length_penalty=0.0 if length_penalty is None else float(length_penalty),
        cache=cache,
        unused=tuple(unused),
    )


def describe(s: Settings, eos: str | None, encoder: bool) -> list[tuple[str, str]]:
    """The decoding conventions in force, for the header (`eos`: tokens.eos, if set;
    `encoder`: whether the model has one, a decoder-only model has no cross-attention)."""
    if s.strategy == "greedy":
        rule = "greedy: the most probable token (a tie goes to the earlier vocabulary entry)"
    elif s.strategy == "sample":
        parts = [f"softmax(logits / {exact(s.temperature)})"]
        if s.top_k is not None:
            parts.append(f"top-k {s.top_k}")
        if s.top_p is not None:
            parts.append(
                f"top-p {exact(s.top_p)} (smallest prefix whose total, not yet renormalised, "
                "reaches p; the crossing token in)"
            )
        rule = (
            "sample from "
            + ", then ".join(parts)
            + f", renormalised; numpy.random.default_rng({s.seed}), u = rng.random() per "
            "iteration, the first token (vocabulary order) whose cumulative p exceeds u"
        )
    else:
        penalty = (
            f"score logP / ((5 + n) / 6)^{exact(s.length_penalty)} (GNMT)"
            if s.length_penalty
            else "score logP (no length penalty)"
        )
        rule = (
            f"beam search, width {s.width}: extensions ranked by cumulative log-probability; "
            f"a kept one ending in eos finishes and the beam narrows by one; the result: "
            f"the best {penalty} among the finished and, at the limit, the live beams cut there"
        )
    stop = (
        f"at tokens.eos ({quoted(eos)}) or after {s.max_tokens} produced token(s), eos included"
        if eos is not None
        else f"after {s.max_tokens} produced token(s): the file sets no tokens.eos"
    )
    return [
        ("decoding", rule),
        ("stop", stop),
        (
            "cache",
            "KV cache: each iteration computes only the new row, over the cached K and V"
            if s.cache
            else "none (--no-cache): each iteration recomputes the whole prefix",
        ),
        (
            "encoder",
            "run once; cross-attention reads its output at every iteration"
            if encoder
            else "none (decoder-only): each iteration reads only the prefix",
        ),
    ]


# ---------------------------------------------------------------------------
# The distribution a choice is made from
# ---------------------------------------------------------------------------


def given_lows(s: Settings, dtype: str) -> tuple[Low, ...]:
    """The decoding options' numbers held as the config's are, each in the dtype it is
    used in, the option its key: --temperature divides the logits in the model's `dtype`
    (refused where float32 makes it 0 or an infinity); --top-p (1 - p) and
    --length-penalty (((5 + n) / 6)^alpha) are used in float64. Those below that dtype's
    smallest normal number, for the run's one note. An option another strategy leaves
    unused is stored nowhere: nothing to say."""
    lows = []
    for option, value, used_in, strategy in (
        ("--temperature", s.temperature, dtype, "sample"),
        ("--top-p", s.top_p, "float64", "sample"),
        ("--length-penalty", s.length_penalty, "float64", "beam"),
    ):
        if value is None or strategy != s.strategy:
            continue
        why = outside_float32(value, divisor=True) if used_in == "float32" else None
        if why is not None:
            raise InputError(f"{option}: {why[0]}", expected=why[1], found=typed(value))
        number = np.array(value, dtype=np.float64)
        low = below_normal(number, np.abs(number), option, used_in)
        lows += [low] if low is not None else []
    return tuple(lows)


def ranking(p: Array) -> Array:
    """Token indices by probability, highest first; ties in vocabulary order. [V] -> [V]"""
    return np.argsort(-p, kind="stable")


def top_k_kept(p: Array, k: int) -> Array:
    """Which tokens are the k most probable (ties to the earlier entry). [V] -> [V] bool"""
    kept = np.zeros(len(p), dtype=bool)
    kept[ranking(p)[:k]] = True
    return kept


def top_k_filter(p: Array, k: int) -> Array:
    """The k most probable tokens (top_k_kept) kept as they are, the rest 0. [V] -> [V]"""
    keep = top_k_kept(p, k)
    out = np.zeros_like(p)
    out[keep] = p[keep]
    return out


def top_p_filter(p: Array, top_p: float) -> Array:
    """Nucleus (Holtzman et al. 2020): sorted by probability, the smallest prefix whose
    total reaches top_p (the crossing token included) kept as it is, the rest 0. [V] -> [V]

    `p` is a distribution (its total is 1 up to rounding). A prefix reaches top_p when
    what it leaves, summed from the smallest up, is at most (1 - top_p) of the total,
    give or take rounding (TIE_ULPS units in the last place of the total):
    - small probabilities summed first lose nothing to rounding, where a running total
      from the largest down reaches 1.0 before the last tokens of tiny probability and
      would cut them. So with top_p = 1 (no slack: nothing is left) every token of
      non-zero probability stays;
    - a prefix whose total is top_p in decimal arithmetic reaches it, as by hand:
      0.5, 0.4, 0.1 with top_p 0.9 keep two, though 0.1 as computed may exceed the
      float 1 - 0.9 by a unit in the last place."""
    order = ranking(p)
    tail = np.cumsum(p[order][::-1])[::-1]  # tail[i]: the total of all but the i largest
    left = np.append(tail[1:], 0.0)  # left[n - 1]: what the first n leave out
    slack = TIE_ULPS * float(np.finfo(p.dtype).eps) * tail[0] if top_p < 1 else 0.0
    n = int(np.argmax(left <= (1.0 - top_p) * tail[0] + slack)) + 1  # left[-1] = 0 fits
    keep = order[:n]
    out = np.zeros_like(p)
    out[keep] = p[keep]
    return out


TIE_ULPS = 4  # top-p: how near 1 - top_p what a prefix leaves out may be and still tie


def sampling_steps(logits: Array, s: Settings) -> list[tuple[str, Array]]:
    """The distribution after each sampling stage in turn: temperature, top-k, top-p.

    The filters keep probabilities as they are, so top-p measures what top-k left
    without renormalising it first, and the one renormalisation comes last (SPEC 4).
    Top-k keeps a prefix of the ranking top-p sorts by, and a prefix of what it left
    has the total of the same prefix of the tempered distribution: so top-p's prefix
    is found on the tempered distribution (a whole one, as top_p_filter needs) and
    the shorter of the two prefixes is kept (all of top-k's when what it left stays
    below p). Each stage is shown renormalised: the distribution a draw after it
    would use. [V]"""
    tempered = ops.softmax(logits, s.temperature)
    p = tempered
    steps = [("tempered", p)]
    if s.top_k is not None:
        p = top_k_filter(p, s.top_k)
        steps.append(("top_k", p / p.sum()))
    if s.top_p is not None:
        p = np.where(top_p_filter(tempered, s.top_p) > 0, p, 0.0)
        steps.append(("top_p", p / p.sum()))
    return steps


def draw(p: Array, u: float) -> int:
    """The first index whose cumulative probability exceeds u x total (inverse CDF)."""
    total = np.cumsum(p)
    i = int(np.searchsorted(total, u * total[-1], side="right"))
    return min(i, int(np.flatnonzero(p)[-1]))  # u x total rounding up to the total


def length_penalty(n: int, alpha: float) -> float:
    """((5 + n) / 6)^alpha (Wu et al. 2016, GNMT); 1 when alpha is 0."""
    return ((5 + n) / 6) ** alpha if alpha else 1.0


# ---------------------------------------------------------------------------
# The results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Beam:
    """A live beam at an iteration: its produced tokens, their cumulative log-probability,
    and its next-token distribution."""

    tokens: tuple[str, ...]
    logprob: float
    probs: Array  # its next-token distribution [V]


@dataclass(frozen=True)
class Candidate:
    """An extension kept at a beam iteration."""

    beam: int  # index of the live beam it extends
    token: str
    token_logprob: float  # log p(token | that beam's prefix)
    logprob: float  # cumulative, the beam's plus token_logprob
    finished: bool  # ends in eos: set aside
    score: float  # logprob / the length penalty of its length


@dataclass(frozen=True)
class Hypothesis:
    """A finished (or, at the limit, live) beam with its length-penalised score."""

    tokens: tuple[str, ...]
    logprob: float
    score: float


@dataclass(frozen=True)
class Iteration:
    """One decoding step: what went in, what came out, what was chosen.

    `prefix`, `probs` and `next` are one extension: for beam search, the best-ranked
    kept candidate's parent prefix, that prefix's distribution, and its token."""

    index: int
    prefix: tuple[str, ...]
    probs: Array  # [V] the distribution the choice was made from
    next: str
    model_probs: Array  # [V] the model's softmax(logits) for `prefix`
    stages: tuple[tuple[str, Array], ...] = ()  # sample: after temperature, top-k, top-p
    u: float | None = None  # sample: the uniform number drawn
    beams: tuple[Beam, ...] = ()  # beam: the live beams this iteration extends
    candidates: tuple[Candidate, ...] = ()  # beam: the kept extensions, best first


@dataclass(frozen=True)
class Generation:
    settings: Settings
    start: tuple[str, ...]  # the starting prefix: target, or [bos]
    generated: tuple[str, ...]  # produced tokens, ending with eos when it was produced
    iterations: tuple[Iteration, ...]
    stopped: str  # eos | max_tokens | beams_finished (beam: every slot finished)
    finished: tuple[Hypothesis, ...] = ()  # beam: every finished hypothesis, in order
    result: Hypothesis | None = None  # beam: the chosen hypothesis
    unfinished: tuple[Hypothesis, ...] = ()  # beam: the live beams cut at --max-tokens


# ---------------------------------------------------------------------------
# Checks before anything runs
# ---------------------------------------------------------------------------


def start_of(cfg: Config, s: Settings) -> tuple[str, ...]:
    """The starting prefix (target, or [tokens.bos]); refuses what generate cannot serve."""
    m = cfg.model
    model.require_decoder(cfg, "generate")
    start = model.target_of(cfg)  # the target, or [tokens.bos] (an error if neither)
    if start.tokens is None:
        raise InputError(
            "generate appends tokens to the target, and this target is a numeric matrix",
            file=cfg.file,
            path="target",
            expected="a list of tokens",
        )
    longest = len(start) + s.max_tokens - 1  # the last token produced is never fed back
    if m.positional in BOUNDED_POSITIONAL and longest > m.max_len:
        raise InputError(
            f"--max-tokens {s.max_tokens} after a prefix of {len(start)} would feed the decoder "
            f"{longest} positions, beyond the {m.max_len} " + BOUNDED_POSITIONAL[m.positional],
            file=cfg.file,
            path="model.max_len",
            expected=f"--max-tokens <= {m.max_len - len(start) + 1}",
            found=str(s.max_tokens),
        )
    return start.tokens


def size(cfg: Config, s: Settings, traced: bool) -> int:
    """About how many numbers a generation holds at its peak: one iteration's
    intermediates (with the cache, the cached K and V too) per beam; with `traced`,
    everything the trace records; and, traced or not, every iteration's record (records),
    kept to the end and written out: the prefixes alone grow as the square of
    --max-tokens (--max-tokens 1000000 ran for ever, its records bound for terabytes)."""
    m = cfg.model
    longest = (len(cfg.target) if cfg.target is not None else 1) + s.max_tokens
    decoder_only = replace(m, encoder_layers=0)
    # K and V (self and cross) of every layer and K/V head, per live beam.
    kv = 2 * m.decoder_layers * m.n_kv_heads * longest * (m.d_k + m.d_v)
    if s.cache:  # one new row per iteration, plus the cached K, V and a row of scores
        iteration = trace_size(decoder_only, 1, len(cfg.vocab)) + kv + 2 * longest
    else:
        iteration = trace_size(decoder_only, longest, len(cfg.vocab))
    source = len(cfg.source) if cfg.source is not None else 0
    encoder = trace_size(replace(m, decoder_layers=0), source, 0) if m.encoder_layers else 0
    return encoder + iteration * s.width * (s.max_tokens if traced else 1) + records(cfg, s)


def records(cfg: Config, s: Settings) -> int:
    """At most how many numbers the iterations' records hold (Iteration), each kept to
    the end: its distributions over the vocabulary (greedy's one, the model's; sampling's
    model's and up to three stages; each live beam's), its prefix and the live beams'
    (one number a token), and its other objects counted as 128."""
    longest = (len(cfg.target) if cfg.target is not None else 1) + s.max_tokens
    distributions = {"greedy": 1, "sample": 4}.get(s.strategy, s.width)
    prefixes = (s.width + 1 if s.strategy == "beam" else 1) * longest
    return s.max_tokens * (distributions * len(cfg.vocab) + prefixes + 128)


# Decoder passes a beam search may make: about 30 s on the hello example (0.3 ms each).
MAX_BEAM_PASSES = 100_000


def beam_passes(s: Settings, n_vocab: int, limit: int = MAX_BEAM_PASSES) -> int:
    """The decoder passes of a beam search at most, one per live beam per iteration:
    iteration t has at most min(width, V^t) live beams. (Counting stops past `limit`.)"""
    passes, live = 0, 1
    for _ in range(s.max_tokens):
        passes += live
        if passes > limit:
            break
        live = min(s.width, live * n_vocab)
    return passes


def check_size(
    cfg: Config, s: Settings, max_elements: int, traced: bool, selectable: bool = True
) -> None:
    """Refuse, before anything runs, a generation whose arrays (with `traced`, whose whole
    trace) would hold more than max_elements numbers, or a beam search too wide to end
    in reasonable time (memory alone does not bound it: each beam's pass is small).
    `selectable`: whether --stage can keep less of the trace (not with --explain)."""
    total = size(cfg, s, traced)
    if total > max_elements:
        ways = ["fewer --max-tokens"]  # what the user can change
        ways += ["a --stage to keep"] if traced and selectable else []
        ways += ["a narrower --beam"] if s.width > 1 else []
        ways += ["a higher --max-elements"]
        raise InputError(
            f"{'the trace of ' if traced else ''}{s.max_tokens} iteration(s) would hold about "
            f"{total:,} numbers, over the limit of {max_elements:,}",
            expected=", ".join(ways[:-1]) + " or " + ways[-1],
        )
    if s.strategy == "beam" and beam_passes(s, len(cfg.vocab)) > MAX_BEAM_PASSES:
        raise InputError(
            f"--beam {s.width} over {s.max_tokens} iteration(s) may need more than "
            f"{MAX_BEAM_PASSES:,} decoder passes (one per live beam per iteration)",
            expected="a narrower --beam or fewer --max-tokens",
            found=f"--beam {s.width} --max-tokens {s.max_tokens}",
        )


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------


def next_distribution(
    cfg: Config,
    enc: Array | None,
    prefix: tuple[str, ...],
    cache: KVCache | None,
    tr: Tracer = NULL_TRACER,
) -> tuple[Array, Array]:
    """The logits and probabilities of the token after `prefix`. -> [V], [V]

    Without a cache the decoder runs on the whole prefix; with one, only on the
    tokens it has not cached yet (the whole prefix at the first iteration, then
    one token). With token types, each position's is model.decoder_types'."""
    done = 0 if cache is None else cache.length
    types = model.decoder_types(cfg, len(prefix))
    seq = Sequence_(tokens=prefix[done:], types=None if types is None else types[done:])
    out = model.decoder(cfg, seq, enc, tr, cache)
    logits, probs = model.output_layer(cfg, out, seq, tr)
    # the run's first NaN or overflow (not a note on a given number)
    nonfinite = [w for w in tr.trace.warnings if not isinstance(w, InputNote)]
    first = f" ({nonfinite[0]})" if nonfinite else ""
    if not np.isfinite(probs[-1]).all():  # never choose from NaN
        raise InputError(
            f"the next-token distribution after {' '.join(prefix)} is not finite{first}",
            expected="finite probabilities",
            found="NaN or infinity",
        )
    return logits[-1], probs[-1]


def run(cfg: Config, s: Settings, tr: Tracer = NULL_TRACER) -> Generation:
    """Decode from `target` (or [tokens.bos]) until tokens.eos or s.max_tokens.

    With a recording tracer, every step of iteration i is under `t<i>.` (beam:
    `t<i>.b<j>.` for live beam j); the encoder's steps keep their plain paths."""
    start = start_of(cfg, s)
    # numpy's overflow warnings silenced: the tracer names the step where it happens.
    with np.errstate(all="ignore"):
        enc = model.encoder(cfg, tr) if cfg.model.encoder_layers else None
        if s.strategy == "beam":
            return _beam(cfg, s, enc, start, tr)
        return _single(cfg, s, enc, start, tr)


def _single(
    cfg: Config, s: Settings, enc: Array | None, start: tuple[str, ...], tr: Tracer
) -> Generation:
    """Greedy or sampling: one prefix, one token per iteration."""
    vocab, eos = cfg.vocab, cfg.tokens.eos
    rng = np.random.default_rng(s.seed) if s.strategy == "sample" else None
    if rng is not None and tr.enabled:  # what the sampling stages used, for `explain`
        tr.trace.sampling.update(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
    cache = KVCache.empty(cfg) if s.cache else None
    prefix, iterations = start, []
    stopped = "max_tokens"
    for index in range(s.max_tokens):
        with tr.scope(f"t{index}"):
            logits, probs = next_distribution(cfg, enc, prefix, cache, tr)
            if rng is None:
                stages: tuple[tuple[str, Array], ...] = ()
                chosen, u = probs, None
                i = int(np.argmax(probs))
            else:
                stages = tuple(sampling_steps(logits, s))
                with tr.scope("sample", rows=(prefix[-1],)):
                    for name, p in stages:
                        tr.rec(name, p[None, :], _stage_formula(name, s), cols=vocab)
                chosen, u = stages[-1][1], float(rng.random())
                i = draw(chosen, u)  # finite: (logits − max) / T is, for any T > 0
        token = vocab[i]
        iterations.append(Iteration(index, prefix, chosen, token, probs, stages, u))
        prefix = (*prefix, token)
        if token == eos:
            stopped = "eos"
            break
    return Generation(s, start, prefix[len(start) :], tuple(iterations), stopped)


def _stage_formula(name: str, s: Settings) -> str:
    if name == "tempered":
        return f"softmax(logits / T), T = {exact(s.temperature)}"
    if name == "top_k":
        return f"the {s.top_k} most probable kept, renormalised"
    assert name == "top_p" and s.top_p is not None
    return (
        f"smallest sorted prefix with total ≥ {exact(s.top_p)} kept (the total before any "
        "renormalisation), renormalised"
    )


def extensions(beams: Sequence[Beam]) -> tuple[Array, Array, Array]:
    """Every extension of every live beam: log p(token | beam), the cumulative logP, and
    the flat indices beam * V + token ranked by logP, best first (ties: the earlier beam,
    then the earlier vocabulary entry). -> [n, V], [n, V], [n * V]"""
    with np.errstate(divide="ignore"):
        token_logp = np.log(np.stack([b.probs for b in beams]))
    totals = np.array([b.logprob for b in beams])[:, None] + token_logp
    return token_logp, totals, np.argsort(-totals.ravel(), kind="stable")


def _beam(
    cfg: Config, s: Settings, enc: Array | None, start: tuple[str, ...], tr: Tracer
) -> Generation:
    """Beam search (module docstring): live beams, finished hypotheses, the best score."""
    vocab, eos = cfg.vocab, cfg.tokens.eos
    V = len(vocab)
    live: list[tuple[tuple[str, ...], float, KVCache | None]] = [
        ((), 0.0, KVCache.empty(cfg) if s.cache else None)
    ]
    finished: list[Hypothesis] = []
    iterations: list[Iteration] = []
    stopped = "max_tokens"

    def hypothesis(tokens: tuple[str, ...], logprob: float) -> Hypothesis:
        return Hypothesis(tokens, logprob, logprob / length_penalty(len(tokens), s.length_penalty))

    for index in range(s.max_tokens):
        beams: list[Beam] = []
        with tr.scope(f"t{index}"):
            for j, (tokens, logprob, cache) in enumerate(live):
                with tr.scope(f"b{j}"):
                    _, probs = next_distribution(cfg, enc, start + tokens, cache, tr)
                beams.append(Beam(tokens, logprob, probs))
        token_logp, totals, order = extensions(beams)
        slots = s.width - len(finished)
        candidates: list[Candidate] = []
        new_live: list[tuple[tuple[str, ...], float, KVCache | None]] = []
        for f in order[:slots]:
            j, i = divmod(int(f), V)
            if not np.isfinite(totals[j, i]):
                break  # probability 0: never kept
            h = hypothesis((*beams[j].tokens, vocab[i]), float(totals[j, i]))
            c = Candidate(j, vocab[i], float(token_logp[j, i]), h.logprob, vocab[i] == eos, h.score)
            candidates.append(c)
            if c.finished:
                finished.append(h)
            else:
                parent = live[j][2]
                new_live.append((h.tokens, h.logprob, parent.fork() if parent else None))
        best = beams[candidates[0].beam]
        iterations.append(
            Iteration(
                index,
                start + best.tokens,
                best.probs,
                candidates[0].token,
                best.probs,
                beams=tuple(beams),
                candidates=tuple(candidates),
            )
        )
        live = new_live
        if not live:
            stopped = "beams_finished"
            break
    # Cut at --max-tokens, the live beams compete with the finished hypotheses: one
    # of them may be more probable than anything that ended in eos.
    unfinished = tuple(hypothesis(tokens, logprob) for tokens, logprob, _ in live)
    result = max((*finished, *unfinished), key=lambda h: h.score)  # ties: the first
    return Generation(
        s, start, result.tokens, tuple(iterations), stopped, tuple(finished), result, unfinished
    )
