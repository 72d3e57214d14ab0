"""Job specs: validation shared by API and CLI, and launch plans. Pure."""

from .launch import launch_plan, master_port, rank_environment

__all__ = ["launch_plan", "master_port", "rank_environment"]
