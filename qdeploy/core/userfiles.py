"""The one place where qdeploy checks and opens paths that a user names.

A recipe, a model, its external data, a dataset sample, the output and cache
folders: each comes from a user and may be anything the file system holds.
Only regular files are read (a device such as /dev/zero, a named pipe or a
socket would make a reader spin or wait for ever), a symlink loop or a folder
where a file belongs is refused, files of a dataset folder stay inside it, and
every OS error on such a path becomes a ``UserFileError`` (exit 2) that names
the path and what to do.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from qdeploy.core.errors import UserFileError

__all__ = ["USER_ERRNOS", "check_folder", "check_regular_file", "files_in_folder", "open_regular_file",
           "os_error_problem", "read_text", "writable_folder"]

USER_ERRNOS = frozenset({errno.ELOOP, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR,
                         errno.ENAMETOOLONG})
"""OS errors that whoever owns the path causes and can fix (rights, read-only mounts, a file where a folder
belongs), even when they surface late in a run: exit 2 naming the path.  A late ENOENT or EEXIST is more likely
a bug or a race than a user's mistake (missing paths are refused up front), so it stays an internal error."""

_PROBLEMS = {
    errno.ENOENT: "does not exist",
    errno.ELOOP: "is a symbolic link loop (or a chain of too many links); point it at a real file",
    errno.EACCES: "cannot be accessed: permission denied; fix its permissions or choose another path",
    errno.EPERM: "cannot be accessed: operation not permitted; choose another path",
    errno.EROFS: "is on a read-only file system; choose a place you can write",
    errno.ENOTDIR: "has a part that is a file, not a folder; fix the path",
    errno.EISDIR: "is a folder, not a file; name a file",
    errno.EEXIST: "exists and is not a folder; name a folder",
    errno.ENAMETOOLONG: "is a name too long for the file system; choose a shorter path",
}


def os_error_problem(exc: OSError) -> str:
    """What an OS error says about its path, in words that tell the user what to do."""
    return _PROBLEMS.get(exc.errno or 0, f"cannot be used: {exc.strerror or exc}")


def _kind_problem(mode: int) -> str | None:
    """Why a file of this mode is not readable as data; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder, not a file; name a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device (such as /dev/zero), not a regular file; name a file"
    if stat.S_ISFIFO(mode):
        return "is a named pipe (FIFO), not a regular file: reading it could wait for ever; name a file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file; name a file"
    return "is not a regular file; name a file"


_KERNEL_FILE_SYSTEMS = ("/proc/", "/sys/")
"""Where the kernel serves files that claim to be regular but are not data: /proc/kmsg blocks a read for ever."""


def _pseudo_file_problem(fd: int, path: Path) -> str | None:
    """Why an opened 'regular' file is a kernel pseudo-file (by where the descriptor really leads); None if not."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: the path is all there is to go by
        real = os.path.realpath(path)
    if real.startswith(_KERNEL_FILE_SYSTEMS):
        return (f"is a kernel pseudo-file ({real}), not data: reading it may wait for ever or change between "
                "reads; name a file")
    return None


def _stat(path: Path, what: str) -> os.stat_result:
    """os.stat with every failure named; a dangling symlink says where it points."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise UserFileError(what, path, f"is a symbolic link to '{os.readlink(path)}', which does not "
                                            "exist") from None
        raise UserFileError(what, path, "does not exist") from None
    except ValueError:  # a NUL byte in the name
        raise UserFileError(what, repr(str(path)), "is not a valid path (it holds a NUL byte)") from None
    except OSError as exc:
        raise UserFileError(what, path, os_error_problem(exc)) from None


def check_regular_file(path: Path, what: str) -> Path:
    """``path`` if it is (a symlink to) a regular file; UserFileError naming it and the problem otherwise."""
    problem = _kind_problem(_stat(path, what).st_mode)
    if problem:
        raise UserFileError(what, path, problem)
    return path


def check_folder(path: Path, what: str) -> Path:
    """``path`` if it is (a symlink to) a folder; UserFileError otherwise."""
    if not stat.S_ISDIR(_stat(path, what).st_mode):
        raise UserFileError(what, path, "is not a folder; name a folder")
    return path


def open_regular_file(path: Path, what: str) -> BinaryIO:
    """Open a regular file for reading; the check is made on the opened file, so a swap after it cannot fool it."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting; cleared below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except ValueError:
        raise UserFileError(what, repr(str(path)), "is not a valid path (it holds a NUL byte)") from None
    except OSError as exc:
        _stat(path, what)  # names a missing file, a dangling link or a loop precisely
        raise UserFileError(what, path, os_error_problem(exc)) from None
    try:
        problem = _kind_problem(os.fstat(fd).st_mode) or _pseudo_file_problem(fd, path)
        if problem:
            raise UserFileError(what, path, problem)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(path: Path, what: str, *, max_bytes: int) -> str:
    """A regular UTF-8 text file of at most ``max_bytes`` bytes, refused before it is read when larger."""
    with open_regular_file(path, what) as stream:
        size = os.fstat(stream.fileno()).st_size
        data = stream.read(max_bytes + 1) if size <= max_bytes else b""
    if size > max_bytes or len(data) > max_bytes:
        raise UserFileError(what, path, f"is {max(size, len(data)) / 1e6:.1f} MB; a {what} may be at most "
                                        f"{max_bytes / 1e6:.0f} MB: keep large data in files it names")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFileError(what, path, f"is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


def files_in_folder(folder: Path, wanted: Callable[[Path], bool], what: str) -> list[Path]:
    """The wanted entries of a folder, in name order, each a regular file that stays inside the folder.

    A symbolic link is followed only when it leads to a file inside the folder, as external data is: a
    dataset is what its folder holds, not what a link in it reaches elsewhere on the machine.
    """
    root = os.path.realpath(check_folder(folder, what))
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise UserFileError(what, folder, os_error_problem(exc)) from None
    files = []
    for entry in entries:
        if not wanted(entry):
            continue
        check_regular_file(entry, f"{what} file")
        target = os.path.realpath(entry)
        if os.path.commonpath([root, target]) != root:
            raise UserFileError(f"{what} file", entry, f"is a symbolic link to '{target}', outside the folder "
                                                       f"{root}; refused for safety: copy the file into the folder")
        files.append(entry)
    return files


def writable_folder(path: Path, what: str) -> Path:
    """A folder qdeploy can write, created when missing; UserFileError naming the path and the fix otherwise."""
    path = Path(path).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserFileError(what, path, "is a file, not a folder; name a folder (qdeploy creates it when "
                                        "missing)") from None
    except FileNotFoundError:
        raise UserFileError(what, path, "cannot be created there (a virtual file system such as /proc, or a "
                                        "parent that vanished); choose a folder on a disk") from None
    except ValueError:
        raise UserFileError(what, repr(str(path)), "is not a valid path (it holds a NUL byte)") from None
    except OSError as exc:
        raise UserFileError(what, exc.filename or path, os_error_problem(exc)) from None
    try:
        handle, probe = tempfile.mkstemp(prefix=".qdeploy-probe-", dir=path)
    except OSError as exc:
        raise UserFileError(what, path, os_error_problem(exc)) from None
    os.close(handle)
    os.unlink(probe)
    return path
