"""The orchestration: recipe, plan, runner, artifact store, gates, summary; report/, sweep/ and cli/ beside them."""

__all__: list[str] = []
