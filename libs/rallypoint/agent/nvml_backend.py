"""Real NVIDIA GPUs through NVML (``nvidia-ml-py``, import name ``pynvml``).

NVLink domain rule (what the scheduler means by "inside one NVLink domain"): two GPUs share a domain
when they are connected by NVLink, directly or through other GPUs or an NVSwitch.

- For every GPU, every link whose state is enabled is followed with ``nvmlDeviceGetNvLinkRemotePciInfo``.
  A link whose remote PCI bus id is another local GPU joins the two GPUs (direct NVLink, e.g. DGX-1
  hybrid cube mesh, or NVLink bridges on pairs of PCIe cards).
- A link whose remote end is an NVSwitch (``nvmlDeviceGetNvLinkRemoteDeviceType`` says SWITCH, or the
  remote bus id is not a local GPU when that call is missing on older drivers) joins the GPU to the node's
  switch fabric; every GPU on the fabric lands in one domain (HGX/DGX A100/H100/H200: all 8 GPUs).
- A GPU without any enabled link (PCIe-only cards such as L4, or NVLink not supported) is a domain of
  its own.

Domains are numbered 0, 1, ... in the order of each domain's lowest GPU index, so the numbering is
stable across restarts and matches the simulated backend's layout on standard 8-GPU boards.

Errors: ``NvmlUnavailable`` when NVML cannot start (no driver, no library, no permission), with a
message that says so; unsupported queries (ECC on consumer cards, NVLink on PCIe cards, XID events in
containers without privileges) degrade to defaults instead of failing the agent.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from rallypoint.agent.backend import MIB, GpuDevice, MigUnavailable
from rallypoint.agent.nics import SYSFS, read_nics
from rallypoint.agent.nvml_mig import make_mig_device
from rallypoint.protocol import GpuSample, NicSample

_log = logging.getLogger(__name__)
T = TypeVar("T")

# Clock-event reasons (nvmlClocksEventReason*) that mean "slowed down against its will". Idle,
# application-clock settings, sync boost and SW power cap (running at TDP under load) are normal
# operation and must not make a healthy GPU look sick.
_HW_SLOWDOWN = 0x8
_SW_THERMAL = 0x20
_HW_THERMAL = 0x40
_HW_POWER_BRAKE = 0x80
# NVLink error counters summed into GpuSample.nvlink_errors: NVML_NVLINK_ERROR_DL_REPLAY (0),
# _RECOVERY (1), _CRC_FLIT (2), _CRC_DATA (3); by number, as older nvidia-ml-py lacks some names.
_NVLINK_ERROR_COUNTERS = (0, 1, 2, 3)


class NvmlUnavailable(RuntimeError):
    """NVML could not be initialised on this machine: no NVIDIA driver, no libnvidia-ml, or no access."""


def _text(value: object) -> str:
    # Older nvidia-ml-py versions return bytes where newer ones return str.
    return value.decode() if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: object) -> str:
    """``00000000:3B:00.0`` and ``0000:3b:00.0`` name the same device; compare on (domain, bus, dev.fn)."""
    text = _text(bus_id).strip().rstrip("\x00").lower()
    domain, rest = text.split(":", 1) if text.count(":") >= 2 else ("0", text)
    try:
        return f"{int(domain or '0', 16):08x}:{rest}"
    except ValueError:
        return text


def nvlink_domains(count: int, gpu_links: dict[int, set[int]], fabric: set[int]) -> list[int]:
    """Union-find over direct GPU links plus one shared switch fabric; returns the domain per GPU index.

    Pure, so the rule is unit-tested without a GPU.
    """
    parent = list(range(count))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for gpu, peers in gpu_links.items():
        for peer in peers:
            union(gpu, peer)
    on_fabric = sorted(fabric)
    for gpu in on_fabric[1:]:
        union(on_fabric[0], gpu)
    numbering: dict[int, int] = {}
    domains = []
    for gpu in range(count):
        root = find(gpu)
        domains.append(numbering.setdefault(root, len(numbering)))
    return domains


class NvmlGpus:
    """The GPUs NVML sees. ``close()`` (or the context manager) shuts NVML down again."""

    def __init__(self, gpu_type: str | None = None, *, sysfs_root: Path | str = SYSFS) -> None:
        self._sysfs_root = Path(sysfs_root)
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - it is a declared dependency
            raise NvmlUnavailable("the nvidia-ml-py package (import pynvml) is not installed") from exc
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML is not available on this machine ({exc}): it needs an NVIDIA GPU with its driver "
                "loaded and libnvidia-ml.so on the library path; use --backend sim elsewhere"
            ) from exc
        self._closed = False
        # NVML is thread-safe, but our XID event-set bookkeeping is not; heartbeats may sample from a
        # worker thread while close() runs on the loop thread.
        self._lock = threading.Lock()
        try:
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self._handles]
            self._gpu_type = gpu_type or (names[0] if names else "none")
            domains = self._discover_domains()
            # Links enabled at start: the only ones whose error counters mean anything (a GPU has up
            # to 18; asking all NVML_NVLINK_MAX_LINKS x 4 counters every second would be wasted calls).
            self._links = [self._enabled_links(h) for h in self._handles]
            self._devices = tuple(
                GpuDevice(
                    index=i,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                    memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // MIB,
                    nvlink_domain=domains[i],
                    name=names[i],
                    mig=_mig_enabled(pynvml, h),
                )
                for i, h in enumerate(self._handles)
            )
            self._last_xid = [0] * count
            self._events = self._register_xid_events()
        except BaseException:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
            raise

    # -- GpuBackend ---------------------------------------------------------------------------------

    @property
    def gpu_type(self) -> str:
        return self._gpu_type

    def inventory(self) -> tuple[GpuDevice, ...]:
        return self._devices

    def sample(self) -> tuple[GpuSample, ...]:
        with self._lock:
            if self._closed:
                raise RuntimeError("NvmlGpus is closed")
            self._drain_xid_events()
            return tuple(self._sample_one(i, h) for i, h in enumerate(self._handles))

    def nics(self) -> tuple[NicSample, ...]:
        """The host's InfiniBand ports and physical Ethernet interfaces, from sysfs (``nics``)."""
        return read_nics(self._sysfs_root)

    def slowdown(self) -> float:
        """Real hardware is as slow as it is: the agent never slows a real node's ranks."""
        return 1.0

    def mig_device(self, index: int, profile: str, start: int) -> str:
        """The MIG device of ``profile`` at memory slice ``start`` of GPU ``index``, its GPU and compute
        instances made (and idle overlapping ones destroyed) if they are not there (``nvml_mig``); the
        launch fails with NVML's reason rather than running unconfined (``MigUnavailable``)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("NvmlGpus is closed")
            if not 0 <= index < len(self._handles):
                raise MigUnavailable(f"this node has no GPU {index}")
            handle = self._handles[index]
            if not _mig_enabled(self._nvml, handle):
                raise MigUnavailable(f"GPU {index} is not in MIG mode")
            return make_mig_device(self._nvml, handle, profile, start)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._events is not None:
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlEventSetFree(self._events)
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    def __enter__(self) -> NvmlGpus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------

    def _try(self, read: Callable[[], T], default: T) -> T:
        """One reading; NotSupported / NoPermission / GPU-lost errors give the default, not a crash."""
        try:
            return read()
        except self._nvml.NVMLError as exc:
            _log.debug("NVML query failed: %s", exc)
            return default

    def _sample_one(self, index: int, h: object) -> GpuSample:
        nv = self._nvml
        temperature = self._try(lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)), 0.0)
        reasons = self._try(lambda: self._clock_reasons(h), 0)
        thermal = bool(reasons & (_SW_THERMAL | _HW_THERMAL))
        power_brake = bool(reasons & _HW_POWER_BRAKE)
        hw_slowdown = bool(reasons & _HW_SLOWDOWN)
        return GpuSample(
            index=index,
            temperature_c=temperature,
            # Percent busy over the last sample period, as nvidia-smi shows it (0-100).
            utilization=self._try(lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu), 0.0),
            memory_used_mib=self._try(lambda: int(nv.nvmlDeviceGetMemoryInfo(h).used) // MIB, 0),
            ecc_uncorrectable=self._ecc(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            xid=self._last_xid[index],
            throttled=thermal or power_brake or hw_slowdown,
            throttle_thermal=thermal,
            throttle_power_brake=power_brake,
            throttle_hw_slowdown=hw_slowdown,
            ecc_corrected=self._ecc(h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            nvlink_errors=self._nvlink_errors(h, self._links[index]),
        )

    def _ecc(self, h: object, kind: int) -> int:
        """The volatile (since driver load) ECC count of one kind; 0 where ECC is off or unsupported."""
        nv = self._nvml
        return self._try(lambda: int(nv.nvmlDeviceGetTotalEccErrors(h, kind, nv.NVML_VOLATILE_ECC)), 0)

    def _nvlink_errors(self, h: object, links: list[int]) -> int:
        """CRC (data, flit), replay and recovery errors summed over the enabled links. A link whose
        counters cannot be read (unsupported, or gone since start) adds nothing."""
        total = 0
        for link in links:
            try:
                total += sum(
                    int(self._nvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter))
                    for counter in _NVLINK_ERROR_COUNTERS
                )
            except self._nvml.NVMLError as exc:
                _log.debug("NVLink %d error counters unreadable: %s", link, exc)
        return total

    def _enabled_links(self, h: object) -> list[int]:
        nv = self._nvml
        links = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED:
                    links.append(link)
            except nv.NVMLError:
                break  # NotSupported (no NVLink) or InvalidArgument past the last link
        return links

    def _clock_reasons(self, handle: object) -> int:
        nv = self._nvml
        # Renamed from "throttle reasons" to "clocks event reasons" in NVML 12.x; older drivers lack
        # the new name.
        getter = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return int(getter(handle))

    def _discover_domains(self) -> list[int]:
        nv = self._nvml
        count = len(self._handles)
        bus_to_gpu: dict[str, int] = {}
        for i, h in enumerate(self._handles):
            with contextlib.suppress(nv.NVMLError):
                bus_to_gpu[normalize_bus_id(nv.nvmlDeviceGetPciInfo(h).busId)] = i
        gpu_links: dict[int, set[int]] = {i: set() for i in range(count)}
        fabric: set[int] = set()
        for i, h in enumerate(self._handles):
            for link in range(nv.NVML_NVLINK_MAX_LINKS):
                try:
                    if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                        continue
                    remote = normalize_bus_id(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
                except nv.NVMLError:
                    # NotSupported on PCIe-only GPUs, InvalidArgument past the last link: either way
                    # there are no more links to follow on this GPU.
                    break
                remote_type = int(self._try(partial(nv.nvmlDeviceGetNvLinkRemoteDeviceType, h, link), -1))
                peer = bus_to_gpu.get(remote)
                unknown = remote_type in (-1, nv.NVML_NVLINK_DEVICE_TYPE_UNKNOWN)
                if remote_type == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH or (unknown and peer is None):
                    fabric.add(i)
                elif peer is not None and peer != i:
                    gpu_links[i].add(peer)
        return nvlink_domains(count, gpu_links, fabric)

    def _register_xid_events(self) -> object | None:
        nv = self._nvml
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return None
        registered = 0
        for h in self._handles:
            # Containers without privileges and some vGPU setups refuse event registration: then XIDs
            # are simply not reported (0), the other health signals still are.
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
                registered += 1
        if not registered:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(events)
            return None
        return events

    def _drain_xid_events(self) -> None:
        nv = self._nvml
        if self._events is None:
            return
        uuid_to_index = {d.uuid: d.index for d in self._devices}
        for _ in range(64):  # bounded: a storm of events must not stall a heartbeat
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:
                return  # Timeout: nothing pending (or the call is unsupported here)
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                index = uuid_to_index.get(_text(self._try(partial(nv.nvmlDeviceGetUUID, data.device), "")))
                if index is not None:
                    self._last_xid[index] = int(data.eventData)


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    """Whether the GPU runs in MIG mode now (its current mode; a pending change needs a GPU reset)."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:
        return False  # not MIG-capable
    return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)
