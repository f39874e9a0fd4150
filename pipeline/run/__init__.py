"""Running a plan: variants as chains of transforms, the runner, the guard before storing, memory and residency."""

__all__: list[str] = []
