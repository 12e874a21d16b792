"""Multiple-choice tasks built deterministically from held-out code.

Each task turns the held-out split into items ``{context, choices, label}``:
the model scores every choice as a continuation of the context, and picks the
most likely one. All tasks have four choices, so chance is exactly 1/4.

- ``next_line``: the ~10 lines before a line → pick that line among the real
  lines of three other items, from *other* files (re-indented like the real
  one, so indentation does not give the answer away).
- ``identifier``: code up to an identifier → pick the identifier (followed by
  the rest of its line, which the choices share) among three other identifiers
  that, like the real one, appear earlier in the context.
- ``docstring``: a ``def`` signature and the opening quotes → pick the first
  line of its docstring among the docstring summaries of three other items.
- ``indent``: the lines before a statement → pick the statement's indentation
  among four consecutive indentation levels (same text, different depth); the
  real depth is the shallowest, second, third or deepest equally often.

Items are a pure function of (documents, task, seed, number of items): the
documents are sorted by path, every random choice comes from a
``random.Random`` seeded with a string (stable across processes), and the
answer positions are balanced over the four slots. ``fingerprint`` names the
inputs so that task files are content-addressed.

Surface cues must not give the answer away, or a model that knows nothing
scores above (or below) chance: line and docstring distractors are the answers
of other items (so answers and distractors have one distribution), identifier
distractors are the context's names closest in length to the answer, and the
answer's indentation rank is balanced. With the default teacher's tokenizer,
a randomly initialised model scores 0.24-0.30 per task (mean 0.26; 300 items
each, stderr ~0.025).
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import keyword
import random
import tokenize
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from autocompress.atomic import write_text_atomic
from autocompress.data.corpus import Document
from autocompress.errors import AutoCompressError

NUM_CHOICES = 4
CHANCE = 1.0 / NUM_CHOICES
# Task files are named by a hash that includes this module's source, so a
# change in how items are built never reuses stale files.
_SOURCE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
CONTEXT_LINES = 10  # lines of code shown before the position being tested
MAX_CONTEXT_CHARS = 700  # keeps contexts well inside a 256-token window


class MCItem(BaseModel):
    """One multiple-choice question: ``choices[label]`` is the real code."""

    id: str
    context: str
    choices: list[str]
    label: int
    source: str  # "path:line" where the real answer comes from


class TaskSpec(BaseModel):
    """How one local task is built and scored."""

    name: str
    description: str
    chance: float = CHANCE
    # lm-eval metric reported as the score. Byte-normalised log-likelihood
    # (acc_norm) where choices are different texts of different lengths; raw
    # (acc) where they differ only in a name or in whitespace, since per-byte
    # normalisation would favour the longer identifier / deeper indentation.
    metric: Literal["acc", "acc_norm"] = "acc"


# A candidate is (context, answer, distractors, source). Builders list cheap
# "sites" per document and a ``realize(site, rng)`` that turns one site into a
# candidate (or None when it does not qualify); only the sites that are picked
# get realized, which keeps building a few hundred items fast.
Candidate = tuple[str, str, list[str], str]


# ----------------------------------------------------------------- helpers


def _rng(*parts: object) -> random.Random:
    """A generator seeded from a string: identical in every process and run."""
    return random.Random(":".join(str(p) for p in parts))


def _context(lines: Sequence[str], end: int, prefix: str = "") -> str | None:
    """Up to CONTEXT_LINES lines before ``end`` (+ ``prefix``), trimmed to size.

    Returns None when there is too little code before ``end`` to judge from.
    """
    window = list(lines[max(0, end - CONTEXT_LINES):end])
    while window and len("\n".join(window)) + len(prefix) > MAX_CONTEXT_CHARS:
        window.pop(0)  # drop the oldest lines first
    if sum(1 for line in window if line.strip()) < 3:
        return None
    return "\n".join(window) + "\n" + prefix


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _is_code_line(line: str) -> bool:
    """A line worth asking about: some real text, not a comment or a lone bracket."""
    text = line.strip()
    return len(text) >= 12 and not text.startswith("#") and any(c.isalpha() for c in text)


def _python_tokens(text: str) -> list[tokenize.TokenInfo] | None:
    try:
        return list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


def _identifiers(tokens: Sequence[tokenize.TokenInfo]) -> list[tokenize.TokenInfo]:
    return [
        t for t in tokens
        if t.type == tokenize.NAME and len(t.string) >= 3 and not keyword.iskeyword(t.string)
        and not keyword.issoftkeyword(t.string)
    ]


# ----------------------------------------------------------------- builders


class _Builder:
    """Sites per document, and how to turn one site into a candidate.

    Builders with ``in_batch = True`` return candidates without distractors;
    those are then taken from the answers of the *other* items (see
    ``_in_batch_distractors``), through ``as_distractor``.
    """

    in_batch = False

    def __init__(self, docs: Sequence[Document]):
        self.docs = docs

    def sites(self) -> list[list[object]]:
        raise NotImplementedError

    def realize(self, site, rng: random.Random) -> Candidate | None:
        raise NotImplementedError

    def as_distractor(self, item: Candidate, other: Candidate) -> str | None:
        """``other``'s answer adapted to ``item``, or None if it cannot serve there."""
        raise NotImplementedError


class _NextLine(_Builder):
    in_batch = True

    def __init__(self, docs):
        super().__init__(docs)
        self.lines = [d.text.splitlines() for d in docs]
        self.texts = {d.path: {ln.strip() for ln in lines}
                      for d, lines in zip(docs, self.lines, strict=True)}

    def sites(self):
        return [[(k, i) for i, ln in enumerate(lines) if _is_code_line(ln)]
                for k, lines in enumerate(self.lines)]

    def realize(self, site, rng):
        k, i = site
        ctx = _context(self.lines[k], i)
        if ctx is None:
            return None
        return ctx, self.lines[k][i].rstrip(), [], f"{self.docs[k].path}:{i + 1}"

    def as_distractor(self, item, other):
        # A line from another file, never one that also occurs in the item's
        # own file, re-indented like the real line.
        path = _path_of(item)
        text = other[1].strip()
        if _path_of(other) == path or text in self.texts[path]:
            return None
        return _indent(item[1]) + text


class _Identifier(_Builder):
    def __init__(self, docs):
        super().__init__(docs)
        self.lines = [d.text.splitlines() for d in docs]
        self.names = [_identifiers(_python_tokens(d.text) or []) for d in docs]

    def sites(self):
        return [[(k, j) for j in range(len(names))] for k, names in enumerate(self.names)]

    def realize(self, site, rng):
        k, j = site
        tok = self.names[k][j]
        row, col = tok.start[0] - 1, tok.start[1]
        lines = self.lines[k]
        if row >= len(lines) or tok.end[0] != tok.start[0]:
            return None
        line = lines[row]
        ctx = _context(lines, row, prefix=line[:col])
        if ctx is None:
            return None
        # The answer and the distractors are all identifiers used in the code
        # of the context, so "it appeared before" does not tell them apart.
        # Among those, the distractors are the names closest in length to the
        # answer: the answer is often the context's most frequent (and
        # shortest) name, which a model that merely prefers few tokens would
        # otherwise pick.
        first_row = row - ctx.count("\n")
        seen = {t.string for t in self.names[k][:j] if t.start[0] - 1 >= first_row}
        if tok.string not in seen:
            return None
        others = sorted(seen - {tok.string})
        rng.shuffle(others)
        others.sort(key=lambda name: abs(len(name) - len(tok.string)))
        wrong = others[:NUM_CHOICES - 1]
        rest = line[tok.end[1]:].rstrip()
        return ctx, tok.string + rest, [w + rest for w in wrong], f"{self.docs[k].path}:{row + 1}"


def _docstring_functions(doc: Document) -> list[tuple[int, int, str, str]]:
    """Per documented function: 0-based rows of its ``def`` and of its docstring,
    the docstring line up to the summary (indent + quotes), and the summary."""
    try:
        tree = ast.parse(doc.text)
    except (SyntaxError, ValueError):
        return []
    lines = doc.text.splitlines()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        doc_text = ast.get_docstring(node, clean=True)
        first = node.body[0]
        if not doc_text or first.lineno - 1 >= len(lines):
            continue
        summary = doc_text.strip().splitlines()[0].strip()
        row = first.lineno - 1
        src = lines[row]
        start = src.find(summary)
        # Keep only docstrings whose summary starts on the opening line, right
        # after the quotes, so that "context + choice" is the real source text.
        if len(summary) < 10 or start < 0 or not src[:start].strip().endswith(("'", '"')):
            continue
        found.append((node.lineno - 1, row, src[:start], summary))
    return sorted(found)


class _Docstring(_Builder):
    in_batch = True

    def __init__(self, docs):
        super().__init__(docs)
        self.lines = [d.text.splitlines() for d in docs]
        self.funcs = [_docstring_functions(d) for d in docs]

    def sites(self):
        return [[(k, j) for j in range(len(fs))] for k, fs in enumerate(self.funcs)]

    def realize(self, site, rng):
        k, j = site
        def_row, row, prefix, summary = self.funcs[k][j]
        signature = "\n".join(self.lines[k][def_row:row])
        if len(signature) + len(prefix) > MAX_CONTEXT_CHARS:
            return None
        return signature + "\n" + prefix, summary, [], f"{self.docs[k].path}:{row + 1}"

    def as_distractor(self, item, other):
        return other[1]  # another function's summary (distinctness is checked by the caller)


def _statement_starts(tokens: Sequence[tokenize.TokenInfo]) -> list[int]:
    """0-based rows where a logical line (a statement) begins."""
    starts, at_start = [], True
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}
    for tok in tokens:
        if tok.type == tokenize.NEWLINE:
            at_start = True
        elif at_start and tok.type not in skip:
            starts.append(tok.start[0] - 1)
            at_start = False
    return starts


class _Indent(_Builder):
    def __init__(self, docs):
        super().__init__(docs)
        self.lines = [d.text.splitlines() for d in docs]
        self.starts = [_statement_starts(_python_tokens(d.text) or []) for d in docs]
        # How often the answer was the shallowest, 2nd, 3rd, deepest choice.
        self.rank_counts = [0] * NUM_CHOICES

    def sites(self):
        return [[(k, row) for row in rows] for k, rows in enumerate(self.starts)]

    def realize(self, site, rng):
        k, row = site
        lines = self.lines[k]
        line = lines[row] if 0 < row < len(lines) else ""
        ind = _indent(line)
        # Spaces only, in steps of 4: the levels below are then well defined.
        if "\t" in ind or len(ind) % 4 or not line.strip():
            return None
        prev = next((lines[r] for r in range(row - 1, -1, -1) if lines[r].strip()), None)
        # Only statements whose depth differs from the previous line's: keeping
        # the same depth is the trivial case.
        ctx = _context(lines, row)
        if prev is None or _indent(prev) == ind or ctx is None:
            return None
        level = len(ind) // 4
        # Rank of the answer among the four levels. A shallow statement cannot
        # have three shallower distractors, so take the least used feasible
        # rank and skip the site if that would unbalance the ranks: then a model
        # that just prefers short (or long) indentation scores chance.
        feasible = range(min(level, NUM_CHOICES - 1) + 1)
        fewest = min(self.rank_counts[r] for r in feasible)
        if fewest > min(self.rank_counts):
            return None
        rank = rng.choice([r for r in feasible if self.rank_counts[r] == fewest])
        self.rank_counts[rank] += 1
        text = line.strip()
        low = level - rank
        wrong = [" " * (4 * lv) + text for lv in range(low, low + NUM_CHOICES) if lv != level]
        return ctx, line.rstrip(), wrong, f"{self.docs[k].path}:{row + 1}"


BUILDERS: dict[str, type[_Builder]] = {
    "next_line": _NextLine,
    "identifier": _Identifier,
    "docstring": _Docstring,
    "indent": _Indent,
}

TASKS: dict[str, TaskSpec] = {
    "next_line": TaskSpec(name="next_line", description="pick the real next line of code",
                          metric="acc_norm"),
    "identifier": TaskSpec(name="identifier",
                           description="pick the identifier at a masked position"),
    "docstring": TaskSpec(name="docstring", metric="acc_norm",
                          description="pick the docstring that belongs to a signature"),
    "indent": TaskSpec(name="indent", description="pick the indentation of the next statement"),
}
LOCAL_TASKS: tuple[str, ...] = tuple(TASKS)


# ----------------------------------------------------------------- assembly


def _path_of(cand: Candidate) -> str:
    return cand[3].rsplit(":", 1)[0]


def _spread(builder: _Builder, n: int, rng: random.Random) -> list[Candidate]:
    """Up to ``n`` candidates, taken round-robin over files in a shuffled order.

    Round-robin keeps one large file from supplying most of the items.
    """
    queues = []
    for sites in builder.sites():
        rng.shuffle(sites)
        if sites:
            queues.append(sites)
    rng.shuffle(queues)
    picked: list[Candidate] = []
    seen: set[tuple[str, str]] = set()
    need = 0 if builder.in_batch else NUM_CHOICES - 1
    while queues and len(picked) < n:
        for q in list(queues):
            if len(picked) == n:
                break
            cand = builder.realize(q.pop(), rng)
            # Identical questions count once; a site without enough distinct
            # distractors (tiny corpora) is skipped.
            if cand and len(cand[2]) == need and (cand[0], cand[1]) not in seen:
                seen.add((cand[0], cand[1]))
                picked.append(cand)
            if not q:
                queues.remove(q)
    return picked


def _in_batch_distractors(builder: _Builder, cands: list[Candidate],
                          rng: random.Random) -> list[Candidate]:
    """Distractors taken from the answers of the other items.

    Each answer then also serves as a wrong choice about three times, so
    answers and distractors have the same distribution (same files, same
    style, same lengths): a model that merely prefers some kinds of text over
    others cannot beat chance. Drawing from the whole file pool instead made
    large files with many short, generic docstrings dominate the distractors,
    and a trained model scored *below* chance. The least-used answers are
    taken first, so usage is nearly uniform.
    """
    uses = [0] * len(cands)
    out = []
    for i, cand in enumerate(cands):
        order = sorted((j for j in range(len(cands)) if j != i),
                       key=lambda j: (uses[j], rng.random()))
        wrong: list[str] = []
        for j in order:
            text = builder.as_distractor(cand, cands[j])
            if text is None or text == cand[1] or text in wrong:
                continue
            wrong.append(text)
            uses[j] += 1
            if len(wrong) == NUM_CHOICES - 1:
                out.append((cand[0], cand[1], wrong, cand[3]))
                break
    return out


def build_items(task: str, docs: Sequence[Document], num_items: int = 300,
                seed: int = 0) -> list[MCItem]:
    """The items of one local task: deterministic in (docs, task, num_items, seed)."""
    if task not in BUILDERS:
        raise AutoCompressError(f"unknown local task '{task}'",
                                f"local tasks are: {', '.join(LOCAL_TASKS)}")
    docs = sorted(docs, key=lambda d: d.path)
    rng = _rng(task, seed)
    builder = BUILDERS[task](docs)
    cands = _spread(builder, num_items, rng)
    if builder.in_batch:
        cands = _in_batch_distractors(builder, cands, rng)
    if not cands:
        raise AutoCompressError(
            f"the held-out documents yield no '{task}' items",
            "use a larger corpus (`autocompress data prepare`) or other --tasks",
        )
    # Balanced answer slots: each of the four positions is the answer equally often.
    slots = [i % NUM_CHOICES for i in range(len(cands))]
    rng.shuffle(slots)
    items = []
    for k, ((ctx, answer, wrong, source), label) in enumerate(zip(cands, slots, strict=True)):
        choices = list(wrong)
        choices.insert(label, answer)
        items.append(MCItem(id=f"{task}-{k}", context=ctx, choices=choices, label=label,
                            source=source))
    return items


def fingerprint(task: str, docs: Sequence[Document], num_items: int, seed: int) -> str:
    """A content hash of everything the items depend on."""
    h = hashlib.sha256()
    h.update(json.dumps([task, num_items, seed, _SOURCE_HASH]).encode())
    for d in sorted(docs, key=lambda d: d.path):
        h.update(d.path.encode() + b"\0" + hashlib.sha256(d.text.encode()).digest())
    return h.hexdigest()


def write_task_file(task: str, docs: Sequence[Document], out_dir: Path, num_items: int = 300,
                    seed: int = 0) -> Path:
    """Build the items of ``task`` and write them as ``<task>-<hash>.jsonl`` (reused if there).

    The file is written to a temporary name and renamed, so a crash never leaves
    a truncated task file that a later run would trust.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{task}-{fingerprint(task, docs, num_items, seed)[:16]}.jsonl"
    if path.exists():
        return path
    items = build_items(task, docs, num_items, seed)
    return write_text_atomic(path, "".join(item.model_dump_json() + "\n" for item in items))


def read_task_file(path: Path) -> list[MCItem]:
    with Path(path).open(encoding="utf-8") as fh:
        return [MCItem.model_validate_json(line) for line in fh if line.strip()]
