"""MIG geometry: which GPU-instance profiles each GPU model offers, where they may start, and how a request
for one is carved out of a GPU whose other instances keep running (issue 32).

A MIG-capable GPU has eight memory slices (positions 0-7) and seven compute slices. A GPU instance of a
profile takes ``size`` consecutive memory slices beginning at one of the profile's start positions; two
instances may not share a memory slice. These are the placements ``nvidia-smi mig -lgipp`` prints as
``{starts}:size`` (NVIDIA's MIG User Guide, "Supported MIG Profiles"); every documented combination of a
model's profiles is exactly a set of such non-overlapping placements, so the tables below are the whole
rule. Media-extension profiles (``+me``: one per GPU, with the decoders) are left out: nothing here asks
for decoders, and a ``1g`` request lands on a plain ``1g`` slice.

A GPU's instances are *busy* (a rank runs there: fixed until it ends) or *idle* (created, unused). Idle
instances can be destroyed and the space re-carved, so :func:`carve` never refuses a request that some
valid layout of the GPU's non-busy slices could hold: it reuses an idle instance of the profile when there
is one, else creates the instance where it destroys the fewest idle ones and leaves the most room for
later requests. Everything is pure and deterministic (the core and the simulator call it alike).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from rallypoint.events.catalogue import MIG_COMPUTE_SLICES

__all__ = [
    "MEMORY_SLICES",
    "MIG_COMPUTE_SLICES",
    "MIG_MODELS",
    "MIG_PROFILES",
    "Carve",
    "MigInstance",
    "MigModel",
    "MigProfile",
    "carve",
    "free_mask",
    "mig_model",
    "room",
]

#: memory slices of every MIG-capable model listed here
MEMORY_SLICES = 8


class MigProfile(msgspec.Struct, frozen=True):
    """A GPU-instance profile: ``name`` as NVIDIA spells it (``3g.40gb``), ``compute`` slices (of 7),
    ``memory_gb`` as named, ``size`` memory slices taken (of 8), and the ``starts`` it may begin at."""

    name: str
    compute: int
    memory_gb: int
    size: int
    starts: tuple[int, ...]

    def mask_at(self, start: int) -> int:
        """The memory slices an instance starting at ``start`` takes, as bits."""
        return ((1 << self.size) - 1) << start


class MigModel(msgspec.Struct, frozen=True):
    """A MIG-capable GPU model: its accepted names and its profiles, smallest first."""

    name: str
    aliases: tuple[str, ...]
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        offered = ", ".join(p.name for p in self.profiles)
        raise KeyError(f"{self.name} has no MIG profile {name!r} (it offers {offered})")


def _model(name: str, aliases: tuple[str, ...], gb: tuple[int, int, int, int, int, int]) -> MigModel:
    """Every model here shares one geometry and differs only in memory per profile:
    1g (7 at any start), 1g with two memory slices (4), 2g (3), 3g (2), 4g (1), 7g (1, whole GPU)."""
    one, one_wide, two, three, four, seven = gb
    return MigModel(
        name=name,
        aliases=aliases,
        profiles=(
            MigProfile(f"1g.{one}gb", 1, one, 1, (0, 1, 2, 3, 4, 5, 6)),
            MigProfile(f"1g.{one_wide}gb", 1, one_wide, 2, (0, 2, 4, 6)),
            MigProfile(f"2g.{two}gb", 2, two, 2, (0, 2, 4)),
            MigProfile(f"3g.{three}gb", 3, three, 4, (0, 4)),
            MigProfile(f"4g.{four}gb", 4, four, 4, (0,)),
            MigProfile(f"7g.{seven}gb", 7, seven, 8, (0,)),
        ),
    )


MIG_MODELS: tuple[MigModel, ...] = (
    _model("A100-40GB", ("A100", "A100-SXM4-40GB", "A100-PCIE-40GB"), (5, 10, 10, 20, 20, 40)),
    _model("A100-80GB", ("A100-SXM4-80GB", "A100-PCIE-80GB"), (10, 20, 20, 40, 40, 80)),
    # sim-h100: the simulated agent's default type, an H100 as far as scheduling goes
    _model("H100-80GB", ("H100", "H100-SXM5-80GB", "H100-PCIE-80GB", "sim-h100"), (10, 20, 20, 40, 40, 80)),
    _model("H200-141GB", ("H200", "H200-SXM5-141GB"), (18, 35, 35, 71, 71, 141)),
)


#: every profile name some model offers (a request names one; the node's model decides where it fits)
MIG_PROFILES: frozenset[str] = frozenset(p.name for m in MIG_MODELS for p in m.profiles)


def mig_model(gpu_type: str) -> MigModel | None:
    """The MIG model a node's GPU type names (its name or an alias, any case), or None: not MIG-capable."""
    wanted = gpu_type.upper()
    for m in MIG_MODELS:
        if wanted == m.name.upper() or wanted in (a.upper() for a in m.aliases):
            return m
    return None


class MigInstance(msgspec.Struct, frozen=True):
    """A GPU instance on one GPU: its profile, first memory slice, and whether a rank runs on it."""

    profile: str
    start: int
    busy: bool = False


class Carve(msgspec.Struct, frozen=True):
    """How to give a request its slice: destroy these idle instances (by start), then use the instance of
    ``profile`` at ``start`` (``create``: it must be made first; else an idle one is reused)."""

    profile: str
    start: int
    create: bool
    destroy: tuple[int, ...] = ()


def _masks(model: MigModel, instances: Iterable[MigInstance]) -> tuple[int, int]:
    """(busy slices, idle slices) as bits."""
    busy = idle = 0
    for inst in instances:
        mask = model.profile(inst.profile).mask_at(inst.start)
        if inst.busy:
            busy |= mask
        else:
            idle |= mask
    return busy, idle


def free_mask(model: MigModel, instances: Iterable[MigInstance]) -> int:
    """Memory slices no instance holds (bits)."""
    busy, idle = _masks(model, instances)
    return ((1 << MEMORY_SLICES) - 1) & ~(busy | idle)


def room(model: MigModel, taken: int) -> int:
    """How many placements of all the model's profiles fit in the slices not in ``taken``: the measure of
    room left for later requests (a carve that keeps more of them open fragments the GPU less)."""
    return sum(1 for p in model.profiles for s in p.starts if not p.mask_at(s) & taken)


def carve(model: MigModel, instances: Sequence[MigInstance], profile: str) -> Carve | None:
    """Where a request for ``profile`` goes on a GPU holding ``instances``, or None when no layout of its
    non-busy slices holds it. Order of preference: reuse an idle instance of the profile; create one
    destroying as few idle instances as possible; among those, leave the most room; then the lowest start."""
    wanted = model.profile(profile)
    for inst in sorted(instances, key=lambda i: i.start):
        if not inst.busy and inst.profile == profile:
            return Carve(profile=profile, start=inst.start, create=False)
    busy, _ = _masks(model, instances)
    best: tuple[int, int, int] | None = None
    best_carve: Carve | None = None
    for start in wanted.starts:
        mask = wanted.mask_at(start)
        if mask & busy:
            continue
        doomed = tuple(
            sorted(
                i.start for i in instances if not i.busy and model.profile(i.profile).mask_at(i.start) & mask
            )
        )
        # room counts idle slices as open: they can be re-carved for the next request too
        rank = (len(doomed), -room(model, busy | mask), start)
        if best is None or rank < best:
            best, best_carve = rank, Carve(profile=profile, start=start, create=True, destroy=doomed)
    return best_carve
