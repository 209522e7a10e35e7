"""Writing a file so that a reader sees the old one or the new one, never half of either."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """``write(temporary)`` into the same directory, then rename it over ``path``: never a half-written file.

    The file gets the permissions the user's umask gives a new file
    (``mkstemp`` would leave it private).
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        mask = os.umask(0)  # the only way to read the umask; set straight back
        os.umask(mask)
        os.chmod(temporary, 0o666 & ~mask)
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """:func:`atomic_write` of a text (a report, a JSON summary)."""
    atomic_write(Path(path), lambda target: Path(target).write_text(text))
