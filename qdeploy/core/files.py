"""Files written so that no reader ever sees half of one: temporary names renamed into place, fsync'd, ENOSPC
named; sha256 as ``sha256sum`` prints it; models saved with external data when large.

The artifact store (``qdeploy.pipeline.publish.store``), the reports and the stages write through here.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from qdeploy.core.errors import DiskFullError
from qdeploy.core.onnx_wire import load_model
from qdeploy.core.values import utf8_safe

if TYPE_CHECKING:
    import onnx

__all__ = ["SHARED_TMPDIR_ENV", "TMP_PREFIX", "FileDigest", "all_tensors", "bytes_on_disk", "disk_full_is_clear",
           "external_data_files", "file_record", "fsync_dir", "process_alive", "sha256_file", "shared_temp_dir",
           "sweep_stale_files", "write_json_atomic", "write_json_synced", "write_text_atomic"]

TMP_PREFIX = ".tmp-"
# the machine's temporary folder where ``qdeploy run``'s supervisor gave its run a private TMPDIR (qdeploy.cli)
SHARED_TMPDIR_ENV = "QDEPLOY_SHARED_TMPDIR"
_CHUNK = 1 << 20


def shared_temp_dir() -> Path:
    """The temporary folder other processes of this user see: where locks shared between runs belong."""
    return Path(os.environ.get(SHARED_TMPDIR_ENV) or tempfile.gettempdir())


def _default_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def disk_full_is_clear(what: str) -> Iterator[None]:
    """Turn ENOSPC into a DiskFullError naming what was being written (the caller has cleaned up)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"no space left on the device while writing {what}; the previous state is intact. "
                                "Free some space (or point --out/--cache-dir elsewhere) and run again") from None
        raise


def _temp_prefix(path: Path) -> str:
    """Temporary files name their process, so a later run can tell a dead run's leftovers from live work."""
    return f"{TMP_PREFIX}{path.name}.p{os.getpid()}."


def sweep_stale_files(folder: Path) -> None:
    """Remove temporary files that processes now gone left in a folder (a run killed while writing)."""
    for leftover in folder.glob(f"{TMP_PREFIX}*"):
        owner = re.search(r"\.p(\d+)\.", leftover.name)
        if owner and leftover.is_file() and not process_alive(int(owner.group(1))):
            leftover.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class FileDigest(TypedDict):
    """``file_record``: a file's sha256 and size in bytes."""

    sha256: str
    size_bytes: int


def file_record(path: Path) -> FileDigest:
    """A file's own sha256 (what ``sha256sum`` prints) and size."""
    return {"sha256": sha256_file(path), "size_bytes": path.stat().st_size}


def external_data_files(path: Path) -> list[Path]:
    """External data files a model references, resolved beside it (its weights are not read)."""
    import onnx


    model = load_model(path, load_external_data=False)
    locations = set()
    for tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location" and entry.value != path.name:  # not the model file's own weights
                    locations.add(entry.value)
    return [path.parent / location for location in sorted(locations)]


def bytes_on_disk(path: Path) -> int:
    """The size of a model file with the external data files it references (the file's own size where it does not
    parse: whoever reads it next says why)."""
    try:
        data = external_data_files(path)
    except Exception:  # not a model (truncated, not protobuf): no references to count
        data = []
    return path.stat().st_size + sum(item.stat().st_size for item in data if item.is_file())


def all_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    from onnx.external_data_helper import _get_all_tensors

    return list(_get_all_tensors(model))


def write_json_synced(path: Path, data: dict[str, Any]) -> None:
    with path.open("w") as stream:
        json.dump(data, stream, indent=2, sort_keys=True, default=str)
        stream.flush()
        os.fsync(stream.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON under a temporary name and rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_files(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), dir=path.parent)
    os.chmod(tmp, _default_file_mode())  # mkstemp makes 0600; reports are meant to be shared
    os.close(fd)
    with disk_full_is_clear(str(path)):
        try:
            write_json_synced(Path(tmp), data)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def write_text_atomic(path: Path, text: str) -> None:
    """Write UTF-8 text under a temporary name and rename it into place; a path in it whose name is not UTF-8
    (surrogate escapes, ``os.fsdecode``) is written escaped (``utf8_safe``), never refused."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_files(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), dir=path.parent)
    os.chmod(tmp, _default_file_mode())  # mkstemp makes 0600; reports are meant to be shared
    with disk_full_is_clear(str(path)):
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as stream:
                stream.write(utf8_safe(text))
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
