"""Controllers that act on decisions: pure reconcile logic, driven by service shells."""

from .reconcile import Action, Append, Kill, Launch, msg_id_for, owned_by, reconcile, subject_for

__all__ = ["Action", "Append", "Kill", "Launch", "msg_id_for", "owned_by", "reconcile", "subject_for"]
