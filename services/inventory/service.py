"""`rally serve inventory`: the live node, GPU and topology view, answered on ``q.inventory.nodes``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import msgspec
from nats.aio.msg import Msg

from rallypoint.events import subjects
from rallypoint.inventory import inventory_view
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.cohost import Hosted
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.following import with_follower
from rallypoint.runtime.health import add_health_check


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(*prepare(argv))


def prepare(argv: Sequence[str] | None = None) -> Hosted:
    """The service's main coroutine and configuration from its arguments: run alone (``main``) or
    hosted with others in one process (``rally serve host``, ``runtime.cohost``)."""
    parser = argparse.ArgumentParser(prog="rally serve inventory", description=__doc__)
    add_common_args(parser)
    args = parser.parse_args(argv)
    config = ServiceConfig.from_args("inventory", args)

    async def run(ctx: ServiceContext) -> int:
        nc = await ctx.nats()
        answering = False
        # /readyz stays 503 until queries are answered: a probe that passes earlier sends a query nobody hears
        add_health_check(ctx, lambda: [] if answering else ["not answering queries yet"], degraded=True)

        async def serve(follower: Follower) -> None:
            async def answer(msg: Msg) -> None:
                await msg.respond(msgspec.json.encode(inventory_view(follower.state)))

            # A queue group: any number of inventory replicas share the queries.
            await nc.subscribe(subjects.query("inventory", "nodes"), queue="inventory", cb=answer)
            await nc.flush()  # the server has the subscription before readiness says so
            nonlocal answering
            answering = True
            await ctx.stop.wait()

        return await with_follower(ctx, serve)

    return run, config
