"""Every shell command in the README and the guides runs, so a quick start cannot rot.

A fenced ``bash`` / ``sh`` / ``shell`` / ``console`` block in README.md or docs/*.md is
either run here, command by command, in a fresh AUTOCOMPRESS_HOME and working directory,
or marked long by an HTML comment on the line before it::

    <!-- long: tests/test_x.py::test_y [tests/test_z.py::test_w ...] -->

A long block names the tests that run tiny variants of it; this file checks that the
tests exist and that every ``autocompress`` command of the block still parses against the
real CLI (its commands and options exist, its values convert) and that every
``python -m`` script of it answers ``--help``. A new unmarked block that does not run fails
here. The guides are also checked for what rots quietly: their links
and the repository paths they name, the README's length, and dates or commit hashes.
"""

from __future__ import annotations

import os
import re
import runpy
import shlex
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

from autocompress.cli import app, main

ROOT = Path(__file__).resolve().parents[1]
# The lab's diaries record what ran on a given day; they are not instructions.
HISTORY = {"results-history.md", "measurement-history.md"}
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md")
                                    if p.name not in HISTORY)]
SHELL = ("bash", "sh", "shell", "console")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LONG = re.compile(r"<!--\s*long:\s*(.+?)\s*-->")
GENERATED = re.compile(r"<!-- ([a-z0-9-]+):start -->.*?<!-- \1:end -->", re.S)

# What turns a documented command into a quick one. `make -n` reads the Makefile and
# prints the target's recipe without installing or running anything.
DRY_RUN = {"make": ["make", "-n"]}


@dataclass
class Block:
    """One fenced shell block: where it is, its commands, and its long marker if any."""

    doc: Path
    line: int
    commands: list[list[str]]
    long: list[tuple[str, str | None]] | None  # (test file, test name or None) each

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def commands_of(text: str, console: bool = False) -> list[list[str]]:
    """The commands of a block as argument lists: continuation lines joined, ``# comments``
    dropped (shlex knows what is quoted). In a ``console`` block only the lines after a
    ``$ `` prompt are commands; the others are their output."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if console and not line.startswith("$ "):
            continue
        args = shlex.split(line.removeprefix("$ "), comments=True)
        if args:
            commands.append(args)
    return commands


def named_tests(marker: str) -> list[tuple[str, str | None]]:
    """``tests/a.py::test_b tests/c.py`` as ``[("tests/a.py", "test_b"), ("tests/c.py", None)]``."""
    return [(path, name or None) for path, _, name in (t.partition("::") for t in marker.split())]


def shell_blocks(doc: Path) -> list[Block]:
    """Every shell block of ``doc``, with the long marker on the line before it."""
    text = doc.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) not in SHELL:
            continue
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        long = LONG.search(before)
        blocks.append(Block(doc, text.count("\n", 0, match.start()) + 1,
                            commands_of(match.group(2), console=match.group(1) == "console"),
                            named_tests(long.group(1)) if long else None))
    return blocks


BLOCKS = [block for doc in DOCS for block in shell_blocks(doc)]
RUNNABLE = [b for b in BLOCKS if b.long is None]
LONG_BLOCKS = [b for b in BLOCKS if b.long is not None]


def run_autocompress(args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """``autocompress ARGS`` through the console script's entry point, in this process
    (one import of torch for all of them); (exit code, output)."""
    monkeypatch.setattr(sys, "argv", ["autocompress", *args])
    try:
        main()
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code or 0
    out = capsys.readouterr()
    return code, out.out + out.err


def run_module(module: str, args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """``python -m MODULE ARGS`` in this process (its imports are already loaded)."""
    monkeypatch.setattr(sys, "argv", [module, *args])
    try:
        with warnings.catch_warnings():
            # runpy warns that the module is imported already; it runs a fresh copy anyway.
            warnings.simplefilter("ignore", RuntimeWarning)
            runpy.run_module(module, run_name="__main__", alter_sys=False)
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code or 0
    out = capsys.readouterr()
    return code, out.out + out.err


def run_other(args: list[str]) -> tuple[int, str]:
    """Any other command (``make``, ``python script.py``), as a process."""
    if args[0] in DRY_RUN:
        args = DRY_RUN[args[0]] + args[1:]
    if args[0] in ("python", "python3"):
        args = [sys.executable, *args[1:]]
    done = subprocess.run(args, cwd=ROOT if args[0] == "make" else None, capture_output=True,
                          text=True, timeout=120, env=os.environ.copy())
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("doc", sorted({b.doc for b in RUNNABLE}),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_unmarked_command_runs(doc, tmp_path, monkeypatch, capsys):
    """The blocks of one document, in order, in one working directory (a later block may
    use what an earlier one wrote, as a reader following the guide would)."""
    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for block in (b for b in RUNNABLE if b.doc == doc):
        for args in block.commands:
            if args[0] == "autocompress":
                code, out = run_autocompress(args[1:], capsys, monkeypatch)
            elif args[:2] in (["python", "-m"], ["python3", "-m"]):
                code, out = run_module(args[2], args[3:], capsys, monkeypatch)
            else:
                code, out = run_other(args)
            assert code == 0, f"{block.where}: `{shlex.join(args)}` exited {code}:\n{out[-3000:]}"


def parses(args: list[str]):
    """Parse ``autocompress ARGS`` down to its command, as click would before running it:
    every command and option must exist and every value convert. Nothing runs; the
    command's context (its ``params``) is returned."""
    command = typer.main.get_command(app)
    ctx = command.make_context("autocompress", list(args))
    while is_group(command):
        rest = [*ctx._protected_args, *ctx.args]
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
    return ctx


def is_group(command) -> bool:
    """A command with subcommands (typer vendors its own click, so no isinstance)."""
    return hasattr(command, "resolve_command")


@pytest.mark.parametrize("block", LONG_BLOCKS, ids=lambda b: b.where)
def test_a_long_block_names_a_test_that_exists_and_parses(block, capsys, monkeypatch):
    for path, name in block.long:
        test_file = ROOT / path
        assert test_file.is_file(), f"{block.where}: the long marker names {path}, which is missing"
        if name:
            assert re.search(rf"^def {name}\(", test_file.read_text(), re.M), \
                f"{block.where}: {path} has no test {name}"
    helps = set()
    for args in block.commands:
        if args[0] == "autocompress":
            try:
                parses(args[1:])
            except typer.Exit:  # --help
                pass
            except typer.exceptions.TyperException as err:  # no such command or option
                pytest.fail(f"{block.where}: `{shlex.join(args)}`: {err}")
        elif args[:2] in (["python", "-m"], ["python3", "-m"]):
            helps.add(args[2])
        elif args[0] in ("python", "python3"):
            pytest.fail(f"{block.where}: run `{args[1]}` as a module (python -m ...), as the "
                        "repository's scripts import their package")
    for module in sorted(helps):  # the script starts and knows its options
        code, out = run_module(module, ["--help"], capsys, monkeypatch)
        assert code == 0, f"{block.where}: `python -m {module} --help` exited {code}:\n{out}"


def test_a_new_block_is_found_and_a_bad_command_fails(tmp_path, monkeypatch, capsys):
    """The checks above can fail: a block is found with its marker, and a command that
    does not exist, or an option that does not, is an error."""
    doc = tmp_path / "guide.md"
    doc.write_text("Text.\n\n```bash\nautocompress no-such-command  # a comment\n```\n\n"
                   "<!-- long: tests/test_api.py::test_nothing tests/test_x.py -->\n```sh\n"
                   "autocompress run \\\n  --no-such-option 1\n```\n")
    plain, long = shell_blocks(doc)
    assert plain.commands == [["autocompress", "no-such-command"]] and plain.long is None
    assert long.long == [("tests/test_api.py", "test_nothing"), ("tests/test_x.py", None)]
    assert commands_of("$ autocompress --help\nUsage: autocompress\n", console=True) == [
        ["autocompress", "--help"]]
    assert long.commands == [["autocompress", "run", "--no-such-option", "1"]]
    assert run_autocompress(plain.commands[0][1:], capsys, monkeypatch)[0] != 0
    with pytest.raises(typer.exceptions.TyperException, match="no-such-option"):
        parses(long.commands[0][1:])
    assert float(parses(["run", "--budget-fraction", "0.5"]).params["budget_fraction"]) == 0.5
    bad = bad_mentions("`autocompress costmodel fit --target x`, `autocompress costmodel fits`, "
                       "`autocompress runs`, `autocompress run --no-such 1`, `autocompress eval`")
    assert [line.split(":")[0] for line in bad] == [
        "autocompress costmodel fits", "autocompress runs", "autocompress run --no-such 1"]


def test_the_make_targets_exist():
    """``make demo`` and ``make test`` (long: the demo runs for minutes, the suite is this
    suite) are targets of the Makefile, and CI runs ``make test``."""
    for target in ("demo", "test"):
        done = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert "autocompress demo" in subprocess.run(
        ["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_cuda_install_pins_the_locked_torch():
    """The GPU guide's install names the lock files and the torch version they pin."""
    guide = (ROOT / "docs" / "gpus.md").read_text()
    pinned = re.search(r"^torch==([\d.]+)", (ROOT / "requirements.lock").read_text(), re.M)
    assert pinned and f"torch=={pinned.group(1)} " in guide
    for lock in re.findall(r"-r (\S+\.lock)", guide):
        assert (ROOT / lock).is_file(), lock


@pytest.mark.parametrize("block", [b for b in BLOCKS if any(a[:2] == ["autocompress", "run"]
                                                             for a in b.commands)],
                         ids=lambda b: b.where)
def test_every_documented_run_has_a_limit(block):
    """A run without a limit stops at once ("no limit to compress for"); a quick start once
    showed one. Every documented ``autocompress run`` gives a budget fraction or a limit."""
    for args in (a for a in block.commands if a[:2] == ["autocompress", "run"]):
        params = parses(args[1:]).params
        given = [name for name, value in params.items()
                 if value and ("budget" in name or "limit" in name or name.startswith(("max_",
                                                                                      "min_")))]
        assert given, f"{block.where}: `{shlex.join(args)}` sets no limit"


# ------------------------------------------------------------------ the text itself

def test_the_readme_is_a_guide_of_at_most_300_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dates_or_commit_hashes_outside_generated_tables(doc):
    """History lives in git and the lab. Generated tables are the generator's business."""
    text = GENERATED.sub("", doc.read_text())
    dates = re.findall(r"\b20\d\d-\d\d-\d\d\b", text)
    hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", text)
              if re.search(r"\d", h) and re.search(r"[a-f]", h)]
    assert not dates and not hashes, (dates, hashes)


# Paths the guides' commands write, not files of the repository.
OUTPUTS = {"served/", "compressed/", "student/", "distilled/"}
# The README and the guides; not the pages other work owns or replaces (the bad-input
# catalogue, the architecture page, the old team pages it replaces).
GUIDES = [doc for doc in DOCS if doc.name not in {"BAD_INPUTS.md", "architecture.md",
                                                 "CONTRACTS.md"}
          and not doc.name.startswith("STATUS-")]


def named_paths(text: str) -> list[str]:
    """The repository paths a guide names in backquotes: a name with a folder that ends
    in ``/`` or a file suffix (so not ``cpu-local/hf-eager/fp32``)."""
    names = re.findall(r"`([\w./-]+)`", text)
    return [n for n in names if n not in OUTPUTS and not n.startswith(".") and "/" in n
            and re.search(r"(/|\.(py|md|json|yaml|lock|png))$", n)]


@pytest.mark.parametrize("doc", GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_named_paths_exist(doc):
    """Relative links resolve, and every repository path a guide names exists (from the
    root, or inside the package where a table names the package's folders)."""
    text = doc.read_text()
    missing = [link for link in re.findall(r"\]\(([^)\s]+)\)", text)
               if "://" not in link and link.split("#")[0]
               and not (doc.parent / link.split("#")[0]).exists()]
    missing += [name for name in named_paths(text)
                if not (ROOT / name).exists() and not (ROOT / "autocompress" / name).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist: {missing}"


def bad_mentions(text: str) -> list[str]:
    """The `autocompress ...` spans of prose that name no command, or an option the
    command lacks. A span may be a fragment: a required argument it leaves out is fine."""
    bad = []
    for span in re.findall(r"`(autocompress [^`]+)`", text):
        if "..." in span or "…" in span:
            continue
        try:
            parses(shlex.split(span)[1:])
        except typer.Exit:  # --help, or a group named without a command
            pass
        except typer.exceptions.TyperException as err:
            if type(err).__name__ != "MissingParameter":  # typer's click is private
                bad.append(f"{span}: {err}")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_named_in_the_text_exists(doc):
    """`autocompress A B --option` in a guide's prose names a command and its options."""
    bad = bad_mentions(doc.read_text())
    assert not bad, f"{doc.relative_to(ROOT)}: {bad}"
