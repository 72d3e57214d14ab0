"""Job specs: validation shared by API and CLI, and launch plans. Pure."""

from typing import TYPE_CHECKING, Any

from .validate import (
    DEFAULT_MAX_GPUS_PER_NODE,
    PRIORITY_CLASSES,
    TOPOLOGY_LEVELS,
    SpecError,
    check_fits_cluster,
    check_idempotency_key,
    job_id_for,
    new_job_id,
    validate_spec,
)

if TYPE_CHECKING:
    from .launch import launch_plan, master_port, rank_environment

# launch.py imports rallypoint.agent.protocol, and rallypoint.agent's package imports its launcher,
# which imports launch.py: importing launch here eagerly made `import rallypoint.jobs` fail whenever it
# came before `import rallypoint.agent`. Resolved on first use instead, so validation (API, CLI) never
# depends on the agent package's import order.
_LAUNCH_NAMES = frozenset({"launch_plan", "master_port", "rank_environment"})


def __getattr__(name: str) -> Any:
    if name in _LAUNCH_NAMES:
        from . import launch

        return getattr(launch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_MAX_GPUS_PER_NODE",
    "PRIORITY_CLASSES",
    "TOPOLOGY_LEVELS",
    "SpecError",
    "check_fits_cluster",
    "check_idempotency_key",
    "job_id_for",
    "launch_plan",
    "master_port",
    "new_job_id",
    "rank_environment",
    "validate_spec",
]
