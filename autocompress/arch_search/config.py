"""What shapes a search: ``SearchConfig`` (and the random ablation's ``RandomConfig``).

Kept apart from the code that runs a search: the search (``run``), its ablations and
the final pick all read these settings, and none of them has to import another for it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autocompress.arch_search.dnas import DNASConfig
from autocompress.arch_search.measured import BusyMachine
from autocompress.arch_search.minitron import MinitronConfig
from autocompress.arch_search.options import SpaceConfig
from autocompress.arch_search.selection import SelectionConfig
from autocompress.importance import CalibrationConfig


class RandomConfig(BaseModel):
    """How the random-search ablation (``search.ablations``) draws its candidates."""

    model_config = ConfigDict(extra="forbid")

    candidates: int | None = Field(
        default=None, ge=1,
        description="Architectures scored (None = what the full search evaluates: DNAS steps "
        "+ the most single-change scores its repair can take in this space).")
    min_budget_use: float = Field(
        default=0.8, ge=0, le=1,
        description="Reject draws using less than this fraction of every budget.")
    max_tries: int = Field(default=200_000, ge=1, description="Draws before relaxing the floor.")


class SearchConfig(BaseModel):
    """Everything that shapes a search (and the baseline built beside it)."""

    model_config = ConfigDict(extra="forbid")

    space: SpaceConfig = Field(default_factory=SpaceConfig)
    dnas: DNASConfig = Field(default_factory=DNASConfig)
    score: Literal["measured", "probability"] = Field(
        default="measured",
        description="Per-option scores for repair: measured KL changes around the search's "
        "argmax, or the search's log-probabilities.",
    )
    score_batches: int = Field(default=1, ge=1, description="Batches for measured scores.")
    score_radius: int | None = Field(
        default=2, ge=0,
        description="Repair's answer uses measured scores of options within this many size "
        "ranks of the search's argmax (plus no-op); None = every option. The final pick's "
        "depth variants score every option.",
    )
    minitron: MinitronConfig = Field(default_factory=MinitronConfig)
    selection: SelectionConfig = Field(
        default_factory=SelectionConfig,
        description="The final pick of the search and its ablations: their top-k candidates "
        "get the baseline's short distillation (search.minitron.distill_*).")
    random: RandomConfig = Field(default_factory=RandomConfig,
                                 description="The random-search ablation (method random).")
    calibration: CalibrationConfig = Field(
        default_factory=lambda: CalibrationConfig(seq_len=128, batch_size=8, num_batches=8,
                                                  removal_batches=0),
        description="Data for importance when it is not given.",
    )
    threads: int | None = Field(default=None, description="torch threads (None = leave as is).")
    measured_rounds: int = Field(
        default=3, ge=0,
        description="On a target this machine can time: measure the pick (random weights) "
        "and, where it misses a timing budget, tighten that budget by the cost model's error "
        "on it and pick again, at most this many measurements (0 = trust the cost model). "
        "The search and its ablations first do the same with their untrained answer (at most "
        "as many timings), so the final pick's short list is trained at a calibrated aim.")
    measured_repeats: int = Field(default=9, ge=2, description="Timed runs per measurement.")
    timing_drift: float = Field(
        default=0.03, ge=0.0, lt=0.5,
        description="How far, as a fraction, a timing may move between the search's session "
        "and verify's (pairing removes the load, not this drift): a pick, the baseline's "
        "alike, meets a timing budget only if measurement + noise + drift × measurement is "
        "within it.")
    confirm_timing: bool = Field(
        default=True,
        description="Time a pick (the baseline's alike) a second time after choosing it; it "
        "must meet the timing budgets in both (the first of several near-limit candidates to "
        "meet them tends to be one that read low).")
    max_short_lists: int = Field(
        default=2, ge=1,
        description="Most short lists the final pick distils: the measured loop re-aims it at "
        "most this many times less one (the untrained answer calibrates the aim first, so "
        "one re-aim of the trained list was enough in all but 3 of 78 recorded searches).")
    busy: BusyMachine = Field(
        default_factory=BusyMachine,
        description="Timing on a machine other jobs share: when it counts as busy, and the "
        "longest wait for a quiet window (search.measured).")

    @property
    def short_list_rounds(self) -> int:
        """Rounds of the measured loop over the final pick: each distils a short list."""
        return min(self.measured_rounds, self.max_short_lists)

    @property
    def scores_teacher_side(self) -> bool:
        """The final pick's teacher side is built (it needs measured scores at the teacher)."""
        return self.selection.has_teacher_side and self.score == "measured"

    @property
    def dnas_starts_on_greedy(self) -> bool:
        """DNAS starts on greedy's answer (which needs every option measured at the teacher)."""
        return self.dnas.start == "greedy" and self.score == "measured"

    @property
    def scores_at_teacher(self) -> bool:
        """Every option is measured at the teacher once (DNAS's start or the teacher side)."""
        return self.dnas_starts_on_greedy or self.scores_teacher_side
