"""Paired comparisons of two models' per-item scores, with bootstrap 95% intervals.

Two models scored on the *same* items (benchmark questions, held-out windows) differ
far less from item to item than two independent samples would suggest: an item that
is hard for one is usually hard for the other. Treating their means as independent
overstates the noise of the difference; pairing by item removes the shared part.

Inputs are per-item scores keyed by task and item id, one mapping per seed of each
method (``{task: {item_id: score}}``, what ``evaluation.suite.evaluate`` records under
``per_item``). Items are matched by task and id (only items every run scored count).
The difference A − B of a task is the mean over items of (A's score averaged over
its seeds − B's likewise); the overall difference is the unweighted mean of the
tasks' differences (as ``mc_mean`` averages tasks).

Intervals are percentile bootstraps. Each replicate resamples, with replacement,
the items of every task (items, never tokens: an item is the unit that was drawn)
and the seeds of each method (so seed-to-seed spread widens the interval; with one
seed that part is fixed). With ``paired_seeds`` (both methods ran the same seeds, given
in the same order) a replicate draws seed *pairs*: seed s of A goes with seed s of B,
which share the seed's data order, limit and often the timing session, so what a seed
does to both (a faster host session lets both keep larger models) cancels in A − B, as
an item's difficulty does. Otherwise seeds are resampled independently for the two
methods: then such a shared seed effect counts twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel

from autocompress.errors import AutoCompressError

ItemScores = Mapping[str, Mapping[str, float]]  # task -> item id -> score
OVERALL = "overall"


class PairedDiff(BaseModel):
    """A − B on matched items: the mean difference and its bootstrap interval."""

    mean: float
    low: float
    high: float
    se: float
    n_items: int
    seeds_a: int
    seeds_b: int
    confidence: float = 0.95

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def text(self, scale: float = 1.0, fmt: str = "+.1f") -> str:
        """``+2.3 [+0.4, +4.1]`` (values × ``scale``)."""
        return (f"{self.mean * scale:{fmt}} [{self.low * scale:{fmt}}, "
                f"{self.high * scale:{fmt}}]")


def _matched(runs_a: Sequence[ItemScores], runs_b: Sequence[ItemScores],
             task: str) -> tuple[np.ndarray, np.ndarray]:
    """[seeds, items] arrays of the items every run of both methods scored in ``task``."""
    runs = [*runs_a, *runs_b]
    if any(task not in run for run in runs):
        raise AutoCompressError(f"task {task!r} has no per-item scores in every run",
                                hint="re-evaluate the models with a suite that records them")
    common = set(runs[0][task])
    for run in runs[1:]:
        common &= set(run[task])
    ids = sorted(common)
    if not ids:
        raise AutoCompressError(f"no item of task {task!r} was scored by every run",
                                hint="evaluate the models on the same items (same suite settings)")

    def array(group):
        return np.array([[float(run[task][i]) for i in ids] for run in group])

    return array(runs_a), array(runs_b)


def _replicates(a: np.ndarray, b: np.ndarray, rng: np.random.Generator, n_boot: int,
                seed_weights: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Bootstrap replicates of mean(A) − mean(B) for one task (items resampled here)."""
    n = a.shape[1]
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot) / n  # [R, items]
    wa, wb = seed_weights
    return (np.einsum("rs,si,ri->r", wa, a, counts)
            - np.einsum("rs,si,ri->r", wb, b, counts))


def paired_differences(runs_a: Sequence[ItemScores], runs_b: Sequence[ItemScores],
                       tasks: Sequence[str] | None = None, *, n_boot: int = 2000,
                       confidence: float = 0.95, seed: int = 0,
                       paired_seeds: bool = False) -> dict[str, PairedDiff]:
    """Per task and ``overall``: A − B with a bootstrap interval (see the module doc).

    ``runs_a`` / ``runs_b``: one ``{task: {item_id: score}}`` per seed of each method.
    ``tasks``: which tasks (default: those every run has); ``overall`` averages them.
    ``paired_seeds``: ``runs_a[i]`` and ``runs_b[i]`` ran the same seed; resample the pairs.
    """
    if not runs_a or not runs_b:
        raise AutoCompressError("a paired comparison needs at least one run of each model",
                                hint="pass the per-item scores of both models")
    if paired_seeds and len(runs_a) != len(runs_b):
        raise AutoCompressError(f"seed pairs need as many runs of each model, not "
                                f"{len(runs_a)} and {len(runs_b)}",
                                hint="pass the runs of the seeds both models ran, in one order")
    if tasks is None:
        tasks = sorted(set.intersection(*(set(run) for run in [*runs_a, *runs_b])))
    if not tasks:
        raise AutoCompressError("the two models share no task with per-item scores",
                                hint="evaluate both on the same tasks")
    rng = np.random.default_rng(seed)
    sa, sb = len(runs_a), len(runs_b)
    # One draw of seeds per replicate, shared by all tasks (a seed's luck is not per task).
    weights = (rng.multinomial(sa, np.full(sa, 1.0 / sa), size=n_boot) / sa,
               rng.multinomial(sb, np.full(sb, 1.0 / sb), size=n_boot) / sb)
    if paired_seeds:  # (both drawn all the same: the items' draws stay as they were)
        weights = (weights[0], weights[0])
    tail = 100 * (1 - confidence) / 2
    out: dict[str, PairedDiff] = {}
    per_task_reps, per_task_means, total_items = [], [], 0
    for task in tasks:
        a, b = _matched(runs_a, runs_b, task)
        reps = _replicates(a, b, rng, n_boot, weights)
        mean = float(a.mean() - b.mean())
        out[task] = _summary(mean, reps, tail, a.shape[1], sa, sb, confidence)
        per_task_reps.append(reps)
        per_task_means.append(mean)
        total_items += a.shape[1]
    overall = np.mean(per_task_reps, axis=0)
    out[OVERALL] = _summary(float(np.mean(per_task_means)), overall, tail, total_items, sa, sb,
                            confidence)
    return out


def _summary(mean: float, reps: np.ndarray, tail: float, n: int, sa: int, sb: int,
             confidence: float) -> PairedDiff:
    low, high = np.percentile(reps, [tail, 100 - tail])
    return PairedDiff(mean=mean, low=float(low), high=float(high),
                      se=float(reps.std(ddof=1)), n_items=n, seeds_a=sa, seeds_b=sb,
                      confidence=confidence)


def paired_vectors(a: Sequence[float], b: Sequence[float], **kwargs) -> PairedDiff:
    """A − B for two equally long vectors of scores on the same items, in the same order."""
    if len(a) != len(b):
        raise AutoCompressError(f"paired scores differ in length ({len(a)} vs {len(b)})",
                                hint="score both models on the same items")
    ids = [str(i) for i in range(len(a))]
    runs_a = [{"items": dict(zip(ids, a, strict=True))}]
    runs_b = [{"items": dict(zip(ids, b, strict=True))}]
    return paired_differences(runs_a, runs_b, ["items"], **kwargs)["items"]


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """0-based ranks, tied values sharing the mean of their ranks (Spearman's convention)."""
    values = np.asarray(values, dtype=float)
    ranks = np.empty(len(values))
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation, ties averaged; NaN when either side has one value only."""
    ra, rb = average_ranks(a), average_ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])
