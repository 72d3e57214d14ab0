"""The rank wrapper's side of an interactive rank: the pty master, a Unix socket, the rank log.

With ``rankwrap --pty`` the rank runs on a pseudo-terminal: its stdin, stdout and stderr are the pty's
slave, and it is the leader of a session whose controlling terminal that is, so job control, Ctrl-C
(the line discipline turns the byte into SIGINT for the foreground group) and window sizes work as on
any terminal. The wrapper keeps the master. It

- copies everything the rank writes into the rank log (``rally logs`` shows the session) and into a
  small buffer of recent output, which a client gets first when it connects (the prompt, the screen);
- listens on ``rank-<r>.tty``, a Unix socket in the attempt folder (inside the agent's work dir, mode
  700; the socket itself 600), where the node agent connects to relay the terminal (``agent.terminal``).
  One client at a time: a new connection takes the terminal over, the old one gets a ``CLOSED`` frame;
- on the rank's exit drains what is left of its output, sends an ``EXIT`` frame with its status and
  returns it, for the wrapper to record as usual.

The socket is bound and connected through ``/proc/self/fd/<folder>``: a Unix socket's path is limited to
108 bytes, and attempt folders under a deep work dir are longer. Standard library only, like the wrapper.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import selectors
import socket
import struct
import subprocess
import termios
import time
from pathlib import Path

from rallypoint.interactive import frames

#: Output kept for a client that connects later: enough for a screen and its prompt.
RECENT_BYTES = 16 * 1024
#: After the rank exited, how long output still held in the pty is waited for (a helper may hold it open).
DRAIN_S = 0.5
_TICK_S = 0.1


def open_pty(rows: int = 24, cols: int = 80) -> tuple[int, int]:
    """A pty pair (master, slave) with a sane window until the client sends its own."""
    master, slave = os.openpty()
    set_window(master, rows, cols)
    return master, slave


def set_window(fd: int, rows: int, cols: int) -> None:
    """The terminal's window size; the kernel sends SIGWINCH to its foreground group."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def short_path(folder: Path, name: str) -> tuple[str, int]:
    """A path to ``folder/name`` short enough for a Unix socket, and the folder's fd that keeps it valid
    (the caller closes it once bound or connected)."""
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{name}", fd


def listen(path: Path) -> socket.socket:
    """The socket clients reach the terminal on, 0600, replacing a stale one."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    short, fd = short_path(path.parent, path.name)
    try:
        old = os.umask(0o177)
        try:
            server.bind(short)
        finally:
            os.umask(old)
    finally:
        os.close(fd)
    server.listen(4)
    server.setblocking(False)
    return server


class PtyHost:
    """Pumps bytes between the pty master, the connected client, and the rank log (``log_fd``)."""

    def __init__(self, master: int, server: socket.socket, log_fd: int) -> None:
        self.master = master
        self.server = server
        self.log_fd = log_fd
        self.client: socket.socket | None = None
        self.decoder = frames.StreamDecoder()
        self.recent = bytearray()
        self.selector = selectors.DefaultSelector()
        self.selector.register(server, selectors.EVENT_READ, "accept")
        self.selector.register(master, selectors.EVENT_READ, "master")
        self.master_open = True

    def serve(self, child: subprocess.Popen[bytes]) -> int:
        """Until the rank exits: relay; reap adopted orphans meanwhile (the wrapper is a subreaper).
        Returns the rank's ``returncode``, once its last output went out."""
        while child.returncode is None:
            self._pump(_TICK_S)
            _reap(child)
        deadline = time.monotonic() + DRAIN_S
        while self.master_open and time.monotonic() < deadline:
            if not self._pump(0.05):
                break
        self._send(frames.exited(_exit_status(child.returncode)))
        self.close()
        return child.returncode

    def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(OSError):
                self.client.close()
            self.client = None
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.selector.unregister(self.server)
        self.server.close()
        self.selector.close()
        with contextlib.suppress(OSError):
            os.close(self.master)

    def _pump(self, timeout: float) -> bool:
        """One wait for input; whether any output came from the rank."""
        output = False
        for key, _ in self.selector.select(timeout):
            if key.data == "accept":
                self._accept()
            elif key.data == "master":
                output = self._from_rank() or output
            else:
                self._from_client()
        return output

    def _accept(self) -> None:
        try:
            conn, _ = self.server.accept()
        except BlockingIOError:
            return
        if self.client is not None:
            self._send(frames.closed("the terminal was attached elsewhere"))
            self._drop_client()
        conn.setblocking(True)
        self.client = conn
        self.decoder = frames.StreamDecoder()
        self.selector.register(conn, selectors.EVENT_READ, "client")
        if self.recent:
            self._send(frames.data(bytes(self.recent)))

    def _from_rank(self) -> bool:
        try:
            chunk = os.read(self.master, 65536)
        except OSError as exc:
            if exc.errno not in (errno.EIO, errno.EBADF):
                raise
            chunk = b""
        if not chunk:  # every holder of the slave is gone
            self.selector.unregister(self.master)
            self.master_open = False
            return False
        with contextlib.suppress(OSError):
            os.write(self.log_fd, chunk)
        self.recent += chunk
        del self.recent[:-RECENT_BYTES]
        self._send(frames.data(chunk))
        return True

    def _from_client(self) -> None:
        assert self.client is not None
        try:
            chunk = self.client.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self._drop_client()
            return
        try:
            received = self.decoder.feed(chunk)
        except frames.FrameError:
            self._drop_client()
            return
        for frame in received:
            if frame.kind == frames.DATA and self.master_open:
                _write_all(self.master, frame.payload)
            elif frame.kind == frames.RESIZE:
                set_window(self.master, *frames.window(frame))

    def _send(self, message: bytes) -> None:
        if self.client is None:
            return
        try:
            self.client.sendall(frames.encode_stream(message))
        except OSError:
            self._drop_client()

    def _drop_client(self) -> None:
        if self.client is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.client)
        with contextlib.suppress(OSError):
            self.client.close()
        self.client = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError as exc:
            if exc.errno == errno.EIO:  # the rank closed its terminal: nothing reads keystrokes any more
                return
            raise
        view = view[written:]


def _reap(child: subprocess.Popen[bytes]) -> None:
    """Reap whatever exited (the rank, or an orphan it left): ``waitpid(-1)`` is safe in the wrapper."""
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(wait_status)


def _exit_status(returncode: int) -> int:
    """The status a shell would show: 128 + signal for a signalled rank."""
    return 128 - returncode if returncode < 0 else returncode
