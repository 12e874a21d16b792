"""Data stages: the corpus every later stage reads, published with its fingerprint."""

from __future__ import annotations

import shutil
from pathlib import Path

from autocompress.artifacts import ArtifactRef
from tasks.stage import StageContext, stage


@stage("corpus")
def prepare_corpus(ctx: StageContext, corpus_dir: Path, source: str | None = None) -> ArtifactRef:
    """Build the corpus if it is missing (stdlib or a ``datasets`` source) and publish it.

    ``corpus_dir`` is a path so that the cache key covers its content: a rebuilt
    corpus is a new input. Consumers open it with ``ctx.working_copy`` (tools
    write token caches beside the corpus).
    """
    from autocompress.data.corpus import SPLITS, build_corpus, check_corpus

    if not (Path(corpus_dir) / "manifest.json").exists():
        build_corpus(Path(corpus_dir), source=source)
    manifest = check_corpus(Path(corpus_dir))
    ctx.log_params({"source": manifest.source, "fingerprint": manifest.fingerprint})
    metrics = {f"files_{split}": float(n) for split, n in manifest.num_files.items()}
    metrics.update({f"bytes_{split}": float(n) for split, n in manifest.num_bytes.items()})
    # Publish the corpus itself (manifest + splits), not caches that tools left beside it.
    out = ctx.scratch() / "corpus"
    out.mkdir()
    for name in ["manifest.json", *(f"{split}.jsonl" for split in SPLITS)]:
        shutil.copy2(Path(corpus_dir) / name, out / name)
    return ctx.publish(out, "corpus", metrics=metrics, move=True,
                       meta={"fingerprint": manifest.fingerprint, "source": manifest.source})
