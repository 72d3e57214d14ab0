"""`rally demo` (make demo) leaves no rally-demo-* folder in the system temp folder when it succeeds
(Issue 18), and keeps it, named, when it failed: its logs say why."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from rallypoint.localcluster import demo


@pytest.mark.parametrize(("code", "kept"), [(0, False), (1, True)])
def test_the_demo_folder_goes_unless_the_demo_failed(
    code: int, kept: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    used: list[Path] = []

    def fake_demo(workdir: Path, *_args: object, **_kwargs: object) -> int:
        (workdir / "logs").mkdir()
        (workdir / "logs" / "api.log").write_text("...")
        used.append(workdir)
        return code

    monkeypatch.setattr(demo, "_run_demo_in", fake_demo)
    assert demo.run_demo(1, 1, 1) == code
    [workdir] = used
    assert workdir.name.startswith("rally-demo-") and workdir.parent == tmp_path
    assert workdir.exists() is kept
    assert (str(workdir) in capsys.readouterr().err) is kept
