"""The published folder of a run: ``artifacts/`` and ``report.*`` change together, as one unit.

An output folder looks like this::

    OUT/.published/<generation>/artifacts/   <variant>.onnx, <variant>.json, external data, SHA256SUMS
    OUT/.published/<generation>/report.json  (and report.md, report.html)
    OUT/.published/<generation>/recipe.snapshot.json  the recipe as validated (section hashes in report.json)
    OUT/.published/current     -> <generation>                 the one switch
    OUT/artifacts              -> .published/current/artifacts  fixed links: the paths users and tools know
    OUT/packages               -> .published/current/packages   (when the run wrote packages)
    OUT/report.json            -> .published/current/report.json (report.md, report.html, recipe.snapshot.json)

A run builds its whole set in a fresh generation folder that nothing reads, writes its reports there, and
then switches ``current`` with one rename(2) of a symbolic link.  So at every instant ``OUT/report.json``
describes exactly the files under ``OUT/artifacts``: a run killed before the switch leaves the previous set
as it was (its unfinished generation is removed by a later run), a run killed after it leaves the new one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from qdeploy.core.context import Artifact
from qdeploy.core.files import disk_full_is_clear, fsync_dir, process_alive, sha256_file, write_json_synced
from qdeploy.pipeline.publish.store import MODEL_FILE, STALE_STAGING_SECONDS, CacheChangedError, StoredFile

__all__ = ["ARTIFACTS", "CHECKSUMS", "CURRENT", "PUBLISHED", "RECIPE_SNAPSHOT", "REPORT_FILES", "PublishedDataFile",
           "begin_generation", "commit_generation", "discard_generation", "publish_artifact", "stable_path",
           "write_checksums", "write_recipe_snapshot"]

log = logging.getLogger(__name__)

PUBLISHED = ".published"
CURRENT = "current"
ARTIFACTS = "artifacts"
REPORT_FILES = ("report.json", "report.md", "report.html")
PACKAGES = "packages"
CHECKSUMS = "SHA256SUMS"
RECIPE_SNAPSHOT = "recipe.snapshot.json"
"""The run's validated recipe (``Recipe.model_dump``): what a package's tolerances are read from."""
_HOST = socket.gethostname().replace("-", "_")
_TMP_LINK = ".tmp-link-"


class PublishedDataFile(TypedDict):
    """An external data file of a published model: its name beside the model, sha256 and size."""

    file: str
    sha256: str
    size_bytes: int


def begin_generation(out_dir: Path) -> Path:
    """A fresh, empty generation folder to build the next published set in (invisible until committed)."""
    root = out_dir / PUBLISHED
    root.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(root, keep=None)
    generation = Path(tempfile.mkdtemp(prefix=f"g-{_HOST}-{os.getpid()}-", dir=root))
    os.chmod(generation, 0o777 & ~_umask())  # mkdtemp makes 0700; published files are meant to be shared
    return generation


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def discard_generation(generation: Path) -> None:
    """Drop a generation that will not be committed (the run failed before its reports)."""
    shutil.rmtree(generation, ignore_errors=True)


def stable_path(out_dir: Path, generation: Path, path: Path) -> Path:
    """Where a file of a generation is seen once committed: OUT/artifacts/x.onnx, not .published/g-.../."""
    return out_dir / path.relative_to(generation)


def publish_artifact(artifact: Artifact, generation: Path, name: str,
                     extra_meta: dict[str, Any]) -> tuple[Path, Path, list[PublishedDataFile]]:
    """Copy an artifact into the generation as artifacts/<name>.onnx with its sidecar and external data.

    A copy, not a link: a user editing the published file must not alter the cache entry.  Each copy is
    hashed and must match the sha256 the cache entry recorded (and was verified against when it was read).
    Returns the model, its sidecar and a record of each external data file.
    """
    folder = generation / ARTIFACTS
    folder.mkdir(parents=True, exist_ok=True)
    meta = {**json.loads(artifact.sidecar.read_text()), **extra_meta}
    files = meta.get("files") or {}
    model_path, sidecar = folder / f"{name}.onnx", folder / f"{name}.json"
    copies = [(MODEL_FILE, artifact.path, model_path)]
    copies += [(data, artifact.path.parent / data, folder / data) for data in meta.get("external_data", [])]
    published: dict[str, StoredFile] = {}
    with disk_full_is_clear(str(model_path)):
        for entry_name, source, target in copies:
            shutil.copyfile(source, target)
            digest = sha256_file(target)
            if digest != files.get(entry_name, {}).get("sha256"):
                raise CacheChangedError(f"cache entry {source.parent} changed while it was published ({entry_name}: "
                                        "hash mismatch); run again and it will be rebuilt")
            published[target.name] = {"sha256": digest, "size_bytes": target.stat().st_size}
        write_json_synced(sidecar, {**meta, "files": published})
    external = [{"file": file, **record} for file, record in published.items() if file != model_path.name]
    return model_path, sidecar, external


def write_checksums(generation: Path) -> None:
    """artifacts/SHA256SUMS in the format of ``sha256sum``: ``cd artifacts && sha256sum -c SHA256SUMS``.

    Everything published is listed: each model, its external data and its sidecar ``<variant>.json`` (the
    sidecar is hashed here, after it was written; report.json records the same hash as ``sidecar_sha256``)."""
    folder = generation / ARTIFACTS
    if not folder.is_dir():
        return
    digests: dict[str, str] = {}
    for sidecar in sorted(folder.glob("*.json")):
        for file, record in json.loads(sidecar.read_text()).get("files", {}).items():
            digests[file] = record["sha256"]
        digests[sidecar.name] = sha256_file(sidecar)
    (folder / CHECKSUMS).write_text("".join(f"{digest}  {name}\n" for name, digest in sorted(digests.items())))


def write_recipe_snapshot(generation: Path, recipe: dict[str, Any]) -> None:
    """The run's recipe as validated, beside its report: a package reads its tolerances from here, and each
    section's hash must equal the one report.json records (``recipe.sections``)."""
    write_json_synced(generation / RECIPE_SNAPSHOT, recipe)


def commit_generation(out_dir: Path, generation: Path) -> None:
    """Make a complete generation the published set, in one atomic switch; then remove the previous one."""
    root = out_dir / PUBLISHED
    _fsync_files(generation)
    previous = _current_generation(root)
    retired = _retire_plain_files(out_dir, root)
    names = (ARTIFACTS, PACKAGES, *REPORT_FILES, RECIPE_SNAPSHOT)
    present = [name for name in names if (generation / name).exists()]
    for name in present:
        _ensure_link(out_dir / name, Path(PUBLISHED) / CURRENT / name)
    _replace_link(root / CURRENT, Path(generation.name))  # the switch
    fsync_dir(root)
    for name in (PACKAGES, *REPORT_FILES, RECIPE_SNAPSHOT):
        if name not in present and (out_dir / name).is_symlink():
            (out_dir / name).unlink()  # a format (or packages) this run did not write: its link would dangle
    for old in [previous, *retired]:
        if old is not None and old != generation:
            shutil.rmtree(old, ignore_errors=True)
    _remove_leftovers(root, keep=generation)
    log.debug("published %s as %s", generation.name, out_dir)


def _current_generation(root: Path) -> Path | None:
    link = root / CURRENT
    return root / os.readlink(link) if link.is_symlink() else None


def _retire_plain_files(out_dir: Path, root: Path) -> list[Path]:
    """Reports and artifacts/ of an older qdeploy (plain files, not links): reports go first, then artifacts/.

    At no instant does a report stand beside artifacts it does not describe; folders are moved aside (rename)
    and removed after the switch.
    """
    retired = []
    for name in (*REPORT_FILES, ARTIFACTS):
        path = out_dir / name
        if path.is_symlink() or not path.exists():
            continue
        if path.is_dir():
            aside = root / f"retired-{_HOST}-{os.getpid()}-{time.monotonic_ns()}"
            os.rename(path, aside)
            retired.append(aside)
        else:
            path.unlink()
    return retired


def _ensure_link(path: Path, target: Path) -> None:
    if path.is_symlink() and Path(os.readlink(path)) == target:
        return
    _replace_link(path, target)


def _replace_link(path: Path, target: Path) -> None:
    """Point a symbolic link at target atomically: a new link under a temporary name, renamed over the old."""
    temporary = path.with_name(f"{_TMP_LINK}{path.name}-{os.getpid()}-{time.monotonic_ns()}")
    os.symlink(target, temporary)
    try:
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def _fsync_files(generation: Path) -> None:
    """The new set is on disk before the switch makes it the published one."""
    for path in generation.rglob("*"):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for folder in [generation, *(p for p in generation.rglob("*") if p.is_dir())]:
        fsync_dir(folder)


def _remove_leftovers(root: Path, keep: Path | None) -> None:
    """Generations of runs that died before their switch, and temporary links; never the current one."""
    current = _current_generation(root)
    for path in root.iterdir():
        if path.name == CURRENT or path in (current, keep) or path.name.startswith(_TMP_LINK):
            continue
        if _abandoned(path):
            shutil.rmtree(path, ignore_errors=True)
    for folder in (root, root.parent):
        for link in folder.glob(f"{_TMP_LINK}*"):
            pid = link.name.rsplit("-", 2)[-2]
            if not pid.isdigit() or int(pid) == os.getpid() or not process_alive(int(pid)):
                link.unlink(missing_ok=True)


def _abandoned(path: Path) -> bool:
    """Left by a process that is gone (or by this one, which builds one generation at a time per folder)."""
    parts = path.name.split("-")
    if len(parts) >= 4 and parts[1] == _HOST and parts[2].isdigit():
        pid = int(parts[2])
        return pid == os.getpid() or not process_alive(pid)
    try:
        return time.time() - path.lstat().st_mtime > STALE_STAGING_SECONDS
    except OSError:
        return False
