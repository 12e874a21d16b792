"""The smoke check's stage: load a published model where the stage runs, one forward pass."""

from __future__ import annotations

import time

from autocompress.artifacts import ArtifactRef
from tasks.stage import StageContext, stage


@stage("forward_probe", retries=1, retry_delay_seconds=1.0)
def forward_probe(ctx: StageContext, model: ArtifactRef, device: str = "cpu") -> ArtifactRef:
    """Fetch ``model`` from the store, run one forward pass on fixed tokens, publish the loss.

    ``device``: ``cpu``, or ``auto`` (the accelerator when the worker has one).
    Proves that this worker can reach the store, load the model and compute.
    """
    import torch
    from transformers import AutoModelForCausalLM

    import autocompress.modeling  # noqa: F401  (registers autocompress_hetero: a compressed model)

    chosen = "cuda" if device == "auto" and torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    lm = AutoModelForCausalLM.from_pretrained(ctx.fetch(model)).to(chosen).eval()
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, lm.config.vocab_size, (2, 16), generator=generator).to(chosen)
    with torch.no_grad():
        loss = float(lm(input_ids=tokens, labels=tokens).loss)
    seconds = time.perf_counter() - started
    return ctx.publish_json("probe.json", {"loss": loss, "device": chosen, "seconds": seconds},
                            kind="probe", metrics={"loss": loss, "seconds": seconds})
