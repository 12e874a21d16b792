"""Architecture search under hardware constraints (what ``autocompress.search(...)`` runs).

- ``options`` / ``space``: the search space (options per choice, nested prefix masks);
- ``masked``: the teacher's forward under masks (= the pruned model, exactly);
- ``dnas``: Gumbel-softmax search with an augmented Lagrangian on cost budgets;
- ``discretize``: exact repair to one architecture meeting every budget;
- ``minitron``: the homogeneous Minitron baseline (parameter or matched target), with
  ``selection`` (its top-k ranked after a short distillation);
- ``config``: ``SearchConfig``, everything that shapes a search;
- ``context``: ``SearchContext`` (teacher, importance, space, cost model) and the
  scores, timings and checks every method shares;
- ``final_pick``: repair of a search's answer and the final pick among candidates;
- ``ablations``: greedy repair from the teacher (no DNAS) and random search;
  ``minitron_scored`` (Minitron's grid under greedy's selection) and ``mip`` (an exact
  0-1 program on greedy's block scores) are the two controls beside them;
- ``run``: the search and the baseline end to end, and the files they write;
- ``family`` / ``multitarget``: several budgets, or several targets, from one search;
- ``trajectory``: the search's per-step record as JSON and a plot.

The one-call entry point is ``autocompress.search`` (``autocompress.api.search``). To
search several budgets on one teacher, build the context once
(``context.SearchContext.build``), then call ``run.run_search`` / ``run.run_minitron``.
This file imports nothing: importing one module (the cost model reads ``options``)
loads only that module and what it imports.
"""
