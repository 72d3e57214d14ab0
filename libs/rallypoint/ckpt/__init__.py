"""Checkpoints for training processes: sharded, asynchronous, atomic; verified on load.

Import-light on purpose (standard library; numpy only when a state is saved or loaded): it runs inside
user training processes. See docs/training-client.md for the contract.
"""

from .client import Checkpointer
from .manifest import FORMAT, MANIFEST, VerifyResult, list_steps, step_dir, verify_checkpoint

__all__ = [
    "FORMAT",
    "MANIFEST",
    "Checkpointer",
    "VerifyResult",
    "list_steps",
    "step_dir",
    "verify_checkpoint",
]
