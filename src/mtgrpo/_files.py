"""Writing files and directories atomically: a reader sees the old content or the new, never half.

Used by checkpoints (a directory renamed into place), the SFT warm start's saved model, the task
cache's chunks and the metrics log's rewind on resume. :func:`aside_path` names where an earlier
run's files are moved, never deleted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["aside_path", "old_path", "temporary_path", "write_atomically",
           "write_text_atomically"]


def aside_path(directory: Path, prefix: str) -> Path:
    """``directory/<prefix>-<local time>``, with ``-1``, ``-2``, ... added while that exists:
    where earlier outputs are moved aside (nothing is deleted)."""
    stamp = directory / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    target, number = stamp, 1
    while target.exists():
        target, number = stamp.with_name(f"{stamp.name}-{number}"), number + 1
    return target


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, flush it to disk, then rename it over
    ``path``; the temporary file is removed if anything fails."""
    # beside the target: rename(2) does not cross mounted filesystems (EXDEV)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates the file 0600 and the rename keeps it: give it the mode a plain
        # open() would (0666 less the umask), so a rewritten log stays readable as before
        os.fchmod(handle, 0o666 & ~_umask())
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            # the data reaches the disk before the new name can point at it
            os.fsync(stream.fileno())
        # rename(2) replaces an existing file atomically: no reader finds the path missing
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask, read without changing it (proc(5)'s ``Umask:`` line, Linux 4.7+;
    elsewhere set and restored, which another thread could observe for that instant)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def temporary_path(final: Path, pid: int | None = None) -> Path:
    """``.<name>.tmp-<pid>`` beside ``final`` (``pid``: the writing process's, default this
    one's): where :func:`write_atomically` writes before the rename."""
    # beside final (same filesystem, for the rename); the pid tells whose leftover it is
    return final.with_name(f".{final.name}.tmp-{os.getpid() if pid is None else pid}")


def write_atomically(final: Path, write: Callable[[Path], object], *,
                     staged: bool = False) -> Path:
    """Call ``write(tmp_dir)`` then rename ``tmp_dir`` to the directory ``final`` (replacing an
    old one, which is moved aside first and deleted once the new one is in place). ``tmp_dir``
    is :func:`temporary_path`, so what a crash leaves is recognisable
    (:func:`mtgrpo.trainer.checkpoint.remove_stale_temporaries`). ``staged``: ``tmp_dir``
    exists already and holds what other processes wrote into it (DeepSpeed's partitions), kept."""
    tmp = temporary_path(final)
    if not staged:
        shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, exist_ok=staged)
    try:
        write(tmp)
    except BaseException:  # a failed write (a full disk) leaves nothing half-written behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # the old copy is renamed aside, not deleted, before the new one takes its name: a crash
    # between the two renames leaves it whole (``.<name>.old-<pid>``, put back by
    # remove_stale_temporaries), where deleting it first could leave a half-deleted directory
    old = old_path(final)
    shutil.rmtree(old, ignore_errors=True)
    # rename(2) puts a directory only where nothing or an empty directory is (else ENOTEMPTY),
    # so the old copy leaves first
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def old_path(final: Path) -> Path:
    """``.<name>.old-<pid>`` beside ``final``: where :func:`write_atomically` moves the copy it
    replaces until the new one is in place."""
    return final.with_name(f".{final.name}.old-{os.getpid()}")
