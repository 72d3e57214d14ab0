"""The agent's side of interactive sessions (``agent.terminal``) on a real NATS server and real ranks on
ptys: what the API sees on ``tty.<node>.<session>`` for what it sends, a takeover, the info answer, a
forward refused for a port the job does not publish, and a terminal hung up when its client never came
back and no API ended it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client

from rallypoint.agent import RankLauncher, terminal
from rallypoint.agent.terminal import TerminalRelay
from rallypoint.eventlog import EventLog
from rallypoint.events import subjects
from rallypoint.interactive import frames
from rallypoint.protocol import LaunchTask, RankSpec, TerminalRequest

NODE = "tty-node"


def shell_task(job_id: str, command: list[str], *, ports: tuple[int, ...] = ()) -> LaunchTask:
    return LaunchTask(
        job_id=job_id, attempt=1, node_id=NODE, node_rank=0, world_size=1, local_world_size=1,
        master_addr="127.0.0.1", master_port=29500, ranks=(RankSpec(rank=0, local_rank=0, gpus=(0,)),),
        command=tuple(command), pty=True, ports=ports,
    )  # fmt: skip


@pytest.fixture
async def relay(event_log: EventLog, tmp_path: Path) -> AsyncIterator[TerminalRelay]:
    launcher = RankLauncher(tmp_path / "work")
    relay = TerminalRelay(event_log.nc, NODE, launcher, keepalive_timeout_s=60.0)
    relay.start()
    try:
        yield relay
    finally:
        await relay.close()
        for status in launcher.status():
            launcher.kill(status.job_id, status.attempt, grace_s=0.0)


class Client_:
    """The API's end of one session: the frames the agent sent, and keys sent to it."""

    def __init__(self, nc: Client, session: str) -> None:
        self.nc, self.session = nc, session
        self.frames: asyncio.Queue[frames.Frame] = asyncio.Queue()

    async def subscribe(self) -> None:
        async def got(msg: object) -> None:
            self.frames.put_nowait(frames.decode(msg.data))  # type: ignore[attr-defined]

        await self.nc.subscribe(subjects.terminal_output(NODE, self.session), cb=got)

    async def send(self, frame: bytes) -> None:
        await self.nc.publish(subjects.terminal_input(NODE, self.session), frame)

    async def until(self, kind: bytes, text: bytes = b"", timeout: float = 15.0) -> bytes:
        """The output up to the first ``kind`` frame (whose payload holds ``text``)."""
        seen = b""
        deadline = time.monotonic() + timeout
        while True:
            frame = await asyncio.wait_for(self.frames.get(), deadline - time.monotonic())
            seen += frame.payload if frame.kind == frames.DATA else b""
            if frame.kind == kind and (text in seen if kind == frames.DATA else text in frame.payload):
                return seen if kind == frames.DATA else frame.payload


async def start(relay: TerminalRelay, task: LaunchTask) -> None:
    await asyncio.to_thread(relay.launcher.launch, task)
    deadline = time.monotonic() + 15
    while await asyncio.to_thread(relay.launcher.terminal_path, task.job_id, 1, 0) is None:
        assert time.monotonic() < deadline, "the rank's terminal never came up"
        await asyncio.sleep(0.05)


async def open_session(relay: TerminalRelay, job_id: str, session: str, **extra: object) -> Client_:
    client = Client_(relay.nc, session)
    await client.subscribe()
    request = TerminalRequest(op="open", job_id=job_id, attempt=1, rank=0, session=session, **extra)  # type: ignore[arg-type]
    reply = await relay.handle(request)
    assert reply.ok, reply.error
    return client


async def test_keys_output_takeover_and_exit(relay: TerminalRelay) -> None:
    await start(relay, shell_task("j-tty", ["sh", "-c", "read a; echo got=$a; read b; exit 4"]))
    first = await open_session(relay, "j-tty", "s1")
    await first.send(frames.data(b"one\r"))
    assert b"got=one" in await first.until(frames.DATA, b"got=one")
    second = await open_session(relay, "j-tty", "s2")
    assert "attached elsewhere" in (await first.until(frames.CLOSED)).decode()
    assert b"got=one" in await second.until(frames.DATA, b"got=one")  # the recent output, replayed
    assert (await relay.handle(TerminalRequest(op="info", job_id="j-tty", attempt=1, rank=0))).attached
    await second.send(frames.data(b"two\r"))
    status = await second.until(frames.EXIT)
    assert frames.status(frames.Frame(frames.EXIT, status)) == 4
    assert not (await relay.handle(TerminalRequest(op="info", job_id="j-tty", attempt=1, rank=0))).attached


async def test_a_port_the_job_does_not_publish_is_refused(relay: TerminalRelay) -> None:
    await start(relay, shell_task("j-web", ["sh", "-c", "sleep 30"], ports=(18888,)))
    ask = TerminalRequest(op="forward", job_id="j-web", attempt=1, rank=0, session="f1", port=18889)
    assert "does not publish port 18889" in (await relay.handle(ask)).error
    published = msgspec.structs.replace(ask, port=18888)
    assert "nothing listens on port 18888" in (await relay.handle(published)).error


async def test_a_terminal_left_alone_past_its_grace_is_hung_up(
    relay: TerminalRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(terminal, "HANGUP_MARGIN_S", 0.0)
    await start(relay, shell_task("j-gone", ["sh", "-c", "trap 'exit 129' HUP; sleep 60 & wait"]))
    client = await open_session(relay, "j-gone", "s3", grace_s=0.5)
    await client.send(frames.closed("the client went away"))  # as the API says when its WebSocket closes
    deadline = time.monotonic() + 15
    exits: list[object] = []
    while not exits:
        assert time.monotonic() < deadline, "the detached terminal was never hung up"
        exits = await asyncio.to_thread(relay.launcher.poll)
        await asyncio.sleep(0.1)
    assert [e.exit_code for e in exits] == [129]  # type: ignore[attr-defined]
    log = relay.launcher.log_path("j-gone", 1, 0).read_text()
    assert "left without a session for 0.5 s; hanging up" in log
