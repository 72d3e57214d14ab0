"""`rally serve checkpoint`: follows the log and keeps the shared state.

Its decisions (manifests, verification, garbage collection) arrive with a later issue.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.following import with_follower

_log = logging.getLogger("rallypoint.checkpoint")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rally serve checkpoint", description=__doc__)
    add_common_args(parser)
    args = parser.parse_args(argv)
    config = ServiceConfig.from_args("checkpoint", args)

    async def run(ctx: ServiceContext) -> int:
        async def idle(follower: Follower) -> None:
            _log.info("following the log from seq %d", follower.state.last_seq)
            await ctx.stop.wait()

        return await with_follower(ctx, idle)

    return run_service(run, config)
