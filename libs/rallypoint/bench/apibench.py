"""The API's submissions beside raw JetStream publishes, with nothing else on the machine's cores.

``python -m rallypoint.bench.apibench --nodes 12500`` (JSON on stdout). ``rally bench cluster``
measures submissions inside a whole cluster: on a 2-core machine every submission there also costs the
scheduler, the controllers, the projector and every other fold their share, and the heartbeats of
12,500 nodes run beside, so its figure is the cluster's per-job CPU as much as the API's. This one
starts only nats-server (with the log set up as the local cluster sets it up) and the real API process
(``rally serve api`` with a token file), registers ``--nodes`` nodes in the log for the API to fold, and
then alternates rounds, ``concurrency`` in flight each: the raw reference of ``rally bench cluster``
(``loadgen.raw_publish``: acked publishes of a JobSubmitted-sized message into a scratch stream),
acked appends of the very event the API appends into the same log (``raw_append``: its
``JobSubmitted``, subject, message id, expected sequence 0 and envelope headers, ``EventLog.append``),
requests to a bare HTTP front that only publishes each into the scratch stream (``httpceiling``: what
HTTP alone costs here, so the most any API could accept), and HTTP submissions to the API
(``leanhttp``). Alternating rounds see the
same load on a shared machine; the ratio is over the totals of all rounds. Also the CPU each process
spent per job in the HTTP rounds (the API, nats-server, this driver).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rallypoint.eventlog import Append, EventLog, connect_nats
from rallypoint.eventlog.setup import setup_log
from rallypoint.events import GpuInfo, JobSpec, JobSubmitted, NodeRegistered, subjects
from rallypoint.infra import ManagedProcess, NatsServer, free_port
from rallypoint.infra.proccpu import cpu_seconds
from rallypoint.jobs import job_id_for
from rallypoint.security.tokens import create_token

from .httpceiling import http_ceiling
from .leanhttp import submit_lean
from .loadgen import raw_publish, spec_body

TEAM = "bench"
GPUS_PER_NODE = 8


def _node(i: int) -> NodeRegistered:
    gpus = tuple(
        GpuInfo(index=g, uuid=f"GPU-{i}-{g}", memory_mib=81559, nvlink_domain=0) for g in range(GPUS_PER_NODE)
    )
    return NodeRegistered(
        node_id=f"node-{i + 1}",
        address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
        rack=f"rack-{i // 32 + 1}",
        gpu_type="H100",
        gpus=gpus,
        cpu_milli=96_000,
        memory_mib=1 << 20,
        agent_instance="apibench",
        at=time.time(),
    )


async def _register(log: EventLog, nodes: int) -> None:
    for start in range(0, nodes, 1000):
        entries = [
            Append(subjects.node_registration(f"node-{i + 1}"), _node(i), f"node-{i + 1}:0:NodeRegistered")
            for i in range(start, min(nodes, start + 1000))
        ]
        await log.append_batch(entries, source="rallypoint/apibench")


def raw_job_ids(prefix: str, count: int) -> list[str]:
    """The ids ``raw_append`` gives its jobs."""
    return [job_id_for(TEAM, f"{prefix}-{i}") for i in range(count)]


async def raw_append(
    log: EventLog, count: int, *, concurrency: int, prefix: str, seconds: float = 10.0
) -> float:
    """Appends per second of ``count`` JobSubmitted as the API appends them (subject, message id, expected
    sequence 0, envelope headers), ``concurrency`` in flight: the API's work without HTTP. Each job runs
    ``seconds`` once started."""
    body = spec_body("raw", 1, seconds)
    spec = JobSpec(**{**body, "team": TEAM, "command": tuple(body["command"])})
    numbers = iter(range(count))

    async def worker() -> None:
        for i in numbers:
            job_id = job_id_for(TEAM, f"{prefix}-{i}")
            event = JobSubmitted(
                job_id=job_id, spec=spec, submitted_at=time.time(), idempotency_key=f"{prefix}-{i}"
            )
            await log.append(
                subjects.job(job_id),
                event,
                msg_id=f"{job_id}:0:JobSubmitted",
                source="rallypoint/apibench",
                expected_last_subject_seq=0,
            )

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count / (time.perf_counter() - start)


def _cpu_seconds(pid: int) -> float:
    return cpu_seconds(pid) or 0.0


async def _wait_ready(api_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection(*api_url.removeprefix("http://").split(":"))
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
            if answer.startswith(b"HTTP/1.1 200"):
                return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the API at {api_url} did not become ready in {timeout:.0f} s")


async def _drive(
    nats_url: str, api: ManagedProcess, api_url: str, token: str, cfg: argparse.Namespace
) -> dict[str, Any]:
    nc = await connect_nats(nats_url, name="apibench")
    try:
        log = await setup_log(nc)
        await _register(log, cfg.nodes)
        await _wait_ready(api_url, timeout=300)
        append_s = http_s = publish_s = ceiling_s = 0.0
        accepted = failed = 0
        cpu = {"api": 0.0, "driver": 0.0}
        body = {**spec_body("bench-http", 1, 10), "team": TEAM}
        for r in range(cfg.rounds):
            rate = await raw_append(log, cfg.jobs, concurrency=cfg.concurrency, prefix=f"raw{r}")
            append_s += cfg.jobs / rate
            publish_s += cfg.jobs / await raw_publish(nc, cfg.jobs, concurrency=cfg.concurrency)
            ceiling_s += cfg.jobs / await http_ceiling(
                nc, nats_url, cfg.jobs, concurrency=cfg.concurrency, body=body, token=token
            )
            before = {"api": _cpu_seconds(api.pid), "driver": _cpu_seconds(os.getpid())}
            ok, took, refused = await submit_lean(
                api_url, cfg.jobs, concurrency=cfg.concurrency, body=body, prefix=f"http{r}",
                time_limit_s=120, token=token,
            )  # fmt: skip
            cpu["api"] += _cpu_seconds(api.pid) - before["api"]
            cpu["driver"] += _cpu_seconds(os.getpid()) - before["driver"]
            http_s += took
            accepted += len(ok)
            failed += refused
        raw_rate = cfg.rounds * cfg.jobs / append_s
        publish_rate = cfg.rounds * cfg.jobs / publish_s
        http_rate = accepted / http_s if http_s else 0.0
        ceiling_rate = cfg.rounds * cfg.jobs / ceiling_s
        return {
            "submissions_per_s": round(http_rate, 1),
            "raw_publish_per_s": round(publish_rate, 1),
            "submissions_over_raw": round(http_rate / publish_rate, 3),
            "http_ceiling_per_s": round(ceiling_rate, 1),
            "http_ceiling_over_raw": round(ceiling_rate / publish_rate, 3),
            "submissions_over_http_ceiling": round(http_rate / ceiling_rate, 3),
            "raw_append_per_s": round(raw_rate, 1),
            "submissions_over_raw_append": round(http_rate / raw_rate, 3),
            "submissions": accepted,
            "submissions_failed": failed,
            "api_cpu_ms_per_submission": round(cpu["api"] * 1000 / max(1, accepted), 3),
            "driver_cpu_ms_per_submission": round(cpu["driver"] * 1000 / max(1, accepted), 3),
        }
    finally:
        await nc.close()


def run(cfg: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "nodes": cfg.nodes,
        "concurrency": cfg.concurrency,
        "jobs_per_round": cfg.jobs,
        "rounds": cfg.rounds,
        "load_1m_before": round(os.getloadavg()[0], 2),
    }
    with tempfile.TemporaryDirectory(prefix="rally-apibench-") as folder:
        workdir = Path(folder)
        tokens = workdir / "tokens.json"
        _, token = create_token(tokens, user="bench", team=TEAM)
        port = free_port()
        with NatsServer(workdir / "nats") as server:
            argv = [
                sys.executable, "-m", "rallypoint.cli.serve", "api", "--nats-url", server.url,
                "--instance", "api", "--http-port", str(port), "--tokens-file", str(tokens),
            ]  # fmt: skip
            api = ManagedProcess(argv, log_path=workdir / "api.log", cwd=workdir)
            try:
                out |= asyncio.run(_drive(server.url, api, f"http://127.0.0.1:{port}", token, cfg))
            finally:
                api.stop()
    out["load_1m_after"] = round(os.getloadavg()[0], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rallypoint.bench.apibench", description=__doc__)
    parser.add_argument("--nodes", type=int, default=4, help="nodes registered in the log (default 4)")
    parser.add_argument("--jobs", type=int, default=1000, help="submissions per round, and raw appends")
    parser.add_argument("--rounds", type=int, default=3, help="alternating raw / HTTP rounds (default 3)")
    parser.add_argument("--concurrency", type=int, default=16, help="in flight (default 16)")
    print(json.dumps(run(parser.parse_args(argv)), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
