"""Content-addressed artifact store with atomic writes.

An entry lives in ``cache/<key[:2]>/<key>/`` and holds ``model.onnx``, optional
external data ``<key>.weights`` beside it, and ``meta.json`` (the sidecar).  An
entry is written in a temporary folder and renamed into place as a whole, so a
run killed at any point leaves either a complete entry or none; a half-written
temporary folder is never read and is swept away later.

The sidecar records each file's own sha256 and size (``files``).  Every read of
an entry (``ArtifactStore.get``) checks them all, so an entry damaged on disk or
by hand is never used: it is evicted, the caller rebuilds it, and the reason is
kept in ``ArtifactStore.evictions`` for the report.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from qdeploy.core.context import Artifact
from qdeploy.core.errors import QdeployError
from qdeploy.core.files import (
    TMP_PREFIX,
    disk_full_is_clear,
    external_data_files,
    file_record,
    fsync_dir,
    process_alive,
    sha256_file,
    write_json_synced,
)
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.external_data import PROTOBUF_SAFE_BYTES, save_onnx

if TYPE_CHECKING:
    import onnx

__all__ = ["META_FILE", "MODEL_FILE", "STALE_STAGING_SECONDS", "ArtifactStore", "CacheChangedError", "EntryMeta",
           "StoredFile", "cache_key", "entry_problem", "library_versions"]

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
META_FILE = "meta.json"
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
"""Models above this many bytes are saved with external data (protobuf's hard limit is 2 GiB)."""
STALE_STAGING_SECONDS = 24 * 3600


def _owner_tag() -> str:
    return f"{socket.gethostname().replace('-', '_')}-{os.getpid()}"


def _staging_is_abandoned(staging: Path) -> bool:
    parts = staging.name[len(TMP_PREFIX):].split("-")
    try:
        age = time.time() - staging.stat().st_mtime
    except OSError:
        return False
    if len(parts) >= 4 and parts[2].isdigit() and parts[1] == socket.gethostname().replace("-", "_"):
        return not process_alive(int(parts[2]))
    return age > STALE_STAGING_SECONDS


class StoredFile(TypedDict):
    """A file of an entry as its sidecar records it (``files``): its own sha256 and size."""

    sha256: str
    size_bytes: int


class EntryMeta(TypedDict, total=False):
    """What a verified entry's sidecar (meta.json) is read for; the stage that built it records more beside these."""

    key: str
    sha256: str
    files: dict[str, StoredFile]
    size_bytes: int
    external_data: list[str]
    created: float
    stages: list[str]
    parent: str | None
    seconds: float


class CacheChangedError(QdeployError):
    """A cache entry changed on disk after it was verified (while it was being published)."""

    exit_code = 1


def library_versions(distributions: tuple[str, ...] | list[str]) -> dict[str, str]:
    versions = {}
    for name in distributions:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def cache_key(parts: dict[str, Any]) -> str:
    """Stable hash of a JSON-serialisable description of a transform."""
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class ArtifactStore:
    """The cache folder of one run (or shared by several)."""

    root: Path
    evictions: dict[str, str] = field(default_factory=dict)
    """Cache key -> why its entry was evicted in this process (damaged on disk); the report says so."""

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> Artifact | None:
        """The complete, verified entry of this key, or None.

        The one integrity check of every cache read: the sidecar must parse and every file it lists must have
        the sha256 and size it recorded.  A damaged entry is evicted (so the caller rebuilds it) and logged.
        """
        entry = self.entry_dir(key)
        meta_path = entry / META_FILE
        if not meta_path.is_file():
            return None
        artifact: Artifact | None = None
        try:
            meta = json.loads(meta_path.read_text())
            problem = entry_problem(entry, meta) if isinstance(meta, dict) else "its sidecar is not a JSON object"
            if problem is None and meta.get("key") != key:
                problem = "its sidecar belongs to another key"
            artifact = _artifact_from_meta(entry, meta, cached=True) if problem is None else None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            problem = f"unreadable sidecar ({exc})"
        except (KeyError, TypeError, ValueError) as exc:
            problem = f"its sidecar lacks {exc}"
        if artifact is None:
            self.evict(key, problem or "unknown")
        return artifact

    def evict(self, key: str, reason: str) -> None:
        """Take a damaged entry out of the cache (renamed away first: a reader never sees half of it)."""
        entry = self.entry_dir(key)
        log.warning("cache entry %s is damaged (%s): evicted, it will be rebuilt", entry, reason)
        self.evictions[key] = reason
        graveyard = entry.parent / f"{TMP_PREFIX}{key[:12]}-{_owner_tag()}-evicted{time.monotonic_ns()}"
        try:
            os.rename(entry, graveyard)
        except OSError:
            return  # gone already (another run evicted it)
        shutil.rmtree(graveyard, ignore_errors=True)

    def put(self, key: str, model: onnx.ModelProto, meta: dict[str, Any], *, saved: Path | None = None) -> Artifact:
        """Write a model and its sidecar as one entry, atomically; a sound entry that already exists wins.

        ``saved``: the model is already on disk there with its external data files beside it (a large model):
        those files are moved into the entry instead of the proto being saved again."""
        final = self.entry_dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{key[:12]}-{_owner_tag()}-", dir=final.parent))
        with disk_full_is_clear(f"cache entry {final}"):
            try:
                model_path = staging / MODEL_FILE
                if saved is not None:
                    _move_saved(saved, model_path)
                else:
                    save_model(model, model_path, external_name=f"{key[:16]}.weights")
                data_files = external_data_files(model_path)
                files = {path.name: file_record(path) for path in (model_path, *data_files)}
                meta = {**meta, "key": key, "sha256": files[MODEL_FILE]["sha256"], "files": files,
                        "size_bytes": sum(record["size_bytes"] for record in files.values()),
                        "external_data": [p.name for p in data_files], "created": time.time()}
                write_json_synced(staging / META_FILE, meta)
                fsync_dir(staging)
                ours = self._move_into_place(key, staging, final)
            finally:
                if staging.exists():
                    shutil.rmtree(staging, ignore_errors=True)
        artifact = _artifact_from_meta(final, meta, cached=False) if ours else self.get(key)
        if artifact is None:
            raise CacheChangedError(f"cache entry {final} was replaced by a damaged one while it was written; "
                                    "run again")
        return artifact

    def _move_into_place(self, key: str, staging: Path, final: Path) -> bool:
        """Rename a staged entry to its place; False when another run placed a sound one there first."""
        if final.exists():
            if self.get(key) is not None:
                log.debug("cache entry %s was written by another run first", final.name)
                return False
            shutil.rmtree(final, ignore_errors=True)  # an entry without its sidecar (damaged by hand)
        try:
            os.rename(staging, final)
        except OSError:
            if not (final / META_FILE).is_file():
                raise
            log.debug("cache entry %s was written by another run first", final.name)
            return False
        return True

    def sweep_temporaries(self) -> int:
        """Remove staging folders that a killed run left behind; returns how many.

        A staging folder of a process still alive on this host is another run's work in flight (runs may share
        a cache): it is kept.  Folders of other hosts are removed only when stale (a day old).
        """
        removed = 0
        for staging in self.root.glob(f"*/{TMP_PREFIX}*"):
            if _staging_is_abandoned(staging):
                shutil.rmtree(staging, ignore_errors=True)
                removed += 1
        return removed


def entry_problem(entry: Path, meta: dict[str, Any]) -> str | None:
    """Why an entry cannot be trusted (a file missing, of another size or another sha256), or None."""
    files, external = meta.get("files"), meta.get("external_data", [])
    if not isinstance(files, dict) or MODEL_FILE not in files or not isinstance(external, list):
        return "its sidecar records no per-file hashes (written by an older qdeploy)"
    for name in [MODEL_FILE, *external]:
        record = files.get(name)
        if not isinstance(name, str) or "/" in name or name.startswith(".") or not isinstance(record, dict):
            return f"its sidecar lists a file it has no hash of: {name!r}"
        path = entry / name
        if path.is_symlink() or not path.is_file():
            return f"{name} is missing or not a regular file"
        if path.stat().st_size != record.get("size_bytes"):
            return f"{name}: size mismatch"
        if sha256_file(path) != record.get("sha256"):
            return f"{name}: hash mismatch"
    return None


def _move_saved(saved: Path, model_path: Path) -> None:
    """Move a saved model and its external data files into a staging folder (renamed when on one file system);
    one below the external-data threshold is written as one file (an artifact's form depends on its size only)."""
    data_files = external_data_files(saved)
    total = saved.stat().st_size + sum(data.stat().st_size for data in data_files)
    if data_files and total <= min(EXTERNAL_DATA_THRESHOLD, PROTOBUF_SAFE_BYTES):
        save_onnx(load_model(saved), model_path, threshold=min(EXTERNAL_DATA_THRESHOLD, PROTOBUF_SAFE_BYTES))
        return
    for data in data_files:
        shutil.move(str(data), str(model_path.parent / data.name))
    shutil.move(str(saved), str(model_path))


def save_model(model: onnx.ModelProto, path: Path, *, external_name: str) -> None:
    """Save a model; large ones with their tensors in one external data file beside it."""

    # sized from tensor shapes: ByteSize fails above 2 GB
    save_onnx(model, path, location=external_name, threshold=min(EXTERNAL_DATA_THRESHOLD, PROTOBUF_SAFE_BYTES))


def _artifact_from_meta(entry: Path, meta: EntryMeta, *, cached: bool) -> Artifact:
    return Artifact(
        path=entry / MODEL_FILE, sidecar=entry / META_FILE, key=meta["key"], sha256=meta["sha256"],
        size_bytes=meta["size_bytes"], stages=tuple(meta.get("stages", ())), parent=meta.get("parent"),
        cached=cached, seconds=meta.get("seconds", 0.0),
        external_data=tuple((name, meta["files"][name]["sha256"], meta["files"][name]["size_bytes"])
                            for name in meta.get("external_data", [])),
    )


