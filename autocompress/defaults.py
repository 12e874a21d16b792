"""The defaults every entry point shares: one constant each.

The Python API (``autocompress.compress`` / ``search``), the ``compress`` flow, the CLI
commands and the demo all take their default teacher, target, workload and methods from
here, so they cannot drift apart. This module imports nothing on purpose: anything may
import it (the CLI's option defaults, the search, the flows) without pulling in torch.
"""

from __future__ import annotations

# The bundled 7M-parameter code teacher (``autocompress teacher`` builds it on first use).
DEFAULT_TEACHER = "default"

# HARDWARE/ENGINE/DTYPE: this machine's CPU, timed through Hugging Face eager mode in fp32.
DEFAULT_TARGET = "cpu-local/hf-eager/fp32"

# The workload preset a run prices and times when none is named. ``interactive-cpu`` (one
# chat session: short prompt, short answer, batch 1, TPOT first) is what the demo, the
# Python API and ``autocompress search`` were sized and tested on; its cost-model fit is
# the cheapest of the CPU presets, which keeps the first run on 2 cores short.
DEFAULT_WORKLOAD = "interactive-cpu"

# How the main branch finds its architecture: the search; its ablations greedy (repair
# from the teacher, no DNAS) and random (random search, as many scored architectures as
# the search); the fair homogeneous Minitron baseline; minitron-scored (Minitron's
# homogeneous candidates through greedy's selection: the control for heterogeneity); and
# mip (greedy's block scores, the optimum of an exact integer program, as Puzzle picks).
METHODS = ("autocompress", "greedy", "random", "minitron", "minitron-scored", "mip")
DEFAULT_METHOD = "autocompress"
