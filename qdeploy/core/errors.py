"""Typed errors at qdeploy's edges.

Every error a user can cause (bad recipe, model or data) derives from
``QdeployInputError`` and maps to exit status 2; the CLI prints its message
without a traceback.  Messages say what was asked and what exists.
"""

from __future__ import annotations

__all__ = ["DataError", "DiskFullError", "ModelError", "QdeployError", "QdeployInputError", "RecipeError",
           "RunLockedError", "StageError", "TargetUnavailable", "UserFileError"]


class QdeployError(Exception):
    """Base class of every error qdeploy raises on purpose."""

    exit_code = 2


class QdeployInputError(QdeployError):
    """The user's input (recipe, model, data) is wrong; exit status 2."""


class RecipeError(QdeployInputError):
    """A recipe file is malformed or inconsistent."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.detail = message
        where = file or "<recipe>"
        if line is not None:
            where = f"{where}:{line}"
        prefix = f"{where}: " if where else ""
        if field:
            prefix += f"field '{field}': "
        super().__init__(prefix + message)


class UserFileError(QdeployInputError):
    """A path the user gave cannot be used: missing, not a regular file, a loop, outside its folder, unwritable."""

    def __init__(self, what: str, path: str | object, problem: str) -> None:
        self.what = what
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{what} '{self.path}' {problem}")


class ModelError(QdeployInputError):
    """A model file cannot be read or is not a valid ONNX graph."""


class DataError(QdeployInputError):
    """A dataset is missing, empty or does not fit the model's inputs."""


class StageError(QdeployError):
    """A stage failed for one variant; the run goes on with the other variants."""

    exit_code = 1

    def __init__(self, stage: str, variant: str, reason: str) -> None:
        self.stage = stage
        self.variant = variant
        self.reason = reason
        super().__init__(f"stage '{stage}' of variant '{variant}' failed: {reason}")


class TargetUnavailable(QdeployError):
    """A target named in the recipe does not exist on this machine."""


class DiskFullError(QdeployError):
    """The disk filled up while writing; what was there before is intact."""


class RunLockedError(QdeployError):
    """Another qdeploy run holds the output folder."""
