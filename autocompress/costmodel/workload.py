"""Workloads: what requests look like (prompt length, output length, concurrency).

Presets follow the three deployment scenarios of the paper, each with a
CPU-scaled twin that the local machine can measure in well under a second per
sample (a ~7M-parameter, 8-layer model on 2 cores):

=================  ===========  =====  ====  =====  ==============================
preset             default      isl    osl   batch  main metric
=================  ===========  =====  ====  =====  ==============================
local-coding       rtx-5070     32768  512   1      memory (long context must fit)
datacenter         h100-sxm     2048   256   64     tpot (throughput under an SLA)
interactive        rtx-5080     256    64    1      tpot (and ttft)
local-coding-cpu   cpu-local    512    32    1      tpot at long context
datacenter-cpu     cpu-local    128    32    6      tpot (throughput = batch/tpot)
interactive-cpu    cpu-local    128    32    1      tpot (and ttft)
=================  ===========  =====  ====  =====  ==============================

Conventions shared by the cost model and the measuring harness:

- TTFT: one prefill of the whole batch (``batch`` prompts of ``isl`` tokens,
  all arriving together), until the first token is chosen.
- TPOT: the median time of one decode step (one token for every sequence of the
  batch); decode steps see on average ``isl + osl/2`` tokens of context.
- End to end: TTFT + (osl − 1) · TPOT.
- Throughput: batch / TPOT generated tokens per second. A constraint
  ``throughput ≥ X`` is therefore the constraint ``TPOT ≤ 1000 · batch / X`` ms.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autocompress.defaults import DEFAULT_TARGET
from autocompress.errors import AutoCompressError, invalid_input

METRIC_NAMES = ("ttft_ms", "tpot_ms", "e2e_ms", "throughput_tok_s", "memory_gb")


class Workload(BaseModel):
    """A request shape; ``batch`` is the number of concurrent sequences."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    description: str = ""
    isl: int = Field(ge=1, description="Input (prompt) tokens per sequence.")
    osl: int = Field(ge=1, description="Output (generated) tokens per sequence.")
    batch: int = Field(default=1, ge=1, description="Concurrent sequences (concurrency).")
    main_metric: str = Field(default="tpot_ms", description="The metric this scenario is about.")
    default_target: str = Field(default=DEFAULT_TARGET)

    @property
    def decode_context(self) -> float:
        """Average context length seen by a decode step (isl + osl/2)."""
        return self.isl + self.osl / 2

    @property
    def final_context(self) -> int:
        """Tokens held in the KV cache once the last token is generated.

        The harness feeds ``osl - 1`` generated tokens back, so the cache ends at
        ``isl + osl - 1`` tokens.
        """
        return self.isl + self.osl - 1

    @property
    def decode_steps(self) -> int:
        return self.osl - 1

    def throughput_constraint_as_tpot_ms(self, min_tokens_per_s: float) -> float:
        """The TPOT bound (ms) equivalent to ``throughput >= min_tokens_per_s``."""
        return 1000.0 * self.batch / min_tokens_per_s

    def with_overrides(
        self, isl: int | None = None, osl: int | None = None, batch: int | None = None
    ) -> Workload:
        """A copy with some fields replaced (named ``<preset>+custom`` when changed)."""
        update = {
            key: value
            for key, value in (("isl", isl), ("osl", osl), ("batch", batch))
            if value is not None
        }
        if not update:
            return self
        changed = any(getattr(self, key) != value for key, value in update.items())
        if changed:
            update["name"] = f"{self.name}+custom"
        try:  # validated like a new workload: model_copy(update=...) would skip the checks
            return Workload.model_validate({**self.model_dump(), **update})
        except ValidationError as err:
            raise invalid_input(err, "workload", "isl, osl and batch (concurrency) "
                                "must be whole numbers of at least 1") from None


PRESETS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            name="local-coding",
            description="Long-context local coding assistant: batch 1, a 32k-token "
            "repository prompt; must fit a 12 GB card, decode speed at long context.",
            isl=32768,
            osl=512,
            batch=1,
            main_metric="memory_gb",
            default_target="rtx-5070/vllm/bf16",
        ),
        Workload(
            name="datacenter",
            description="Batched datacenter serving: 64 concurrent requests; throughput "
            "under a TPOT service-level bound.",
            isl=2048,
            osl=256,
            batch=64,
            main_metric="tpot_ms",
            default_target="h100-sxm/vllm/bf16",
        ),
        Workload(
            name="interactive",
            description="Latency-sensitive in-game interaction: batch 1, short prompts, "
            "tight TTFT and TPOT.",
            isl=256,
            osl=64,
            batch=1,
            main_metric="tpot_ms",
            default_target="rtx-5080/vllm/bf16",
        ),
        Workload(
            name="local-coding-cpu",
            description="CPU-scaled local coding: batch 1, the longest prompt the local "
            "CPU measures quickly; TPOT at long context.",
            isl=512,
            osl=32,
            batch=1,
            main_metric="tpot_ms",
        ),
        Workload(
            name="datacenter-cpu",
            description="CPU-scaled batched serving: 6 concurrent sequences.",
            isl=128,
            osl=32,
            batch=6,
            main_metric="tpot_ms",
        ),
        Workload(
            name="interactive-cpu",
            description="CPU-scaled interaction: batch 1, short prompt.",
            isl=128,
            osl=32,
            batch=1,
            main_metric="tpot_ms",
        ),
    ]
}


# Metrics a workload may be about: each has a limit that a budget fraction scales down
# (throughput is a floor, not a cost, so it stays a limit of its own).
MAIN_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms", "memory_gb")


def get_workload(name: str) -> Workload:
    """The preset called ``name``; ``PRESET:METRIC`` is that preset about another metric
    (``local-coding-cpu:ttft_ms``: the same requests, a budget on their time to first
    token). Unknown names list the presets."""
    preset, _, metric = name.partition(":")
    if preset not in PRESETS:
        raise AutoCompressError(
            f"unknown workload preset {preset!r}",
            hint=f"presets: {', '.join(PRESETS)} (see `autocompress costmodel presets`)",
        )
    if not metric:
        return PRESETS[preset]
    if metric not in MAIN_METRICS:
        raise AutoCompressError(
            f"workload {name!r} names an unknown main metric {metric!r}",
            hint=f"write PRESET:METRIC with METRIC one of {', '.join(MAIN_METRICS)}",
        )
    return PRESETS[preset].model_copy(update={"name": name, "main_metric": metric})


def default_workload_for(target_name: str) -> Workload:
    """The preset whose default target is ``target_name``'s hardware, else interactive(-cpu)."""
    hardware = target_name.split("/")[0]
    for preset in PRESETS.values():
        if preset.default_target.split("/")[0] == hardware:
            return preset
    return PRESETS["interactive-cpu" if hardware == "cpu-local" else "interactive"]
