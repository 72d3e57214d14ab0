"""The local cluster's fork server (``rallypoint.infra.forkserver``): each child is a process of its own.

Every e2e test's cluster runs its services through it (their NATS credentials reach them only through the
environment the server sets after the fork, so a wrong environment fails every one of them); these tests
pin what a supervisor relies on: pids, process groups, exit codes, logs, and that nothing outlives the
server. And that no preloaded module reads the environment when imported, which a fork would freeze.
"""

from __future__ import annotations

import ast
import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.infra.forkserver import PRELOAD, ForkedProcess, ForkServer

ENV_READS = {"environ", "environb", "getenv"}


def _import_time_env_reads(source: str) -> list[int]:
    """Lines of ``source`` that read the environment when the module is imported: anywhere outside a
    function body (module level, class bodies, decorators, default values)."""
    hits: list[int] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Attribute) and node.attr in ENV_READS:
            hits.append(node.lineno)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for part in (*node.decorator_list, *node.args.defaults, *node.args.kw_defaults):
                if part is not None:
                    visit(part)
            return
        if isinstance(node, ast.Lambda):
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return hits


def test_the_scan_finds_a_module_level_read_and_ignores_one_in_a_function() -> None:
    source = "import os\nA = os.environ.get('X')\ndef f(d=os.getenv('Y')):\n    return os.environ['Z']\n"
    assert _import_time_env_reads(source) == [2, 3]


def test_no_preloaded_module_of_ours_reads_the_environment_when_imported() -> None:
    for module in PRELOAD:
        importlib.import_module(module)
    ours = {
        name: mod.__file__
        for name, mod in sys.modules.items()
        if name.split(".")[0] in ("rallypoint", "rallypoint_services") and getattr(mod, "__file__", None)
    }
    assert "rallypoint.runtime.following" in ours  # the scan covers what the services import
    found = {
        name: lines
        for name, path in ours.items()
        if (lines := _import_time_env_reads(Path(path).read_text()))
    }
    assert not found, f"read at import, so a forked service would see the fork server's: {found}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    folder = tmp_path_factory.mktemp("forkserver")
    started = ForkServer(folder / "forkserver.log", preload=("rallypoint.cli.serve", "http.server"))
    yield started
    started.stop()


def _serve_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "rallypoint.cli.serve", *args]


def test_a_child_runs_the_module_in_its_own_process_group_and_reports_its_exit_code(
    server: ForkServer, tmp_path: Path
) -> None:
    log = tmp_path / "child.log"
    child = ForkedProcess(server, _serve_argv("no-such-service"), log_path=log, env={"A": "1"}, cwd=tmp_path)
    assert child.popen.wait(30) == 2
    assert "usage: python -m rallypoint.cli.serve" in log.read_text()
    assert child.pid not in (os.getpid(), server.proc.pid)
    assert not child.running()


def test_a_killed_child_reads_as_killed_and_its_name_says_what_it_serves(
    server: ForkServer, tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"]
    child = ForkedProcess(server, argv, log_path=tmp_path / "http.log", env={}, cwd=tmp_path)
    assert child.running()
    assert os.getpgid(child.pid) == child.pid  # its own group: stop() sweeps it and what it forked
    deadline = time.monotonic() + 30  # the child names itself once it runs
    while Path(f"/proc/{child.pid}/comm").read_text().strip() != "rally-server":
        assert time.monotonic() < deadline, Path(f"/proc/{child.pid}/comm").read_text()
        time.sleep(0.02)
    with pytest.raises(subprocess.TimeoutExpired):
        child.popen.wait(0.2)
    assert child.stop(timeout=10) == -signal.SIGTERM


def test_children_die_with_the_server(tmp_path: Path) -> None:
    own = ForkServer(tmp_path / "forkserver.log", preload=("http.server",))
    argv = [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"]
    child = ForkedProcess(own, argv, log_path=tmp_path / "http.log", env={}, cwd=tmp_path)
    os.kill(own.proc.pid, signal.SIGKILL)
    assert child.popen.wait(30) == -signal.SIGKILL  # as the supervisor hears it: the server is gone
    deadline = time.monotonic() + 30
    while _alive(child.pid):  # and as the kernel has it: the parent-death signal killed it
        assert time.monotonic() < deadline, f"pid {child.pid} outlived its fork server"
        time.sleep(0.05)
    own.stop()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_only_python_dash_m_is_served(server: ForkServer, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="python -m MODULE"):
        server.spawn(["/bin/sh", "-c", "true"], env={}, cwd=tmp_path, log_path=tmp_path / "x.log")
