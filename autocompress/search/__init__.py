"""Architecture search under hardware constraints.

- ``space``: the search space (options per choice, nested prefix masks);
- ``masked``: the teacher's forward under masks (= the pruned model, exactly);
- ``dnas``: Gumbel-softmax search with an augmented Lagrangian on cost budgets;
- ``discretize``: exact repair to one architecture meeting every budget;
- ``minitron``: the homogeneous Minitron baseline (parameter or matched target), with
  ``selection`` (its top-k ranked after a short distillation);
- ``ablations``: greedy repair from the teacher (no DNAS) and random search;
- ``trajectory``: the search's per-step record as JSON and a plot;
- ``run``: all of it end to end (what the CLI and the stages call).

Most users call ``autocompress.search(teacher, target, workload, limits, config)``
(``autocompress.api.search``): this package is callable for that reason. Exported
here: the configs, and the two-step form for callers that search several budgets
on one teacher (``SearchContext.build`` once, then ``run_search`` / ``run_minitron``).
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autocompress.search.dnas import DNASConfig
    from autocompress.search.minitron import MinitronConfig
    from autocompress.search.options import SpaceConfig
    from autocompress.search.run import SearchConfig, SearchContext, run_minitron, run_search

# Name -> module, imported on first access: importing one module of the package
# (the cost model reads ``search.options``) must not load the whole search.
_EXPORTS = {
    "DNASConfig": "autocompress.search.dnas",
    "MinitronConfig": "autocompress.search.minitron",
    "SearchConfig": "autocompress.search.run",
    "SearchContext": "autocompress.search.run",
    "SpaceConfig": "autocompress.search.options",
    "run_minitron": "autocompress.search.run",
    "run_search": "autocompress.search.run",
}
__all__ = ["DNASConfig", "MinitronConfig", "SearchConfig", "SearchContext", "SpaceConfig",
           "run_minitron", "run_search"]


class _CallableModule(types.ModuleType):
    """``autocompress.search(...)`` is ``autocompress.api.search(...)``.

    The natural name of the API's function is the name of this package, and a
    function bound as ``autocompress.search`` would be replaced by the package as
    soon as anything imported ``autocompress.search.<module>``. So the package
    itself is callable. (The API is imported by name, not by an ``import``
    statement, so that the stages' cache keys, which follow import statements,
    do not take the whole API in with this package.)
    """

    def __call__(self, *args, **kwargs):
        return importlib.import_module("autocompress.api").search(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in _EXPORTS:
            return getattr(importlib.import_module(_EXPORTS[name]), name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")


sys.modules[__name__].__class__ = _CallableModule
