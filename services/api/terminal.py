"""GET /v1/jobs/{job_id}/terminal: an interactive job's terminal over a WebSocket (``rally run --pty``).

The caller is authenticated like every call (``Authorization: Bearer``) and must act for the job's team,
else the job does not exist for it (404, as everywhere). The API never reaches the node: it asks the
rank's agent over core NATS to open a session (``cmd.agent.<node>.tty``), then relays frames
(``rallypoint.interactive.frames``) both ways: the client's binary messages to
``cmd.agent.<node>.tty.<session>``, the agent's ``tty.<node>.<session>`` messages to the client.

How a session ends, and what the job's end records (``JobCancelRequested.reason``):

- the rank exits: an ``EXIT`` frame, and the job ends with the rank's status (the shell's ``exit 3``);
- the client goes away: the terminal stays, detached; after the team's disconnect grace
  (``interactive_disconnect_grace_s``, queue file) the job is cancelled unless a session is attached
  again by then (``rally attach``, through any API replica: the agent answers whether one is);
- nothing typed and nothing printed for the team's idle timeout (``interactive_idle_timeout_s``): the
  client gets a ``CLOSED`` frame saying so, and the job is cancelled.

While the client is connected the API sends the agent a keepalive every ``KEEPALIVE_S``; an agent that
hears none for a while detaches the session (an API replica that died with its WebSockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import WSMsgType, web
from nats.aio.subscription import Subscription

from rallypoint.eventlog import EventLog, LogUnavailable
from rallypoint.events import JobCancelRequested, subjects
from rallypoint.events.subjects import TOKEN_PATTERN
from rallypoint.interactive import frames
from rallypoint.jobs import SpecError
from rallypoint.protocol import TerminalReply, TerminalRequest
from rallypoint.scheduling.queues import Queues
from rallypoint.state import JobView

from .auth import not_theirs, principal
from .fold import FoldFollower
from .history_openapi import _JOB_ID, _problem, _query
from .history_views import rank_node
from .problems import invalid_spec, not_found, problem, unavailable

_log = logging.getLogger("rallypoint.api.terminal")

DEFAULT_IDLE_TIMEOUT_S = 3600.0
DEFAULT_DISCONNECT_GRACE_S = 60.0
KEEPALIVE_S = 5.0
AGENT_TIMEOUT_S = 5.0
_json = msgspec.json.Encoder()


def session_limits(queues: Queues | None, team: str) -> tuple[float, float]:
    """The team's idle timeout and disconnect grace, in seconds (its own, its org's, else the defaults)."""
    if queues is None:
        return DEFAULT_IDLE_TIMEOUT_S, DEFAULT_DISCONNECT_GRACE_S
    idle = queues.inherited(team, "interactive_idle_timeout_s")
    grace = queues.inherited(team, "interactive_disconnect_grace_s")
    return (
        float(idle) if idle is not None else DEFAULT_IDLE_TIMEOUT_S,
        float(grace) if grace is not None else DEFAULT_DISCONNECT_GRACE_S,
    )


class TerminalHandlers:
    def __init__(self, log: EventLog, follower: FoldFollower, queues: Queues | None, source: str) -> None:
        self.log = log
        self.follower = follower
        self.queues = queues
        self.source = source
        self._graces: set[asyncio.Task[None]] = set()

    def _target(self, request: web.Request, kind: str | None) -> tuple[JobView, int, str] | web.Response:
        """The job, rank and node a terminal or port request reaches, or the problem why not."""
        job_id = request.match_info["job_id"]
        job = self.follower.state.jobs.get(job_id) if TOKEN_PATTERN.match(job_id) else None
        if job is None:
            return not_found("job", job_id)
        if (refused := not_theirs(request, job)) is not None:
            return refused
        if (wrong := _not_live(job, kind)) is not None:
            return wrong
        try:
            rank = int(request.query.get("rank", "0"))
        except ValueError:
            rank = -1
        node_id = rank_node(job, job.placements, rank) if rank >= 0 else None
        if node_id is None:
            return invalid_spec_rank(rank, job)
        return job, rank, node_id

    async def terminal(self, request: web.Request) -> web.StreamResponse:
        target = self._target(request, "interactive")
        if isinstance(target, web.Response):
            return target
        job, rank, node_id = target
        job_id = job.job_id
        ws = _websocket(request)
        if isinstance(ws, web.Response):
            return ws
        attempt, session = job.attempt, secrets.token_hex(8)
        idle_s, grace_s = session_limits(self.queues, job.spec.team)
        ask = TerminalRequest(
            op="open", job_id=job_id, attempt=attempt, rank=rank, session=session, grace_s=grace_s
        )
        output = await self._open(node_id, ask)
        if isinstance(output, web.Response):
            return output
        await ws.prepare(request)
        relay = _Relay(self.log, ws, output, node_id, session, idle_s, lambda: self._gone(job_id, attempt))
        ended = await relay.run()
        if ended == "gone":  # the fold says the rank is gone, which its lost node could not tell
            if relay.why_gone.startswith("lost"):
                await self._cancel(job, f"interactive session {relay.why_gone}", "interactive")
            await relay.close(relay.why_gone)
            await relay.detach()
            return ws
        if ended == "idle":  # cancelled before the client hears it: what it reads next is the cancel
            await self._cancel(job, f"interactive session idle for {idle_s:g} s", principal(request).user)
            await relay.close(f"idle for {idle_s:g} s: the session ends and its job is cancelled")
            await relay.detach()
            return ws
        await relay.close()
        if not relay.exited:
            # the client left, or the agent closed the session: taken over by another attach (the grace
            # then finds it attached), or the agent stopping (the user has the grace to attach again)
            if ended == "client":
                await relay.detach()
            task = asyncio.create_task(self._after_grace(job, attempt, rank, node_id, grace_s))
            self._graces.add(task)
            task.add_done_callback(self._graces.discard)
        return ws

    async def port(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/jobs/{id}/ports/{port}: one TCP connection to a port the job publishes, as a WebSocket
        of ``DATA`` frames (``rally port-forward`` opens one per local connection)."""
        target = self._target(request, None)
        if isinstance(target, web.Response):
            return target
        job, rank, node_id = target
        port = request.match_info["port"]
        if not port.isdigit() or int(port) not in job.spec.ports:
            published = ", ".join(map(str, job.spec.ports)) or "none"
            detail = f"job {job.job_id} does not publish port {port} (its ports: {published})"
            return problem(409, "Port not published", detail, slug="port-not-published")
        ws = _websocket(request)
        if isinstance(ws, web.Response):
            return ws
        ask = TerminalRequest(
            op="forward", job_id=job.job_id, attempt=job.attempt, rank=rank, session=secrets.token_hex(8),
            port=int(port),
        )  # fmt: skip
        output = await self._open(node_id, ask)
        if isinstance(output, web.Response):
            return output
        await ws.prepare(request)
        relay = _Relay(self.log, ws, output, node_id, ask.session, math.inf)
        ended = await relay.run()
        await relay.close()
        if ended == "client":  # the agent closes its connection to the port
            await relay.detach()
        return ws

    def _gone(self, job_id: str, attempt: int) -> str:
        """Why the session's rank no longer runs, as the fold tells it ("": it runs). An attempt that moved
        on lost its node: its shell is gone, and a new one would not be the one the user had."""
        job = self.follower.state.jobs.get(job_id)
        if job is None or job.terminal:
            return f"the job ended ({job.state if job else 'gone'})"
        if job.attempt != attempt:
            return f"lost its node: attempt {attempt} ended (the job is cancelled, as srun's would be)"
        return ""

    async def close(self) -> None:
        for task in list(self._graces):
            task.cancel()

    async def _open(self, node_id: str, ask: TerminalRequest) -> Subscription | web.Response:
        """Ask the agent to open ``ask``'s session; its output's subscription, or the problem why not. The
        subscription comes first, so the first output (a prompt, a server's greeting) is not missed."""
        output = await self.log.nc.subscribe(subjects.terminal_output(node_id, ask.session))
        reply = await self._ask(node_id, ask)
        if reply is not None and reply.ok:
            return output
        await output.unsubscribe()
        if reply is None:
            return unavailable(f"the agent of {node_id} did not answer; retry")
        return problem(502, "Agent refused", reply.error, slug="agent-error", node_id=node_id)

    async def _ask(self, node_id: str, ask: TerminalRequest) -> TerminalReply | None:
        try:
            msg = await self.log.nc.request(
                subjects.agent_command(node_id, "tty"), _json.encode(ask), timeout=AGENT_TIMEOUT_S
            )
            return msgspec.json.decode(msg.data, type=TerminalReply)
        except Exception as exc:  # no responders, a timeout, a garbled reply: the agent cannot answer now
            _log.warning("the agent of %s did not answer %s (%s)", node_id, ask.op, type(exc).__name__)
            return None

    async def _after_grace(self, job: JobView, attempt: int, rank: int, node_id: str, grace_s: float) -> None:
        """Cancel the job ``grace_s`` after its client left, unless it ended, moved on or was reattached."""
        await asyncio.sleep(grace_s)
        current = self.follower.state.jobs.get(job.job_id)
        if current is None or current.terminal or current.attempt != attempt:
            return
        info = await self._ask(
            node_id, TerminalRequest(op="info", job_id=job.job_id, attempt=attempt, rank=rank)
        )
        if info is not None and info.attached:
            return
        await self._cancel(current, f"interactive session disconnected for {grace_s:g} s", "interactive")

    async def _cancel(self, job: JobView, reason: str, who: str) -> None:
        event = JobCancelRequested(job_id=job.job_id, at=time.time(), requested_by=who, reason=reason)
        try:
            seq = await self.log.append(
                subjects.job(job.job_id), event, msg_id=f"{job.job_id}:cancel", source=self.source
            )
        except LogUnavailable as exc:
            _log.error("could not cancel %s (%s): %s", job.job_id, reason, exc)
            return
        self.follower.wrote(seq)
        _log.info("cancelled %s: %s", job.job_id, reason)


def _websocket(request: web.Request) -> web.WebSocketResponse | web.Response:
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=frames.MAX_PAYLOAD + 1)
    if ws.can_prepare(request).ok:
        return ws
    detail = "this is a WebSocket: send the Upgrade handshake (rally attach and rally port-forward do)"
    return problem(426, "Upgrade required", detail, slug="upgrade-required", headers={"Upgrade": "websocket"})


def _not_live(job: JobView, kind: str | None) -> web.Response | None:
    """Why the job has no terminal (``kind`` interactive) or port (None: any kind) to reach now."""
    if kind is not None and job.spec.kind != kind:
        detail = f"job {job.job_id} is a {job.spec.kind} job; only interactive jobs have a terminal"
        return problem(409, "Not interactive", detail, slug="not-interactive", state=job.state)
    if job.terminal:
        detail = f"job {job.job_id} is already {job.state}; its terminal and ports are gone"
        return problem(409, "Job already finished", detail, slug="job-terminal", state=job.state)
    if job.state != "running":
        detail = f"job {job.job_id} is {job.state}; its terminal and ports open once it runs"
        return problem(409, "Not running yet", detail, slug="not-running", state=job.state)
    return None


def invalid_spec_rank(rank: int, job: JobView) -> web.Response:
    return invalid_spec(SpecError("rank", f"job {job.job_id} has ranks 0-{job.world_size - 1}, not {rank}"))


class _Relay:
    """One WebSocket and one agent session: pumps both ways until one of them ends. ``run`` says who:
    ``rank`` (it exited, or the agent closed the session), ``client`` (it went away), ``idle``, ``gone``
    (the fold says the rank no longer runs: ``why_gone``; a lost node sends no exit)."""

    def __init__(
        self, log: EventLog, ws: web.WebSocketResponse, output: Subscription, node_id: str, session: str,
        idle_s: float, gone: Callable[[], str] = lambda: "",
    ) -> None:  # fmt: skip
        self.nc = log.nc
        self.ws = ws
        self.output = output
        self.input = subjects.terminal_input(node_id, session)
        self.idle_s = idle_s
        self.active_at = time.monotonic()
        self.exited = False  # the rank exited (an EXIT frame came): its job ends by itself
        self.gone = gone
        self.why_gone = ""

    async def run(self) -> str:
        tasks = {
            asyncio.create_task(self._from_client(), name="client"),
            asyncio.create_task(self._from_agent(), name="rank"),
            asyncio.create_task(self._keepalive(), name="idle"),
            asyncio.create_task(self._watch(), name="gone"),
        }
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await self.output.unsubscribe()
        return next(iter(done)).get_name()

    async def close(self, note: str | None = None) -> None:
        """End the client's side, telling it why first (``note``)."""
        with contextlib.suppress(Exception):
            if note is not None:
                await self.ws.send_bytes(frames.closed(note))
            await self.ws.close()

    async def detach(self) -> None:
        """Tell the agent the client left; the rank keeps its terminal for a later attach."""
        with contextlib.suppress(Exception):
            await self.nc.publish(self.input, frames.closed("the client went away"))

    async def _from_client(self) -> None:
        async for msg in self.ws:
            if msg.type != WSMsgType.BINARY:
                continue  # text, pings: nothing for the rank
            try:
                frame = frames.decode(msg.data)
            except frames.FrameError:
                continue
            if frame.kind in (frames.DATA, frames.RESIZE):
                if frame.kind == frames.DATA:
                    self.active_at = time.monotonic()
                await self.nc.publish(self.input, bytes(msg.data))

    async def _from_agent(self) -> None:
        async for msg in self.output.messages:
            try:
                frame = frames.decode(msg.data)
            except frames.FrameError:
                continue
            self.active_at = time.monotonic()
            await self.ws.send_bytes(msg.data)
            self.exited = frame.kind == frames.EXIT
            if frame.kind in (frames.EXIT, frames.CLOSED):
                return

    async def _watch(self) -> None:
        """Until the fold says the rank is gone; give its exit frame a moment to come first."""
        while not (why := self.gone()):
            await asyncio.sleep(KEEPALIVE_S)
        await asyncio.sleep(KEEPALIVE_S)
        self.why_gone = why

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(min(KEEPALIVE_S, self.idle_s))
            if time.monotonic() - self.active_at >= self.idle_s:
                return
            await self.nc.publish(self.input, frames.ping())


def terminal_paths() -> dict[str, Any]:
    """The terminal's entry in the OpenAPI document (a WebSocket: its frames are in docs/api.md)."""
    rank = _query("rank", {"type": "integer", "minimum": 0}, "Which rank's terminal (default 0).")
    return {
        "/v1/jobs/{job_id}/terminal": {
            "parameters": [_JOB_ID],
            "get": {
                "operationId": "openJobTerminal",
                "summary": "An interactive job's terminal, as a WebSocket of frames (docs/api.md, Terminals)",
                "parameters": [rank],
                "responses": {
                    "101": {"description": "Switching to the WebSocket; frames both ways."},
                    "404": _problem("Unknown job, or another team's."),
                    "409": _problem("Not an interactive job, not running yet, or finished."),
                    "422": _problem("No such rank."),
                    "426": _problem("Not a WebSocket handshake."),
                    "502": _problem("The rank's agent refused."),
                    "503": _problem("The rank's agent did not answer."),
                },
            },
        },
        "/v1/jobs/{job_id}/ports/{port}": {
            "parameters": [
                _JOB_ID,
                {"name": "port", "in": "path", "required": True, "schema": {"type": "string"}},
            ],
            "get": {
                "operationId": "forwardJobPort",
                "summary": "A TCP connection to a port the job publishes, over a WebSocket (docs/api.md)",
                "parameters": [
                    _query("rank", {"type": "integer", "minimum": 0}, "Whose node (default rank 0's).")
                ],
                "responses": {
                    "101": {
                        "description": "Switching to the WebSocket; the connection's bytes in data frames."
                    },
                    "404": _problem("Unknown job, or another team's."),
                    "409": _problem("The job does not publish that port, is not running yet, or finished."),
                    "422": _problem("No such rank."),
                    "426": _problem("Not a WebSocket handshake."),
                    "502": _problem("The rank's agent refused: nothing of the job's listens there, say."),
                    "503": _problem("The rank's agent did not answer."),
                },
            },
        },
    }


def add_terminal_routes(
    app: web.Application, log: EventLog, follower: FoldFollower, queues: Any, source: str
) -> None:
    handlers = TerminalHandlers(log, follower, queues, source)

    async def stop(app: web.Application) -> None:
        await handlers.close()

    app.on_cleanup.append(stop)
    app.router.add_get("/v1/jobs/{job_id}/terminal", handlers.terminal)
    app.router.add_get("/v1/jobs/{job_id}/ports/{port}", handlers.port)
