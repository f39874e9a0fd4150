"""The bottom layer: errors, strict configs and tolerances, Artifact and StageContext, files, numeric comparison."""

__all__: list[str] = []
