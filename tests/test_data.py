"""The corpus, tokenizer and packed batches: deterministic, fingerprinted, refusing bad input."""

from __future__ import annotations

import json

import pytest
import torch

from autocompress.data.corpus import build_corpus, load_documents, load_manifest, split_of
from autocompress.data.tokens import PackedTokens, token_batches
from autocompress.errors import AutoCompressError


def test_split_is_a_stable_function_of_the_path():
    paths = [f"pkg/module_{i}.py" for i in range(400)]
    first = [split_of(p) for p in paths]
    assert first == [split_of(p) for p in reversed(paths)][::-1]
    counts = {s: first.count(s) for s in ("train", "calibration", "heldout")}
    # 90/4/6 buckets: every split gets documents, train most of them.
    assert counts["train"] > 300 and counts["calibration"] > 0 and counts["heldout"] > 0


def test_manifest_fingerprints_the_files(tiny_corpus):
    manifest = load_manifest(tiny_corpus)
    assert sum(manifest.num_files.values()) == len(manifest.files)
    held = load_documents(tiny_corpus, "heldout")
    assert {d.path for d in held} == {f.path for f in manifest.files if f.split == "heldout"}
    assert len(manifest.fingerprint) == 64


def test_fingerprint_changes_when_a_file_changes(tmp_path):
    rows = [{"path": f"m{i}.py", "text": f"def f{i}():\n    return {i}\n"} for i in range(300)]
    src = tmp_path / "a.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows))
    fp1 = build_corpus(tmp_path / "c1", source=str(src)).fingerprint
    rows[5]["text"] += "# edited\n"
    src.write_text("\n".join(json.dumps(r) for r in rows))
    fp2 = build_corpus(tmp_path / "c2", source=str(src)).fingerprint
    assert fp1 != fp2


def test_a_replaced_split_file_is_not_trusted(tmp_path):
    rows = [{"path": f"m{i}.py", "text": f"def f{i}():\n    return {i}\n"} for i in range(300)]
    src = tmp_path / "a.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows))
    corpus = tmp_path / "c"
    build_corpus(corpus, source=str(src))
    assert len(load_documents(corpus, "train")) == load_manifest(corpus).num_files["train"]
    original = (corpus / "heldout.jsonl").read_text()
    lines = original.splitlines()
    doc = json.loads(lines[0])
    for tampered in ([json.dumps({**doc, "text": "import os  # replaced"}), *lines[1:]],
                     lines[1:],  # a document removed
                     [*lines, lines[0]]):  # one duplicated
        (corpus / "heldout.jsonl").write_text("\n".join(tampered) + "\n")
        with pytest.raises(AutoCompressError, match="does not match its manifest") as err:
            load_documents(corpus, "heldout")
        assert "data prepare" in err.value.hint
    (corpus / "heldout.jsonl").write_text(original)
    assert len(load_documents(corpus, "heldout")) == len(lines)


def test_empty_source_is_a_clear_error(tmp_path):
    src = tmp_path / "empty.jsonl"
    src.write_text(json.dumps({"path": "x.py", "text": ""}) + "\n")
    with pytest.raises(AutoCompressError) as err:
        build_corpus(tmp_path / "c", source=str(src))
    assert "too small" in err.value.message or "no documents" in err.value.message


def test_missing_corpus_says_how_to_build_it(tmp_path):
    with pytest.raises(AutoCompressError) as err:
        load_documents(tmp_path / "nowhere", "train")
    assert "autocompress data prepare" in err.value.hint


def test_tokenizer_round_trips_code(tiny_corpus, tiny_tokenizer):
    text = load_documents(tiny_corpus, "heldout")[0].text[:2000]
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text
    # No BOS is prepended (it would be double-counted by rolling log-likelihoods).
    assert tiny_tokenizer("x = 1")["input_ids"][0] != tiny_tokenizer.bos_token_id


def test_batches_are_a_pure_function_of_the_step(tiny_corpus, tiny_tokenizer):
    data = PackedTokens(tiny_tokenizer, tiny_corpus, "train", 64)
    a = data.batch_at(7, 4, seed=3)
    fresh = PackedTokens(tiny_tokenizer, tiny_corpus, "train", 64)  # from the on-disk cache
    assert torch.equal(a, fresh.batch_at(7, 4, seed=3))
    assert not torch.equal(a, data.batch_at(7, 4, seed=4))
    # Walking past the end starts a new, differently shuffled epoch.
    n = len(data)
    first_epoch = torch.cat([data.batch_at(s, 1, seed=0) for s in range(n)])
    assert sorted(first_epoch.sum(1).tolist()) == sorted(data.windows.sum(1).tolist())


def test_token_batches_shape(tiny_corpus, tiny_tokenizer):
    batches = list(token_batches(tiny_tokenizer, tiny_corpus, "calibration", 32, 2, max_batches=3))
    assert len(batches) == 3 and all(b.shape == (2, 32) for b in batches)
    assert batches[0].dtype == torch.long
