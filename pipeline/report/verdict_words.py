"""The verdict in words: per target a headline and its detail lines, as the Markdown, HTML and CLI writers show it
(the verdict itself is ``qdeploy.pipeline.report.verdict``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from qdeploy.core.report_parts import Packages, TargetVerdictRecord, VerdictChoice, VerdictSection
from qdeploy.core.runtimes import is_pinned_f32
from qdeploy.pipeline.report.format import fmt_fidelity, fmt_mb, fmt_ms, fmt_rate, fmt_speedup
from qdeploy.pipeline.report.precision import execution_phrase

__all__ = ["describe", "in_recipe_order", "package_of", "ran_phrase", "short_reason", "tie_rule_words",
           "verdict_lines"]


def tie_rule_words(section: VerdictSection) -> str:
    """How the verdict chose among artifacts the benchmark could not tell apart, for the reports' preambles."""
    if section.tie_break == "size":
        return "among artifacts the benchmark cannot tell apart, the smallest (as printed), then the simpler"
    return ("among artifacts the benchmark cannot tell apart, the closest to the reference (the reference first); "
            "on a machine too busy to tell them apart, the verdict says it is undecided")


def verdict_lines(section: VerdictSection | Mapping[str, Any] | None,
                  packages: Packages | None = None) -> list[tuple[str, list[str]]]:
    """The verdict for people: per target a headline (the pick, how it ran, its numbers, why, the package the run
    wrote of it: report.json's ``packages``) and its detail lines (runner-up, why not the others); the targets
    this machine lacks in one entry.  The Markdown, HTML and CLI writers all show these."""
    if not section:
        return []
    if not isinstance(section, VerdictSection):
        section = VerdictSection.model_validate(dict(section))
    entries = []
    for target, verdict in in_recipe_order(section):
        if verdict.status != "ship" or verdict.variant is None:
            entries.append((f"{target}: nothing to ship: {verdict.why}", _rejected_lines(verdict)))
            continue
        package = package_of(packages, target, verdict.variant)
        undecided = f"undecided: {verdict.undecided}; meanwhile " if verdict.undecided else ""
        headline = (f"{target}: {undecided}ship {verdict.variant}{ran_phrase(verdict)}: {describe(verdict)}; "
                    f"{verdict.why}" + (f"; {package}" if package else ""))
        details = []
        if verdict.runner_up is not None:
            runner = verdict.runner_up
            details.append(f"runner-up {runner.variant}{ran_phrase(runner)}: {describe(runner)}")
        entries.append((headline, details + _rejected_lines(verdict)))
    for target, why in section.unreadable.items():
        shipped = target in section.targets
        entries.append((f"{target}: {'the original model is unreadable here' if shipped else 'nothing to ship'}, "
                        f"not a failure of a variant: {why}", []))
    if section.unavailable:
        reasons = "; ".join(dict.fromkeys(short_reason(reason) for reason in section.unavailable.values()))
        entries.append((f"Not available on this machine: {', '.join(section.unavailable)} ({reasons})", []))
    return entries


def in_recipe_order(section: VerdictSection) -> list[tuple[str, TargetVerdictRecord]]:
    """The section's targets in the recipe's order (report.json sorts its keys)."""
    targets = section.targets
    order = [name for name in section.order if name in targets]
    return [(name, targets[name]) for name in [*order, *(name for name in targets if name not in order)]]


def ran_phrase(choice: VerdictChoice) -> str:
    """' (fp16 artifact, but onnxruntime ran all 8 of its kernels in float32 on CPUExecutionProvider: ...)';
    '' for a verdict written before it carried ``execution``."""
    text = execution_phrase(choice.execution)
    return f" ({text})" if text else ""


def package_of(packages: Packages | None, target: str, variant: str) -> str:
    """'package packages/ort-cpu-int8 (checked)' for the package the run wrote of (variant, target), the reason
    where it wrote none; '' when the run wrote no packages."""
    if packages is None:
        return ""
    for written in packages.written:
        if written.target == target and written.variant == variant:
            path = PurePath(written.path)
            checked = "checked" if written.checked else f"not checked: {written.unchecked_reason or 'no reason given'}"
            return f"package {path.parent.name}/{path.name} ({checked})"
    for failed in packages.failed:
        if failed.target == target and failed.variant == variant:
            return f"no package: {failed.reason}"
    return ""


def describe(choice: VerdictChoice) -> str:
    """Latency, speedup, throughput, fidelity and size of one choice, those measured."""
    parts = []
    if choice.decode_ms_per_token is not None:  # ranked by decode: its speedup is decode's, prefill said apart
        parts.append(f"{fmt_ms(choice.decode_ms_per_token)} per token decode")
        if choice.speedup is not None:
            parts.append(f"{fmt_speedup(choice.speedup, choice.speedup_range)} the reference's decode")
        if choice.latency_ms is not None:
            parts.append(f"prefill {fmt_ms(choice.latency_ms)}" + (" (noisy)" if choice.noisy else ""))
    elif choice.latency_ms is not None:
        parts.append(fmt_ms(choice.latency_ms) + (" (noisy)" if choice.noisy else ""))
        if choice.speedup is not None:
            parts.append(fmt_speedup(choice.speedup, choice.speedup_range))
        if choice.speedup_vs_default is not None:
            parts.append(f"{fmt_speedup(choice.speedup_vs_default, choice.speedup_vs_default_range)} "
                         "the float32 model at the device's default precision")
    if choice.inferences_per_s is not None:
        parts.append(f"{fmt_rate(choice.inferences_per_s)} with {choice.requests_in_flight} requests "
                     f"in flight ({fmt_ms(choice.latency_at_load_ms)} at that load)")
    parts.append(fmt_fidelity(choice.fidelity or {}))
    parts.append(fmt_mb(choice.size_bytes))
    if choice.deploy_precision:
        why = ("its activations in float32" if is_pinned_f32(choice.variant or "")
               else "the device default missed its tolerance")
        parts.append(f"with INFERENCE_PRECISION_HINT {choice.deploy_precision} pinned ({why}; the package's "
                     "runtime.json pins it)")
    return ", ".join(parts)


def _rejected_lines(verdict: TargetVerdictRecord) -> list[str]:
    return [f"not {variant}: {reason}" for variant, reason in verdict.rejected.items()]


def short_reason(reason: str) -> str:
    """'target ort:cuda requested; this machine's onnxruntime has ...' -> the part after the target."""
    return reason.split("; ", 1)[-1]
