"""The frames of an interactive session (``rallypoint.interactive.frames``), the wrapper that serves a rank's
pty on its socket (``rankwrap --pty``), and who may speak on the terminal subjects."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rallypoint.agent import ports, workdir
from rallypoint.agent.ptyhost import short_path
from rallypoint.events import subjects
from rallypoint.interactive import frames
from rallypoint.security.permissions import agent_permissions, permissions


def test_each_frame_decodes_to_what_was_encoded() -> None:
    assert frames.decode(frames.data(b"ls\r")) == frames.Frame(frames.DATA, b"ls\r")
    assert frames.window(frames.decode(frames.resize(50, 132))) == (50, 132)
    assert frames.window(frames.decode(frames.resize(0, 10**6))) == (1, 0xFFFF)  # clamped, never 0 rows
    assert frames.status(frames.decode(frames.exited(3))) == 3
    assert frames.status(frames.decode(frames.exited(-9))) == -9
    assert frames.reason(frames.decode(frames.closed("idle for 60 s"))) == "idle for 60 s"
    assert frames.decode(frames.ping()).kind == frames.PING


@pytest.mark.parametrize(
    "message", [b"", b"z", b"r\x00\x01", b"x\x00", b"d" + b"a" * (frames.MAX_PAYLOAD + 1)], ids=repr
)
def test_what_is_no_frame_is_refused(message: bytes) -> None:
    with pytest.raises(frames.FrameError):
        frames.decode(message)


def test_a_stream_gives_whole_frames_however_it_is_cut() -> None:
    sent = [frames.data(b"hello"), frames.resize(24, 80), frames.data(b""), frames.exited(0)]
    stream = b"".join(frames.encode_stream(m) for m in sent)
    for cut in range(1, len(stream)):
        decoder = frames.StreamDecoder()
        got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert [f.kind + f.payload for f in got] == sent
    one_byte = frames.StreamDecoder()
    assert [f for b in stream for f in one_byte.feed(bytes([b]))] == [frames.decode(m) for m in sent]


def test_a_stream_announcing_a_huge_frame_is_refused() -> None:
    with pytest.raises(frames.FrameError):
        frames.StreamDecoder().feed(b"d\xff\xff\xff\xff")


def _allowed(patterns: tuple[str, ...], subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` the rest."""
    tokens = subject.split(".")
    for pattern in patterns:
        parts = pattern.split(".")
        if parts[-1] == ">" and len(tokens) >= len(parts) and _match(parts[:-1], tokens[: len(parts) - 1]):
            return True
        if len(parts) == len(tokens) and _match(parts, tokens):
            return True
    return False


def _match(parts: list[str], tokens: list[str]) -> bool:
    return all(p in ("*", t) for p, t in zip(parts, tokens, strict=True))


def test_only_the_api_and_the_ranks_agent_speak_on_a_terminal() -> None:
    output, keys = subjects.terminal_output("n1", "s1"), subjects.terminal_input("n1", "s1")
    api, agent, other_agent = permissions("api"), agent_permissions("n1"), agent_permissions("n2")
    assert _allowed(api.publish, keys) and _allowed(api.publish, subjects.agent_command("n1", "tty"))
    assert _allowed(api.subscribe, output) and not _allowed(api.publish, output)
    assert _allowed(agent.publish, output) and _allowed(agent.subscribe, keys)
    assert not _allowed(other_agent.publish, output) and not _allowed(other_agent.subscribe, keys)
    assert not _allowed(agent.subscribe, output) and not _allowed(agent.publish, keys)
    for role in ("scheduler", "job-controller", "inventory", "projector"):
        perms = permissions(role)
        assert not _allowed(perms.subscribe, output) and not _allowed(perms.publish, output), role


def _connect(path: Path, deadline_s: float = 10.0) -> socket.socket:
    end = time.monotonic() + deadline_s
    while True:
        sock = socket.socket(socket.AF_UNIX)
        short, fd = short_path(path.parent, path.name)
        try:
            sock.connect(short)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > end:
                raise
            time.sleep(0.05)
        finally:
            os.close(fd)


def _read_until_exit(sock: socket.socket) -> list[frames.Frame]:
    decoder, got = frames.StreamDecoder(), list[frames.Frame]()
    sock.settimeout(20)
    while not any(f.kind == frames.EXIT for f in got):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += decoder.feed(chunk)
    return got


def test_the_wrapper_serves_the_ranks_terminal_and_records_its_status(tmp_path: Path) -> None:
    # a deep folder: the socket's path is longer than a Unix socket's 108 bytes, reached all the same
    folder = tmp_path.joinpath(*["deep-folder-name"] * 8)
    folder.mkdir(parents=True)
    log = open(folder / "rank-0.log", "wb")  # noqa: SIM115 - the wrapper's stdout, closed below
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "rallypoint.agent.rankwrap", "--dir", str(folder), "--rank", "0", "--pty",
         "--", "sh", "-c", "stty size; echo tty=$(tty); read line; echo got=$line; exit 7"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        sock = _connect(workdir.rank_file(folder, 0, "tty"))
        sock.sendall(frames.encode_stream(frames.resize(33, 99)) + frames.encode_stream(frames.data(b"hi\r")))
        got = _read_until_exit(sock)
        assert wrapper.wait(20) == 0
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
        log.close()
    output = b"".join(f.payload for f in got if f.kind == frames.DATA)
    assert b"tty=/dev/pts/" in output and b"got=hi" in output
    assert got[-1] == frames.decode(frames.exited(7))
    assert workdir.read_record(workdir.rank_file(folder, 0, "exit"))["exit_code"] == 7  # type: ignore[index]
    assert b"got=hi" in (folder / "rank-0.log").read_bytes()  # the session is in the rank's log too


def _table(*rows: tuple[str, str, int]) -> str:
    """A /proc/net/tcp-style table: (local address, state, uid) per socket."""
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
    lines = [f"{i:4d}: {address} 00000000:0000 {st} 00000000:00000000 00:00000000 00000000 {uid} 0 {i}"
             for i, (address, st, uid) in enumerate(rows)]  # fmt: skip
    return "\n".join([head, *lines]) + "\n"


TCP = _table(
    ("0100007F:22B8", "0A", 1001),
    ("00000000:1F90", "0A", 1002),
    ("0100007F:1F91", "01", 1001),
    ("0100000A:1F92", "0A", 1001),
)
TCP6 = _table(("00000000000000000000000001000000:1F93", "0A", 1001))


def test_the_listeners_of_a_node_and_their_owners() -> None:
    found = ports.listeners([TCP, TCP6])
    assert [(str(x.address), x.port, x.uid) for x in found] == [
        ("127.0.0.1", 8888, 1001),
        ("0.0.0.0", 8080, 1002),
        ("10.0.0.1", 8082, 1001),  # the established connection (st 01) is no listener
        ("::1", 8083, 1001),
    ]
    assert ports.target(8888, 1001, found) == "127.0.0.1"
    assert ports.target(8083, 1001, found) == "::1"
    with pytest.raises(ports.PortRefused, match="another user's"):
        ports.target(8080, 1001, found)  # the port is someone else's: never connected to
    with pytest.raises(ports.PortRefused, match="nothing listens"):
        ports.target(8082, 1001, found)  # not on the loopback: not what a rank publishes to its node
    with pytest.raises(ports.PortRefused, match="nothing listens"):
        ports.target(9999, 1001, found)
