"""Architecture search under hardware constraints.

- ``space``: the search space (options per choice, nested prefix masks);
- ``masked``: the teacher's forward under masks (= the pruned model, exactly);
- ``dnas``: Gumbel-softmax search with an augmented Lagrangian on cost budgets;
- ``discretize``: exact repair to one architecture meeting every budget;
- ``minitron``: the homogeneous Minitron baseline (parameter or matched target);
- ``trajectory``: the search's per-step record as JSON and a plot;
- ``run``: all of it end to end (what the CLI calls).
"""

from autocompress.search.budgets import budgets_from_limits, limits_from_fraction
from autocompress.search.discretize import repair, smallest_reachable
from autocompress.search.dnas import DNAS, DNASConfig, DNASResult
from autocompress.search.masked import MaskedTeacher
from autocompress.search.minitron import MinitronConfig, minitron_for_params, minitron_matched
from autocompress.search.run import (
    SearchConfig,
    SearchContext,
    minitron_to_file,
    run_minitron,
    run_search,
    search_to_file,
)
from autocompress.search.space import Choice, SearchSpace, SpaceConfig

__all__ = [
    "DNAS",
    "Choice",
    "DNASConfig",
    "DNASResult",
    "MaskedTeacher",
    "MinitronConfig",
    "SearchConfig",
    "SearchContext",
    "SearchSpace",
    "SpaceConfig",
    "budgets_from_limits",
    "limits_from_fraction",
    "minitron_for_params",
    "minitron_matched",
    "minitron_to_file",
    "repair",
    "run_minitron",
    "run_search",
    "search_to_file",
    "smallest_reachable",
]
