"""The `trace-tf` command line: parse -> load -> run -> render. Nothing else.

Heavy modules (numpy, the engine) are imported inside the commands, so that
`trace-tf --help` and `trace-tf examples` start quickly. Annotations are not
postponed here (no `from __future__ import annotations`): typer reads each
command's parameter types when it starts, and evaluating them from strings costs
every run several milliseconds; names imported only for type checking are quoted.
"""

import functools
import inspect
import io
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional

import typer
from typer.core import TyperGroup

from trace_tf.text import Typed

if TYPE_CHECKING:
    import numpy as np
    from rich.console import Console, RenderableType

    from trace_tf.config import Config, OpConfig
    from trace_tf.explain import Explanation
    from trace_tf.render import View
    from trace_tf.runner import CheckResult
    from trace_tf.trace import Shown, Step, Trace


class _Group(TyperGroup):
    """Typer's group, with a usage error (an unknown option, a bad option value) told
    as every other bad input is: one line on stderr, exit 2, rather than a box."""

    def main(
        self,
        args: "Sequence[str] | None" = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        def run() -> Any:
            return super(_Group, self).main(
                args, prog_name, complete_var, False, windows_expand_args, **extra
            )

        try:  # typer 0.2x carries its own click (a click installed beside it is another class)
            from typer._click.exceptions import ClickException
        except ImportError:
            from click import ClickException  # type: ignore[no-redef,assignment,unused-ignore]

        if not standalone_mode:
            return run()
        try:
            code = run()
        except ClickException as exc:
            if type(exc).__name__ != "NoArgsIsHelpError":  # (`trace-tf` alone: help shown)
                ctx = getattr(exc, "ctx", None)
                hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
                typer.echo(f"trace-tf: error: {exc.format_message().rstrip('.')}{hint}", err=True)
            sys.exit(exc.exit_code)
        except typer.Abort:  # end of input where typer reads some
            typer.echo("trace-tf: interrupted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


try:  # (as _Group: typer 0.2x carries its own click, whose types its options take)
    from typer._click.types import FloatParamType
except ImportError:
    from click.types import FloatParamType  # type: ignore[assignment,unused-ignore]


class _FloatText(FloatParamType):
    """FLOAT as click reads it, kept with the text the user typed (text.Typed), so that
    a message says `found 1e-400`, not the 0 that float64 made of it."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        number = super().convert(value, param, ctx)
        return Typed(number, value) if isinstance(value, str) else number


FLOAT_TEXT = _FloatText()

_APP_SETTINGS: dict[str, Any] = dict(
    cls=_Group,
    name="trace-tf",
    help="Trace every step of a Transformer, number by number.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app = typer.Typer(**_APP_SETTINGS)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"trace-tf {_version()}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    pass


# ---------------------------------------------------------------------------
# The options every running command takes (SPEC section 4)
# ---------------------------------------------------------------------------

ConfigArg = Annotated[
    Optional[str],  # noqa: UP045 (typer needs Optional on Python 3.10)
    typer.Argument(
        help="Config file, the name of a packaged example (default: hello), or - for stdin.",
        metavar="CONFIG",
        show_default=False,
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
CSV_BY_STEP = "one step: select it with `step --stage PATH`"  # how a command's csv step is chosen


def _format_opt(csv: str, npz: str = "every step", offers_csv: bool = True) -> Any:
    """--format offering table, json, npz and, if `offers_csv`, csv; `npz` says which
    steps npz writes, `csv` which step csv writes and how it is chosen (or, without
    csv, why there is none)."""
    npz_text = f"npz ({npz} under its path, for numpy.load; needs --output, - for stdout)"
    return Annotated[
        str,
        typer.Option(
            "--format",
            help=f"table, json, {npz_text} or csv ({csv})."
            if offers_csv
            else f"table, json or {npz_text}; no csv ({csv}).",
        ),
    ]


FormatOpt = _format_opt(CSV_BY_STEP)
NO_CSV = ("table", "json", "npz")  # several steps, and no --stage to choose one
REPORTS = ("table", "json")  # no traced steps to write
TIMED_RUNS = 3  # cost's --repeat: the runs timed per --vary value
SHOWN_ROWS = 10  # generate's --show: the rows of each next-token distribution's table
ReportFormatOpt = Annotated[str, typer.Option("--format", help="table or json.")]
DtypeOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--dtype",
        help="float64 (default) or float32, for weights and every computation. float32 halves "
        "memory and is faster on large models but keeps about 7 significant digits: expect "
        "relative errors around 1e-6, larger after many layers, and `check` tolerances may not "
        "hold. A given number float32 would round to 0 (1e-46) is refused; one below 1.17549e-38 "
        "(a subnormal, fewer digits) is a warning.",
        show_default=False,
    ),
]
NoDtypeOpt = Annotated[  # a calculator's: refused with the reason, and not in its help
    Optional[str],  # noqa: UP045
    typer.Option("--dtype", hidden=True),
]
OutputOpt = Annotated[
    Optional[str],  # noqa: UP045 (a str: typer would read an empty one as Path("."))
    typer.Option(
        "--output",
        help="Write to this file instead of stdout (never overwrites without --force; - is stdout).",
        metavar="FILE",
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
    bool,
    typer.Option(
        "--debug", help="Show the Python traceback of an error (the exit code is unchanged)."
    ),
]
MaxElementsOpt = Annotated[
    int,
    typer.Option(
        "--max-elements",
        min=1,
        help="Refuse configs whose arrays would hold more numbers than this.",
    ),
]


MIN_WIDTH = 40  # a narrower terminal ($COLUMNS=1, say) is laid out 40 wide: it wraps
MAX_WIDTH = 1000  # panels fill the width: $COLUMNS=999999999 padded them out of memory


def screen_width() -> int:
    """The terminal's width (or $COLUMNS), 120 when stdout is not a terminal, between
    MIN_WIDTH and MAX_WIDTH."""
    import shutil

    return min(MAX_WIDTH, max(MIN_WIDTH, shutil.get_terminal_size((120, 40)).columns))


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

    @property
    def to_stdout(self) -> bool:
        """No --output, or `--output -`."""
        return self.output is None or str(self.output) == "-"

    @property
    def width(self) -> int:
        """The width tables are laid out for, and printed at: the terminal's (or
        $COLUMNS), 120 when stdout is not a terminal, 160 in an --output file; never
        under MIN_WIDTH, where a panel would have no room left for its text, nor over
        MAX_WIDTH."""
        return screen_width() if self.to_stdout else 160

    def view(self) -> "View":
        """Elide matrices to what fits the terminal. `max_cols` is the most columns that
        could fit, each at its narrowest (`0.1234` and its padding and border:
        precision + 5 cells); the tables then drop columns until they really fit."""
        from trace_tf.render import View

        width = self.width
        cols = max(4, (width - 4) // (self.precision + 5))
        return View(
            precision=self.precision,
            full=self.full,
            max_cols=cols,
            col_edge=max(2, (cols - 1) // 2),
            width=width,
        )


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


def _common(formats: tuple[str, ...] = FORMATS, **given: Any) -> Common:
    """The shared options; those a command does not take keep their defaults.
    `formats`: the --format values the command can write."""
    kw: dict[str, Any] = {name: default for name, (_, default) in _COMMON_OPTIONS.items()}
    kw.update({k: v for k, v in given.items() if k in _COMMON_OPTIONS})
    from trace_tf.errors import suggest

    fmt = kw["fmt"]
    if fmt not in formats:
        why = {"npz": "traced steps", "csv": "a single step's matrix"}.get(fmt)
        _fail(
            f"--format must be one of {', '.join(formats)}, not {fmt!r}"
            + (
                f" ({fmt} writes {why}, and this command has {'none' if formats == REPORTS else 'several'})"
                if why
                else suggest(fmt, formats)
            )
        )
    if kw.get("output") == "":
        _fail("--output is empty; expected a file name, or - for stdout")
    if kw.get("output") is not None:
        if kw["output"] != "-":
            _output_in_a_directory(kw["output"])
        kw["output"] = Path(kw["output"])
    if fmt == "npz" and kw.get("output") is None:
        _fail("--format npz writes a binary file: give it with --output FILE")
    if kw.get("dtype") not in (None, "float64", "float32"):
        dtypes = ("float64", "float32")
        _fail(
            f"--dtype must be float64 or float32, not {kw['dtype']!r}{suggest(kw['dtype'], dtypes)}"
        )
    return Common(sets=list(kw["sets"] or []), **{k: v for k, v in kw.items() if k != "sets"})


def running(
    formats: tuple[str, ...] = FORMATS,
    dtype: bool = True,
    csv: str = CSV_BY_STEP,
    npz: str = "every step",
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A command that runs the model: it takes the common options (SPEC section 4),
    with --format offering `formats` (its help saying what npz and csv write: `npz`,
    `csv`; or, where `formats` has no csv, `csv` why not) and --dtype in its help only
    if `dtype`, receives them as `c: Common`, and has its errors turned into exit
    codes."""

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        own = [p for p in inspect.signature(fn).parameters.values() if p.name != "c"]
        if formats == REPORTS:
            fmt = ReportFormatOpt
        else:
            fmt = _format_opt(csv, npz, offers_csv=formats == FORMATS)
        options = {**_COMMON_OPTIONS, "fmt": (fmt, "table")}
        if not dtype:  # the calculators compute in float64, as their inputs are written
            options["dtype"] = (NoDtypeOpt, None)
        common = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=d)
            for name, (ann, d) in options.items()
        ]

        @functools.wraps(fn)
        def command(**kw: Any) -> None:
            with guarded(kw["debug"]):
                c = _common(formats, **{name: kw.pop(name) for name in _COMMON_OPTIONS})
                fn(c, **kw)

        command.__signature__ = inspect.Signature([*own, *common])  # type: ignore[attr-defined]
        del command.__wrapped__  # typer must read the signature above, not fn's
        return command

    return wrap


def _fail(message: str) -> NoReturn:
    from trace_tf.errors import InputError

    raise InputError(message)


OUT_OF_MEMORY = (
    "trace-tf: error: out of memory: the config's arrays do not fit in this machine's "
    "memory; expected smaller sizes (the default --max-elements refuses such configs "
    "before allocating)"
)


def _end(code: int, message: str, debug: bool) -> NoReturn:
    """End a command: with --debug the traceback first; the exit code is the same either
    way (a bug is 3 with or without --debug, never Python's 1, which is a check's mismatch)."""
    if debug:
        import traceback

        traceback.print_exc(file=sys.stderr)
    typer.echo(message, err=True)
    raise typer.Exit(code) from None


def _unloadable(exc: ImportError) -> str:
    """The library an ImportError failed to load. numpy re-raises the failure of its C core
    as a new ImportError with no name, so then the first module the traceback enters
    outside trace-tf and the import machinery names it (numpy/__init__.py: numpy)."""
    if exc.name:
        return exc.name
    tb = exc.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module and not module.startswith(("trace_tf", "importlib", "contextlib")):
            return module.split(".")[0]
        tb = tb.tb_next
    return "a library it needs"


@contextmanager
def guarded(debug: bool) -> Iterator[None]:
    """Bad input: one line on stderr, exit 2. A bug: one line, exit 3 (--debug: traceback)."""
    from trace_tf.errors import InputError
    from trace_tf.loader import FILES_READ

    FILES_READ.clear()  # a command starts: it has read nothing yet
    try:
        yield
    except InputError as exc:
        _end(2, f"trace-tf: error: {exc}", debug)
    except (typer.Exit, typer.Abort):
        raise
    except KeyboardInterrupt:
        # Ctrl-C: 130 (128 + SIGINT), as shells report it; never 1, a check's mismatch
        typer.echo("trace-tf: interrupted", err=True)
        raise typer.Exit(130) from None
    except MemoryError:
        # Not a bug: a config within a raised --max-elements can still exceed the machine.
        _end(2, OUT_OF_MEMORY, debug)
    except ImportError as exc:
        # Not a bug either: numpy (loaded when a command first needs it) is broken or
        # missing, or the process may not map more memory (`ulimit -v`). numpy's own
        # message is a page long; its last line says what failed.
        lines = str(exc).strip().splitlines()
        detail = lines[-1].removeprefix("Original error was: ") if lines else ""
        _end(
            3,
            f"trace-tf: error: cannot load {_unloadable(exc)} ({detail}); "
            "expected a working installation and the memory to load it",
            debug,
        )
    except Exception as exc:
        hint = "" if debug else " Run again with --debug to see the traceback."
        _end(
            3,
            f"trace-tf: internal error ({type(exc).__name__}: {exc}); this is a bug.{hint}",
            debug,
        )


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


@contextmanager
def _sink(c: Common, binary: bool = False) -> Iterator[Any]:
    """stdout (also for `--output -`); a pipe or character device (`/dev/null`, a
    FIFO) written straight into; or a file, written through a temporary file beside
    it that takes its name only once everything is written: a failure leaves no
    half-written file, and an existing one is never lost (nor replaced without
    --force). A symbolic link is written through, as a shell's `>` does."""
    if c.to_stdout:
        _no_binary_to_terminal(sys.stdout, binary, "-")
        with _write_errors("standard output"):
            out = sys.stdout.buffer if binary else sys.stdout
            yield out
            out.flush()  # a full disk says so now, not at exit
        return
    path = c.output
    assert path is not None
    if _is_stream(path):
        with _write_errors(f"--output {path}"), _open(path, binary, shown=path) as fh:
            _no_binary_to_terminal(fh, binary, str(path))  # /dev/stdout, /dev/tty
            yield _InOrder(fh) if binary else fh
        return
    _writable(path, c.force)
    real = Path(os.path.realpath(path))
    # (its start only: a name of 250 characters, valid, must not make one too long)
    tmp = real.with_name(f".{real.name[:64]}.{os.getpid()}.tmp")
    try:
        with _write_errors(f"--output {path}"), _open(tmp, binary, shown=path) as fh:
            yield fh
        _commit(tmp, real, c.force, shown=path)
    finally:
        with suppress(OSError):  # (never made, when the name could not be)
            tmp.unlink(missing_ok=True)


class _InOrder:
    """A pipe or character device for bytes, neither seekable nor telling: zipfile (npz)
    then writes in order, as into a pipe. (/dev/null is seekable but stays at position
    0, which made zipfile's offsets negative.)"""

    def __init__(self, out: Any) -> None:
        self._out = out

    def write(self, data: bytes) -> int:
        return int(self._out.write(data))

    def read(self, size: int = -1) -> bytes:  # (numpy takes an object without it for a path)
        raise io.UnsupportedOperation("read")

    def flush(self) -> None:
        self._out.flush()


def _no_binary_to_terminal(out: Any, binary: bool, shown: str) -> None:
    if binary and out.isatty():
        _fail(f"--output {shown} would write binary data to the terminal; redirect it to a file")


@contextmanager
def _write_errors(shown: str) -> Iterator[None]:
    """A failed write (a full disk, an I/O error) is the machine's state, not a bug:
    one line, exit 2. (A reader that went away ends the process by SIGPIPE instead.)"""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        _fail(f"cannot write {shown}: {exc.strerror or exc}")
    except UnicodeEncodeError as exc:  # a terminal set to ASCII or Latin-1: its state, too
        _fail(
            f"cannot write {shown}: its encoding, {exc.encoding}, has no "
            f"{exc.object[exc.start]!r} (U+{ord(exc.object[exc.start]):04X}); expected an "
            "output that takes UTF-8 (a UTF-8 locale, or PYTHONIOENCODING=utf-8)"
        )


def _output_in_a_directory(given: str) -> None:
    """--output as the system reads the name, before Path() and realpath() tidy it: `x/`
    and `x/.` name a directory, and in `f.txt/../y` or `gone/../y` the part before the
    file name is no directory (a shell's `>` refuses all three). Tidied, they were the
    files x and y: `x/` wrote (with --force, overwrote) the file x."""
    head, name = os.path.split(given)
    if name in ("", ".", ".."):
        last = "a name ending in '/'" if not name else f"'{name}' as its last part"
        _fail(f"--output {given} names a directory; expected a file name, found {last}")
    if head:
        import stat

        try:
            mode = os.stat(head).st_mode
        except OSError as exc:  # `gone/..`: no such directory; `f.txt/..`: not a directory
            _fail(f"cannot write --output {given}: {head}: {exc.strerror}")
        if not stat.S_ISDIR(mode):
            _fail(f"cannot write --output {given}: {head}: Not a directory")


def _is_stream(path: Path) -> bool:
    """Whether `path` is an existing pipe or character device (after its links); a
    block device or socket is refused."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:  # not there (yet), or not reachable: the file path reports it
        return False
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return True
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        _fail(f"--output {path} is not a file, a pipe or a character device")
    return False


def _writable(path: Path, force: bool) -> None:
    # (os.path: False, not an OSError, for a name too long; writing it then says so)
    if os.path.isdir(path):
        _fail(f"--output {path} is a directory")
    if _was_read(path):  # what the user gave is never modified, --force or not
        _fail(f"--output {path} is a file this command reads; write to another file")
    if os.path.exists(path) and not force:
        _fail(f"--output {path} exists; pass --force to overwrite it")


def _was_read(path: Path) -> bool:
    """Whether `path` is (a link to) a file this command has read."""
    from trace_tf.loader import FILES_READ

    try:
        st = os.stat(path)
    except (OSError, ValueError):  # not there, or a name the system refuses
        return False
    return (st.st_dev, st.st_ino) in FILES_READ


def _open(path: Path, binary: bool, shown: Path) -> Any:
    """A file for --output (`shown`: as given) opened for writing: bytes (npz), or
    UTF-8 text with its newlines as written (csv)."""
    try:
        if binary:
            return open(path, "wb")
        # surrogateescape: a file name's bytes that were not UTF-8 are written back as they
        # were, as the terminal shows them (Python keeps such a byte 0xNN as U+DCNN)
        return open(path, "w", encoding="utf-8", errors="surrogateescape", newline="")
    except OSError as exc:
        _fail(f"cannot write --output {shown}: {exc.strerror}")


def _commit(tmp: Path, path: Path, force: bool, shown: Path) -> None:
    """Give the written file its name: replace (--force), or link, which refuses an
    existing name even if one appeared meanwhile. (`shown`: the path as given.)"""
    try:
        if force:
            if os.path.exists(path):  # overwritten, it keeps its permissions, as a shell's `>`
                import shutil

                shutil.copymode(path, tmp)
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError:  # a filesystem without hard links
            _writable(path, force)
            os.replace(tmp, path)
    except FileExistsError:
        _fail(f"--output {shown} exists; pass --force to overwrite it")
    except OSError as exc:
        _fail(f"cannot write --output {shown}: {exc.strerror}")


def console(file: Any, width: int) -> "Console":
    from rich.console import Console

    # Every string is text: a "[/]" or "[bold]" in a token, title or note is printed as
    # written, not read as rich markup (styles are given as Text); and a ":name:" is no
    # emoji (nor is the emoji table loaded). The width is the one tables were elided
    # for (rich's own guess for a pipe, 80, would crop them).
    if file is sys.stdout:
        return Console(highlight=False, markup=False, emoji=False, width=width)
    return Console(
        file=file, highlight=False, markup=False, emoji=False, color_system=None, width=width
    )


def emit(
    c: Common,
    renderables: "list[RenderableType]",
    data: dict[str, Any] | Callable[[], dict[str, Any]],
    steps: "list[Step] | None" = None,
    choose: str = "`trace-tf step --stage PATH` (a whole path, e.g. encoder.0.self_attn.h0.softmax)",
) -> None:
    """Print tables, or the JSON object (built only when asked for), to stdout or --output;
    or write the steps: npz every one under its path, csv the one selected."""
    if c.fmt in ("npz", "csv"):
        assert steps is not None, "a command without steps offers table and json only"
        _write_steps(c, steps, choose)
        return
    with _sink(c) as fh:
        if c.fmt == "json":
            from trace_tf.text import write_json

            write_json(fh, data() if callable(data) else data)
            fh.write("\n")
        else:
            from trace_tf.render import least_width, unpadded

            con = console(fh, c.width)
            # A table whose numbers cannot all fit is printed wider than the terminal
            # rather than cut one; with --full, every column of a matrix, however wide.
            renderables = [unpadded(r, con.width) for r in renderables]
            widths = [least_width(r) for r in renderables]
            screen, con.width = con.width, max(con.width, *widths)
            for r, need in zip(renderables, widths, strict=True):
                con.print(r, width=max(screen, need))  # the rest keeps the screen's width


def _write_steps(c: Common, steps: "list[Step]", choose: str) -> None:
    if c.fmt == "npz":
        import numpy as np

        savez: Any = np.savez  # keys are step paths (numpy's stub types **kwds as bool)
        with _sink(c, binary=True) as fh:
            savez(fh, **{s.path: s.value for s in steps})
        return
    if len(steps) != 1:
        _fail(
            f"--format csv writes one step, and {len(steps)} are selected; "
            f"choose one with {choose}, or use --format npz for many"
        )
    from trace_tf.render import step_csv

    text = step_csv(steps[0])
    with _sink(c) as fh:
        fh.write(text)


def warn(c: Common, warnings: list[str], file: str | None = None) -> None:
    """NaN and overflow: a warning on stderr, or an error with --strict; a given number
    stored with fewer digits (an InputNote) a warning either way."""
    from trace_tf.errors import InputNote, NumericalError

    for w in warnings:
        if c.strict and not isinstance(w, InputNote):
            raise NumericalError(w + " (--strict)", file=file)
        _warning(f"{file}: {w}" if file else w)


def _warning(text: str) -> None:
    """A warning on stderr, on one line whatever a file name in it holds (as errors are)."""
    from trace_tf.text import printable

    typer.echo(f"trace-tf: warning: {printable(text)}", err=True)


# ---------------------------------------------------------------------------
# Model commands
# ---------------------------------------------------------------------------


def _load(config: str | None, c: Common) -> "Config | OpConfig":
    from trace_tf.config import load

    return load(config, c.sets, c.variant, c.max_elements, c.dtype)


def _show(
    cfg: "Config | OpConfig",
    trace: "Trace",
    steps: "list[Step]",
    c: Common,
    body: "Callable[[], list[RenderableType]]",
    inputs: "Sequence[Step]" = (),
    weights: "Mapping[str, Step] | None" = None,
) -> None:
    """Tables (`body`: laid out by the view the run stored its parts for), JSON, npz or
    csv of `steps`; with `inputs` (`step --inputs`), JSON and npz also hold those
    (earlier steps, and arrays of `weights`) once each."""
    from trace_tf import render
    from trace_tf.config import Config
    from trace_tf.runner import conventions

    warn(c, trace.warnings, cfg.file)
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
        if cfg.model.token_types:  # each position's token type, beside its token
            tokens["source_types"] = cfg.source.types if cfg.source else None
            tokens["target_types"] = tgt.types if tgt else None

    def data() -> dict[str, Any]:
        out = render.trace_json(
            cfg.title, tokens, steps, conventions=dict(conventions(cfg)), warnings=trace.warnings
        )
        if inputs:
            sources = cfg.sources if isinstance(cfg, Config) else {}
            out["inputs"] = render.inputs_json(inputs, weights or {}, sources)
        return out

    if c.fmt != "table":
        emit(c, [], data, [*steps, *inputs])
        return
    head = render.header(cfg.title or cfg.file, conventions(cfg), trace.warnings)
    items = body()
    emit(c, [head, *items], data, steps)


def _trace_command(command: str, config: str | None, c: Common) -> None:
    from trace_tf import render
    from trace_tf.runner import require_model, run

    cfg = require_model(_load(config, c), command)
    # One view for the run and its tables: the parts stored are those it shows (a
    # terminal resized meanwhile would otherwise ask for numbers not kept).
    view = c.view()
    trace = run(cfg, command, part=_table_part(c, view))
    steps = list(trace)
    _show(cfg, trace, steps, c, lambda: [render.trace_view(steps, view)])


def _table_part(c: Common, view: "View") -> "Callable[[np.ndarray], np.ndarray | Shown] | None":
    """What a traced run stores of each step: for tables (elided), only the numbers they
    show, so the engine's arrays are freed as in an untraced run (render.View.part);
    for json, npz and csv, or --full, every array whole (None)."""
    return view.part if c.fmt == "table" and not view.full else None


@app.command()
@running()
def encode(c: Common, config: ConfigArg = None) -> None:
    """Run the encoder on `source` and show every step in order."""
    _trace_command("encode", config, c)


@app.command()
@running()
def decode(c: Common, config: ConfigArg = None) -> None:
    """Encoder + decoder on `source` and `target` (teacher forcing) through logits and probs."""
    _trace_command("decode", config, c)


@app.command()
@running(csv="one step: select it with --stage PATH, a whole path")
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
    with_inputs: Annotated[
        bool,
        typer.Option(
            "--inputs",
            help="With --format json or npz: also write the numbers of the inputs the steps "
            "were computed from (earlier steps, weights), each once (the tables always show "
            "them).",
        ),
    ] = False,
) -> None:
    """Only the matching steps, each with the inputs it was computed from and its formula."""
    from trace_tf import render
    from trace_tf.errors import InputError
    from trace_tf.runner import input_steps, inputs_of, run
    from trace_tf.trace import check_selection, matches

    if with_inputs and c.fmt == "csv":
        _fail("--inputs writes the inputs' numbers beside the steps: use --format json or npz")
    if with_inputs and c.fmt == "table":
        _warning("--inputs adds the inputs' numbers to --format json or npz: unused by tables")
    cfg = _load(config, c)
    # Store only the selected steps (and, as they are recorded, their inputs); for
    # tables, only what they show of each (see _trace_command).
    view = c.view()
    trace = run(
        cfg,
        "full",
        keep=lambda p: matches(p, stage, layer, head),
        with_inputs=True,
        part=_table_part(c, view),
    )
    try:
        check_selection(trace, stage, layer, head)
    except InputError as exc:
        raise exc.with_file(cfg.file) from None
    steps = trace.select(stage, layer, head)
    weights = input_steps(cfg)
    given = inputs_of(steps, trace.steps, weights) if with_inputs and c.fmt != "table" else []
    _show(
        cfg,
        trace,
        steps,
        c,
        lambda: [render.step_with_inputs(s, trace.steps, weights, view) for s in steps],
        given,
        weights,
    )


@app.command()
def check(
    configs: Annotated[
        list[str] | None,
        typer.Argument(
            help="Config files with `expect` entries (default: hello).",
            metavar="CONFIG...",
            show_default=False,
        ),
    ] = None,
    every_example: Annotated[
        bool,
        typer.Option(
            "--examples",
            help="Check every packaged example, in name order (no CONFIG).",
        ),
    ] = False,
    sets: SetOpt = None,
    fmt: ReportFormatOpt = "table",
    output: OutputOpt = None,
    force: ForceOpt = False,
    precision: PrecisionOpt = 4,
    strict: StrictOpt = False,
    debug: DebugOpt = False,
    max_elements: MaxElementsOpt = 2**28,
) -> None:
    """Evaluate every `expect` entry; exit 1 if any does not match."""
    with guarded(debug):
        from dataclasses import asdict

        from trace_tf.config import parse_set, read_document
        from trace_tf.render import json_value
        from trace_tf.runner import check as run_check

        c = _common(
            REPORTS,
            sets=sets,
            fmt=fmt,
            output=output,
            force=force,
            precision=precision,
            strict=strict,
            debug=debug,
            max_elements=max_elements,
        )
        pairs = [parse_set(s) for s in c.sets]
        if every_example:
            from trace_tf.loader import example_names

            if configs:
                _fail("--examples checks every packaged example; give it no CONFIG")
            docs = (read_document(name, example=True) for name in example_names())
        else:
            docs = (read_document(name) for name in configs or [None])  # type: ignore[list-item]
        results = []
        for doc in docs:
            results.extend(run_check(doc, pairs, c.max_elements))
        _check_warnings(c, results)
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
                    "rtol": r.rtol,
                    "note": r.note,
                    **(
                        {"document": {k: json_value(v) for k, v in asdict(r.document).items()}}
                        if r.document
                        else {}
                    ),
                    **({"problem": r.problem} if r.problem else {}),
                    **({"warnings": list(r.warnings)} if r.warnings else {}),
                }
                for r in results
            ],
        }
        from rich.text import Text

        from trace_tf.render import check_view

        emit(c, [*check_view(results, c.width), Text(summary)], data)
        if failed:
            raise typer.Exit(1)


def _check_warnings(c: Common, results: "list[CheckResult]") -> None:
    """Each run's NaN or overflow once on stderr (an error with --strict)."""
    for config, variant, w in dict.fromkeys(
        (r.config, r.variant, w) for r in results for w in r.warnings
    ):
        warn(c, [w], config + (f" (variant {variant})" if variant else ""))


@app.command()
@running(REPORTS)
def weights(c: Common, config: ConfigArg = None) -> None:
    """Every weight the model reads: its key path, shape and where its numbers came from."""
    from trace_tf import render
    from trace_tf.runner import require_model
    from trace_tf.runner import weights as listed

    cfg = require_model(_load(config, c), "weights")
    warn(c, list(cfg.notes), cfg.file)  # (given numbers stored with fewer digits)
    rows = listed(cfg)
    table = render.weights_table([(k, shape, src.text) for k, shape, src in rows], c.view())
    emit(
        c,
        [table],
        lambda: {  # (built only for JSON: a vocabulary may have 50,000 embeddings)
            "trace_tf": _version(),
            "title": cfg.title,
            "weights": render.weights_json(rows),
            "warnings": list(cfg.notes),
        },
    )


_TITLE_LEAST = 30  # the fewest cells `examples` gives its titles beside the names


@app.command()
def examples(
    name: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(
            help="Print this example's YAML (to start a config from: > mine.yaml).",
            metavar="NAME",
            show_default=False,
        ),
    ] = None,
    debug: DebugOpt = False,
) -> None:
    """List the packaged examples, or print one's file."""
    with guarded(debug):
        from trace_tf.errors import InputError, quoted, suggest
        from trace_tf.loader import (  # no numpy: starts quickly
            example_names,
            example_title,
            examples_dir,
            read_text,
        )
        from trace_tf.text import beside

        width, names = screen_width(), example_names()
        if name is not None:
            if name not in names:
                raise InputError(
                    "no such packaged example" + suggest(name, names),
                    file=name,
                    expected="a name trace-tf examples lists",
                    found=quoted(name),
                )
            # an installed trace-tf has no fixtures/ to read the examples in
            with _write_errors("standard output"):
                sys.stdout.write(read_text(examples_dir() / f"{name}.yaml"))
                sys.stdout.flush()
            return
        # Each title beside its name, over lines at its spaces, or under it where the
        # titles' column would be too narrow
        lines = beside([(n, example_title(n)) for n in names], width, _TITLE_LEAST)
        with _write_errors("standard output"):  # a full disk: one line, exit 2
            sys.stdout.write("".join(f"{x}\n" for x in lines))
            sys.stdout.flush()


# ---------------------------------------------------------------------------
# generate (issue 3): commands for autoregressive decoding go here
# ---------------------------------------------------------------------------


@app.command()
@running(
    csv="one traced step: select it with --trace --stage PATH, a whole path",
    npz="with --trace, every traced step",
)
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
        typer.Option(
            "--temperature",
            click_type=FLOAT_TEXT,
            help="--sample: divide the logits by T.",
            show_default="1",
        ),
    ] = None,
    top_k: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--top-k",
            help="--sample: keep the k most probable tokens (default: every token).",
            show_default=False,
        ),
    ] = None,
    top_p: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--top-p",
            click_type=FLOAT_TEXT,
            help="--sample: keep the smallest most-probable set whose total reaches p (default 1: "
            "every token of non-zero probability).",
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
            click_type=FLOAT_TEXT,
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
    layer: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--layer", min=0, help="With --trace: only this layer."),
    ] = None,
    head: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--head", min=0, help="With --trace: only this head."),
    ] = None,
    show: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--show",
            min=1,
            help=f"Rows of each next-token distribution's table (default {SHOWN_ROWS}).",
            show_default=False,
        ),
    ] = None,
    explain_step: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--explain",
            metavar="STEP",
            help="Show only one entry of this step of the generation written out with its "
            "numbers, as `explain` does: a path (t3.decoder.0.self_attn.h0.softmax) or a "
            "stage or pattern that selects one step.",
            show_default=False,
        ),
    ] = None,
    cell: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--cell",
            help="With --explain: the entry, I,J (default: the first, 0,0).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Autoregressive decoding until tokens.eos or --max-tokens, iteration by iteration.

    From the target (tokens.bos when the file gives none), each iteration shows its prefix,
    the next-token distribution and the token chosen; with --explain, one entry of one
    step of it, written out."""
    from trace_tf import generate as gen_mod
    from trace_tf import render
    from trace_tf.config import notes_of
    from trace_tf.errors import InputError, InputNote
    from trace_tf.runner import conventions, require_model
    from trace_tf.trace import CheckingTracer, Tracer, check_selection, matches

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
    unused = list(s.unused)
    if show is not None and (explain_step is not None or c.fmt != "table"):
        # (the table's rows: JSON holds each whole distribution, --explain one entry)
        by = "--explain" if explain_step is not None else f"--format {c.fmt}"
        unused.append(f"--show applies to the table of each distribution: unused by {by}")
    for note in unused:  # said at once: also when the run then stops on an error
        _warning(note)
    if cell is not None and explain_step is None:
        _fail("--cell chooses the entry --explain writes out: add --explain STEP")
    if explain_step is not None:
        if stage is not None or layer is not None or head is not None:
            _fail(
                "--explain names its one step itself (a path, a stage or a pattern); "
                "--stage, --layer and --head select the steps of --trace"
            )
        if c.fmt in ("npz", "csv"):
            _fail(f"--explain writes one explanation, as a table or json, not --format {c.fmt}")
        trace = True  # every step, so that each input of the step can be read
    if (stage is not None or layer is not None or head is not None) and not trace:
        _fail("--stage, --layer and --head select traced steps: add --trace")
    if c.fmt in ("npz", "csv") and not trace:
        _fail(f"--format {c.fmt} writes traced steps: add --trace")
    cfg = require_model(_load(config, c), "generate")
    # given numbers stored with fewer digits: the config's and the options', one note
    notes = notes_of([*cfg.lows, *gen_mod.given_lows(s, cfg.model.dtype)])
    # --trace records what it is asked for (for tables, what they show of it; all of it
    # for --explain, which reads every input); without, only NaN and overflow are watched
    view = c.view()
    part = _table_part(c, view) if explain_step is None else None
    tr = (
        Tracer(keep=lambda path: matches(path, stage, layer, head), part=part)
        if trace
        else CheckingTracer()
    )
    tr.trace.warnings.extend(notes)
    try:  # what the config cannot serve is its error: name the file
        start = gen_mod.start_of(cfg, s)
        gen_mod.check_size(
            cfg, s, c.max_elements, traced=trace and stage is None, selectable=explain_step is None
        )
        tr.name_all(cfg.named_arrays())
        result = gen_mod.run(cfg, s, tr)
        if stage is not None or layer is not None or head is not None:
            check_selection(tr.trace, stage, layer, head)  # as `step` does
        if explain_step is not None:
            from trace_tf import explain as ex

            e = ex.explain_named(cfg, tr.trace, explain_step, cell, c.precision)
    except InputError as exc:
        if any(not isinstance(w, InputNote) for w in tr.trace.warnings):
            # the run went NaN or overflowed: a tiny given number (a scale or temperature
            # of 1e-40, a divisor) may be why, so its note comes first, as encode's does
            warn(c, list(notes), cfg.file)
        raise exc.with_file(cfg.file) from None
    warn(c, tr.trace.warnings, cfg.file)
    if explain_step is not None:  # the explanation only, as `explain` prints it
        _emit_explanation(c, cfg, e, generated=list(result.generated))
        return
    warnings = [*unused, *tr.trace.warnings]
    steps = list(tr.trace)
    tokens: dict[str, Any] = {
        "source": cfg.source.labels if cfg.source else None,
        "target": start,
    }
    if cfg.model.token_types:  # the start's types; a generated token's: decoder_types
        from trace_tf.model import decoder_types

        tokens["source_types"] = cfg.source.types if cfg.source else None
        tokens["target_types"] = decoder_types(cfg, len(start))
    header_rows = conventions(cfg) + gen_mod.describe(
        s, cfg.tokens.eos, encoder=cfg.model.encoder_layers > 0
    )

    def data() -> dict[str, Any]:
        return render.trace_json(
            cfg.title,
            tokens,
            steps,
            **render.generation_json(result, cfg.vocab),
            conventions=dict(header_rows),
            warnings=warnings,
        )

    traced = steps if trace else None  # what --format npz / csv write (with --trace only)
    if c.fmt != "table":
        emit(c, [], data, traced, "--stage PATH (a whole path, e.g. t0.probs)")
        return
    head_panel = render.header(cfg.title or cfg.file, header_rows, warnings)
    body = render.generation_view(result, cfg.vocab, steps, show or SHOWN_ROWS, view)
    emit(c, [head_panel, *body], data, traced)


# ---------------------------------------------------------------------------
# calculators and tools (issue 4): attend, norm, pe, diff, explain, stages
# ---------------------------------------------------------------------------

MatrixOpt = Optional[str]  # noqa: UP045 (typer needs Optional on Python 3.10)
WordOpt = Optional[str]  # noqa: UP045
_MATRIX_HELP = "rows separated by ';', numbers by spaces or commas, e.g. '1 0 0; 1,2,0'"


def _inline_value(text: str, option: str) -> Any:
    """A number, or a vector, given to an option."""
    from trace_tf.config import parse_matrix

    rows = parse_matrix(text, option)
    if all(isinstance(row, list) for row in rows):  # "1 2; 3": a row of one is its number
        rows = [r[0] if len(r) == 1 else r for r in rows]
    return rows[0] if len(rows) == 1 else rows  # (YAML `[1, 2]` is the vector itself)


def _scale_value(text: str) -> float | str:
    """--scale read as `attention.scale` is in the file and by --set (YAML 1.2 numbers)."""
    from trace_tf.loader import read_number

    if text.strip() == "sqrt_dk":
        return "sqrt_dk"
    value = read_number(text.strip())
    if value is None:
        _fail(
            f"--scale must be a number or sqrt_dk; expected a positive number or sqrt_dk, "
            f"found {text!r}"
        )
    return _as_in_file(Typed(value, text), "--scale")  # (1e-400, 1e400 refused there)


def _set_into(c: Common, kind: str) -> bool:
    """Whether a --set writes into the single-operation section `kind` (--set
    attention.Q=[[1]]): it then stands in for the command's own input options."""
    from trace_tf.config import parse_set

    return any(parse_set(s)[0].split(".")[0] == kind for s in c.sets)


def _op_config(
    command: str, kind: str, file: str | None, options: list[tuple[str, str, Any]], c: Common
) -> "OpConfig":
    """A single-operation config: the file's `kind:` section (or an empty one), then its
    variant, --set, and the command's own options, each an override of that section."""
    from trace_tf.config import (
        OP_COMMANDS,
        OP_KINDS,
        Document,
        OpConfig,
        build,
        parse_set,
        read_document,
    )
    from trace_tf.errors import InputError
    from trace_tf.loader import Lines

    if file is None:
        doc = Document(
            "command line", {"title": f"{command}, from the command line", kind: {}}, Lines()
        )
    else:
        doc = read_document(file)
        found = [k for k in ("model", *OP_KINDS) if k in doc.data]
        if found != [kind]:
            # what runs the file instead: its operation's command, or a model's
            runs = {"model": "encode"} | OP_COMMANDS
            instead = f" (trace-tf {runs[found[0]]} runs this file)" if len(found) == 1 else ""
            raise InputError(
                f"{command} needs a single {kind} operation{instead}",
                file=doc.file,
                expected=f"a file with the section '{kind}:' (and no model or other operation)",
                found=", ".join(f"'{k}:'" for k in found) or "neither",
            )
    sets = [parse_set(s) for s in c.sets]
    own = [(f"{kind}.{key}", _as_in_file(value, option), option) for key, option, value in options]
    cfg = build(doc, sets, c.variant, c.max_elements, c.dtype, own)  # --dtype: refused there
    assert isinstance(cfg, OpConfig)
    return cfg


def _as_in_file(value: Any, option: str) -> Any:
    """An option's value as the file would hold it: a number typed whole (`0`, `-1`) an
    int, so that a message says `found the number 0`, not 0.0, any other kept with its
    text (`found the number -1.50`, not -1.5); a number float64 cannot hold (1e-400,
    1e400) refused, as in the file."""
    from trace_tf.config import within_float64
    from trace_tf.text import whole_number

    if not isinstance(value, Typed):
        return value
    within_float64(value, option)
    return int(value.text.strip()) if whole_number(value.text.strip(), signed=True) else value


def _run_op(cfg: "OpConfig", c: Common) -> None:
    """Run a single operation and show what it was given, then every step."""
    from trace_tf import render
    from trace_tf.calc import op_arrays
    from trace_tf.runner import run
    from trace_tf.trace import Step

    trace = run(cfg)
    view = c.view()

    def body() -> "list[RenderableType]":
        given = [
            render.step_table(Step(path=name, formula="given", data=arr), view)
            for name, arr in op_arrays(cfg.kind, cfg.params).items()
            if arr.ndim >= 1
        ]
        return [*given, render.trace_view(list(trace), view)]

    _show(cfg, trace, list(trace), c, body)


@app.command()
@running(
    NO_CSV,
    dtype=False,
    csv="it writes a single matrix, and attend records several: attn.scores, attn.scaled, "
    "attn.masked with a mask, attn.softmax, attn.context, and a score function's own",
)
def attend(
    c: Common,
    file: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(
            help="A file with an 'attention:' section.", metavar="FILE", show_default=False
        ),
    ] = None,
    q: Annotated[MatrixOpt, typer.Option("--q", help=f"Queries Q: {_MATRIX_HELP}.")] = None,
    k: Annotated[MatrixOpt, typer.Option("--k", help="Keys K, one row per key.")] = None,
    v: Annotated[MatrixOpt, typer.Option("--v", help="Values V, one row per key.")] = None,
    mask: Annotated[
        MatrixOpt,
        typer.Option(
            "--mask",
            help="Additive mask M, n_q x n_k: 0 attends, -inf masks; another number is added as a "
            "bias (default none).",
        ),
    ] = None,
    scale: Annotated[
        WordOpt,
        typer.Option(
            "--scale",
            help="Divide the scores by this: a number or sqrt_dk (default sqrt_dk for "
            "scaled_dot, 1 for the other scores).",
        ),
    ] = None,
    temperature: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--temperature",
            click_type=FLOAT_TEXT,
            help="Softmax temperature T, dividing inside the softmax (default 1).",
        ),
    ] = None,
    score: Annotated[
        WordOpt,
        typer.Option("--score", help="scaled_dot (default), dot, additive, bilinear or gaussian."),
    ] = None,
    w: Annotated[
        MatrixOpt,
        typer.Option("--w", help="gaussian: the kernel width w, a number or a vector (default 1)."),
    ] = None,
    softcap: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--softcap",
            click_type=FLOAT_TEXT,
            help="Soft cap c of the scaled scores, c · tanh(S / scale / c), before the mask "
            "(Gemma 2's; default none).",
        ),
    ] = None,
) -> None:
    """One attention, softmax((score(Q, K) / scale + M) / T) V, step by step."""
    from trace_tf.config import parse_matrix

    if file is None and (q is None or k is None or v is None) and not _set_into(c, "attention"):
        _fail("attend needs --q, --k and --v (or a FILE with an 'attention:' section)")
    options: list[tuple[str, str, Any]] = []
    for key, option, text in (("Q", "--q", q), ("K", "--k", k), ("V", "--v", v)):
        if text is not None:
            options.append((key, option, parse_matrix(text, option)))
    if mask is not None:
        options.append(("mask", "--mask", parse_matrix(mask, "--mask", allow_inf=True)))
    if scale is not None:
        options.append(("scale", "--scale", _scale_value(scale)))
    if temperature is not None:
        options.append(("temperature", "--temperature", temperature))
    if score is not None:
        options.append(("score", "--score", score))
    if w is not None:
        options.append(("w", "--w", _inline_value(w, "--w")))
    if softcap is not None:
        options.append(("softcap", "--softcap", softcap))
    _run_op(_op_config("attend", "attention", file, options, c), c)


@app.command()
@running(
    NO_CSV,
    dtype=False,
    csv="it writes a single matrix, and norm records its statistics and its output: "
    "norm.mean, norm.var, norm.centered and norm.out, or for rms norm.rms and norm.out",
)
def norm(
    c: Common,
    file: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(help="A file with a 'norm:' section.", metavar="FILE", show_default=False),
    ] = None,
    x: Annotated[
        MatrixOpt,
        typer.Option(
            "--x", help=f"The input: {_MATRIX_HELP}; '|' separates the B samples of instance."
        ),
    ] = None,
    kind: Annotated[
        WordOpt,
        typer.Option("--kind", help="layer (default), rms, batch or instance."),
    ] = None,
    eps: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--eps",
            click_type=FLOAT_TEXT,
            help="Added inside the root: to the variance, or for rms to mean(x²) (default 1e-5).",
        ),
    ] = None,
    gamma: Annotated[
        MatrixOpt, typer.Option("--gamma", help="Scale γ per feature (default 1 each).")
    ] = None,
    beta: Annotated[
        MatrixOpt, typer.Option("--beta", help="Shift β per feature (default 0 each).")
    ] = None,
) -> None:
    """One normalisation (layer, rms, batch, instance): its statistics, then its output."""
    from trace_tf.config import parse_matrix

    if file is None and x is None and not _set_into(c, "norm"):
        _fail("norm needs --x (or a FILE with a 'norm:' section)")
    options: list[tuple[str, str, Any]] = []
    if x is not None:
        if kind == "instance" and "|" not in x and not x.lstrip().startswith("["):
            _fail(
                "--x: instance norm takes a B x C x n array: separate the B samples "
                "(each C x n) with '|', e.g. --x '1 2 3; 4 5 6 | 0 1 0; 2 2 3'"
            )
        options.append(("x", "--x", parse_matrix(x, "--x")))
    if kind is not None:
        options.append(("kind", "--kind", kind))
    if eps is not None:
        options.append(("eps", "--eps", eps))
    for key, option, text in (("gamma", "--gamma", gamma), ("beta", "--beta", beta)):
        if text is not None:
            value = _inline_value(text, option)
            options.append((key, option, value if isinstance(value, list) else [value]))
    _run_op(_op_config("norm", "norm", file, options, c), c)


@app.command()
@running(
    dtype=False,
    csv="its one step, pe: a header row, pe and the column indices, then a row per "
    "position, pos 0, pos 1, ..., of its d numbers, or with rope of its angles, one a pair",
)
def pe(
    c: Common,
    file: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(help="A file with a 'pe:' section.", metavar="FILE", show_default=False),
    ] = None,
    length: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--length", min=1, help="Number of positions L."),
    ] = None,
    d_model: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--d-model", min=1, help="Width d."),
    ] = None,
    kind: Annotated[
        WordOpt,
        typer.Option("--kind", help="sinusoidal (default) or rope (the rotation angles)."),
    ] = None,
    base: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--base", click_type=FLOAT_TEXT, help="The base of the frequencies (default 10000)."
        ),
    ] = None,
    rope_dims: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--rope-dims",
            help="rope: the columns turned (partial rotary), frequencies over them (default d).",
        ),
    ] = None,
) -> None:
    """The positional encoding matrix (sinusoidal), or RoPE's rotation angles."""
    if file is None and (length is None or d_model is None) and not _set_into(c, "pe"):
        _fail("pe needs --length and --d-model (or a FILE with a 'pe:' section)")
    options: list[tuple[str, str, Any]] = [
        (key, option, value)
        for key, option, value in (
            ("length", "--length", length),
            ("d_model", "--d-model", d_model),
            ("kind", "--kind", kind),
            ("base", "--base", base),
            ("rope_dims", "--rope-dims", rope_dims),
        )
        if value is not None
    ]
    _run_op(_op_config("pe", "pe", file, options, c), c)


@app.command()
@running(REPORTS)
def diff(
    c: Common,
    config_a: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(metavar="A", help="The first config (default: hello).", show_default=False),
    ] = None,
    config_b: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(
            metavar="B",
            help="The second config; default: A again, varied by --set-b / --variant-b.",
            show_default=False,
        ),
    ] = None,
    set_b: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--set-b", help="Override a key of B only: KEY=VALUE (repeatable).", metavar="KEY=VALUE"
        ),
    ] = None,
    variant_b: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--variant-b", help="Run B on this variant (instead of --variant)."),
    ] = None,
    atol: Annotated[
        float,
        typer.Option(
            "--atol", click_type=FLOAT_TEXT, help="Cells closer than this count as equal (>= 0)."
        ),
    ] = 1e-12,
    stage: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--stage", help="Compare only these steps (a stage, group or pattern)."),
    ] = None,
    delta: Annotated[
        bool, typer.Option("--delta", help="Show B − A in the tables instead of B's values.")
    ] = False,
    brief: Annotated[
        bool, typer.Option("--brief", help="Only the summary table, no matrices.")
    ] = False,
    all_steps: Annotated[
        bool, typer.Option("--all", help="List the steps that are the same too.")
    ] = False,
    exit_code: Annotated[
        bool, typer.Option("--exit-code", help="Exit 1 when the runs differ (like git diff).")
    ] = False,
) -> None:
    """Run two configs, or one against a variation of itself, and show where they differ.

    --set and --variant apply to both A and B; --set-b to B only; --variant-b replaces
    the variant for B.
    """
    from trace_tf import render
    from trace_tf.config import Config, build, option_number, parse_set, read_document
    from trace_tf.diff import (
        DIFFERS,
        SAME,
        compare,
        compare_weights,
        first_difference,
        verdict,
        weights_verdict,
    )
    from trace_tf.errors import InputError
    from trace_tf.runner import run
    from trace_tf.trace import check_stage, matches

    atol = option_number(atol, "--atol", minimum=0)
    if config_b is None and not set_b and variant_b is None:
        _fail(
            "diff needs something to compare A with: a second config B, "
            "or --set-b KEY=VALUE / --variant-b NAME (e.g. diff hello --set-b model.scale=30)"
        )
    both = [parse_set(s) for s in c.sets]
    only_b = [parse_set(s) for s in set_b or []]
    doc_a = read_document(config_a)
    doc_b = read_document(config_b) if config_b is not None else doc_a
    var_b = variant_b if variant_b is not None else c.variant
    runs = [(doc_a, c.variant, []), (doc_b, var_b, [(k, v, "--set-b") for k, v in only_b])]
    built = []
    for name, (doc, variant, own) in zip("AB", runs, strict=True):
        try:
            built.append(build(doc, both, variant, c.max_elements, c.dtype, own))
        except InputError as exc:  # which of the two runs the config is bad for
            exc.message += f" (in run {name})"
            raise
    trace_a, trace_b = run(built[0]), run(built[1])
    # which run each is from (A and B are often one file)
    warn_a = [type(w)(f"{w} (in run A)") for w in trace_a.warnings]  # (an InputNote kept)
    warn_b = [type(w)(f"{w} (in run B)") for w in trace_b.warnings]
    warn(c, warn_a, doc_a.file)
    warn(c, warn_b, doc_b.file)
    keep = None
    if stage is not None:
        check_stage(
            stage,
            trace_a.stages() | trace_b.stages() | set(trace_a.steps) | set(trace_b.steps),
            "either config",
        )
        keep = lambda path: matches(path, stage, None, None)  # noqa: E731
    diffs = compare(trace_a, trace_b, atol, keep)
    # the weights each run reads (a single-operation file has none)
    cfg_a, cfg_b = built
    weight_diffs = (
        compare_weights(cfg_a, cfg_b, atol)
        if isinstance(cfg_a, Config) and isinstance(cfg_b, Config)
        else []
    )
    first = first_difference(diffs)
    sides = {
        "a": {"config": doc_a.file, "variant": c.variant, "overrides": dict(both)},
        "b": {"config": doc_b.file, "variant": var_b, "overrides": dict(both + only_b)},
    }
    data = lambda: {  # noqa: E731 (built only for JSON: a vocabulary may have 50,000 embeddings)
        "trace_tf": _version(),
        # (a --set value is as the user wrote it: `--set-b title=.nan` is a NaN)
        **render.json_value(sides),
        "atol": atol,
        "identical": first is None,
        "first_difference": first.path if first is not None else None,
        "steps": [render.diff_json(d) for d in diffs],
        "only_a": [d.path for d in diffs if d.b is None],
        "only_b": [d.path for d in diffs if d.a is None],
        "warnings": warn_a + warn_b,
        "weights": [render.weights_diff_json(d) for d in weight_diffs],
    }
    view = c.view()
    items: list[Any] = [
        render.diff_header(sides["a"], sides["b"], verdict(diffs, atol, listed_same=all_steps))
    ]
    if weight_diffs:  # their count, or that none differs, then those that do
        items.append(render.weights_diff(weight_diffs, weights_verdict(weight_diffs, atol), view))
    listed = diffs if all_steps else [d for d in diffs if d.status != SAME]
    if listed:
        items.append(render.diff_summary(listed, view))
    if not brief:
        items.extend(render.diff_detail(d, view, delta) for d in diffs if d.status == DIFFERS)
    emit(c, items, data)
    if exit_code and first is not None:
        raise typer.Exit(1)


@app.command()
@running(REPORTS)
def explain(
    c: Common,
    step_name: Annotated[
        str,
        typer.Argument(
            metavar="STEP",
            help="A step path (encoder.0.self_attn.h0.scores), or a stage that selects one step.",
        ),
    ],
    config: ConfigArg = None,
    cell: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--cell",
            help="The entry: I,J, as many indices as the step has dimensions (default: the "
            "first, 0,0).",
        ),
    ] = None,
) -> None:
    """One entry of one step written out with its own numbers, as the documents do by hand."""
    from trace_tf import explain as ex
    from trace_tf.errors import InputError
    from trace_tf.runner import run

    if step_name.endswith((".yaml", ".yml")) or os.path.isfile(step_name):
        _fail(
            f"{step_name!r} is a config file, and explain takes the step first: "
            f"trace-tf explain {config or 'STEP'} {step_name}"
        )
    cfg = _load(config, c)
    trace = run(cfg)
    warn(c, trace.warnings, cfg.file)
    try:  # a step or cell this config does not have: name the file
        e = ex.explain_named(cfg, trace, step_name, cell, c.precision)
    except InputError as exc:
        raise exc.with_file(cfg.file) from None
    _emit_explanation(c, cfg, e)


def _emit_explanation(c: Common, cfg: "Config | OpConfig", e: "Explanation", **more: Any) -> None:
    """One explanation, as `explain` and `generate --explain` print it (JSON: with `more`)."""
    from trace_tf.explain import explanation_view

    data = {"trace_tf": _version(), "title": cfg.title, **e.json(), **more}
    emit(c, [explanation_view(e, c.precision)], data)


@app.command()
def stages(fmt: ReportFormatOpt = "table", debug: DebugOpt = False) -> None:
    """Every stage the engine records: its paths, formula, shape and meaning; and the groups."""
    with guarded(debug):
        from trace_tf.render import stages_view
        from trace_tf.stages import GROUP_MEANINGS, STAGES

        c = _common(REPORTS, fmt=fmt, debug=debug)
        data = {
            "trace_tf": _version(),
            "stages": [
                {
                    "stage": s.name,
                    "key": s.key,
                    "paths": list(s.paths),
                    "formula": s.formula,
                    "shape": s.shape,
                    "meaning": s.meaning,
                }
                for s in STAGES
            ],
            "groups": GROUP_MEANINGS,
        }
        emit(c, stages_view(STAGES, GROUP_MEANINGS), data)


# ---------------------------------------------------------------------------
# performance (issue 6): cost
# ---------------------------------------------------------------------------


@app.command()
@running(REPORTS)
def cost(
    c: Common,
    config: ConfigArg = None,
    vary_opt: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--vary",
            help="L=8,16,32,64 (sequence length: the tokens repeated) or D=64,128,... "
            "(d_model; widths by their defaults, weights drawn): one row per value.",
            metavar="L=N,N,...|D=N,N,...",
            show_default=False,
        ),
    ] = None,
    repeat: Annotated[
        Optional[int],  # noqa: UP045 (None: not given, which --vary alone allows)
        typer.Option(
            "--repeat",
            min=1,
            max=100,
            help=f"Runs timed per --vary value (fastest kept; 1-100; default {TIMED_RUNS}).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """The multiply-adds of every stage, totals per stage and kind; with --vary, how they grow."""
    from dataclasses import asdict

    from trace_tf import cost as costs
    from trace_tf import render
    from trace_tf.config import build, parse_set, read_document
    from trace_tf.errors import InputError, quoted
    from trace_tf.runner import require_model

    if vary_opt and len(vary_opt) > 1:  # the last alone would be used, the others unsaid
        raise InputError(
            "--vary is given more than once; it varies one size",
            expected="one --vary, L=N,N,... or D=N,N,...",
            found=", ".join(quoted(v) for v in vary_opt),
        )
    if repeat is not None and not vary_opt:  # nothing else is timed
        _fail("--repeat times the runs of --vary: add --vary")
    varied = costs.parse_vary(vary_opt[0]) if vary_opt else None
    doc = read_document(config)  # once: `-` (stdin) can be read only once
    pairs = [parse_set(s) for s in c.sets]
    cfg = require_model(build(doc, pairs, c.variant, c.max_elements, c.dtype), "cost")
    ledger = costs.ledger(cfg)
    totals = costs.totals(ledger)
    rows: list[costs.VaryRow] = []
    if varied is not None:
        name, values = varied
        rows = costs.vary(
            doc, cfg, name, values, pairs, c.variant, c.max_elements, c.dtype, repeat or TIMED_RUNS
        )
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
        items.extend(render.vary_table(name, costs.VARY[name], rows, costs.KINDS, c.width))
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


def _help_text(doc: str) -> str:
    """A docstring as help: typer keeps a paragraph's line breaks, so join its lines."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split("\n")) for p in paragraphs)


for _info in app.registered_commands:
    if _info.callback is not None and _info.callback.__doc__:
        _info.help = _help_text(_info.callback.__doc__)


def app_for(args: list[str]) -> typer.Typer:
    """The app to run `args` with: one holding only the command `args` names, if it
    names one; else (--help, no command, a misspelt one) the whole app.

    Typer reads the signature of every command it holds each time it starts, a few
    milliseconds a command; with only the one asked for, `trace-tf encode` starts
    faster, and behaves the same (the tests compare every command both ways)."""
    chosen = [
        info
        for info in app.registered_commands
        if args and (info.name or getattr(info.callback, "__name__", None)) == args[0]
    ]
    if not chosen:
        return app
    one = typer.Typer(**_APP_SETTINGS)
    one.registered_commands = chosen
    one.callback()(_no_options)  # still a group: `trace-tf NAME ...`, as with the whole app
    return one


def _no_options() -> None:
    pass


class _ClosedOutput(io.TextIOBase):
    """Standard output when it was closed: writing to it fails as writing to a closed
    descriptor does (EBADF), which says so on one line, exit 2, as a full disk does.
    (As None, it was an internal error, exit 3; click's help skips it.)"""

    def write(self, data: object) -> int:  # text, or through .buffer npz's bytes
        import errno

        raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    @property
    def buffer(self) -> "_ClosedOutput":
        return self

    def flush(self) -> None:
        pass


def main() -> None:
    import signal

    # `trace-tf encode | head`: when the reader goes, end as Unix tools do, by SIGPIPE,
    # rather than through rich's exit 1, which would say `check` found a mismatch.
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if sys.stdout is None:  # `trace-tf encode >&-`: Python leaves it None
        sys.stdout = _ClosedOutput()
    # A config named with bytes that are not UTF-8 (Python keeps a byte 0xNN of an
    # argument as U+DCNN) is shown with those bytes, as a UTF-8 locale's "C" one does.
    if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
        sys.stdout.reconfigure(errors="surrogateescape")
    try:
        app_for(sys.argv[1:])()
    except MemoryError:  # outside a command's guard: parsing the options, say
        typer.echo(OUT_OF_MEMORY, err=True)
        sys.exit(2)
    except OSError as exc:  # outside a command's guard: `--help > /dev/full`, say
        with suppress(OSError):
            typer.echo(f"trace-tf: error: cannot write: {exc.strerror or exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
