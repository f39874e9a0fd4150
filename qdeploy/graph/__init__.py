"""Graph helpers every stage shares: walks and subgraphs, topological order, the rewrite engine and its rules."""

__all__: list[str] = []
