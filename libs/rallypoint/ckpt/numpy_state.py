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
from pathlib import Path
from typing import IO, Any

from .files import write_atomic_with
from .manifest import shard_name

State = dict[str, Any]
SUFFIX = "npz"
_PLAIN = "__plain__"


def copy_state(state: State) -> State:
    """A private copy, taken on the training path so the loop may change its arrays right after."""
    if not isinstance(state, dict) or not all(isinstance(key, str) for key in state):
        raise TypeError("a checkpoint state is a dict with str keys")
    # No numpy in the process means no arrays in the state: skip the import.
    np = sys.modules.get("numpy")
    copied: State = {}
    plain: State = {}
    for key, value in state.items():
        if np is not None and isinstance(value, np.ndarray | np.generic):
            copied[key] = _copy_array(np, key, value)
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


def _copy_array(np: Any, key: str, value: Any) -> Any:
    array = np.array(value, copy=True)
    if array.dtype.hasobject:
        raise TypeError(f"cannot checkpoint {key!r}: arrays of Python objects need pickle")
    return array


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

    def copy(self, state: State) -> State:
        return copy_state(state)

    def write(self, folder: Path, rank: int, state: State) -> list[str]:
        name = shard_name(rank, SUFFIX)
        write_atomic_with(folder / name, lambda handle: write_state(handle, state))
        return [name]
