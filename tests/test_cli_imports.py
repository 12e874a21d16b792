"""Every module and name that a CLI command imports (lazily, inside its body) exists.

Commands import heavy modules inside their functions to keep ``--help`` fast, so
a wrong path (``from flows.teacher import ...``) only fails when someone runs
that command. This reads every ``from X import Y`` in the command modules and
the CLI and checks that X imports and has Y.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import autocompress.cli
import autocompress.commands

COMMAND_FILES = sorted(Path(autocompress.commands.__file__).parent.glob("*.py")) + [
    Path(autocompress.cli.__file__)]
OURS = {"autocompress", "flows", "tasks", "bench"}


def _imports() -> list[tuple[str, str, str]]:
    found = []
    for path in COMMAND_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found += [(path.name, node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(path.name, alias.name, "") for alias in node.names]
    return found


def test_every_cli_module_is_registered():
    """A commands module with a ``register(app)`` is one the CLI assembles."""
    names = {p.stem for p in COMMAND_FILES if "\ndef register(" in p.read_text()} - {"cli"}
    assert names == set(autocompress.cli.COMMAND_MODULES)


def test_command_imports_resolve():
    """Only our own packages: a third-party import is checked by the lock file, not here."""
    missing = []
    for where, module, name in _imports():
        if module.split(".")[0] not in OURS:
            continue
        try:
            imported = importlib.import_module(module)
        except ImportError as err:
            missing.append(f"{where}: {module} ({err})")
            continue
        if name and not (hasattr(imported, name)
                         or importlib.util.find_spec(f"{module}.{name}") is not None):
            missing.append(f"{where}: {module} has no {name}")
    assert not missing, missing
