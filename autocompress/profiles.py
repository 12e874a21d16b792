"""Run profiles: every stage of a compression sized by one name.

``full`` is each stage's own defaults (what a real compression uses). ``demo`` is
`autocompress demo`'s, sized for about five minutes on 2 cores. ``tiny`` shrinks
every stage at once — a few cost-model probes, a few search steps, a few thousand
distillation tokens, a handful of benchmark items — so that a real ``compress`` flow run
of the bundled teacher fits an integration test (the served test runs it across two
workers). A tiny run exercises every stage and every hand-over between them; its model is
not worth keeping.

A profile only fills in what the caller left unset: options given explicitly win, key by
key, and so do an explicit ``eval_limit`` and ``eval_config``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from autocompress.errors import AutoCompressError


class Profile(BaseModel):
    """The stage options and benchmark sizes one profile stands for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    options: dict[str, dict[str, Any]] = {}
    eval_limit: int | None = None
    eval_config: dict[str, Any] = {}


# Each tiny value's full size is in its comment. The tiny profile fits and validates a
# cost model like a full run, on a few probes; its gate is open (two architectures cannot
# rank anything). The search times its pick once and keeps a wider margin for drift, so
# that the pick still meets the limit when verification times it with few repeats; it does
# not wait for other processes to leave the cores (a tiny run usually has a test suite
# beside it, and is not worth the wait): it goes straight to what it does after the wait.
TINY = Profile(
    options={
        "costmodel": {"n_probes": 4, "repeats": 1},                  # 20 probes, 3 repeats
        "validation": {"n": 2, "repeats": 1,                         # 12 archs, 3 repeats
                       "max_mape": None, "min_kendall_tau": None},   # gated (2 say nothing)
        "importance": {"num_batches": 2, "removal_batches": 1,       # 16 and 2 batches
                       "batch_size": 2, "seq_len": 64},              # of 8 x 256 tokens
        "search": {"dnas": {"steps": 6, "batch_size": 2, "seq_len": 64,  # 160 steps of 4
                            "checkpoint_every": 3},
                   "measured_rounds": 1,                             # 3 timed re-aims of the pick
                   "timing_drift": 0.1,                              # 0.03 (few repeats: noisier)
                   "measured_repeats": 3,                            # 9 timed runs
                   "score_batches": 1,
                   "selection": {"top_k": 1},                        # 10 short-distilled
                   "minitron": {"top_k": 2, "distill_tokens": 1_024,  # 10, 32,768 tokens
                                "score_batches": 1},                 # 8 batches
                   "calibration": {"num_batches": 2, "batch_size": 2, "seq_len": 64},
                   "busy": {"wait_s": 0}},                           # 20 s for others to leave
        "distill": {"tokens": 4_096, "seq_len": 64, "batch_size": 4,  # 200,000 tokens
                    "warmup_steps": 2, "eval_batches": 1, "ckpt_every": 4},
        "verify": {"repeats": 2, "sessions": 1},                     # 9 repeats, 3 sessions
    },
    eval_limit=4,                                                    # 300 items a task
    eval_config={"bpb_bytes": 4_000, "next_token_windows": 4, "seq_len": 64},
)
# The demo's sizes (`autocompress demo`, `make demo`): the main job in about five minutes
# on 2 cores. Each value's full size is in its comment. Timing repetitions: paired timing
# spreads by a few per cent, so 2 suffice to fit and gate and 5 to verify.
DEMO = Profile(
    options={
        "costmodel": {"repeats": 2},                          # 3 repeats (all 20 probes)
        "validation": {"repeats": 2},                         # 3 repeats (all 12 archs)
        "importance": {"num_batches": 4, "removal_batches": 1},  # 16 and 2 batches
        "search": {"dnas": {"steps": 40, "batch_size": 2},    # 160 steps of 4 sequences
                   "measured_rounds": 2,                      # 3 timed re-aims of the pick
                   "measured_repeats": 5,                     # 9 timed runs per check
                   "selection": {"top_k": 2},                 # 10 candidates short-distilled
                   "minitron": {"distill_tokens": 8_192}},    # 32,768 tokens each
        "distill": {"tokens": 30_000, "eval_batches": 2},     # 200,000 tokens, 8 batches
        "verify": {"repeats": 3, "sessions": 2},              # 9 repeats, 3 sessions
    },
    eval_limit=20,                                            # 300 items a task
)
PROFILES: dict[str, Profile] = {"full": Profile(), "demo": DEMO, "tiny": TINY}


def get_profile(name: str | None) -> Profile:
    """The profile called ``name`` (None: ``full``); one line naming the choices if unknown."""
    if name is None:
        return PROFILES["full"]
    if name not in PROFILES:
        raise AutoCompressError(f"unknown profile {name!r}",
                                f"use one of {', '.join(PROFILES)}")
    return PROFILES[name]


def with_profile(options: dict[str, dict[str, Any]] | None, profile: Profile
                 ) -> dict[str, dict[str, Any]]:
    """``options`` over the profile's: explicit settings win, nested dicts merged by key."""
    return _merged(profile.options, options or {})


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        both_dicts = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merged(merged[key], value) if both_dicts else value
    return merged
