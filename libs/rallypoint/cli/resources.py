"""Argument types of `rally submit`'s resource flags: ``--cpus``, ``--memory`` and ``--gpu-fraction``.

Each turns what a user types into the unit the job spec carries (millicores, MiB, thousandths of a GPU) and
refuses anything else with a message argparse prints before it exits 2.
"""

from __future__ import annotations

import argparse
import math
import re

__all__ = [
    "add_taint_arg",
    "parse_affinity",
    "parse_anti_affinity",
    "parse_cpus",
    "parse_gpu_fraction",
    "parse_gpu_indices",
    "parse_label",
    "parse_memory",
    "parse_taint",
]

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_CPUS = re.compile(rf"^{_NUMBER}(m?)$")
_MEMORY = re.compile(rf"^{_NUMBER}\s*([kmgtp]?)(i?b?)$")
# MiB per unit: K, M, G, T, P; decimal (G) and binary (Gi) suffixes both mean the binary unit, as Slurm's
# --mem and most users mean it
_MIB_PER = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024**2, "p": 1024**3}


def parse_cpus(text: str) -> int:
    """Millicores from ``4`` or ``0.5`` (cores) or ``500m`` (millicores, as Kubernetes writes them)."""
    match = _CPUS.match(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a CPU amount: {text!r} (try 4, 0.5 or 500m)")
    value = float(match.group(1))
    milli = value if match.group(2) else value * 1000
    if milli != math.floor(milli):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of millicores")
    return int(milli)


def parse_memory(text: str) -> int:
    """MiB from ``32G``, ``32GiB``, ``512M``, ``1.5T`` or a plain number of MiB; rounded up to a whole MiB."""
    match = _MEMORY.match(text.strip().lower())
    if match is None or (match.group(3) and not match.group(2)):
        raise argparse.ArgumentTypeError(f"not a memory size: {text!r} (try 32G, 512M or 1.5T)")
    return math.ceil(float(match.group(1)) * _MIB_PER[match.group(2)])


def parse_gpu_fraction(text: str) -> int:
    """Thousandths of one GPU from a fraction between 0 and 1 (``0.25``) or a percentage (``25%``)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a GPU fraction: {text!r} (try 0.25 or 25%)") from None
    milli = round(value * 1000)
    if not 0 < value < 1 or not 1 <= milli <= 999:
        raise argparse.ArgumentTypeError(
            f"a GPU fraction is between 0.001 and 0.999, got {text!r} (a whole GPU: --gpus 1)"
        )
    return milli


def parse_gpu_indices(text: str) -> tuple[int, ...]:
    """GPU indices from ``6,7`` (sorted, each once): the GPUs a node runs in MIG mode."""
    try:
        indices = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"want GPU indices like 6,7; got {text!r}") from None
    if any(i < 0 for i in indices):
        raise argparse.ArgumentTypeError(f"GPU indices are >= 0; got {text!r}")
    return indices


def parse_label(text: str) -> tuple[str, str]:
    """``KEY=VALUE``: a node label (the agent's ``--label``) or one a job selects (``--node-selector``)."""
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"want KEY=VALUE, got {text!r}")
    return key, value


def parse_affinity(text: str) -> dict[str, object]:
    """``GROUP[:node|rack]``: an affinity rule (``--affinity``), node level unless said."""
    group, _sep, level = text.partition(":")
    if not group or level not in ("", "node", "rack"):
        raise argparse.ArgumentTypeError(f"want GROUP, GROUP:node or GROUP:rack; got {text!r}")
    return {"group": group, "level": level or "node"}


def parse_anti_affinity(text: str) -> dict[str, object]:
    """``GROUP[:node|rack]``: an anti-affinity rule (``--anti-affinity``)."""
    return {**parse_affinity(text), "anti": True}


def add_taint_arg(parser: argparse.ArgumentParser, what: str) -> None:
    """``--taint KEY[=VALUE]`` (repeatable) on ``parser``; ``what`` says whose taint it is."""
    parser.add_argument(
        "--taint",
        type=parse_taint,
        action="append",
        default=[],
        metavar="KEY[=VALUE]",
        help=f"{what} (repeatable): only jobs with a matching --toleration run on the node, "
        "e.g. dedicated=inference",
    )


def parse_taint(text: str) -> str:
    """``KEY[=VALUE]``: a node's taint (the agent's ``--taint``), checked as the API checks tolerations."""
    from rallypoint.jobs.placement_rules import TAINT_PATTERN  # (lazy: the CLI's start stays light)

    if not TAINT_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"want KEY or KEY=VALUE (letters, digits, '.', '_', '/', '-'); got {text!r}"
        )
    return text
