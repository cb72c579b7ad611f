"""The targets a plan compiles for, TPU slices and GPU nodes: each chip's public figures, a target's name, its
devices without the hardware."""

from __future__ import annotations

import dataclasses
import math
import re

import jax

from transformer_jax.errors import UserError

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class CudaDevice:
    """What XLA's GPU compiler is told of an NVIDIA GPU (the device info of its GpuTargetConfigProto)."""

    compute_capability: tuple[int, int]
    sms: int  # streaming multiprocessors
    fp32_cores_per_sm: int
    shared_memory_per_sm: int  # bytes
    shared_memory_per_block_optin: int  # bytes a block may ask for
    l2_cache_bytes: int
    clock_ghz: float  # boost


@dataclasses.dataclass(frozen=True)
class Chip:
    """Public peak figures of one chip (one JAX device: a v4 / v5p chip is one megacore device; a GPU)."""

    name: str
    peak_flops: float  # dense bfloat16 FLOP/s
    hbm_bytes: int  # HBM per chip as published (the compiler may leave a little less to a program)
    hbm_bandwidth: float  # bytes/s
    topology_axes: tuple[int, ...]  # the axes a target may name: TPU slices 2 (AxB) or 3 (AxBxC); GPUs 1 or 2 (NxG)
    cuda: CudaDevice | None = None  # a GPU: what its compiler is told; None: a TPU

    @property
    def platform(self) -> str:
        return "tpu" if self.cuda is None else "cuda"


# TPUs: Google Cloud's TPU pages, system architecture tables (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e): v4 275
# TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s; v5e 197 TFLOP/s, 16 GB at 819 GB/s; v5p 459 TFLOP/s, 95 GiB at 2765 GB/s;
# v6e (Trillium) 918 TFLOP/s, 32 GB at 1640 GB/s. The compiler's limit on a v5e is 15.75 GiB.
# GPUs: NVIDIA's datasheets and architecture whitepapers. H100 SXM5 80GB: 989 TFLOP/s dense bf16, 80 GB HBM3 at
# 3.35 TB/s, compute capability 9.0, 132 SMs of 128 FP32 cores, 228 KiB shared memory per SM (227 KiB a block),
# 50 MiB L2, 1.98 GHz. A100 SXM4 80GB: 312 TFLOP/s, 80 GB HBM2e at 2,039 GB/s, 8.0, 108 SMs of 64, 164 KiB
# (163 KiB a block), 40 MiB L2, 1.41 GHz.
CHIPS: dict[str, Chip] = {
    "v4": Chip("TPU v4", 275e12, 32 * GiB, 1200e9, (3,)),
    "v5e": Chip("TPU v5e", 197e12, 16 * GiB, 819e9, (2,)),
    "v5p": Chip("TPU v5p", 459e12, 95 * GiB, 2765e9, (3,)),
    "v6e": Chip("TPU v6e", 918e12, 32 * GiB, 1640e9, (2,)),
    "h100": Chip(
        "NVIDIA H100 80GB HBM3", 989e12, 80 * GiB, 3350e9, (1, 2),
        CudaDevice((9, 0), 132, 128, 228 * 2**10, 227 * 2**10, 50 * 2**20, 1.98),
    ),
    "a100": Chip(
        "NVIDIA A100-SXM4-80GB", 312e12, 80 * GiB, 2039e9, (1, 2),
        CudaDevice((8, 0), 108, 64, 164 * 2**10, 163 * 2**10, 40 * 2**20, 1.41),
    ),
}  # fmt: skip

TARGET_FORMS = (
    "a TPU slice as GENERATION:TOPOLOGY, the chips along each axis: v5e:AxB or v6e:AxB (e.g. v5e:2x2, v5e:4x4, "
    "v6e:16x16), v4:AxBxC or v5p:AxBxC (e.g. v4:2x2x2, v5p:2x2x4); GPUs as GPU:G or GPU:NxG, N nodes of G GPUs "
    "(h100:8, a100:8, h100:4x8)"
)


@dataclasses.dataclass(frozen=True)
class Target:
    """A TPU slice, `generation:topology`, e.g. v5e:2x2 (4 chips); or GPUs, e.g. h100:8 (a node of 8), h100:4x8."""

    generation: str  # a key of CHIPS
    topology: tuple[int, ...]  # TPU: chips along each axis; GPU: (gpus,) or (nodes, gpus per node)

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
        raise UserError(f"target {name!r} is not a known slice or GPU; use {TARGET_FORMS}.")
    generation, sizes = match.group(1), tuple(int(size) for size in match.group(2).split("x"))
    axes = CHIPS[generation].topology_axes
    if len(sizes) not in axes or min(sizes) < 1:
        example = "x".join(["2"] * axes[-1])
        raise UserError(
            f"target {name!r}: a {generation} target has {' or '.join(map(str, axes))} axes of at least 1 chip, "
            f"e.g. {generation}:{example}; use {TARGET_FORMS}."
        )
    return Target(generation, sizes)


def gpu_target_config(chip: Chip) -> str:
    """The GpuTargetConfigProto (text format) that tells XLA's GPU compiler the chip, without the GPU."""
    cuda = chip.cuda
    if cuda is None:
        raise ValueError(f"{chip.name} is not a GPU.")
    major, minor = cuda.compute_capability
    info = {
        "threads_per_block_limit": 1024,  # every CUDA GPU since compute capability 2.0
        "threads_per_warp": 32,
        "shared_memory_per_block": 48 * 2**10,  # without opting in
        "shared_memory_per_block_optin": cuda.shared_memory_per_block_optin,
        "shared_memory_per_core": cuda.shared_memory_per_sm,
        "threads_per_core_limit": 2048,
        "core_count": cuda.sms,
        "fpus_per_core": cuda.fp32_cores_per_sm,
        "block_dim_limit_x": 2**31 - 1,
        "block_dim_limit_y": 65535,
        "block_dim_limit_z": 65535,
        "memory_bandwidth": int(chip.hbm_bandwidth),
        "l2_cache_size": cuda.l2_cache_bytes,
        "clock_rate_ghz": cuda.clock_ghz,
        "device_memory_size": chip.hbm_bytes,
    }
    fields = "\n".join(f"  {key}: {value}" for key, value in info.items())
    return (
        f"gpu_device_info {{\n  cuda_compute_capability {{ major: {major} minor: {minor} }}\n{fields}\n}}\n"
        f'platform_name: "CUDA"\ndnn_version_info {{ major: 9 minor: 8 patch: 0 }}\n'
        f'device_description_str: "{chip.name}"\n'
    )


def target_devices(target: Target) -> list:
    """The target's devices, described by its compiler without the hardware (one device per TPU chip or GPU).
    UserError without that compiler (libtpu; the CUDA plugin) or for a topology the TPU software does not know
    (e.g. v5e:3x3)."""
    from jax.experimental import topologies

    if target.chip.platform == "cuda":
        try:
            import jax_cuda12_plugin  # noqa: F401
        except ImportError:
            raise UserError(
                f"planning for {target.name} needs the GPU compiler: pip install 'jax[cuda12-local]' (it runs "
                "without a GPU or CUDA; `make test-plan` builds such a venv in .venv-tpu)."
            ) from None
        nodes, gpus = (1, *target.topology) if len(target.topology) == 1 else target.topology
        description = topologies.get_topology_desc(
            platform="cuda", target_config=gpu_target_config(target.chip), topology=f"1x{nodes}x{gpus}"
        )
        return list(description.devices)
    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise UserError(
            f"planning for {target.name} needs the TPU compiler, libtpu: pip install 'jax[tpu]' (it runs "
            "without a TPU; `make test-plan` builds such a venv in .venv-tpu)."
        ) from None
    options = {"chip_config_name": "megacore"} if target.generation == "v4" else {}  # one device per v4 chip
    try:
        description = topologies.get_topology_desc(topology_name=target.name, platform="tpu", **options)
    except jax.errors.JaxRuntimeError as error:
        raise UserError(f"target {target.name}: the TPU software refuses it ({error}); use {TARGET_FORMS}.") from None
    return list(description.devices)
