"""The scale harness's processes beside a cluster: fleets of simulated nodes, and an RSS sampler.

A fleet connects as the cluster's admin user. The alternative, a bench-only "fleet" identity with the
agent permissions of every node it serves, would put a user that no deployment has into the one
permission matrix the deploy configs are generated from; and the server's per-publish permission check
is what it is for any user, so the admin identity changes no figure the harness reports. What the agents'
own permissions allow is proven separately (tests/integration/test_nats_acl.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rallypoint.infra import ManagedProcess
from rallypoint.localcluster.supervisor import LocalCluster
from rallypoint.security import ADMIN


@dataclass
class FleetSet:
    """The fleet processes serving a cluster's nodes, and the nodes SIGUSR1 silences."""

    processes: list[ManagedProcess]
    ready_files: list[Path]
    silenced: list[str]

    def signal(self, sig: int) -> None:
        for proc in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)

    def silence(self) -> None:
        self.signal(signal.SIGUSR1)

    def resume(self) -> None:
        self.signal(signal.SIGUSR2)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(f.exists() for f in self.ready_files):
            dead = [p for p in self.processes if not p.running()]
            if dead:
                raise RuntimeError(f"a fleet died while starting:\n{dead[0].log_tail(3000)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"fleets not up after {timeout:.0f} s")
            time.sleep(0.2)


def start_fleets(
    cluster: LocalCluster, *, fleets: int, silence: int, heartbeat_interval_s: float
) -> FleetSet:
    """``fleets`` processes serving the cluster's nodes in contiguous shares; each silences its share of
    ``silence`` (its first nodes). Call from the thread that keeps the cluster (parent-death signal)."""
    assert cluster.nats is not None and cluster.credentials is not None
    env = {**cluster.env, **cluster.credentials.env_for(ADMIN)}
    total, count = cluster.nodes, max(1, min(fleets, cluster.nodes))
    node_ids = cluster.node_ids()
    processes, ready, silenced = [], [], []
    for f in range(count):
        first, last = f * total // count, (f + 1) * total // count
        quiet = silence * (last - first) // total
        silenced += node_ids[first : first + quiet]
        ready_file = cluster.workdir / f"fleet-{f + 1}.ready"
        argv = [
            sys.executable, "-m", "rallypoint.agent.fleet", "--nats-url", cluster.nats.url,
            "--instance", f"fleet-{f + 1}", "--first", str(first + 1), "--count", str(last - first),
            "--total", str(total), "--racks", str(cluster.racks), "--gpus", str(cluster.gpus_per_node),
            "--heartbeat-interval", str(heartbeat_interval_s), "--silence", str(quiet),
            "--ready-file", str(ready_file),
        ]  # fmt: skip
        proc = ManagedProcess(
            argv, log_path=cluster.workdir / "logs" / f"fleet-{f + 1}.log", env=env, cwd=cluster.workdir
        )
        cluster.processes[f"fleet-{f + 1}"] = proc
        processes.append(proc)
        ready.append(ready_file)
    return FleetSet(processes, ready, silenced)


def rss_mb(pid: int) -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


@dataclass
class RssSampler:
    """Peak resident memory of every process of a cluster (services, fleets, servers), sampled each second."""

    cluster: LocalCluster
    peaks: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _pids(self) -> dict[str, int]:
        pids = {name: proc.pid for name, proc in list(self.cluster.processes.items())}
        servers = [*self.cluster.nats_names(), ("postgres", self.cluster.postgres)]
        for name, server in servers:
            if server is not None and server.pid is not None:
                pids[name] = server.pid
        return pids

    def sample(self) -> None:
        for name, pid in self._pids().items():
            mb = rss_mb(pid)
            if mb is not None:
                self.peaks[name] = round(max(self.peaks.get(name, 0.0), mb), 1)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.sample()
        return dict(sorted(self.peaks.items()))
