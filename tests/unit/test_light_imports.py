"""The packages whose parts run in small processes import their parts on first use (PEP 562).

The rank wrapper runs once per rank and imports two standard-library modules of ``rallypoint.agent``;
before, the package's own import brought in the launcher, the GPU backends, msgspec and the checkpoint
client with them, ~100 ms of every rank's start.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import rallypoint.agent
import rallypoint.ckpt

HEAVY = ("msgspec", "nats", "numpy", "aiohttp", "rallypoint.agent.launcher", "rallypoint.ckpt.client")


def loaded_after(statement: str) -> set[str]:
    probe = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_the_rank_wrapper_loads_no_heavy_module() -> None:
    loaded = loaded_after("import rallypoint.agent.rankwrap")
    assert "rallypoint.agent.workdir" in loaded and "rallypoint.agent.rankuser" in loaded
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


def test_using_a_name_imports_its_module() -> None:
    loaded = loaded_after("from rallypoint.agent import RankLauncher")
    assert {"rallypoint.agent.launcher", "msgspec"} <= loaded


@pytest.mark.parametrize("package", [rallypoint.agent, rallypoint.ckpt], ids=lambda p: p.__name__)
def test_every_exported_name_is_its_home_modules_object(package: object) -> None:
    homes: dict[str, str] = package._HOMES  # type: ignore[attr-defined]
    assert sorted(package.__all__) == sorted(homes)  # type: ignore[attr-defined]
    for name, home in homes.items():
        module = importlib.import_module(home, package.__name__)  # type: ignore[attr-defined]
        assert getattr(package, name) is getattr(module, name)
        assert name in dir(package)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = package.nothing_here  # type: ignore[attr-defined]
