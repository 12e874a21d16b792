"""``--config``: a command's deep settings from YAML/JSON files and ``KEY=VALUE`` entries.

The command line keeps what a user sets on most runs (the model, the target, the limits,
where to write); everything else is a setting of the pydantic config the library itself
takes (``SearchConfig``, ``DistillConfig``, ...). ``--config`` is repeatable and each entry
is either a file (YAML or JSON: a mapping of those settings) or one ``KEY=VALUE`` setting,
with dotted keys for nested ones (``--config dnas.steps=40``; ``KEY[]=VALUE`` appends to a
list), or an inline mapping
(``--config '{"dnas": {"steps": 40}}'``). Later entries win. The
result is validated by the config class, so an unknown key or a bad value stops the
command in one line naming it, with exit code 2.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, TypeVar

import typer
import yaml
from pydantic import BaseModel, ValidationError

from autocompress.errors import AutoCompressError, invalid_input

Config = TypeVar("Config", bound=BaseModel)

CONFIG_HELP = ("Settings as a YAML/JSON FILE or one KEY=VALUE (dotted for nested keys); "
               "repeatable, later entries win.")


def config_option(example: str) -> typer.models.OptionInfo:
    """The ``--config`` option of a command (a fresh one each, as typer expects)."""
    return typer.Option([], "--config", "-c", metavar="FILE|KEY=VALUE",
                        help=f"{CONFIG_HELP} {example}")


def read_entries(entries: list[str] | None, base: dict[str, Any] | None = None,
                 option: str = "--config") -> dict:
    """``base`` with each entry of ``option`` (file or ``KEY=VALUE``) merged over it."""
    data = copy.deepcopy(base or {})
    for entry in entries or []:
        if entry.lstrip().startswith("{"):  # an inline mapping (JSON or YAML flow style)
            _merge(data, _mapping(_parse_value(entry, entry, option), f"{option} {entry}"))
        elif _is_setting(entry):
            key, _, raw = entry.partition("=")
            _set_dotted(data, key.strip(), _parse_value(raw, entry, option))
        else:
            _merge(data, _read_file(Path(entry), option))
    return data


def load_settings(config: type[Config], entries: list[str] | None, what: str,
                  base: dict[str, Any] | None = None, takes: str | None = None) -> Config:
    """The ``--config`` entries over ``base`` as a ``config``; a bad key or value is one
    usage error naming it (``takes``: the keys the hint lists, default the config's)."""
    data = read_entries(entries, base)
    try:
        return config.model_validate(data)
    except ValidationError as err:
        where, fields = _fields_at(config, err.errors()[0]["loc"])
        if takes is None or where:
            takes = ", ".join(fields)
        raise invalid_input(err, f"{what} settings (--config)",
                            f"{what} settings{f' under {where}' if where else ''} take: "
                            f"{takes}") from None


def _fields_at(config: type[BaseModel], loc: tuple) -> tuple[str, list[str]]:
    """The nested settings a bad key sits in (``dnas`` for ``dnas.stepz``) and their keys,
    so that the hint lists the keys a user can write there."""
    model, path = config, []
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            break
        model, path = annotation, [*path, part]
    return ".".join(path), list(model.model_fields)


def _is_setting(entry: str) -> bool:
    # A file name may contain '=' too: an existing file is always read as a file.
    return "=" in entry and not Path(entry).is_file()


def _parse_value(raw: str, entry: str, option: str) -> Any:
    """A KEY=VALUE value as YAML reads it: 3 -> int, false -> bool, [1, 0.5] -> list."""
    try:
        return yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise AutoCompressError(f"cannot read {option} {entry!r}",
                                "write KEY=VALUE, e.g. dnas.steps=40 or head_fractions=[1,0.5]"
                                ) from None


def _read_file(path: Path, option: str) -> dict:
    try:
        data = yaml.safe_load(path.read_text())  # YAML reads JSON too
    except (OSError, yaml.YAMLError) as err:
        first = str(err).strip().splitlines()[0]
        raise AutoCompressError(f"cannot read {option} {path}: {first}",
                                "pass a YAML or JSON file of settings, or KEY=VALUE") from None
    return _mapping(data, f"{option} {path}")


def _mapping(data: Any, where: str) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise AutoCompressError(f"{where} does not hold a mapping of settings",
                                "write KEY: VALUE lines (YAML) or a JSON object")
    return data


def _set_dotted(data: dict, key: str, value: Any) -> None:
    """``a.b=1`` sets ``data["a"]["b"]``; ``a[]=1`` appends to the list ``data["a"]``."""
    *parents, last = key.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    if last.endswith("[]"):  # one more item of a list (what a repeated option gave)
        items = node.get(last[:-2])
        node[last[:-2]] = [*(items if isinstance(items, list) else []), value]
    else:
        node[last] = value


def _merge(into: dict, new: dict) -> None:
    """Merge ``new`` into ``into``, nested mappings key by key."""
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
