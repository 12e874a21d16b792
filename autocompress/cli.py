"""The ``autocompress`` command line.

Each area of the library keeps its commands in ``autocompress/commands/<area>.py``
and exposes ``register(app)``; this module only assembles them and turns
``AutoCompressError`` into a one-line message and exit code 2 (any other
exception into one line, a log file with the traceback and exit code 3), and SIGTERM
into a clean stop with exit code 143 (what the process started is stopped too).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Callable

import typer

from autocompress import __version__
from autocompress.errors import (
    EXIT_INTERNAL,
    EXIT_USAGE,
    AutoCompressError,
    from_os_error,
    invalid_input,
    write_crash_log,
)

# Order is the order of ``--help``: pipeline order.
COMMAND_MODULES = [
    "data",
    "teacher",
    "evaluate",
    "prune",
    "costmodel",
    "search",
    "distill",
    "verify",
    "export",
    "pipeline",
    "bench",
    "demo",
    "serve",
]

app = typer.Typer(
    name="autocompress",
    help=(
        "Compress a decoder-only LLM (Llama, Mistral, Qwen2/3) so that it meets "
        "latency, throughput and memory limits on a target GPU/CPU and serving "
        "engine, keeping as much accuracy as possible. Wherever a model is asked for, "
        "pass a directory, a hub id, or a named teacher: `default` (the bundled code "
        "teacher) or `smollm2-135m` (SmolLM2-135M-Instruct, built from an installed GGUF).\n\n"
        "Every command spells its options the same way: --model (and --teacher beside it "
        "where a student learns from a teacher), --data for a corpus, --limit METRIC=VALUE, "
        "--json FILE to write a result, --format json to print one, and --config FILE or "
        "KEY=VALUE for the deeper settings (YAML or JSON, checked like the library checks "
        "them). Old spellings still work for one release and say what to use instead."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# A shell's code for a process SIGTERM ended; what ``autocompress`` exits with on SIGTERM.
EXIT_TERMINATED = 128 + signal.SIGTERM

# What a command's output leaves out unless --verbose: in a log, third-party progress bars
# (weights loading, datasets saving) and the INFO lines of Prefect (two per task) and MLflow
# bury the stages' own lines. Warnings and errors still show; Prefect's UI keeps its logs
# (only its console handler is raised); a variable the user set wins.
QUIET_ENV = {
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' bars too
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
}


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"autocompress {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
    verbose: bool = typer.Option(False, "--verbose", help="Also show the libraries' own "
                                 "output: progress bars, Prefect's and MLflow's INFO lines."),
) -> None:
    """Options before the command (``autocompress --verbose run ...``)."""
    if not verbose:
        for name, value in QUIET_ENV.items():
            os.environ.setdefault(name, value)


for _name in COMMAND_MODULES:
    importlib.import_module(f"autocompress.commands.{_name}").register(app)


def main() -> None:
    """Entry point: run the app; exit 0 ok, 1 a limit missed, 2 bad input, 3 a bug."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    # Not HF_HUB_OFFLINE: a hub id (org/name) given by the user is fetched where a
    # network exists; named teachers and local directories never touch the hub.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # `ulimit -f` kills a process with SIGXFSZ unless it is ignored; ignored, the
    # write fails with EFBIG and becomes the one-line "disk" error below.
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    report_errors(app)


class Terminated(SystemExit):
    """SIGTERM, raised in the main thread: the process unwinds as from ``sys.exit``, so
    ``finally`` blocks, ``with`` exits and atexit handlers run. Python's default for SIGTERM
    ends the process at once, and what it started lives on: Prefect's temporary server
    (stopped by an atexit handler), a vLLM server. Not a KeyboardInterrupt: click turns
    that into "Aborted!" and exit code 1, which here means a missed limit."""


def _terminate(signum, frame) -> None:
    # A second SIGTERM must not cut the clean-up short and orphan what it stops (SIGKILL
    # still ends the process).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated(EXIT_TERMINATED)


def _stop_cleanly_on_sigterm():
    """Install ``_terminate`` for SIGTERM; the handler it replaced (None off the main
    thread, where Python allows no handler)."""
    try:
        return signal.signal(signal.SIGTERM, _terminate)
    except ValueError:
        return None


def report_errors(entry: Callable[[], object]) -> None:
    """Run ``entry`` (the app, or a bench script's ``main``): a user error becomes one
    line with its hint and exit code 2; any other exception one line, a log file with
    its traceback and exit code 3 (so that a crash never reads as verify's exit 1);
    SIGTERM a clean stop with exit code 143 (``Terminated``)."""
    previous = _stop_cleanly_on_sigterm()
    try:
        _run_reported(entry)
    except Terminated:
        typer.secho("stopped: SIGTERM", err=True)
        raise
    finally:  # for a caller in the same process (tests): its own handler back
        if previous is not None and signal.getsignal(signal.SIGTERM) is _terminate:
            signal.signal(signal.SIGTERM, previous)


def _run_reported(entry: Callable[[], object]) -> None:
    from pydantic import ValidationError

    try:
        entry()
    except ValidationError as err:  # a value the options let through but a config refused
        _report(invalid_input(err, f"{err.title} settings"))
    except AutoCompressError as err:
        _report(err)
    except Exception as err:  # noqa: BLE001 - the last line of defence: one line, a log
        disk = from_os_error(err)  # disk full, read-only: the user's to fix, not a bug
        if disk is not None:
            _report(disk)
        _crash(err)


def _report(err: AutoCompressError) -> None:
    """``error:`` and ``hint:`` lines on stderr, exit code 2 (a usage error)."""
    typer.secho(f"error: {err.message}", fg="red", err=True)
    if err.hint:
        typer.secho(f"hint: {err.hint}", err=True)
    sys.exit(EXIT_USAGE)


def _crash(err: BaseException) -> None:
    """An internal error: its one-line cause, where the traceback is, exit code 3."""
    log = write_crash_log(err)
    first = (str(err).strip().splitlines() or [""])[0][:300]
    typer.secho(f"error: internal error: {type(err).__name__}: {first}", fg="red", err=True)
    typer.secho(f"hint: this is a bug in AutoCompress; the traceback is in {log}", err=True)
    sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()
