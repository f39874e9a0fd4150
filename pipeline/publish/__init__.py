"""Publishing: the content-addressed store, the published folder as one unit, the hash chain, packages."""

__all__: list[str] = []
