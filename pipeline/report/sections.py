"""Sentences of report.md and report.html that summarise a record of report.json: the noise floor of the
reference and the packages the run wrote.  Each says what its own record holds, in words (never a raw dict)."""

from __future__ import annotations

from qdeploy.core.report import Report
from qdeploy.core.report_parts import NoiseFloor, NoiseFloorTarget
from qdeploy.pipeline.report.format import fmt_fidelity, fmt_number

__all__ = ["noise_floor_lines", "package_lines"]


def noise_floor_lines(noise: NoiseFloor | None) -> list[str]:
    """'noise floor of the reference: fp32 on openvino:cpu against fp32 on ort:cpu: cosine 1 − 6e-13,
    SNR 118.9 dB, max abs err 8.11e-06, mean abs err 1.88e-06 (passed)', one line per target."""
    if noise is None or not noise.model_fields_set:
        return []
    if noise.targets is None:  # a report written before the floor was kept per target: its metrics only
        return [f"noise floor of the reference: {_metrics(noise)}"]
    variant, against = noise.variant or "the reference", noise.against or "ort:cpu"
    return [f"noise floor of the reference: {variant} on {target} against {variant} on {against}: "
            f"{_metrics(metrics)}" + (f" ({metrics.status})" if metrics.status else "")
            for target, metrics in noise.targets.items()]


def _metrics(metrics: NoiseFloor | NoiseFloorTarget) -> str:
    measured = metrics.to_json()
    parts = [fmt_fidelity(measured)] if any(key in measured for key in ("cosine", "snr_db")) else []
    parts += [f"{key.replace('_', ' ')} {fmt_number(measured[key])}" for key in ("max_abs_err", "mean_abs_err")
              if measured.get(key) is not None]
    return ", ".join(parts) or "nothing measured"


def package_lines(report: Report) -> list[str]:
    """The packages the run wrote (report.json ``packages``), the pairs it could not package and why, and the
    check data they carry; [] for a report without a ``packages`` record."""
    packages = report.packages
    if packages is None:
        return []
    if not packages.enabled:
        return ["No packages: report.packages.enabled is false in the recipe (`qdeploy package` writes one later)."]
    written = packages.written
    chosen = {"verdict": "the verdict, one per target"}.get(packages.chosen_by or "", packages.chosen_by)
    lines = [f"{len(written)} package{'s' if len(written) != 1 else ''} written, chosen by "
             f"{chosen or 'the recipe'}:" if written else "No package was written."]
    for item in written:
        checked = (f"checked against {packages.check_samples} reference samples" if item.checked
                   else f"not checked: {item.unchecked_reason or 'no reason given'}")
        lines.append(f"`{item.path}`: {item.variant} for {item.target}; {checked}")
    lines += [f"no package for {item.variant} on {item.target}: {item.reason}" for item in packages.failed]
    data = packages.check_data
    if written and data is not None:
        lines.append(f"check data `{data.file}` (sha256 `{data.sha256}`), from "
                     f"{packages.check_source or 'the reference'}")
    return lines
