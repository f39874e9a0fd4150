"""The recipe: its pydantic models, loading a file, the stage registry, selection and `qdeploy check`'s preflight."""

__all__: list[str] = []
