"""A rank's state as one ``.npz`` file: numpy arrays, bytes and JSON values, no pickle.

A state is a dict of name -> ``numpy.ndarray`` (or numpy scalar, which loads back as a 0-d array),
``bytes`` (or bytearray / memoryview, which load back as bytes) or a JSON value (None, bool, int,
float, str, list, dict). Inside the archive arrays are ``a/<name>``, bytes ``b/<name>`` and every JSON
value is in one ``__plain__`` entry. numpy is imported only when a state is written or read, so a
process that never saves arrays never pays for it.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import IO, Any

from .files import write_atomic_with
from .manifest import shard_name

State = dict[str, Any]
SUFFIX = "npz"
_PLAIN = "__plain__"


def copy_state(state: State, pool: BufferPool | None = None) -> State:
    """A private copy, taken on the training path so the loop may change its arrays right after.
    Arrays are copied into ``pool``'s buffers when it has some of the right shape (no page faults)."""
    if not isinstance(state, dict) or not all(isinstance(key, str) for key in state):
        raise TypeError("a checkpoint state is a dict with str keys")
    # No numpy in the process means no arrays in the state: skip the import.
    np = sys.modules.get("numpy")
    copied: State = {}
    plain: State = {}
    for key, value in state.items():
        if np is not None and isinstance(value, np.ndarray | np.generic):
            copied[key] = _copy_array(np, key, value, pool)
        elif isinstance(value, bytes | bytearray | memoryview):
            copied[key] = bytes(value)
        else:
            plain[key] = value
    # A JSON round trip copies and validates in one go: a value we cannot store fails here, in the
    # caller's thread, and not later in the writer.
    try:
        copied.update(json.loads(json.dumps(plain, allow_nan=True)))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot checkpoint {exc}: use numpy arrays, bytes or JSON values") from None
    return copied


def _copy_array(np: Any, key: str, value: Any, pool: BufferPool | None) -> Any:
    source = np.asarray(value)
    if source.dtype.hasobject:
        raise TypeError(f"cannot checkpoint {key!r}: arrays of Python objects need pickle")
    target = pool.take(np, key, source) if pool is not None else np.empty_like(source)
    np.copyto(target, source)
    return target


class BufferPool:
    """Copy buffers kept between saves, per state key: writing into memory already mapped is several
    times faster than a fresh allocation, and the copy is all the loop waits for. Holds at most
    ``per_key`` buffers per key (one per save in flight); a buffer of another shape is dropped."""

    def __init__(self, per_key: int = 2) -> None:
        self.per_key = per_key
        self._free: dict[str, list[Any]] = {}
        self._lock = threading.Lock()  # taken in the loop's thread, given back by the writer

    def take(self, np: Any, key: str, like: Any) -> Any:
        with self._lock:
            free = self._free.get(key, [])
            while free:
                buffer = free.pop()
                if buffer.shape == like.shape and buffer.dtype == like.dtype:
                    return buffer
        return np.empty(like.shape, like.dtype)

    def give_back(self, state: State) -> None:
        np = sys.modules.get("numpy")
        if np is None:
            return
        with self._lock:
            for key, value in state.items():
                free = self._free.setdefault(key, [])
                if isinstance(value, np.ndarray) and value.ndim > 0 and len(free) < self.per_key:
                    free.append(value)


def write_state(handle: IO[bytes], state: State) -> None:
    """``state`` (a copy from ``copy_state``) as an npz archive into an open file."""
    import numpy as np

    plain = {k: v for k, v in state.items() if not isinstance(v, bytes | np.ndarray)}
    entries: dict[str, Any] = {_PLAIN: np.frombuffer(json.dumps(plain).encode(), dtype=np.uint8)}
    for key, value in state.items():
        if isinstance(value, bytes):
            entries[f"b/{key}"] = np.frombuffer(value, dtype=np.uint8)
        elif isinstance(value, np.ndarray):
            entries[f"a/{key}"] = value
    np.savez(handle, **entries)  # object arrays were refused in copy_state: nothing here needs pickle


def read_state(path: Path) -> State:
    """The state saved in ``path``; ValueError if it is not one of ours."""
    import numpy as np

    with np.load(path, allow_pickle=False) as archive:
        if _PLAIN not in archive.files:
            raise ValueError(f"{path} holds no rallypoint state")
        state: State = json.loads(archive[_PLAIN].tobytes())
        for key in archive.files:
            if key.startswith("a/"):
                state[key[2:]] = archive[key]
            elif key.startswith("b/"):
                state[key[2:]] = archive[key].tobytes()
    return state


class NumpyCodec:
    """The default shard codec: one ``rank-<r>.npz`` per rank (see ``client.ShardCodec``)."""

    def __init__(self, max_in_flight: int = 2) -> None:
        self.pool = BufferPool(per_key=max_in_flight)

    def copy(self, state: State) -> State:
        return copy_state(state, self.pool)

    def write(self, folder: Path, rank: int, state: State) -> list[str]:
        name = shard_name(rank, SUFFIX)
        try:
            write_atomic_with(folder / name, lambda handle: write_state(handle, state))
        finally:
            self.pool.give_back(state)  # written (or failed): the next save may copy into these
        return [name]
