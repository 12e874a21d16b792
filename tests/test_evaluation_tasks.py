"""Local multiple-choice tasks and held-out chunks: deterministic, balanced, well-formed.

Built from real standard-library files read directly (no model, no lm-eval).
"""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path

import pytest

from autocompress.data.corpus import Document
from autocompress.errors import AutoCompressError
from autocompress.evaluation import heldout, mc_tasks

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = ["glob.py", "heapq.py", "queue.py", "bdb.py", "fnmatch.py", "shlex.py"]


@pytest.fixture(scope="module")
def docs() -> list[Document]:
    return [Document(path=f, text=(STDLIB / f).read_text(encoding="utf-8")) for f in FILES]


@pytest.mark.parametrize("task", mc_tasks.LOCAL_TASKS)
def test_items_are_deterministic_and_well_formed(docs, task):
    items = mc_tasks.build_items(task, docs, num_items=60, seed=3)
    again = mc_tasks.build_items(task, list(reversed(docs)), num_items=60, seed=3)
    assert [i.model_dump() for i in items] == [i.model_dump() for i in again]
    assert len(items) == 60

    texts = {d.path: d.text for d in docs}
    for item in items:
        assert len(item.choices) == mc_tasks.NUM_CHOICES
        assert 0 <= item.label < mc_tasks.NUM_CHOICES
        assert len(set(item.choices)) == mc_tasks.NUM_CHOICES, "distractors must differ"
        assert item.context.strip()
        # context + answer is real code: its last context line + the answer
        # appear together in the source file the item names.
        path = item.source.rsplit(":", 1)[0]
        last_line = item.context.split("\n")[-1]
        assert last_line + item.choices[item.label] in texts[path]

    # Every answer slot is used equally often (within one item), so chance is exactly 1/4.
    counts = [sum(i.label == k for i in items) for k in range(mc_tasks.NUM_CHOICES)]
    assert max(counts) - min(counts) <= 1


def test_other_seed_gives_other_items(docs):
    a = mc_tasks.build_items("next_line", docs, num_items=40, seed=0)
    b = mc_tasks.build_items("next_line", docs, num_items=40, seed=1)
    assert [i.source for i in a] != [i.source for i in b]


def test_indent_answer_depth_is_balanced(docs):
    # A model that always prefers the shallowest (or deepest) indentation
    # must score chance: the answer's rank among the four depths is balanced.
    items = mc_tasks.build_items("indent", docs, num_items=80, seed=0)
    ranks = []
    for item in items:
        depths = [len(c) - len(c.lstrip(" ")) for c in item.choices]
        assert len(set(c.strip() for c in item.choices)) == 1  # same text, other depth
        ranks.append(sorted(depths).index(depths[item.label]))
    counts = [ranks.count(r) for r in range(4)]
    assert max(counts) - min(counts) <= 2, counts


@pytest.mark.parametrize("task", ["next_line", "docstring"])
def test_distractors_are_other_items_answers(docs, task):
    # Answers and distractors share one distribution: every distractor is the
    # (re-indented) answer of another item, and answers are reused evenly.
    items = mc_tasks.build_items(task, docs, num_items=60, seed=0)
    answers = [i.choices[i.label].strip() for i in items]
    uses = {a: 0 for a in answers}
    for item in items:
        path = item.source.rsplit(":", 1)[0]
        for k, choice in enumerate(item.choices):
            if k == item.label:
                continue
            assert choice.strip() in uses
            uses[choice.strip()] += 1
            if task == "next_line":
                indent = item.choices[item.label][: -len(item.choices[item.label].lstrip())]
                assert choice.startswith(indent) and choice.strip() not in {
                    ln.strip() for ln in (STDLIB / path).read_text().splitlines()}
    # Each item's answer is a distractor about three times (identical lines of
    # two items count together).
    assert all(abs(n - 3 * answers.count(a)) <= 2 for a, n in uses.items())


def test_identifier_distractors_come_from_the_context(docs):
    for item in mc_tasks.build_items("identifier", docs, num_items=40, seed=0):
        shared = _common_suffix(item.choices)  # the rest of the line, same in every choice
        for choice in item.choices:
            name = choice[: len(choice) - len(shared)] if shared else choice
            assert name and name in item.context


def _common_suffix(strings: list[str]) -> str:
    rev = [s[::-1] for s in strings]
    out = []
    for chars in zip(*rev, strict=False):
        if len(set(chars)) != 1:
            break
        out.append(chars[0])
    return "".join(out)[::-1]


def test_task_file_is_content_addressed_and_atomic(docs, tmp_path):
    path = mc_tasks.write_task_file("docstring", docs, tmp_path, num_items=30, seed=0)
    assert path.name.startswith("docstring-") and path.suffix == ".jsonl"
    assert mc_tasks.write_task_file("docstring", docs, tmp_path, num_items=30, seed=0) == path
    other = mc_tasks.write_task_file("docstring", docs[:-1], tmp_path, num_items=30, seed=0)
    assert other != path  # different inputs, different name
    items = mc_tasks.read_task_file(path)
    assert [i.model_dump() for i in items] == [
        i.model_dump() for i in mc_tasks.build_items("docstring", docs, 30, 0)]
    assert not list(tmp_path.glob("*.tmp*"))


def test_unknown_task_and_empty_documents_are_user_errors(docs):
    with pytest.raises(AutoCompressError, match="unknown local task"):
        mc_tasks.build_items("nope", docs)
    no_functions = [Document(path="a.py", text="x = 1\ny = 2\n")]
    with pytest.raises(AutoCompressError, match="no 'docstring' items"):
        mc_tasks.build_items("docstring", no_functions)


def test_heldout_chunks_deterministic_within_budget(docs):
    chunks = heldout.heldout_chunks(docs, max_bytes=20_000, chunk_bytes=2000, seed=0)
    assert chunks == heldout.heldout_chunks(list(reversed(docs)), 20_000, 2000, 0)
    sizes = [len(c.encode()) for c in chunks]
    assert sum(sizes[:-1]) < 20_000 <= sum(sizes) + 2000
    assert all(any(c in d.text for d in docs) for c in chunks)
    assert heldout.heldout_chunks(docs, 20_000, 2000, seed=1) != chunks


def test_bits_per_byte_ratio_and_stderr():
    # (log-likelihood in nats, bytes) per chunk, as lm-eval logs them.
    samples = [{"bits_per_byte": (-100.0, 50)}, {"bits_per_byte": (-300.0, 100)},
               {"bits_per_byte": (-120.0, 60)}]
    bpb, stderr, nbytes = heldout.bits_per_byte_from_samples(samples)
    assert nbytes == 210
    assert bpb == pytest.approx(520.0 / 210 / math.log(2))
    assert stderr is not None and 0 < stderr < bpb
    same = [{"bits_per_byte": (-2.0 * b * math.log(2), b)} for b in (10, 20, 30)]
    assert heldout.bits_per_byte_from_samples(same)[:2] == pytest.approx((2.0, 0.0))
