"""Job specs: validation shared by API and CLI, and launch plans. Pure."""

from .launch import launch_plan, master_port, rank_environment
from .text import SpecError, check_strings, check_text, text_fault
from .validate import (
    DEFAULT_MAX_GPUS_PER_NODE,
    DEFAULT_PRIORITY,
    PRIORITY_CLASSES,
    TOPOLOGY_LEVELS,
    check_checkpoint_dir,
    check_fits_cluster,
    check_idempotency_key,
    job_id_for,
    new_job_id,
    validate_spec,
)

__all__ = [
    "DEFAULT_MAX_GPUS_PER_NODE",
    "DEFAULT_PRIORITY",
    "PRIORITY_CLASSES",
    "TOPOLOGY_LEVELS",
    "SpecError",
    "check_checkpoint_dir",
    "check_fits_cluster",
    "check_idempotency_key",
    "check_strings",
    "check_text",
    "job_id_for",
    "launch_plan",
    "master_port",
    "new_job_id",
    "rank_environment",
    "text_fault",
    "validate_spec",
]
