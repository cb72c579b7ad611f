"""The TPU slices a plan compiles for: each chip's public figures, a target's name, its devices without a TPU."""

from __future__ import annotations

import dataclasses
import math
import re

import jax

from transformer_jax.errors import UserError

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    """Public peak figures of one chip (one JAX device: a v4 / v5p chip is one megacore device)."""

    name: str
    peak_flops: float  # dense bfloat16 FLOP/s
    hbm_bytes: int  # HBM per chip as published (the compiler may leave a little less to a program)
    hbm_bandwidth: float  # bytes/s
    mesh_dims: int  # dimensions of a slice's topology: 2 (AxB) or 3 (AxBxC)


# Sources: Google Cloud's TPU pages, system architecture tables (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e):
# v4 275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s; v5e 197 TFLOP/s, 16 GB at 819 GB/s; v5p 459 TFLOP/s, 95 GiB at
# 2765 GB/s; v6e (Trillium) 918 TFLOP/s, 32 GB at 1640 GB/s. The compiler's limit on a v5e is 15.75 GiB.
CHIPS: dict[str, Chip] = {
    "v4": Chip("TPU v4", 275e12, 32 * GiB, 1200e9, 3),
    "v5e": Chip("TPU v5e", 197e12, 16 * GiB, 819e9, 2),
    "v5p": Chip("TPU v5p", 459e12, 95 * GiB, 2765e9, 3),
    "v6e": Chip("TPU v6e", 918e12, 32 * GiB, 1640e9, 2),
}

TARGET_FORMS = (
    "a TPU slice as GENERATION:TOPOLOGY, the chips along each axis: v5e:AxB or v6e:AxB (e.g. v5e:2x2, v5e:4x4, "
    "v6e:16x16), v4:AxBxC or v5p:AxBxC (e.g. v4:2x2x2, v5p:2x2x4)"
)


@dataclasses.dataclass(frozen=True)
class Target:
    """A slice: `generation:topology`, e.g. v5e:2x2 (4 chips)."""

    generation: str  # a key of CHIPS
    topology: tuple[int, ...]  # chips along each axis

    @property
    def name(self) -> str:
        return f"{self.generation}:{'x'.join(map(str, self.topology))}"

    @property
    def chip(self) -> Chip:
        return CHIPS[self.generation]

    @property
    def chips(self) -> int:
        return math.prod(self.topology)


def parse_target(name: str) -> Target:
    """'v5e:2x2' -> Target('v5e', (2, 2)). A name of another form is a UserError that lists the valid forms."""
    text = name.strip().lower()
    match = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+)*)", text)
    if match is None or match.group(1) not in CHIPS:
        raise UserError(f"target {name!r} is not a known slice; use {TARGET_FORMS}.")
    generation, sizes = match.group(1), tuple(int(size) for size in match.group(2).split("x"))
    dims = CHIPS[generation].mesh_dims
    if len(sizes) != dims or min(sizes) < 1:
        example = "x".join(["2"] * dims)
        raise UserError(
            f"target {name!r}: a {generation} slice has {dims} axes of at least 1 chip, e.g. {generation}:{example}; "
            f"use {TARGET_FORMS}."
        )
    return Target(generation, sizes)


def target_devices(target: Target) -> list:
    """The slice's devices, described by libtpu without a TPU (one device per chip). UserError without libtpu or
    for a topology the TPU software does not know (e.g. v5e:3x3)."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise UserError(
            f"planning for {target.name} needs the TPU compiler, libtpu: pip install 'jax[tpu]' (it runs "
            "without a TPU; `make test-plan` builds such a venv in .venv-tpu)."
        ) from None
    from jax.experimental import topologies

    options = {"chip_config_name": "megacore"} if target.generation == "v4" else {}  # one device per v4 chip
    try:
        description = topologies.get_topology_desc(topology_name=target.name, platform="tpu", **options)
    except jax.errors.JaxRuntimeError as error:
        raise UserError(f"target {target.name}: the TPU software refuses it ({error}); use {TARGET_FORMS}.") from None
    return list(description.devices)


# --------------------------------------------------------------------------------------------- memory and figures
