"""Rallypoint services, installed as ``rallypoint_services``: one folder per deployable service.

Services import ``rallypoint`` (libs/), never each other: they talk only through the event log.
"""
