"""A dataset's source file opened once, checked through the open file, and copied from it.

Checking a path and then reading it by its name again leaves a window in which the name can be
swapped — for a symlink to a file outside the data root, say — and the file read is then not the
file checked. So a source is read here in three steps, none of which looks the path up again
after the check:

1. the real path that :func:`~dpkit.server.datasets.resolve_source` checked (no ``..``, under
   the data root, a regular file of an accepted kind) is **opened** (without blocking, so a FIFO
   swapped in cannot hang the service);
2. the **open file** is checked: it is a regular file, and the kernel's own name for it (Linux:
   ``/proc/self/fd/N``; macOS: ``F_GETPATH``) is the real path checked in step 1 — a file opened
   through a link swapped in for a moment has another name, and is refused like a path outside
   the root. Elsewhere the file at the real path must be the open file (its device and inode),
   which holds unless the name is swapped twice between the two checks;
3. its bytes are **copied from the open file** into a private file in the service's own dataset
   directory (:func:`snapshot`), which is what DuckDB then reads — DuckDB opens files by name, so
   it is never given the curator's path. A ``.duckdb`` source's write-ahead log, if it has one,
   is opened, checked and copied the same way (DuckDB replays it when it attaches the copy).

The copy costs one more write of the source at registration (and when a lost shared copy is
re-made), and its disk space until the shared copy is built; nothing at query time.

Spark datasets are read in place by the cluster, by path: their files are listed and checked
under the root at registration and before every query (:mod:`dpkit.server.spark_pins`), but a name
swapped between that check and Spark's read is read by Spark. Whoever can write inside the data
root is trusted like the administrator for Spark datasets.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dpkit.errors import InvalidParameterError
from dpkit.server.datasets import _UNDER_ROOT, SourcePath, source_kind

try:  # POSIX; macOS names an open file with F_GETPATH
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = ["OpenedSource", "open_source", "snapshot"]

_CHUNK = 4 * 1024 * 1024
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


@dataclass(frozen=True)
class OpenedSource:
    """A checked source and its open file (``fd``); ``wal``: a ``.duckdb`` source's write-ahead
    log, opened and checked the same way (None when it has none)."""

    located: SourcePath
    fd: int
    wal: int | None = None


@contextlib.contextmanager
def open_source(located: SourcePath, data_root: Path | None) -> Iterator[OpenedSource]:
    """The source ``located`` (checked by :func:`~dpkit.server.datasets.resolve_source` under
    ``data_root``: its ``path`` is a real path under the root) opened once and checked again
    through the open file (see the module docstring); its files are closed when the block ends.
    Refused like ``resolve_source`` refuses a path outside the root: InvalidParameterError naming
    ``source``, saying nothing of where a path led."""
    fd = _open_checked(located.path, located.stored, data_root, required=True)
    assert fd is not None
    wal: int | None = None
    try:
        if source_kind(located.path) == "duckdb":
            wal = _open_checked(Path(f"{located.path}.wal"), located.stored, data_root, required=False)
        yield OpenedSource(located, fd, wal)
    finally:
        for opened in (fd, wal):
            if opened is not None:
                os.close(opened)


def _open_checked(path: Path, shown: str, data_root: Path | None, *, required: bool) -> int | None:
    """``path`` opened and checked through its open file: a regular file, and (with a data root)
    the file whose real path is ``path``. None for a missing file that is not ``required``."""
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        if not required:
            return None
        raise _refused(shown, data_root) from None
    except OSError:
        raise _refused(shown, data_root) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or (data_root is not None and not _is_file_at(fd, path)):
            raise _refused(shown, data_root)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_file_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is the file at the real path ``path`` (see the module
    docstring for how, per system)."""
    try:
        if os.path.isdir("/proc/self/fd"):  # Linux: the kernel's name for the open file
            return os.readlink(f"/proc/self/fd/{fd}") == os.fspath(path)
        getpath = getattr(fcntl, "F_GETPATH", None)
        if getpath is not None:  # pragma: no cover - macOS: the same, asked of the descriptor
            name = fcntl.fcntl(fd, getpath, bytes(1024)).split(b"\0", 1)[0]
            return os.fsdecode(name) == os.fspath(path)
        opened, named = os.fstat(fd), os.stat(path)  # pragma: no cover - elsewhere: device and inode
        return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)  # pragma: no cover
    except OSError:
        return False


def _refused(shown: str, data_root: Path | None) -> InvalidParameterError:
    if data_root is None:
        return InvalidParameterError("source", shown, "an existing .csv, .parquet or .duckdb file")
    return InvalidParameterError("source", shown, _UNDER_ROOT, "there is no such file under the data root")


@contextlib.contextmanager
def snapshot(opened: OpenedSource, directory: Path) -> Iterator[Path]:
    """A private copy of the open source (and its write-ahead log) in ``directory``, named with
    the source's suffix so that it is read as the same kind; removed when the block ends.
    OSError when the directory cannot be written."""
    directory.mkdir(parents=True, exist_ok=True)
    private = directory / f".source-{uuid.uuid4().hex}{opened.located.path.suffix.lower()}"
    made: list[Path] = []
    try:
        for fd, target in ((opened.fd, private), (opened.wal, Path(f"{private}.wal"))):
            if fd is not None:
                made.append(target)
                _copy(fd, target)
        yield private
    finally:
        for path in made:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _copy(fd: int, target: Path) -> None:
    """The bytes of the open file ``fd``, from its start, into a new file ``target`` (readable by
    the service only)."""
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, _CHUNK):
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
    finally:
        os.close(out)
