"""The code part of a stage's cache key, derived from what the stage really imports.

A cached result may be reused only if the code that produced it is unchanged. A
hand-written list of "the modules this stage depends on" goes stale the day
someone adds an import, and a stale list silently reuses results of old code. So
the key is computed from the source: start at the module that defines the stage,
read its ``import`` statements (at the top and inside functions, where a heavy
optional dependency is imported lazily), and follow every import that lands in one of our packages
(``autocompress``, ``tasks`` and the stage module's own top-level package),
transitively. ``from package import Name`` where the package loads ``Name`` on first
use (its ``_LAZY`` table, as ``autocompress`` and ``autocompress.costmodel`` have)
follows the module the table names. Importing ``a.b.c`` also runs ``a/__init__.py`` and
``a/b/__init__.py``, so those count too. The key hashes every file reached, plus
the data files those modules name (``hardware_specs.json``).

Reading is static (``ast``): nothing is imported, and imports under
``if TYPE_CHECKING:`` do not count, since they never run. An import built from a
string at run time (``importlib.import_module(name)``) is invisible; stages do not
do that.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
from pathlib import Path

OUR_PACKAGES = ("autocompress", "tasks")


def code_key(module: str, packages: tuple[str, ...] = OUR_PACKAGES) -> str:
    """sha256 over the source of ``module`` and everything it imports from ``packages``
    (``module``'s own top-level package is always included)."""
    packages = tuple(sorted({*packages, module.split(".")[0]}))
    roots = [root for root in map(_package_dir, packages) if root is not None]
    digest = hashlib.sha256()
    for path in sorted(code_files(module, packages)):
        digest.update(str(_relative(path, roots)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def code_files(module: str, packages: tuple[str, ...]) -> set[Path]:
    """The source files (and named data files) ``module`` runs when imported and called."""
    roots = {name: _package_dir(name) for name in packages}
    seen: set[str] = set()
    files: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name, roots)
        if path is None:
            continue
        files.add(path)
        imports, strings = _scan(path, path.read_bytes())
        for target in imports:
            todo.extend(_with_parents(_resolve(target, name, path, roots)))
        files.update(_data_files(strings, path, roots[name.split(".")[0]]))
        todo.extend(_with_parents(name))
    return files


def _package_dir(name: str) -> Path | None:
    """Where top-level package ``name`` lives (a directory), found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return Path(spec.origin).parent if spec and spec.origin else None
    return Path(next(iter(spec.submodule_search_locations)))


def _module_file(name: str, roots: dict[str, Path | None]) -> Path | None:
    """``a.b.c`` -> ``<root of a>/b/c.py`` or ``.../c/__init__.py``; None outside our packages."""
    top, *rest = name.split(".")
    root = roots.get(top)
    if root is None:
        return None
    if not root.is_dir():  # a single-file module (tests define stages in one)
        return root if not rest else None
    base = root.joinpath(*rest)
    for candidate in (base.with_suffix(".py") if rest else None, base / "__init__.py"):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _with_parents(name: str | None) -> list[str]:
    """``a.b.c`` -> [``a.b.c``, ``a.b``, ``a``]: importing it runs every parent package."""
    if not name:
        return []
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _resolve(target: tuple[str, str | None, int], module: str, path: Path,
             roots: dict[str, Path | None]) -> str | None:
    """The module an import statement loads: ``from x import y`` loads ``x.y`` when that
    is a module, else ``x``; relative imports are taken from ``module``'s package."""
    base, member, level = target
    if level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - (level - 1)]
        base = ".".join([*package, base] if base else package)
    if member and _module_file(f"{base}.{member}", roots) is not None:
        return f"{base}.{member}"
    package = _module_file(base, roots)
    if member and package is not None and package.name == "__init__.py":
        return _lazy_names(package, package.read_bytes()).get(member, base)
    return base


@functools.lru_cache(maxsize=256)
def _lazy_names(path: Path, source: bytes) -> dict[str, str]:
    """A package's ``_LAZY`` table (name -> module its ``__getattr__`` imports on first
    use): ``from package import Name`` runs that module, not the package's own imports.

    The table is read as a literal dict whose values are strings, its ``**dict.fromkeys(
    (names...), module)`` entries included; anything else in it is ignored.
    """
    for node in ast.parse(source, filename=str(path)).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "_LAZY"
                and isinstance(node.value, ast.Dict)):
            return _literal_table(node.value)
    return {}


def _literal_table(table: ast.Dict) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, value in zip(table.keys, table.values, strict=True):
        if key is None and isinstance(value, ast.Call) and len(value.args) == 2:  # **fromkeys
            names, module = value.args
            if isinstance(names, ast.Tuple | ast.List) and isinstance(module, ast.Constant):
                found.update((n.value, module.value) for n in names.elts
                             if isinstance(n, ast.Constant))
        elif isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
            found[key.value] = value.value
    return found


@functools.lru_cache(maxsize=1024)
def _scan(path: Path, source: bytes) -> tuple[tuple[tuple[str, str | None, int], ...],
                                              tuple[str, ...]]:
    """Imports as (module, imported name or None, relative level), and string constants.

    Cached by content, so an edited file is read afresh.
    """
    tree = ast.parse(source, filename=str(path))
    skipped = {id(node) for branch in ast.walk(tree) if _is_type_checking(branch)
               for node in ast.walk(branch)}
    imports: list[tuple[str, str | None, int]] = []
    strings: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            imports.extend((alias.name, None, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imports.extend((node.module or "", alias.name, node.level) for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.append(node.value)
    return tuple(imports), tuple(strings)


def _is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _data_files(strings: tuple[str, ...], path: Path, package_root: Path | None) -> list[Path]:
    """Data files a module names by a string constant, beside it or at its package's root."""
    dirs = {path.parent} | ({package_root} if package_root and package_root.is_dir() else set())
    found = []
    for text in strings:
        if ("." not in text or "/" in text or "\n" in text or text.endswith(".py")
                or len(text) > 255):  # a sentence, not a file name (too long for one)
            continue
        for folder in dirs:
            candidate = folder / text
            if candidate.is_file():
                found.append(candidate)
    return found


def _relative(path: Path, roots: list[Path]) -> Path:
    """``path`` from its package's parent, so two checkouts of one commit agree."""
    for root in roots:
        if path == root or root in path.parents:
            return path.relative_to(root.parent)
    return Path(path.name)
