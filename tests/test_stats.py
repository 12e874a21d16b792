"""Paired bootstrap intervals on synthetic per-item scores with a known difference."""

from __future__ import annotations

import numpy as np
import pytest

from autocompress.errors import AutoCompressError
from bench.stats import OVERALL, paired_differences, paired_vectors


def _runs(item_means: dict[str, np.ndarray], shift: float, seeds: int, noise: float,
          rng: np.random.Generator) -> list[dict[str, dict[str, float]]]:
    """``seeds`` runs scoring every item at its mean + ``shift`` + per-run noise."""
    return [{task: {f"{task}-{i}": float(m + shift + rng.normal(0, noise))
                    for i, m in enumerate(means)} for task, means in item_means.items()}
            for _ in range(seeds)]


def test_known_difference_is_inside_a_narrow_paired_interval():
    rng = np.random.default_rng(1)
    # Items differ a lot from one another (sd 0.3); the models differ by 0.05 on each.
    means = {"a": rng.normal(0.5, 0.3, 300), "b": rng.normal(0.4, 0.3, 200)}
    runs_a = _runs(means, 0.05, seeds=3, noise=0.02, rng=rng)
    runs_b = _runs(means, 0.0, seeds=3, noise=0.02, rng=rng)
    out = paired_differences(runs_a, runs_b)
    assert set(out) == {"a", "b", OVERALL}
    for task in ("a", "b", OVERALL):
        d = out[task]
        assert d.low < 0.05 < d.high and d.excludes_zero
        assert d.high - d.low < 0.02  # pairing removes the items' own spread
    assert out[OVERALL].n_items == 500 and out["a"].seeds_a == 3
    # Treated as independent samples, the same data would give an interval ~ 0.3 * 4 / sqrt(n).
    unpaired_width = 2 * 1.96 * 0.3 * np.sqrt(2 / 300)
    assert out["a"].high - out["a"].low < unpaired_width / 5


def test_no_difference_covers_zero_and_seed_spread_widens_the_interval():
    rng = np.random.default_rng(2)
    means = {"t": rng.normal(0.5, 0.3, 300)}
    one = paired_differences(_runs(means, 0.0, 1, 0.0, rng), _runs(means, 0.0, 1, 0.05, rng))
    assert one["t"].low < 0 < one["t"].high and not one["t"].excludes_zero
    # Seeds that disagree as a whole (a shift per seed) must widen the interval.
    shifted = [{"t": {k: v + s for k, v in run["t"].items()}}
               for run, s in zip(_runs(means, 0.0, 3, 0.0, rng), (-0.05, 0.0, 0.05), strict=True)]
    steady = _runs(means, 0.0, 3, 0.0, rng)
    wide = paired_differences(shifted, steady)["t"]
    narrow = paired_differences(_runs(means, 0.0, 3, 0.01, rng), steady)["t"]
    assert wide.high - wide.low > 3 * (narrow.high - narrow.low)


def test_items_are_matched_by_id_and_bad_input_is_refused():
    a = {"t": {"x": 1.0, "y": 0.0, "z": 1.0}}
    b = {"t": {"z": 0.0, "y": 0.0, "w": 1.0}}
    d = paired_differences([a], [b], n_boot=200)["t"]
    assert d.n_items == 2 and d.mean == pytest.approx(0.5)  # z: 1-0, y: 0-0
    assert paired_vectors([1.0, 2.0], [0.5, 1.0], n_boot=200).mean == pytest.approx(0.75)
    with pytest.raises(AutoCompressError, match="no item"):
        paired_differences([{"t": {"x": 1.0}}], [{"t": {"y": 1.0}}])
    with pytest.raises(AutoCompressError, match="differ in length"):
        paired_vectors([1.0], [1.0, 2.0])
    with pytest.raises(AutoCompressError, match="at least one run"):
        paired_differences([], [b])


def test_seed_pairs_cancel_what_a_seed_does_to_both_methods():
    """Each seed moves both methods alike (as a faster timing session lets both keep larger
    models): resampling seed pairs leaves the steady +0.03 difference with a narrow interval
    above zero; resampling each method's seeds independently counts the seed effect twice."""
    rng = np.random.default_rng(3)
    means = {"t": rng.normal(0.5, 0.2, 300)}
    shifts = (0.0, 0.0, 0.08)  # seed 2 ran where both could keep more
    runs_b = [{"t": {k: v + s for k, v in run["t"].items()}}
              for run, s in zip(_runs(means, 0.0, 3, 0.0, rng), shifts, strict=True)]
    runs_a = [{"t": {k: v + 0.03 for k, v in run["t"].items()}} for run in runs_b]
    pairs = paired_differences(runs_a, runs_b, paired_seeds=True)["t"]
    apart = paired_differences(runs_a, runs_b)["t"]
    assert pairs.mean == pytest.approx(0.03) == apart.mean
    assert pairs.excludes_zero and pairs.high - pairs.low < 0.01
    assert not apart.excludes_zero and apart.high - apart.low > 0.1
    with pytest.raises(AutoCompressError, match="as many runs"):
        paired_differences(runs_a, runs_b[:2], paired_seeds=True)
