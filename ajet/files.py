"""Atomic file writes: a file holds its old content or its new content, never half of one.

What a run writes while it may be killed (pipeline.json, reports, caches, markers) goes
through here. The new content is written to a temp file in the same directory, flushed and
fsynced, then renamed over the target with `os.replace` (atomic within one filesystem), and
the directory is fsynced so the rename itself survives a power loss. A kill at any moment
leaves the previous file intact plus, at worst, a stray `.<name>.<random>.tmp` next to it; an
exception removes the temp file.

The bottom layer of ajet: the standard library only, so every module may use it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", *, encoding: str = "utf-8",
                permissions: int = 0o666) -> Iterator[IO[Any]]:
    """Open a temp file next to `path` for writing ("w" or "wb"); on a clean exit it replaces
    `path`. `permissions` apply before any byte is written (less the umask, as for `open`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a whole file: mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, permissions)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8",
                      permissions: int = 0o666) -> None:
    """`Path.write_text`, atomically."""
    with atomic_open(path, encoding=encoding, permissions=permissions) as handle:
        handle.write(text)


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2,
                      ensure_ascii: bool = True, permissions: int = 0o666) -> None:
    """`obj` as JSON (one trailing newline), atomically."""
    with atomic_open(path, permissions=permissions) as handle:
        json.dump(obj, handle, indent=indent, ensure_ascii=ensure_ascii)
        handle.write("\n")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the renames and creations in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc` or an exception it came from is "no space left on device" (or over quota):
    torch.save reports it as a RuntimeError raised while handling the OSError."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def free_mib(path: str | os.PathLike[str]) -> float:
    """MiB free on the file system that holds `path`."""
    return shutil.disk_usage(path).free / 2**20


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes (hex), read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
