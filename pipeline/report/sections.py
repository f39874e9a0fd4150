"""Sentences of report.md and report.html that summarise a record of report.json: the noise floor of the
reference and the packages the run wrote.  Each says what its own record holds, in words (never a raw dict)."""

from __future__ import annotations

from typing import Any

from qdeploy.pipeline.report.format import fmt_fidelity, fmt_number

__all__ = ["noise_floor_lines", "package_lines"]


def noise_floor_lines(noise: dict[str, Any] | None) -> list[str]:
    """'noise floor of the reference: fp32 on openvino:cpu against fp32 on ort:cpu: cosine 1 − 6e-13,
    SNR 118.9 dB, max abs err 8.11e-06, mean abs err 1.88e-06 (passed)', one line per target."""
    if not noise:
        return []
    if "targets" not in noise:  # a report written before the floor was kept per target: its metrics only
        return [f"noise floor of the reference: {_metrics(noise)}"]
    variant, against = noise.get("variant") or "the reference", noise.get("against") or "ort:cpu"
    return [f"noise floor of the reference: {variant} on {target} against {variant} on {against}: "
            f"{_metrics(metrics)}" + (f" ({metrics['status']})" if metrics.get("status") else "")
            for target, metrics in (noise.get("targets") or {}).items()]


def _metrics(metrics: dict[str, Any]) -> str:
    parts = [fmt_fidelity(metrics)] if any(key in metrics for key in ("cosine", "snr_db", "task_metric")) else []
    parts += [f"{key.replace('_', ' ')} {fmt_number(metrics[key])}" for key in ("max_abs_err", "mean_abs_err")
              if metrics.get(key) is not None]
    return ", ".join(parts) or "nothing measured"


def package_lines(report: dict[str, Any]) -> list[str]:
    """The packages the run wrote (report.json ``packages``), the pairs it could not package and why, and the
    check data they carry; [] for a report without a ``packages`` record."""
    packages = report.get("packages")
    if not packages:
        return []
    if not packages.get("enabled", True):
        return ["No packages: report.packages.enabled is false in the recipe (`qdeploy package` writes one later)."]
    written = packages.get("written") or []
    chosen = {"verdict": "the verdict, one per target"}.get(packages.get("chosen_by"), packages.get("chosen_by"))
    lines = [f"{len(written)} package{'s' if len(written) != 1 else ''} written, chosen by "
             f"{chosen or 'the recipe'}:" if written else "No package was written."]
    for item in written:
        checked = (f"checked against {packages.get('check_samples')} reference samples" if item.get("checked")
                   else f"not checked: {item.get('unchecked_reason') or 'no reason given'}")
        lines.append(f"`{item.get('path')}`: {item.get('variant')} for {item.get('target')}; {checked}")
    lines += [f"no package for {item.get('variant')} on {item.get('target')}: {item.get('reason')}"
              for item in packages.get("failed") or []]
    data = packages.get("check_data") or {}
    if written and data.get("file"):
        lines.append(f"check data `{data['file']}` (sha256 `{data.get('sha256')}`), from "
                     f"{packages.get('check_source') or 'the reference'}")
    return lines
