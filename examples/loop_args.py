"""The command line every example training loop takes (one definition for all of them)."""

from __future__ import annotations

import argparse


def loop_parser(doc: str | None, *, steps: int, step_time: float, ckpt_every: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=steps, help="train until this step")
    parser.add_argument("--step-time", type=float, default=step_time, help="extra seconds per step")
    parser.add_argument("--ckpt-every", type=int, default=ckpt_every, help="save every N steps")
    return parser
