"""The `trace-tf` command line: parse -> load -> run -> render. Nothing else.

Heavy modules (numpy, the engine) are imported inside the commands, so that
`trace-tf --help` and `trace-tf examples` start quickly.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from trace_tf.config import Config, OpConfig
    from trace_tf.render import View
    from trace_tf.trace import Step, Trace

app = typer.Typer(
    name="trace-tf",
    help="Trace every step of a Transformer, number by number.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# ---------------------------------------------------------------------------
# The options every running command takes (SPEC section 4)
# ---------------------------------------------------------------------------

ConfigArg = Annotated[
    Optional[str],  # noqa: UP045 (typer needs Optional on Python 3.10)
    typer.Argument(
        help="Config file, or the name of a packaged example (default: hello).", show_default=False
    ),
]
SetOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--set",
        help="Override a config key: KEY=VALUE, VALUE read as YAML (repeatable).",
        metavar="KEY=VALUE",
    ),
]
VariantOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--variant", help="Apply one of the file's named variants before --set.", show_default=False
    ),
]
FORMATS = ("table", "json", "npz", "csv")
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        help="table, json, npz (every step under its path, for numpy.load; needs --output) "
        "or csv (one step: select it with `step --stage PATH`).",
    ),
]
DtypeOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--dtype",
        help="float64 (default) or float32, for weights and every computation. float32 halves "
        "memory and is faster on large models but keeps about 7 significant digits: expect "
        "relative errors around 1e-6, larger after many layers, and `check` tolerances may not "
        "hold.",
        show_default=False,
    ),
]
OutputOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--output",
        help="Write to this file instead of stdout (never overwrites without --force).",
        show_default=False,
    ),
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Allow --output to overwrite an existing file.")
]
PrecisionOpt = Annotated[
    int,
    typer.Option("--precision", min=0, max=17, help="Digits after the decimal point in tables."),
]
FullOpt = Annotated[bool, typer.Option("--full", help="Show every row and column, however large.")]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Make NaN and overflow warnings errors (exit 2).")
]
DebugOpt = Annotated[
    bool, typer.Option("--debug", help="Show the Python traceback of an internal error.")
]
MaxElementsOpt = Annotated[
    int,
    typer.Option(
        "--max-elements",
        min=1,
        help="Refuse configs whose arrays would hold more numbers than this.",
    ),
]


@dataclass
class Common:
    sets: list[str]
    variant: str | None
    fmt: str
    output: Path | None
    force: bool
    precision: int
    full: bool
    strict: bool
    debug: bool
    max_elements: int
    dtype: str | None = None

    def view(self) -> View:
        """Elide matrices to what fits the terminal: columns as wide as the numbers."""
        import shutil

        from trace_tf.render import View

        width = shutil.get_terminal_size((120, 40)).columns if self.output is None else 160
        cols = max(4, (width - 16) // (self.precision + 7))
        return View(
            precision=self.precision, full=self.full, max_cols=cols, edge=max(2, (cols - 1) // 2)
        )


def _common(**kw: Any) -> Common:
    """The shared options out of a command's locals (its own arguments are ignored)."""
    kw = {k: v for k, v in kw.items() if k in Common.__dataclass_fields__ or k == "sets"}
    fmt = kw["fmt"]
    if fmt not in FORMATS:
        _fail(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if fmt == "npz" and kw.get("output") is None:
        _fail("--format npz writes a binary file: give it with --output FILE")
    if kw.get("dtype") not in (None, "float64", "float32"):
        _fail(f"--dtype must be float64 or float32, not {kw['dtype']!r}")
    return Common(sets=list(kw["sets"] or []), **{k: v for k, v in kw.items() if k != "sets"})


_COMMON_OPTIONS = {
    "sets": (SetOpt, None),
    "variant": (VariantOpt, None),
    "fmt": (FormatOpt, "table"),
    "output": (OutputOpt, None),
    "force": (ForceOpt, False),
    "precision": (PrecisionOpt, 4),
    "full": (FullOpt, False),
    "strict": (StrictOpt, False),
    "debug": (DebugOpt, False),
    "max_elements": (MaxElementsOpt, 2**28),
    "dtype": (DtypeOpt, None),
}


def running(fn: Callable[..., None]) -> Callable[..., None]:
    """A command that runs the model: it takes the common options (SPEC section 4),
    receives them as `c: Common`, and has its errors turned into exit codes."""
    own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "c"]
    common = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=default)
        for name, (ann, default) in _COMMON_OPTIONS.items()
    ]

    @functools.wraps(fn)
    def command(**kw: Any) -> None:
        with guarded(kw["debug"]):
            c = _common(**{name: kw.pop(name) for name in _COMMON_OPTIONS})
            fn(c, **kw)

    command.__signature__ = inspect.Signature([*own, *common])  # type: ignore[attr-defined]
    del command.__wrapped__  # typer must read the signature above, not fn's
    return command


def _fail(message: str) -> None:
    from trace_tf.errors import InputError

    raise InputError(message)


@contextmanager
def guarded(debug: bool) -> Iterator[None]:
    """Bad input: one line on stderr, exit 2. A bug: one line, exit 3 (--debug: traceback)."""
    from trace_tf.errors import InputError

    try:
        yield
    except InputError as exc:
        if debug:
            raise
        typer.echo(f"trace-tf: error: {exc}", err=True)
        raise typer.Exit(2) from None
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:
        if debug:
            raise
        typer.echo(
            f"trace-tf: internal error ({type(exc).__name__}: {exc}); this is a bug. "
            "Run again with --debug to see the traceback.",
            err=True,
        )
        raise typer.Exit(3) from None


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


@contextmanager
def _sink(c: Common, binary: bool = False) -> Iterator[Any]:
    if c.output is None:
        yield sys.stdout
        return
    if c.output.exists() and not c.force:
        _fail(f"{c.output} exists; pass --force to overwrite it")
    if c.output.is_dir():
        _fail(f"{c.output} is a directory")
    try:
        with (
            open(c.output, "wb") if binary else open(c.output, "w", encoding="utf-8", newline="")
        ) as fh:
            yield fh
    except OSError as exc:
        _fail(f"cannot write {c.output}: {exc.strerror}")


def console(file: Any) -> Console:
    from rich.console import Console

    # emoji=False: a ":name:" in a title or token is text, not an emoji (and loads no emoji table)
    if file is sys.stdout:
        return Console(highlight=False, emoji=False)
    return Console(file=file, highlight=False, emoji=False, color_system=None, width=160)


def emit(
    c: Common,
    renderables: list[RenderableType],
    data: dict[str, Any] | Callable[[], dict[str, Any]],
    steps: list[Step] | None = None,
) -> None:
    """Print tables, or the JSON object (built only when asked for), to stdout or --output;
    or write the steps: npz every one under its path, csv the one selected."""
    if c.fmt in ("npz", "csv"):
        if steps is None:
            _fail(
                f"--format {c.fmt} writes traced steps; this command has none (use table or json)"
            )
        assert steps is not None
        _write_steps(c, steps)
        return
    with _sink(c) as fh:
        if c.fmt == "json":
            fh.write(json.dumps(data() if callable(data) else data, allow_nan=False) + "\n")
        else:
            con = console(fh)
            for r in renderables:
                con.print(r)


def _write_steps(c: Common, steps: list[Step]) -> None:
    if c.fmt == "npz":
        import numpy as np

        savez: Any = np.savez  # keys are step paths (numpy's stub types **kwds as bool)
        with _sink(c, binary=True) as fh:
            savez(fh, **{s.path: s.value for s in steps})
        return
    if len(steps) != 1:
        _fail(
            f"--format csv writes one step, and {len(steps)} are selected; "
            "choose one with `trace-tf step --stage PATH` (a whole path, e.g. "
            "encoder.0.self_attn.h0.softmax), or use --format npz for many"
        )
    from trace_tf.render import step_csv

    text = step_csv(steps[0])
    with _sink(c) as fh:
        fh.write(text)


def warn(c: Common, trace: Trace) -> None:
    """NaN and overflow: a warning on stderr, or an error with --strict."""
    from trace_tf.errors import NumericalError

    for w in trace.warnings:
        if c.strict:
            raise NumericalError(w + " (--strict)")
        typer.echo(f"trace-tf: warning: {w}", err=True)


# ---------------------------------------------------------------------------
# Model commands
# ---------------------------------------------------------------------------


def _load(config: str | None, c: Common) -> Config | OpConfig:
    from trace_tf.config import load

    return load(config, c.sets, c.variant, c.max_elements, c.dtype)


def _show(
    cfg: Config | OpConfig,
    trace: Trace,
    steps: list[Step],
    c: Common,
    body: Callable[[], list[RenderableType]] | None = None,
) -> None:
    from trace_tf import render
    from trace_tf.config import Config
    from trace_tf.runner import conventions

    warn(c, trace)
    tokens: dict[str, Any] = {}
    if isinstance(cfg, Config):
        tgt = cfg.target
        if tgt is None and cfg.model.decoder_layers and cfg.tokens.bos:
            from trace_tf.model import target_of

            tgt = target_of(cfg)
        tokens = {
            "source": cfg.source.labels if cfg.source else None,
            "target": tgt.labels if tgt else None,
        }

    def data() -> dict[str, Any]:
        return render.trace_json(
            cfg.title, tokens, steps, conventions=dict(conventions(cfg)), warnings=trace.warnings
        )

    if c.fmt != "table":
        emit(c, [], data, steps)
        return
    head = render.header(cfg.title or cfg.file, conventions(cfg), trace.warnings)
    items = body() if body is not None else [render.trace_view(steps, c.view())]
    emit(c, [head, *items], data, steps)


def _trace_command(command: str, config: str | None, c: Common) -> None:
    from trace_tf.runner import require_model, run

    cfg = require_model(_load(config, c), command)
    trace = run(cfg, command)
    _show(cfg, trace, list(trace), c)


@app.command()
@running
def encode(c: Common, config: ConfigArg = None) -> None:
    """Run the encoder on `source` and show every step in order."""
    _trace_command("encode", config, c)


@app.command()
@running
def decode(c: Common, config: ConfigArg = None) -> None:
    """Encoder + decoder on `source` and `target` (teacher forcing) through logits and probs."""
    _trace_command("decode", config, c)


@app.command()
@running
def step(
    c: Common,
    config: ConfigArg = None,
    stage: Annotated[
        str,
        typer.Option(
            "--stage",
            help="A step name (softmax, q, ...), a group (qkv, add_norm, ffn, cross, attention), "
            "a pattern with *, or one whole path (encoder.0.self_attn.h0.softmax).",
        ),
    ] = "softmax",
    layer: Annotated[Optional[int], typer.Option("--layer", min=0, help="Only this layer.")] = None,  # noqa: UP045
    head: Annotated[Optional[int], typer.Option("--head", min=0, help="Only this head.")] = None,  # noqa: UP045
) -> None:
    """Only the matching steps, each with the inputs it was computed from and its formula."""
    from trace_tf import render
    from trace_tf.config import Config
    from trace_tf.errors import InputError
    from trace_tf.runner import run
    from trace_tf.trace import check_stage, matches

    cfg = _load(config, c)
    # Store only the selected steps (and, as they are recorded, their inputs).
    trace = run(cfg, "full", keep=lambda p: matches(p, stage, layer, head), with_inputs=True)
    check_stage(stage, trace.stages() | trace.paths())  # a name, or one whole path
    steps = trace.select(stage, layer, head)
    if not steps:
        raise InputError(
            f"no step matches --stage {stage}"
            + (f" --layer {layer}" if layer is not None else "")
            + (f" --head {head}" if head is not None else ""),
            expected="a layer and head the model has",
        )
    weights = cfg.named_arrays() if isinstance(cfg, Config) else {}
    view = c.view()
    _show(
        cfg,
        trace,
        steps,
        c,
        lambda: [render.step_with_inputs(s, trace.steps, weights, view) for s in steps],
    )


@app.command()
def check(
    configs: Annotated[
        list[str] | None,
        typer.Argument(
            help="Config files with `expect` entries (default: hello).", show_default=False
        ),
    ] = None,
    sets: SetOpt = None,
    fmt: FormatOpt = "table",
    output: OutputOpt = None,
    force: ForceOpt = False,
    precision: PrecisionOpt = 4,
    debug: DebugOpt = False,
    max_elements: MaxElementsOpt = 2**28,
) -> None:
    """Evaluate every `expect` entry; exit 1 if any does not match."""
    with guarded(debug):
        from rich.table import Table

        from trace_tf.config import parse_set, read_document
        from trace_tf.runner import check as run_check

        c = _common(
            sets=sets,
            variant=None,
            fmt=fmt,
            output=output,
            force=force,
            precision=precision,
            full=False,
            strict=False,
            debug=debug,
            max_elements=max_elements,
        )
        pairs = [parse_set(s) for s in c.sets]
        results = []
        for name in configs or [None]:  # type: ignore[list-item]
            doc = read_document(name)
            results.extend(run_check(doc, pairs, c.max_elements))
        table = Table(title="trace-tf check", title_justify="left")
        for col in ("config", "step", "variant", "ok", "max abs error", "atol"):
            table.add_column(col, justify="right" if col in ("max abs error", "atol") else "left")
        table.add_column("note", max_width=60, no_wrap=True, overflow="ellipsis")
        for r in results:
            err = "—" if r.max_abs_error is None else f"{r.max_abs_error:.3g}"
            table.add_row(
                Path(r.config).name,
                r.step,
                r.variant or "",
                "[green]ok[/]" if r.ok else "[bold red]FAIL[/]",
                err,
                f"{r.atol:g}",
                r.problem or r.note,
            )
        failed = sum(not r.ok for r in results)
        summary = f"{len(results) - failed} passed, {failed} failed"
        data = {
            "trace_tf": _version(),
            "results": [
                {
                    "config": r.config,
                    "step": r.step,
                    "variant": r.variant,
                    "ok": r.ok,
                    "max_abs_error": r.max_abs_error,
                    "atol": r.atol,
                    "note": r.note,
                    **({"problem": r.problem} if r.problem else {}),
                }
                for r in results
            ],
        }
        from rich.text import Text

        emit(c, [table, Text(summary)], data)
        if failed:
            raise typer.Exit(1)


@app.command()
def examples() -> None:
    """List the packaged examples."""
    from trace_tf.loader import example_names, examples_dir  # no numpy: starts quickly

    for name in example_names():
        title = ""
        for line in (examples_dir() / f"{name}.yaml").read_text(encoding="utf-8").splitlines():
            if line.startswith("title:"):
                title = line.partition(":")[2].strip()
                break
        typer.echo(f"{name:12s} {title}")


# ---------------------------------------------------------------------------
# generate (issue 3): commands for autoregressive decoding go here
# ---------------------------------------------------------------------------


@app.command()
@running
def generate(
    c: Common,
    config: ConfigArg = None,
    greedy: Annotated[
        bool, typer.Option("--greedy", help="Take the most probable token (the default).")
    ] = False,
    sample: Annotated[
        bool,
        typer.Option("--sample", help="Sample from softmax(logits / T), after top-k and top-p."),
    ] = False,
    beam: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--beam", help="Beam search with this many beams.", show_default=False),
    ] = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Stop after this many produced tokens (eos counts).")
    ] = 20,
    temperature: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--temperature", help="--sample: divide the logits by T.", show_default="1"),
    ] = None,
    top_k: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--top-k", help="--sample: keep the k most probable tokens.", show_default=False
        ),
    ] = None,
    top_p: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--top-p",
            help="--sample: keep the smallest most-probable set whose total reaches p.",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--seed", help="--sample: seed of numpy.random.default_rng.", show_default="0"
        ),
    ] = None,
    length_penalty: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--length-penalty",
            help="--beam: alpha in score = logP / ((5 + n) / 6)^alpha.",
            show_default="0",
        ),
    ] = None,
    cache: Annotated[
        bool,
        typer.Option(
            "--cache/--no-cache",
            help="Keep K and V between iterations, or recompute the whole prefix each time.",
        ),
    ] = True,
    trace: Annotated[
        bool, typer.Option("--trace", help="Show every step of every iteration (paths t<i>.…).")
    ] = False,
    stage: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--stage",
            help="With --trace: only these steps (a name, a group or a pattern with *).",
            show_default=False,
        ),
    ] = None,
    layer: Annotated[Optional[int], typer.Option("--layer", min=0, help="Only this layer.")] = None,  # noqa: UP045
    head: Annotated[Optional[int], typer.Option("--head", min=0, help="Only this head.")] = None,  # noqa: UP045
    show: Annotated[
        int, typer.Option("--show", min=1, help="Rows of each next-token distribution shown.")
    ] = 10,
) -> None:
    """Autoregressive decoding from tokens.bos (or the target) until tokens.eos or
    --max-tokens: each iteration's prefix, next-token distribution and choice."""
    from trace_tf import generate as gen_mod
    from trace_tf import render
    from trace_tf.runner import conventions, require_model
    from trace_tf.trace import Tracer, check_stage, matches

    s = gen_mod.settings(
        greedy=greedy,
        sample=sample,
        beam=beam,
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        length_penalty=length_penalty,
        cache=cache,
    )
    if (stage is not None or layer is not None or head is not None) and not trace:
        _fail("--stage, --layer and --head select traced steps: add --trace")
    cfg = require_model(_load(config, c), "generate")
    start = gen_mod.start_of(cfg, s)
    gen_mod.check_size(cfg, s, c.max_elements, traced=trace and stage is None)
    seen: set[str] = set()

    def keep(path: str) -> bool:
        seen.update((path, path.rsplit(".", 1)[-1]))  # a stage name, or one whole path
        return trace and matches(path, stage, layer, head)

    tr = Tracer(keep=keep)  # records only what --trace asks for; warnings always
    tr.name_all(cfg.named_arrays())
    result = gen_mod.run(cfg, s, tr)
    if stage is not None:
        check_stage(stage, seen)
    warn(c, tr.trace)
    steps = list(tr.trace)
    tokens = {"source": cfg.source.labels if cfg.source else None, "target": start}
    header_rows = conventions(cfg) + gen_mod.describe(s)
    data = render.trace_json(
        cfg.title,
        tokens,
        steps,
        **render.generation_json(result, cfg.vocab),
        conventions=dict(header_rows),
        warnings=tr.trace.warnings,
    )
    traced = steps if trace else None  # what --format npz / csv write
    if c.fmt != "table":
        emit(c, [], data, traced)
        return
    head_panel = render.header(cfg.title or cfg.file, header_rows, tr.trace.warnings)
    body = render.generation_view(result, cfg.vocab, steps, show, c.view())
    emit(c, [head_panel, *body], data, traced)


# ---------------------------------------------------------------------------
# calculators and tools (issue 4): attend, norm, pe, diff, explain, stages
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# performance (issue 6): cost
# ---------------------------------------------------------------------------


@app.command()
@running
def cost(
    c: Common,
    config: ConfigArg = None,
    vary_opt: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--vary",
            help="L=8,16,32,64 (sequence length: the tokens repeated) or D=64,128,... "
            "(d_model; widths by their defaults, weights drawn): one row per value.",
            metavar="L=N,N,...|D=N,N,...",
            show_default=False,
        ),
    ] = None,
    repeat: Annotated[
        int, typer.Option("--repeat", min=1, help="Runs timed per --vary value (fastest kept).")
    ] = 3,
) -> None:
    """The multiply-adds of every stage, totals per stage and kind; with --vary, how they grow."""
    from dataclasses import asdict

    from trace_tf import cost as costs
    from trace_tf import render
    from trace_tf.config import parse_set, read_document
    from trace_tf.runner import require_model

    varied = costs.parse_vary(vary_opt) if vary_opt is not None else None
    cfg = require_model(_load(config, c), "cost")
    ledger = costs.ledger(cfg)
    totals = costs.totals(ledger)
    rows: list[costs.VaryRow] = []
    if varied is not None:
        doc = read_document(config)
        pairs = [parse_set(s) for s in c.sets]
        name, values = varied
        rows = costs.vary(doc, cfg, name, values, pairs, c.variant, c.max_elements, c.dtype, repeat)
    data: dict[str, Any] = {
        "trace_tf": _version(),
        "title": cfg.title,
        "ledger": [
            {
                "path": x.path,
                "stage": x.stage,
                "kind": x.kind,
                "shape": list(x.shape),
                "formula": x.formula,
                "terms": list(x.terms),
                "macs": x.macs,
            }
            for x in ledger
        ],
        "totals": asdict(totals),
    }
    items: list[RenderableType] = [
        render.cost_ledger(ledger),
        render.cost_totals(totals, costs.GROWTH),
    ]
    if varied is not None:
        name = varied[0]
        growth = costs.exponents(rows)
        data["vary"] = {
            "name": name,
            "meaning": costs.VARY[name],
            "rows": [asdict(r) for r in rows],
            "exponents": growth,
        }
        items.append(render.vary_table(name, costs.VARY[name], rows, costs.KINDS))
        if growth:
            from rich.text import Text

            items.append(
                Text(
                    f"growth exponent over {name} (multiply-adds ∝ {name}^p): "
                    + ", ".join(f"{k} p = {p:.2f}" for k, p in growth.items())
                )
            )
    emit(c, items, data)


def _version() -> str:
    from trace_tf import __version__

    return __version__


def main() -> None:
    app()


if __name__ == "__main__":
    main()
