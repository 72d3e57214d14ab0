"""A fleet of simulated nodes hears its own nodes' commands only, as each node's agent does: two fleets on
two connections, a command to a node of one reaches that one alone, a node nobody serves has no
responders, and a verb a virtual rank cannot serve gets an answer that says so."""

from __future__ import annotations

import msgspec
import nats.errors
import pytest

from rallypoint.agent.fleet import Fleet, SimNode
from rallypoint.eventlog import EventLog
from rallypoint.events import subjects
from rallypoint.infra.nats_server import NatsServer
from rallypoint.protocol import StatusReply

pytestmark = pytest.mark.asyncio


async def _started(log: EventLog, prefix: str) -> Fleet:
    fleet = Fleet(log, [SimNode(f"{prefix}-{i}", "rack-1", 8) for i in range(3)], heartbeat_interval_s=60)
    await fleet.start()
    return fleet


async def test_each_fleet_answers_its_own_nodes_alone(event_log: EventLog, nats_server: NatsServer) -> None:
    other_log = await EventLog.connect(nats_server.url, name="fleet-b", create=False)
    first, second = await _started(event_log, "a"), await _started(other_log, "b")
    nc = event_log.nc
    try:
        heard_before = other_log.nc.stats["in_msgs"]
        for node in ("a-0", "a-2"):
            answer = await nc.request(subjects.agent_command(node, "status"), b"", timeout=5)
            assert msgspec.json.decode(answer.data, type=StatusReply).node_id == node
        await other_log.nc.flush()
        assert other_log.nc.stats["in_msgs"] == heard_before  # the other fleet heard none of them

        answer = await nc.request(subjects.agent_command("b-1", "status"), b"", timeout=5)
        assert msgspec.json.decode(answer.data, type=StatusReply).node_id == "b-1"

        with pytest.raises(nats.errors.NoRespondersError):
            await nc.request(subjects.agent_command("c-0", "status"), b"", timeout=5)

        refused = msgspec.json.decode((await nc.request(subjects.agent_command("a-1", "logs"), b"")).data)
        assert refused == {"ok": False, "error": "a simulated node does not serve 'logs'"}
    finally:
        await first.close()
        await second.close()
        await other_log.close()
