"""A simulated GPU set: topology, memory, temperatures, and injectable faults.

Everything is deterministic: uuids derive from (node id, index), sample noise from a seeded generator
(never the wall clock), so two runs with the same seed and the same calls see the same numbers.

Faults can be injected three ways, so unit tests, integration tests and demos can all trigger them:

- methods: ``inject_thermal``, ``inject_ecc``, ``inject_xid``, ``inject_throttle``, ``clear_faults``;
- the ``RALLY_SIM_FAULTS`` environment variable, read once at construction;
- a fault file (``RALLY_SIM_FAULT_FILE`` or the ``fault_file`` argument), re-read whenever it changes,
  so ``echo '3:xid=79' > faults`` makes GPU 3 of a running agent report XID 79 on its next heartbeat,
  and emptying the file clears those faults again.

Spec and file syntax: entries separated by commas, semicolons or newlines, each ``<gpu>:<kind>[=<value>]``
with ``<gpu>`` an index or ``*`` for every GPU; ``#`` starts a comment. Kinds and their default values:
``thermal`` (temperature in °C, 95), ``ecc`` (uncorrectable errors, 1), ``xid`` (code, 79: fallen off
the bus), ``throttle`` (1 on, 0 off).
"""

from __future__ import annotations

import hashlib
import os
import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rallypoint.agent.backend import GpuDevice
from rallypoint.protocol import GpuSample

FAULTS_ENV = "RALLY_SIM_FAULTS"
FAULT_FILE_ENV = "RALLY_SIM_FAULT_FILE"

FaultKind = Literal["thermal", "ecc", "xid", "throttle"]
_DEFAULTS: dict[str, float] = {"thermal": 95.0, "ecc": 1.0, "xid": 79.0, "throttle": 1.0}

# An H100 SXM 80GB reports 81559 MiB through NVML; simulated nodes look the same to the scheduler.
DEFAULT_MEMORY_MIB = 81559
_UUID_NAMESPACE = uuid.UUID("5f0c6a0e-2d55-4f8e-9a51-7a1f3c2b9d10")
_IDLE_TEMP_C = 34.0


@dataclass(frozen=True)
class FaultSpec:
    """One parsed fault entry; ``index`` None means every GPU."""

    index: int | None
    kind: FaultKind
    value: float


def parse_fault_spec(text: str) -> list[FaultSpec]:
    """Parse ``0:thermal=97, *:throttle; 3:xid=48``. Raises ValueError naming the bad entry."""
    specs: list[FaultSpec] = []
    for raw_line in text.splitlines():
        line = raw_line.split("#", 1)[0]
        for raw in line.replace(";", ",").split(","):
            entry = raw.strip()
            if not entry:
                continue
            target, sep, rest = entry.partition(":")
            if not sep:
                raise ValueError(f"fault entry {entry!r}: expected <gpu>:<kind>[=<value>]")
            kind, _, value_text = rest.strip().partition("=")
            kind = kind.strip()
            if kind not in _DEFAULTS:
                raise ValueError(f"fault entry {entry!r}: kind must be one of {sorted(_DEFAULTS)}")
            try:
                index = None if target.strip() == "*" else int(target)
                value = float(value_text) if value_text.strip() else _DEFAULTS[kind]
            except ValueError:
                raise ValueError(
                    f"fault entry {entry!r}: gpu must be an index or '*', value a number"
                ) from None
            if index is not None and index < 0:
                raise ValueError(f"fault entry {entry!r}: negative gpu index")
            specs.append(FaultSpec(index=index, kind=kind, value=value))  # type: ignore[arg-type]
    return specs


@dataclass
class _Faults:
    temperature_c: float | None = None
    ecc: int = 0
    xid: int = 0
    throttled: bool = False

    def apply(self, spec: FaultSpec) -> None:
        if spec.kind == "thermal":
            self.temperature_c = spec.value
        elif spec.kind == "ecc":
            self.ecc += int(spec.value)
        elif spec.kind == "xid":
            self.xid = int(spec.value)
        else:
            self.throttled = spec.value != 0

    def merged(self, other: _Faults) -> _Faults:
        temps = [t for t in (self.temperature_c, other.temperature_c) if t is not None]
        return _Faults(
            temperature_c=max(temps) if temps else None,
            ecc=self.ecc + other.ecc,
            xid=other.xid or self.xid,
            throttled=self.throttled or other.throttled,
        )


def sim_uuid(node_id: str, index: int) -> str:
    """NVIDIA-style ``GPU-<uuid>``, stable for (node, index) so re-registration keeps identities."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_id}/{index}')}"


class SimulatedGpus:
    """``count`` identical GPUs in NVLink domains of ``nvlink_domain_size`` consecutive indices."""

    def __init__(
        self,
        node_id: str,
        count: int = 8,
        *,
        gpu_type: str = "sim-h100",
        memory_mib: int = DEFAULT_MEMORY_MIB,
        nvlink_domain_size: int = 8,
        seed: int = 0,
        faults: str | None = None,
        fault_file: Path | str | None = None,
    ) -> None:
        if count < 0:
            raise ValueError("count must be >= 0")
        if nvlink_domain_size < 1:
            raise ValueError("nvlink_domain_size must be >= 1")
        self.node_id = node_id
        self._gpu_type = gpu_type
        self._devices = tuple(
            GpuDevice(
                index=i,
                uuid=sim_uuid(node_id, i),
                memory_mib=memory_mib,
                nvlink_domain=i // nvlink_domain_size,
                name=gpu_type,
            )
            for i in range(count)
        )
        # Seeded from (seed, node) so nodes differ from each other but each is reproducible.
        digest = hashlib.sha256(f"{seed}:{node_id}".encode()).digest()
        self._rng = random.Random(int.from_bytes(digest[:8], "big"))
        self._injected = [_Faults() for _ in range(count)]
        self._from_file = [_Faults() for _ in range(count)]
        self._busy = [False] * count
        env_spec = os.environ.get(FAULTS_ENV) if faults is None else faults
        if env_spec:
            self.apply_faults(parse_fault_spec(env_spec))
        file_name = fault_file if fault_file is not None else os.environ.get(FAULT_FILE_ENV)
        self.fault_file = Path(file_name) if file_name else None
        self._file_stamp: tuple[int, int] | None = None

    # -- GpuBackend ---------------------------------------------------------------------------------

    @property
    def gpu_type(self) -> str:
        return self._gpu_type

    def inventory(self) -> tuple[GpuDevice, ...]:
        return self._devices

    def sample(self) -> tuple[GpuSample, ...]:
        self._reload_fault_file()
        samples = []
        for device in self._devices:
            i = device.index
            faults = self._injected[i].merged(self._from_file[i])
            # Draw the noise unconditionally so injecting a fault on one GPU does not shift the
            # numbers every other GPU reports (keeps before/after comparisons in tests exact).
            jitter = self._rng.uniform(-1.0, 1.0)
            load = self._rng.uniform(88.0, 99.0)
            utilization = load if self._busy[i] else 0.0
            temperature = round(_IDLE_TEMP_C + 0.3 * utilization + jitter, 1)
            if faults.temperature_c is not None:
                temperature = faults.temperature_c
            samples.append(
                GpuSample(
                    index=i,
                    temperature_c=temperature,
                    utilization=round(utilization, 1),
                    memory_used_mib=int(device.memory_mib * 0.6) if self._busy[i] else 0,
                    ecc_uncorrectable=faults.ecc,
                    xid=faults.xid,
                    throttled=faults.throttled or (faults.temperature_c or 0.0) >= 90.0,
                )
            )
        return tuple(samples)

    def close(self) -> None:
        """Nothing to release; present for the Protocol."""

    # -- fault injection ----------------------------------------------------------------------------

    def inject_thermal(self, index: int, temperature_c: float = _DEFAULTS["thermal"]) -> None:
        self.apply_faults([FaultSpec(self._check(index), "thermal", temperature_c)])

    def inject_ecc(self, index: int, count: int = 1) -> None:
        """Adds ``count`` uncorrectable errors: like NVML's volatile counter, it only grows."""
        self.apply_faults([FaultSpec(self._check(index), "ecc", count)])

    def inject_xid(self, index: int, xid: int = 79) -> None:
        self.apply_faults([FaultSpec(self._check(index), "xid", xid)])

    def inject_throttle(self, index: int, throttled: bool = True) -> None:
        self.apply_faults([FaultSpec(self._check(index), "throttle", 1.0 if throttled else 0.0)])

    def clear_faults(self, index: int | None = None) -> None:
        """Clears method/env-injected faults (file faults follow the file's contents)."""
        for i in self._targets(index):
            self._injected[i] = _Faults()

    def apply_faults(self, specs: Iterable[FaultSpec]) -> None:
        for spec in specs:
            for i in self._targets(spec.index):
                self._injected[i].apply(spec)

    def set_busy(self, indices: Iterable[int], busy: bool) -> None:
        """Mark GPUs as running a rank, so utilization, memory and temperature look alive in demos."""
        for i in indices:
            if 0 <= i < len(self._busy):
                self._busy[i] = busy

    # -- internals ----------------------------------------------------------------------------------

    def _check(self, index: int) -> int:
        if not 0 <= index < len(self._devices):
            raise IndexError(f"no GPU {index} on {self.node_id} ({len(self._devices)} GPUs)")
        return index

    def _targets(self, index: int | None) -> range | tuple[int, ...]:
        if index is None:
            return range(len(self._devices))
        # Out-of-range indices from an env var or file are ignored, not fatal: a fault file written for
        # an 8-GPU node must not crash a 4-GPU agent that happens to read it.
        return (index,) if 0 <= index < len(self._devices) else ()

    def _reload_fault_file(self) -> None:
        if self.fault_file is None:
            return
        try:
            stat = self.fault_file.stat()
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._file_stamp:
            return
        self._file_stamp = stamp
        fresh = [_Faults() for _ in self._devices]
        if stamp is not None:
            try:
                specs = parse_fault_spec(self.fault_file.read_text())
            except (OSError, ValueError):
                # A half-written or malformed file keeps the previous faults rather than clearing them;
                # any later change to the file (even its removal) is picked up, as the stamp matches nothing.
                self._file_stamp = (-1, -1)
                return
            for spec in specs:
                for i in self._targets(spec.index):
                    fresh[i].apply(spec)
        self._from_file = fresh
