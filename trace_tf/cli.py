"""The `trace-tf` command line: parse -> load -> run -> render. Nothing else.

Heavy modules (numpy, the engine) are imported inside the commands, so that
`trace-tf --help` and `trace-tf examples` start quickly.
"""

from __future__ import annotations

import functools
import inspect
import io
import json
import os
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
    from trace_tf.runner import CheckResult
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
FormatOpt = Annotated[str, typer.Option("--format", help="table or json.")]
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
    if fmt not in ("table", "json"):
        _fail(f"--format must be table or json, not {fmt!r}")
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
    except MemoryError:
        # Not a bug: a config within a raised --max-elements can still exceed the machine.
        if debug:
            raise
        typer.echo(
            "trace-tf: error: out of memory: the config's arrays do not fit in this machine's "
            "memory; expected smaller sizes (the default --max-elements refuses such configs "
            "before allocating)",
            err=True,
        )
        raise typer.Exit(2) from None
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
def _sink(c: Common) -> Iterator[Any]:
    """stdout, or a buffer written to --output only once everything is rendered, so a
    failure leaves no half-written file and an existing one is never lost."""
    if c.output is None:
        yield sys.stdout
        return
    _writable(c.output, c.force)
    buffer = io.StringIO()
    yield buffer
    _write_file(c.output, buffer.getvalue(), c.force)


def _writable(path: Path, force: bool) -> None:
    if path.is_dir():
        _fail(f"--output {path} is a directory")
    if path.exists() and not force:
        _fail(f"--output {path} exists; pass --force to overwrite it")


def _write_file(path: Path, text: str, force: bool) -> None:
    """Create `path` (refusing an existing file unless `force`), or replace it atomically."""
    _writable(path, force)
    try:
        if not force:
            with open(path, "x", encoding="utf-8") as fh:  # "x": never clobber, even in a race
                fh.write(text)
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    except FileExistsError:
        _fail(f"--output {path} exists; pass --force to overwrite it")
    except OSError as exc:
        _fail(f"cannot write --output {path}: {exc.strerror}")


def console(file: Any) -> Console:
    from rich.console import Console

    if file is sys.stdout:
        return Console(highlight=False)
    return Console(file=file, highlight=False, color_system=None, width=160)


def emit(c: Common, renderables: list[RenderableType], data: dict[str, Any]) -> None:
    """Print tables, or the JSON object, to stdout or --output."""
    with _sink(c) as fh:
        if c.fmt == "json":
            fh.write(json.dumps(data, allow_nan=False) + "\n")
        else:
            con = console(fh)
            for r in renderables:
                con.print(r)


def warn(c: Common, trace: Trace, file: str | None = None) -> None:
    """NaN and overflow: a warning on stderr, or an error with --strict."""
    from trace_tf.errors import NumericalError

    for w in trace.warnings:
        if c.strict:
            raise NumericalError(w + " (--strict)", file=file)
        typer.echo(f"trace-tf: warning: {f'{file}: ' if file else ''}{w}", err=True)


# ---------------------------------------------------------------------------
# Model commands
# ---------------------------------------------------------------------------


def _load(config: str | None, c: Common) -> Config | OpConfig:
    from trace_tf.config import load

    return load(config, c.sets, c.variant, c.max_elements)


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

    warn(c, trace, cfg.file)
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
    data = render.trace_json(
        cfg.title, tokens, steps, conventions=dict(conventions(cfg)), warnings=trace.warnings
    )
    if c.fmt == "json":
        emit(c, [], data)
        return
    head = render.header(cfg.title or cfg.file, conventions(cfg), trace.warnings)
    items = body() if body is not None else [render.trace_view(steps, c.view())]
    emit(c, [head, *items], data)


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
            help="A step name (softmax, q, ...), a group (qkv, add_norm, ffn, cross, attention) or a pattern with *.",
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
    from trace_tf.trace import check_stage

    cfg = _load(config, c)
    trace = run(cfg, "full")
    try:
        check_stage(stage, trace.stages())
    except InputError as exc:
        raise exc.with_file(cfg.file) from None
    steps = trace.select(stage, layer, head)
    if not steps:
        raise InputError(
            f"no step matches --stage {stage}"
            + (f" --layer {layer}" if layer is not None else "")
            + (f" --head {head}" if head is not None else ""),
            file=cfg.file,
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
    strict: StrictOpt = False,
    debug: DebugOpt = False,
    max_elements: MaxElementsOpt = 2**28,
) -> None:
    """Evaluate every `expect` entry; exit 1 if any does not match."""
    with guarded(debug):
        from rich.table import Table

        from trace_tf.config import parse_set, read_document
        from trace_tf.render import json_value
        from trace_tf.runner import check as run_check

        c = _common(
            sets=sets,
            variant=None,
            fmt=fmt,
            output=output,
            force=force,
            precision=precision,
            full=False,
            strict=strict,
            debug=debug,
            max_elements=max_elements,
        )
        pairs = [parse_set(s) for s in c.sets]
        results = []
        for name in configs or [None]:  # type: ignore[list-item]
            doc = read_document(name)
            results.extend(run_check(doc, pairs, c.max_elements))
        _check_warnings(c, results)
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
                    "max_abs_error": json_value(r.max_abs_error),  # inf when NaN meets a number
                    "atol": r.atol,
                    "note": r.note,
                    **({"problem": r.problem} if r.problem else {}),
                    **({"warnings": list(r.warnings)} if r.warnings else {}),
                }
                for r in results
            ],
        }
        from rich.text import Text

        emit(c, [table, Text(summary)], data)
        if failed:
            raise typer.Exit(1)


def _check_warnings(c: Common, results: list[CheckResult]) -> None:
    """Each run's NaN or overflow once on stderr (an error with --strict)."""
    from trace_tf.errors import NumericalError

    for config, variant, w in dict.fromkeys(
        (r.config, r.variant, w) for r in results for w in r.warnings
    ):
        label = config + (f" (variant {variant})" if variant else "")
        if c.strict:
            raise NumericalError(w + " (--strict)", file=label)
        typer.echo(f"trace-tf: warning: {label}: {w}", err=True)


@app.command()
def examples(debug: DebugOpt = False) -> None:
    """List the packaged examples."""
    with guarded(debug):
        from trace_tf.config import example_names, examples_dir

        for name in example_names():
            title = ""
            text = (examples_dir() / f"{name}.yaml").read_text(encoding="utf-8")
            for line in text.splitlines():
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
    from trace_tf.errors import InputError
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
    seen: set[str] = set()

    def keep(path: str) -> bool:
        seen.add(path.rsplit(".", 1)[-1])
        return trace and matches(path, stage, layer, head)

    tr = Tracer(keep=keep)  # records only what --trace asks for; warnings always
    try:  # what the config cannot serve is its error: name the file
        start = gen_mod.start_of(cfg, s)
        gen_mod.check_size(cfg, s, c.max_elements, traced=trace and stage is None)
        tr.name_all(cfg.named_arrays())
        result = gen_mod.run(cfg, s, tr)
        if stage is not None:
            check_stage(stage, seen)
    except InputError as exc:
        raise exc.with_file(cfg.file) from None
    warn(c, tr.trace, cfg.file)
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
    if c.fmt == "json":
        emit(c, [], data)
        return
    head_panel = render.header(cfg.title or cfg.file, header_rows, tr.trace.warnings)
    body = render.generation_view(result, cfg.vocab, steps, show, c.view())
    emit(c, [head_panel, *body], data)


# ---------------------------------------------------------------------------
# calculators and tools (issue 4): attend, norm, pe, diff, explain, stages
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# performance (issue 6): cost
# ---------------------------------------------------------------------------


def _version() -> str:
    from trace_tf import __version__

    return __version__


def main() -> None:
    app()


if __name__ == "__main__":
    main()
