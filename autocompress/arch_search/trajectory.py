"""The search trajectory on disk: JSON (every step) and a PNG overview.

The JSON holds, per step, the temperature, the KL loss, the penalty, every λ,
every ``g = E[cost]/budget − 1``, the expected costs and the probabilities of
every choice. The plot shows the loss, the expected cost relative to each
budget, the multipliers, and the expected kept fraction of attention heads and
FFN width per layer over the steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from autocompress.arch_search.space import SearchSpace
from autocompress.atomic import atomic_path, write_json_atomic


def save_trajectory(path: str | Path, trajectory: list[dict[str, Any]], meta: dict[str, Any]
                    ) -> Path:
    """Write ``{"meta": ..., "steps": [...]}`` atomically."""
    return write_json_atomic(path, {"meta": meta, "steps": trajectory}, indent=None)


def _kept_fractions(space: SearchSpace, probs: list[list[float]], kind: str) -> np.ndarray:
    """Expected kept fraction per layer: Σ_k p_k · size_k / teacher size."""
    teacher = space.teacher.layers[0]
    if kind == "attention":
        sizes = [0.0 if o is None else o.num_heads / teacher.attention.num_heads
                 for o in space.attention_options]
    else:
        sizes = [0.0 if o is None else o.intermediate_size / teacher.ffn.intermediate_size
                 for o in space.ffn_options]
    return np.asarray(probs) @ np.asarray(sizes)


def plot_trajectory(path: str | Path, trajectory: list[dict[str, Any]], space: SearchSpace,
                    title: str = "") -> Path:
    """Write a 2×2 PNG overview of the search."""
    # lazy: matplotlib takes a second to import and only the plot needs it
    import matplotlib

    matplotlib.use("Agg")  # no display: select the file backend before pyplot loads
    import matplotlib.pyplot as plt

    path = Path(path)
    steps = [r["step"] for r in trajectory]
    metrics = list(trajectory[0]["g"]) if trajectory else []
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    ax = axes[0, 0]
    ax.plot(steps, [r["kl"] for r in trajectory], lw=0.8, label="KL(teacher‖sample)")
    if len(steps) > 10:
        kernel = np.ones(10) / 10
        smooth = np.convolve([r["kl"] for r in trajectory], kernel, mode="valid")
        ax.plot(steps[9:], smooth, lw=1.8, label="KL, 10-step mean")
    ax.set_title("loss")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    held = "mode" if trajectory and trajectory[0].get("constraint") == "mode" else "E"
    for m in metrics:
        ax.plot(steps, [1.0 + r["g"][m] for r in trajectory], label=f"{held}[{m}] / budget")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_title("the cost the limits hold / budget")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    ax = axes[1, 0]
    for m in metrics:
        ax.plot(steps, [r["lambda"][m] for r in trajectory], label=f"λ {m}")
    ax.set_title("Lagrange multipliers")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    ax = axes[1, 1]
    if trajectory:
        att = np.stack([_kept_fractions(space, r["p_attention"], "attention")
                        for r in trajectory])
        ffn = np.stack([_kept_fractions(space, r["p_ffn"], "ffn") for r in trajectory])
        cmap = plt.get_cmap("viridis")
        for layer in range(space.num_layers):
            color = cmap(layer / max(1, space.num_layers - 1))
            ax.plot(steps, att[:, layer], color=color, ls="-", lw=1)
            ax.plot(steps, ffn[:, layer], color=color, ls=":", lw=1.4)
        ax.plot([], [], "k-", label="attention heads")
        ax.plot([], [], "k:", label="FFN width")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("expected kept fraction per layer (dark = first)")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path
