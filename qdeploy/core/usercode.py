"""Importing the Python a recipe names (`model.torch.factory`, `validate.metric`): code execution, on purpose."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["import_user_module"]


def import_user_module(module_part: str, resolve_path: Path | None, *, label: str) -> ModuleType:
    """Import 'path/to/file.py' (resolved beforehand by the caller) or 'package.module'; errors propagate."""
    if resolve_path is None:
        return importlib.import_module(module_part)
    spec = importlib.util.spec_from_file_location(f"qdeploy_{label}_{resolve_path.stem}", resolve_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {resolve_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
