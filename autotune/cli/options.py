"""What the commands share: options, parameter types, the number format, the progress printer.

Every command module imports these public names from here; no private name crosses a module.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from autotune.cli.formats import fmt_number
from autotune.cli.progress import Progress
from autotune.run import options as options_table
from autotune.vllm import servecmd

DEFAULT_RUNS_DIR = "runs"

# The progress display every command that boots vLLM uses (stderr; plain off a TTY).
ProgressPrinter = Progress

# One number format for the CLI and the progress display (65,536; 0.95; 12.34).
fmt = fmt_number


def runs_dir_option(f, callback=None):
    """--runs-dir: where run folders are written and read (AUTOTUNE_RUNS_DIR)."""
    return click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path),
                        default=DEFAULT_RUNS_DIR, envvar="AUTOTUNE_RUNS_DIR", show_default=True,
                        show_envvar=True, help="Where run folders are written and read.", callback=callback)(f)


def written_runs_dir_option(f):
    """--runs-dir of a command that writes runs: checked writable (made if missing) before anything
    else happens, so that an unwritable folder is one line and exit 1, not a traceback after boots."""
    return runs_dir_option(f, callback=_writable_runs_dir)


def _writable_runs_dir(ctx, param, value: Path) -> Path:
    from autotune.store import writable

    try:
        return writable.check_runs_dir(value)
    except writable.RunsDirNotWritable as exc:
        raise click.ClickException(str(exc)) from None


def request_option(name: str, param: str | None = None, **overrides):
    """The click option of a tune's option `name` (run/options.py's TuneOptions): its flag, default,
    choices and help come from that table, so that a default is spelled once; overrides are a
    command's own (its help, a default of its own). param: the Python name, when not `name`."""
    found = options_table.spec(name)
    flag, choices, value = found.metadata["flag"], found.metadata["choices"], options_table.default(name)
    kwargs: dict = {"help": found.metadata["help"]}
    if isinstance(value, bool):
        kwargs["is_flag"] = True
    elif value is not None:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # shown as a person writes it (1200, not 1200.0); the float type converts it back
        kwargs.update(default=value, show_default=True)
    if choices:
        kwargs["type"] = click.Choice(list(choices))
    elif name in _CLICK_TYPES:
        kwargs["type"] = _CLICK_TYPES[name]
    if name in _METAVARS:
        kwargs["metavar"] = _METAVARS[name]
    kwargs.update(overrides)
    return click.option(flag, param or name, **kwargs)


def boot_options(max_boots_help: str | None = None):
    """The options every command that boots vLLM takes (tune, sweep): GPU pinning, preflight
    overrides, the stall watchdog and the boot budget (max_boots_help: a command's own help)."""
    options = [request_option("gpu"), request_option("force"), request_option("allow_risky_gmu"),
               request_option("stall_timeout_s"),
               request_option("max_boots", **({"help": max_boots_help} if max_boots_help else {}))]

    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


class LengthType(click.ParamType):
    """A context length: 65536, 64K (65,536), 64k (64,000); with allow_max also `max`."""

    name = "LENGTH"

    def __init__(self, allow_max: bool = False):
        self.allow_max = allow_max

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        if self.allow_max and str(value).strip().lower() == "max":
            return "max"
        try:
            return servecmd.parse_length(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class MemoryType(click.ParamType):
    """An amount of memory in GiB: 24, 24GiB, 23.58G, 24576MiB (binary units; a bare number is GiB)."""

    name = "GIB"
    _UNITS = {"": 1.0, "g": 1.0, "m": 1 / 1024, "t": 1024.0}

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([gmt]?)(?:i?b)?\s*", str(value), re.IGNORECASE)
        if not found or float(found[1]) <= 0:
            self.fail(f"{value!r} is not an amount of memory: give GiB, e.g. 24, 24GiB, 23.58GiB or 24576MiB",
                      param, ctx)
        return float(found[1]) * self._UNITS[found[2].lower()]


# The click types of the tune's options that are not plain (run/options.py holds their defaults).
_CLICK_TYPES = {"stall_timeout_s": click.FloatRange(min=1), "max_boots": click.IntRange(min=1),
                "max_gmu": click.FloatRange(0, 1, min_open=True), "margin_bytes": MemoryType()}
_METAVARS = {"gpu": "SELECTOR", "margin_bytes": "SIZE"}


def serve_argv(serve_command: tuple[str, ...]) -> list[str]:
    """The serve command given after `--` (click keeps the `--` when options precede it)."""
    argv = list(serve_command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    return argv


def echo_err(message: str, quiet: bool = False) -> None:
    """A diagnostic on stderr, unless --quiet."""
    if not quiet:
        click.echo(message, err=True)


def sayer(quiet: bool):
    """A progress-line printer for stderr that --quiet silences."""
    return (lambda text: None) if quiet else (lambda text: click.echo(text, err=True))


def warn(text: str) -> None:
    """A warning on stderr (never silenced)."""
    click.echo(text, err=True)


