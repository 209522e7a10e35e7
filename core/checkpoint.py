"""Checkpoints: an append-only JSON-lines file of finished items, so that a rerun resumes.

A long sweep or batch fit writes each item to its checkpoint as it
finishes; run it again with the same checkpoint and only the items not yet
in the file are computed.

- **Line 1, the header**, names the run: ``{"format", "version", "run"}``,
  where ``run`` holds what makes two runs the same (the target, the number
  of items, a fingerprint of every item). It is written atomically when the
  file is created (:func:`core.atomic.atomic_write`).
- **Every other line is one finished item**, appended with one ``write`` of
  a whole line ending in ``"\\n"`` and then ``fsync``: once ``append``
  returns, the item survives a crash, a kill or a power cut.
- **A crash mid-write** leaves at most one cut-off last line. Opening the
  file drops it with a :class:`CheckpointWarning` and rewrites the file
  atomically without it; that item is computed again.
- **Another run's file** is refused with a :class:`CheckpointError` naming
  what differs. Why refuse rather than start a new file: the old file may
  hold hours of results that a typo in the grid would otherwise throw
  away, and mixing the two runs' items would give a wrong answer. The user
  deletes the file or names another one.
- **A corrupt file** (not JSON, not a checkpoint, a record that does not
  decode) is a :class:`CheckpointError` naming the file, the line and what
  to do, never a traceback from ``json``.

Values are plain JSON (``allow_nan=False``, so the file stays readable by
any JSON tool), with markers for what JSON cannot say exactly: a NumPy
array or scalar is its dtype, shape and raw bytes in base64 (bit-exact,
NaN payloads and infinities included), a non-finite float its 8 bytes in
hex, a tuple a tagged list. Nothing is ever pickled, so reading a
checkpoint never runs code.

One run at a time per checkpoint: two runs appending to one file lose no
line (each is one ``O_APPEND`` write) but compute the same items twice.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import math
import os
import re
import struct
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from core.atomic import atomic_write
from core.errors import CrossoverError

FORMAT = "crossover-checkpoint"
VERSION = 1
ARRAY, FLOAT, TUPLE, DICT = "__ndarray__", "__float__", "__tuple__", "__dict__"
MARKERS = (ARRAY, FLOAT, TUPLE, DICT)
STORABLE = ("None, bool, int, float, str, lists, tuples, dicts with str keys and NumPy arrays or scalars "
            "(numbers, bools, strings; never objects)")
WHAT_TO_DO = "delete it to start afresh, or give another checkpoint path"
FIX_LINE = "delete that line to compute its item again, or delete the file to start afresh"
DIGEST = re.compile(r"[0-9a-f]{64}")  # a fingerprint: said to differ, not printed


class CheckpointError(CrossoverError, ValueError):
    """A checkpoint file is corrupt, belongs to another run, or was given a value it cannot store."""


class CheckpointWarning(UserWarning):
    """A checkpoint was repaired: its cut-off last line (a crash mid-write) was dropped."""


# -- values <-> JSON ---------------------------------------------------------------------------------


def encode(value: Any, where: str = "value") -> Any:
    """``value`` as plain JSON data that :func:`decode` turns back into an equal, bit-exact value.

    ``where`` names the value in the error raised for one that cannot be stored.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (np.ndarray, np.generic)):  # before float: np.float64 is a float
        return {ARRAY: _encode_array(value, where)}
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {FLOAT: struct.pack(">d", value).hex()}
    if isinstance(value, tuple):
        return {TUPLE: [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise CheckpointError(f"{where} has the key {bad[0]!r} ({type(bad[0]).__name__}): a checkpoint holds "
                                  f"{STORABLE}")
        encoded = {k: encode(v, f"{where}[{k!r}]") for k, v in value.items()}
        # a user's dict that looks like one of the markers is tagged, so that it decodes as a dict
        return {DICT: encoded} if len(encoded) == 1 and next(iter(encoded)) in MARKERS else encoded
    raise CheckpointError(f"{where} is a {type(value).__name__}: a checkpoint holds {STORABLE}")


def _encode_array(value: np.ndarray | np.generic, where: str) -> dict[str, Any]:
    array = np.asarray(value)
    if array.dtype.hasobject or array.dtype.kind == "V":
        raise CheckpointError(f"{where} is an array of dtype {array.dtype}: a checkpoint holds {STORABLE}")
    return {"dtype": array.dtype.str, "shape": list(array.shape), "scalar": isinstance(value, np.generic),
            "data": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")}


def decode(value: Any) -> Any:
    """The value :func:`encode` was given; raises ValueError, TypeError or KeyError on data it did not write."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (key, inner), = value.items()
        if key == ARRAY:
            return _decode_array(inner)
        if key == FLOAT:
            return struct.unpack(">d", bytes.fromhex(inner))[0]
        if key == TUPLE:
            return tuple(decode(v) for v in inner)
        if key == DICT:
            return {k: decode(v) for k, v in inner.items()}
    return {k: decode(v) for k, v in value.items()}


def _decode_array(fields: dict[str, Any]) -> np.ndarray | np.generic:
    dtype = np.dtype(fields["dtype"])
    if dtype.hasobject:
        raise ValueError(f"dtype {dtype} holds Python objects")
    raw = base64.b64decode(fields["data"], validate=True)
    array = np.frombuffer(raw, dtype=dtype).reshape(fields["shape"]).copy()  # a copy: writable, owns its memory
    return array[()] if fields["scalar"] else array


def _json_line(value: Any) -> bytes:
    return (json.dumps(value, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8")


def fingerprint(value: Any, where: str = "value") -> str:
    """A SHA-256 of ``value``'s canonical encoding: equal values (to the bit) give equal fingerprints."""
    text = json.dumps(encode(value, where), allow_nan=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_fingerprint(path: str | os.PathLike) -> str:
    """A SHA-256 of a file's bytes (read in 1 MiB pieces, so any size fits in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while piece := handle.read(2**20):
            digest.update(piece)
    return digest.hexdigest()


def callable_identity(fn: Any, field: str = "target") -> str:
    """A name for a function that is the same in every process and run, for a checkpoint's header.

    - a function or class found by its name, ``module:qualname``, as a
      worker or the next run would find it: defined at the top level of a
      module (a builtin or NumPy function, a method of a class there);
    - ``functools.partial``: its function's identity and a fingerprint of
      its bound arguments (values a checkpoint can store), so two partials
      of one function with other arguments are two runs;
    - anything else is refused with a :class:`CheckpointError` naming
      ``field``. Why refuse rather than guess: every lambda is named
      ``<lambda>`` and every closure a factory makes shares one name, so a
      second one would silently resume from the first one's results; and an
      object's ``repr`` holds its memory address, which changes every run,
      so it would never resume.
    """
    if isinstance(fn, functools.partial):
        inner = callable_identity(fn.func, field)
        bound = fingerprint((fn.args, dict(fn.keywords)), f"{field}'s functools.partial arguments")
        return f"functools.partial({inner}, arguments {bound[:16]})"
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if module is None and isinstance(getattr(fn, "__self__", None), type):  # a builtin classmethod: dict.fromkeys
        module = fn.__self__.__module__
    if not isinstance(qualname, str) or not isinstance(module, str):
        raise _unnamed(fn, field, f"a {type(fn).__name__!r} object has no name that stays the same from one run "
                                  f"to the next")
    if "<lambda>" in qualname:
        raise _unnamed(fn, field, "every lambda is named <lambda>, so another lambda would resume from its results")
    if "<locals>" in qualname:
        raise _unnamed(fn, field, f"{qualname} is defined inside a function, and every function that call makes "
                                  f"shares its name, so another would resume from its results")
    if not _found_by_name(fn, module, qualname):  # a bound method, or an object whose name another one holds
        raise _unnamed(fn, field, f"{module}.{qualname} names something else (a method bound to an object, or a "
                                  f"function replaced since), so the name does not identify it")
    return f"{module}:{qualname}"


def _found_by_name(fn: Any, module: str, qualname: str) -> bool:
    """Whether importing ``module`` and following ``qualname`` finds ``fn`` (as a worker, or the next run, would)."""
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    try:
        return found is fn or bool(found == fn)  # a classmethod is a new bound method at each lookup, equal to it
    except Exception:  # an == that cannot compare: not the same
        return False


def _unnamed(fn: Any, field: str, why: str) -> CheckpointError:
    return CheckpointError(f"{field}={fn!r} cannot be checkpointed: {why}; define it with def at the top level of a "
                           f"module (functools.partial of one is fine), or run without a checkpoint")


# -- the file ----------------------------------------------------------------------------------------


class Checkpoint:
    """An open checkpoint: the records of the items already finished, and :meth:`append` for new ones.

    Use :func:`open_checkpoint`; close it (or use it as a context manager)
    when the run ends, and :meth:`remove` it once the run's real output is
    safely written.
    """

    def __init__(self, path: Path, records: list[Any], descriptor: int):
        self.path = path
        self.records = records  # decoded, in file order (a retried item may appear more than once)
        self._descriptor: int | None = descriptor

    def append(self, record: Any, where: str = "record") -> None:
        """Add one finished item; it is on disk (fsync'd) when this returns.

        ``where`` names the record in the error raised for a value it cannot store.
        """
        line = _json_line(encode(record, where))  # encoded first: a value it cannot store writes nothing
        if self._descriptor is None:
            raise CheckpointError(f"checkpoint {self.path} is closed: open it again to append")
        size = os.fstat(self._descriptor).st_size
        try:
            view = memoryview(line)
            while view:  # one write in practice; a short write (full disk) goes on where it stopped
                view = view[os.write(self._descriptor, view):]
            os.fsync(self._descriptor)
        except BaseException as exc:
            # never leave half a line for the next append to glue onto
            try:
                os.ftruncate(self._descriptor, size)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise CheckpointError(f"checkpoint {self.path} cannot be appended to ({exc.strerror or exc}); the "
                                      f"items written before are kept") from None
            raise

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    def remove(self) -> None:
        """Close and delete the file: the run is done and its output is written."""
        self.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_checkpoint(path: str | os.PathLike, run: Mapping[str, Any]) -> Checkpoint:
    """Open (or create) the checkpoint of the run described by ``run``, ready to append.

    ``run`` is plain JSON data (str, int, float, bool) naming what makes two
    runs the same; a file written for a different ``run`` raises
    :class:`CheckpointError` naming each field that differs.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory: give the path of a file")
    run = dict(run)
    header = _json_line({"format": FORMAT, "version": VERSION, "run": encode(run, "run")})
    try:
        if not path.exists() or path.stat().st_size == 0:  # an empty file holds nothing to lose
            path.parent.mkdir(parents=True, exist_ok=True)
            _rewrite(path, header)
            records: list[Any] = []
        else:
            records = _load(path, run)
        return Checkpoint(path, records, os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path} cannot be written ({exc.strerror or exc}); give a checkpoint "
                              f"path in a directory you can write") from None


def _rewrite(path: Path, content: bytes) -> None:
    """Replace ``path`` by ``content`` atomically and durably (the data, then the rename)."""
    def write(temporary: str) -> None:
        with open(temporary, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())

    atomic_write(path, write)
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """Make a new file's name durable too (where directories can be opened: not on Windows)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _load(path: Path, run: dict[str, Any]) -> list[Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read ({exc.strerror or exc}); {WHAT_TO_DO}") from None
    lines = data.split(b"\n")
    cut = lines.pop()  # the bytes after the last newline: empty, unless a write was cut short
    if not lines:
        raise CheckpointError(f"checkpoint {path} is not a crossover checkpoint (no complete first line); "
                              f"{WHAT_TO_DO}")
    try:
        header = json.loads(lines[0])
    except ValueError:
        header = None  # some other file given as the checkpoint: refused below, never overwritten
    _check_header(path, header, run)
    records = [_record(path, line, number) for number, line in enumerate(lines[1:], start=2)]
    if cut:
        warnings.warn(f"checkpoint {path}: its last line was cut short (a run stopped while writing it); dropped "
                      f"it and kept the {len(records)} complete records", CheckpointWarning, stacklevel=_users_level())
        _rewrite(path, data[:len(data) - len(cut)])
    return records


def _users_level() -> int:
    """The stack level of the first caller outside crossover's core, so that a warning points at the user's call."""
    core = str(Path(__file__).resolve().parent)
    frame, level = sys._getframe(1), 1  # the function that warns is stack level 1
    while frame is not None and frame.f_code.co_filename.startswith(core):
        frame, level = frame.f_back, level + 1
    return level


def _parse(path: Path, line: bytes, number: int) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:  # UnicodeDecodeError is one
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        raise CheckpointError(f"checkpoint {path} is corrupt: line {number} is not JSON ({why}); {FIX_LINE}") from None


def _record(path: Path, line: bytes, number: int) -> Any:
    try:
        return decode(_parse(path, line, number))
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"checkpoint {path} is corrupt: line {number} does not decode ({exc}); {FIX_LINE}") \
            from None


def _check_header(path: Path, header: Any, run: dict[str, Any]) -> None:
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a crossover checkpoint (its first line is not a "
                              f"{FORMAT} header); {WHAT_TO_DO}")
    if header.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {header.get('version')!r}; this crossover "
                              f"reads version {VERSION}; {WHAT_TO_DO}")
    before = header.get("run")
    if not isinstance(before, dict):
        raise CheckpointError(f"checkpoint {path} is corrupt: its header has no run description; {WHAT_TO_DO}")
    now = encode(run, "run")
    differences = [_difference(key, before.get(key), now.get(key))
                   for key in sorted(set(before) | set(now)) if before.get(key) != now.get(key)]
    if differences:
        raise CheckpointError(f"checkpoint {path} belongs to another run ({'; '.join(differences)}); {WHAT_TO_DO}")


def _difference(key: str, before: Any, now: Any) -> str:
    if any(isinstance(v, str) and DIGEST.fullmatch(v) for v in (before, now)):
        return f"{key} differs"
    return f"{key}: {before!r} there, {now!r} here"
