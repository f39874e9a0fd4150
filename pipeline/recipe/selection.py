"""Which variants and targets a run covers: the CLI's ``--variant`` and ``--target``, checked against the recipe."""

from __future__ import annotations

from qdeploy.core.errors import QdeployInputError
from qdeploy.core.runtimes import variants_named
from qdeploy.pipeline.recipe.schema import Recipe

__all__ = ["selected_targets", "selected_variants"]


def selected_variants(recipe: Recipe, wanted: list[str] | None) -> list[str]:
    """The variants ``--variant`` names (a name split by per_runtime selects its builds); all when none."""
    if not wanted:
        return list(recipe.variants)
    chosen = []
    for name in wanted:
        found = variants_named(name, list(recipe.variants))
        if not found:
            raise QdeployInputError(f"--variant {name}: not in the recipe; its variants are "
                                    f"{', '.join(recipe.variants)}")
        chosen += found
    return list(dict.fromkeys(chosen))


def selected_targets(recipe: Recipe, wanted: list[str] | None) -> list[str]:
    """The targets ``--target`` names; all the recipe's when none."""
    if not wanted:
        return list(recipe.targets)
    unknown = [name for name in wanted if name not in recipe.targets]
    if unknown:
        raise QdeployInputError(f"--target {', '.join(unknown)}: not in the recipe; its targets are "
                                f"{', '.join(recipe.targets)}")
    return list(dict.fromkeys(wanted))
