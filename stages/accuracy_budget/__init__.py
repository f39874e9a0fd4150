"""One accuracy-budget engine for every stage that trades precision for accuracy (int8, fp16, whatever comes next).

A stage supplies only how to build its model with a set of nodes kept float, its candidates and its ranking
signal (``search.Builder``, ``search.Signal``; fp16: its artifact builder and its ladder of node groups).  The
engine holds the rest, once:

- ``evaluate``: candidates against float32 on search and held-back samples (output tolerance or task metric);
- ``rank``: the candidates, most harmful first (damage alone, then the stage's signal);
- ``prefix`` and ``search``: the shortest ranked prefix that holds, pruning, held-back rounds, the time bound
  (``clock``), latency-aware reverting (``latency``);
- ``targets``: confirmation on every target the variant is validated on, loaded as validation loads it
  (``targets.load_as_validated``), with the one pinned-precision fallback validation also uses (``precision``);
- ``findings``: the typed record (``BudgetFindings``, ``TargetRecord``); ``search.BudgetResult`` the typed result.

A shared part of the stage layer, not a stage: it imports no stage, and importing it does nothing.
"""

__all__: list[str] = []
