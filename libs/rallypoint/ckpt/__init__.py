"""Checkpoints for training processes: sharded, asynchronous, atomic; verified on load.

Import-light on purpose (standard library; numpy only when a state is saved or loaded, torch only in
``rallypoint.ckpt.torch_dcp``): it runs inside user training processes. docs/training-client.md has the
contract.
"""

from .client import Checkpointer, Loaded, ShardCodec
from .manifest import FORMAT, MANIFEST, VerifyResult, list_steps, step_dir, verify_checkpoint

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
