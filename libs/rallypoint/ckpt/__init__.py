"""Checkpoints for training processes: sharded, asynchronous, atomic; verified on load.

Import-light on purpose (standard library; numpy only when a state is saved or loaded, torch only in
``rallypoint.ckpt.torch_dcp``): it runs inside user training processes. docs/training-client.md has the
contract.

The names below are imported on first use (PEP 562): the rank wrapper imports ``ckpt.files`` alone, once
per rank, and importing the client with it took ~30 ms of every rank's start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rallypoint.lazyexports import lazy_exports

if TYPE_CHECKING:
    from .client import Checkpointer, Loaded, ShardCodec
    from .manifest import FORMAT, MANIFEST, VerifyResult, list_steps, step_dir, verify_checkpoint

#: Each public name -> the module of this package that defines it.
_HOMES = {
    "FORMAT": ".manifest",
    "MANIFEST": ".manifest",
    "Checkpointer": ".client",
    "Loaded": ".client",
    "ShardCodec": ".client",
    "VerifyResult": ".manifest",
    "list_steps": ".manifest",
    "step_dir": ".manifest",
    "verify_checkpoint": ".manifest",
}

__all__ = [
    "FORMAT",
    "MANIFEST",
    "Checkpointer",
    "Loaded",
    "ShardCodec",
    "VerifyResult",
    "list_steps",
    "step_dir",
    "verify_checkpoint",
]


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
