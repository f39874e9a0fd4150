"""The plan of a recipe: variants as chains of transforms sharing prefixes, times the targets.

`qdeploy check` prints it; the runner gets the same sharing from the cache keys.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from qdeploy.pipeline.recipe.schema import EXPORTED, Recipe, registry
from qdeploy.pipeline.run.per_runtime import plan_lines
from qdeploy.targets import get_target

__all__ = ["Plan", "PlanNode", "Prefix", "build_plan", "describe_plan", "recipe_json_schema", "variants_with_reference"]

log = logging.getLogger(__name__)

Prefix = tuple[tuple[str, str], ...]
"""A chain prefix: (stage, canonical config JSON) per step."""


@dataclass
class PlanNode:
    """One transform of the plan, computed once for every variant whose chain passes through it."""

    prefix: Prefix
    variants: list[str] = field(default_factory=list)

    @property
    def stage(self) -> str:
        return self.prefix[-1][0] if self.prefix else "export"

    @property
    def config(self) -> dict[str, Any]:
        return json.loads(self.prefix[-1][1]) if self.prefix else {}


@dataclass
class Plan:
    """Transforms in execution order (each prefix once) and the evaluation matrix."""

    nodes: list[PlanNode]
    variants: dict[str, Prefix]
    targets: list[str]
    reference: str

    def node(self, prefix: Prefix) -> PlanNode:
        return next(node for node in self.nodes if node.prefix == prefix)


def build_plan(recipe: Recipe) -> Plan:
    nodes: dict[Prefix, PlanNode] = {(): PlanNode((), [EXPORTED])}
    chains: dict[str, Prefix] = {}
    for variant, steps in recipe.variants.items():
        prefix: Prefix = ()
        nodes[()].variants.append(variant)
        for step in steps:
            prefix = (*prefix, (step.stage, json.dumps(step.config.model_dump(mode="json"), sort_keys=True)))
            nodes.setdefault(prefix, PlanNode(prefix)).variants.append(variant)
        chains[variant] = prefix
    return Plan(list(nodes.values()), chains, list(recipe.targets), recipe.reference_variant)


def describe_plan(recipe: Recipe) -> str:
    """A human-readable plan: transforms (shared ones once), evaluations, targets here, code the recipe runs."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.recipe.loader import recipe_python_references

    plan = build_plan(recipe)
    source = _export_source(recipe)
    lines = [f"recipe {recipe.name}: valid", "", "transforms (each computed once, shared by the variants listed):"]
    for node in plan.nodes:
        depth = len(node.prefix)
        config = f" {json.dumps(_non_default(node))}" if _non_default(node) else ""
        label = f"export from {source}" if depth == 0 else f"{node.stage}{config}"
        lines.append(f"  {'  ' * depth}- {label}  [{', '.join(dict.fromkeys(node.variants))}]")
    lines += ["", f"reference: {plan.reference} on ort:cpu", "targets:"]
    for target in plan.targets:
        available, reason = get_target(target).availability()
        lines.append(f"  - {target}: {'available' if available else 'unavailable: ' + reason}")
    batches = recipe.benchmark.batch_sizes if recipe.benchmark.enabled else []
    evaluated = len(plan.variants) + (plan.reference == EXPORTED)
    lines.append(f"evaluations: {evaluated} artifacts x {len(plan.targets)} targets validated, "
                 f"benchmarked at batch sizes {batches or 'none (benchmark disabled)'}")
    lines.append(f"gates: {len(recipe.gates)}")
    lines += plan_lines(recipe)
    references = recipe_python_references(recipe)
    if references:
        lines += ["", "Python code this recipe executes (review it: a recipe's code runs with your rights):"]
        lines += [f"  - {ref['field']}: {ref['code']}" for ref in references]
    return "\n".join(lines)


def _export_source(recipe: Recipe) -> str:
    """How the plan names the model it exports: the ONNX file, the torch factory or the causal_lm checkpoint."""
    model = recipe.model
    if model.causal_lm is not None:
        return f"causal_lm {model.causal_lm.label()}"
    return model.onnx or (model.torch.factory if model.torch else "")


def _non_default(node: PlanNode) -> dict[str, Any]:
    if not node.prefix:
        return {}
    defaults = registry.stage(node.stage).config().model_dump(mode="json")
    return {key: value for key, value in node.config.items() if defaults.get(key) != value}


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema of the recipe as users write it: a step is a stage name or {stage: config}."""
    schema = Recipe.model_json_schema(by_alias=True)
    defs = schema.setdefault("$defs", {})
    step_forms: list[dict[str, Any]] = [{"type": "string", "enum": list(registry.VARIANT_STAGES)}]
    for name in registry.VARIANT_STAGES:
        config_schema = registry.stage(name).config.model_json_schema(ref_template=f"#/$defs/{name}_{{model}}")
        for def_name, definition in config_schema.pop("$defs", {}).items():
            defs[f"{name}_{def_name}"] = definition
        defs[f"{name}_config"] = config_schema
        step_forms.append({"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
                           "properties": {name: {"anyOf": [{"$ref": f"#/$defs/{name}_config"}, {"type": "null"}]}}})
    schema["properties"]["variants"] = {
        "type": "object", "description": "Variant name -> chain of transform stages.",
        "additionalProperties": {"type": "array", "items": {"anyOf": step_forms}},
    }
    defs.pop("VariantStep", None)
    defs.pop("StageConfig", None)  # a step's config: the stage's own, above
    return schema


def variants_with_reference(recipe: Recipe, variants: list[str]) -> list[str]:
    """The variants a run builds: the selected ones, and the reference variant first when ``--variant`` leaves it
    out (every artifact is validated against it: without it a run could only say "reference variant was not
    built")."""
    reference = recipe.reference_variant
    if reference in variants or reference not in recipe.variants:
        return variants
    log.warning("--variant %s leaves out the reference variant '%s': building it too (every artifact is validated "
                "against it)", ", ".join(variants), reference)
    return [reference, *variants]
