"""What a compiled step says: memory per chip against the chip's HBM, a compile-time OOM's figures, FLOPs, the bytes
its collectives move and a rough roofline estimate of its speed."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from transformer_jax.accounting import forward_flops
from transformer_jax.plan.targets import Chip


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    """One compiled batch shape [rows, length] on one chip. Bytes and FLOPs are per chip; None where unknown (a
    step that does not fit has no memory or cost analysis, only the compiler's required / available figures)."""

    length: int
    rows: int  # of the global batch
    fits: bool
    compile_s: float
    hbm_bytes: int  # the chip's HBM (CHIPS)
    argument_bytes: int | None = None  # the state and this chip's rows of the batch
    expected_argument_bytes: int | None = None  # the same from our shardings, in the chip's tiles (tiled_bytes)
    output_bytes: int | None = None
    alias_bytes: int | None = None  # outputs written into donated arguments (the state)
    temp_bytes: int | None = None
    peak_bytes: int | None = None  # the compiler's peak of live buffers
    total_bytes: int | None = None  # arguments + outputs - aliased + temp: what the step allocates
    required_bytes: int | None = None  # a step that does not fit: what the compiler needed ...
    available_bytes: int | None = None  # ... and what it had
    compiler_message: str | None = None  # a step that does not fit: the compiler's own words
    flops: float | None = None  # the compiler's count, every op of the step (optimizer included)
    analytic_flops: float | None = None  # 3 x accounting.forward_flops (matmuls only) / chips
    bytes_accessed: float | None = None
    collective_bytes: dict[str, int] | None = None  # per kind of collective, what it produces (collective_bytes)
    compute_s: float | None = None  # flops / peak FLOP/s
    memory_s: float | None = None  # bytes_accessed / HBM bandwidth
    step_s: float | None = None  # the roofline estimate: max(compute_s, memory_s)
    tokens_per_s: float | None = None  # rows x length / step_s: padded positions per side (data.tokens_per_batch)
    mfu: float | None = None  # analytic_flops / (step_s x peak FLOP/s)

    @property
    def needed_bytes(self) -> int | None:
        """HBM the step needs: the larger of the compiler's peak and its allocations; a step that does not fit:
        what the compiler required."""
        sizes = [size for size in (self.peak_bytes, self.total_bytes) if size is not None]
        return max(sizes) if sizes else self.required_bytes

    @property
    def headroom_bytes(self) -> int | None:
        """HBM left beside the peak (negative: short by that much); for a step that does not fit, available -
        required from the compiler's message."""
        if self.required_bytes is not None and self.available_bytes is not None:
            return self.available_bytes - self.required_bytes
        return None if self.needed_bytes is None else self.hbm_bytes - self.needed_bytes


@dataclasses.dataclass(frozen=True)
class PlanReport:
    """The plan of an experiment on a target: its layout, the state per chip from our shardings, each bucket."""

    target: str
    chip: Chip
    chips: int
    mesh: dict[str, int]  # data, fsdp, tensor
    rules: str  # the mesh section's table name ('auto' resolved: dp, fsdp, tensor or fsdp_tensor)
    mode: str
    dtype: str
    tokens_per_batch: int  # data.tokens_per_batch: a micro-batch's padded positions a side
    accum_steps: int  # micro-batches an update
    parameters: int
    state_bytes: dict[str, int]  # per chip, from the shardings: params, optimizer (Adam moments), other
    batch_bytes: dict[int, int]  # per chip: bucket length -> bytes of this chip's rows of a batch
    buckets: list[BucketPlan]

    @property
    def fits(self) -> bool:
        return all(bucket.fits for bucket in self.buckets)

    @property
    def tokens_per_s(self) -> float | None:
        """The slowest bucket's estimate (every bucket holds about data.tokens_per_batch positions)."""
        rates = [bucket.tokens_per_s for bucket in self.buckets]
        return None if not rates or None in rates else min(rate for rate in rates if rate is not None)

    @property
    def overrides(self) -> str:
        """The overrides that give `train` this layout: --config.mesh.*, the micro-batch and the accumulation."""
        mesh = [f"--config.mesh.{axis}={size}" for axis, size in self.mesh.items()]
        batch = [
            f"--config.data.tokens_per_batch={self.tokens_per_batch}",
            f"--config.train.accum_steps={self.accum_steps}",
        ]
        return " ".join(mesh + batch)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, with the derived figures (fits, headroom, tokens per second, overrides)."""
        values = dataclasses.asdict(self)
        values["batch_bytes"] = {str(length): size for length, size in self.batch_bytes.items()}
        for bucket, plan in zip(values["buckets"], self.buckets):
            bucket.update(needed_bytes=plan.needed_bytes, headroom_bytes=plan.headroom_bytes)
        values.update(fits=self.fits, tokens_per_s=self.tokens_per_s, overrides=self.overrides)
        return values


class CompiledMemory(NamedTuple):
    """A compiled program's memory on one chip (`memory_analysis`), in bytes."""

    argument_bytes: int
    output_bytes: int
    alias_bytes: int  # outputs written into donated arguments
    temp_bytes: int
    peak_bytes: int | None  # the compiler's peak of live buffers, where it reports one
    total_bytes: int  # arguments + outputs - aliased + temp: what the program allocates

    @property
    def needed_bytes(self) -> int:
        """HBM the program needs: the larger of the compiler's peak and its allocations."""
        return max(self.peak_bytes or 0, self.total_bytes)


def compiled_memory(compiled: Any) -> CompiledMemory:
    memory = compiled.memory_analysis()
    argument, output, alias, temp = (
        int(getattr(memory, f"{name}_size_in_bytes")) for name in ("argument", "output", "alias", "temp")
    )
    peak = int(getattr(memory, "peak_memory_in_bytes", 0)) or None
    return CompiledMemory(argument, output, alias, temp, peak, argument + output - alias + temp)


def shard_bytes(tree: Any) -> int:
    """Bytes of one device's shard of every leaf (ShapeDtypeStructs or arrays with NamedShardings): the largest
    shard, as every shard of an evenly divided array."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def tiled_bytes(shape: Sequence[int], dtype: Any, layout: Any) -> int:
    """Bytes of an array of `shape` in a device layout (`compiled.input_formats`): its dimensions in the layout's
    major-to-minor order, the most minor ones padded to the layout's first tile (a TPU keeps a float32 vector in
    tiles of 128 elements, a matrix in tiles of 8 x 128, a scalar in a tile of 128)."""
    dims = [shape[axis] for axis in layout.major_to_minor] or [1]
    tile = tuple(layout.tiling[0]) if layout.tiling else ()
    dims = [1] * (len(tile) - len(dims)) + dims
    for index, size in enumerate(reversed(tile), start=1):
        dims[-index] = -(-dims[-index] // size) * size
    return math.prod(dims) * jnp.dtype(dtype).itemsize


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_oom(message: str) -> tuple[int | None, int | None]:
    """(required, available) bytes from the TPU compiler's CompileTimeHbmOom message, e.g. '... the total memory
    required for HLO temporaries (18.67G) exceeds available HBM (15.75G)' (sizes in binary units); None for a
    figure the message does not give."""

    def size(pattern: str) -> int | None:
        found = re.search(pattern + r"\s*\(?\s*([\d.]+)\s*([KMGT]?)i?B?\)?", message, re.IGNORECASE)
        return None if found is None else round(float(found.group(1)) * _UNITS[found.group(2).upper()])

    required = size(r"required[^()]*")
    available = size(r"available HBM")
    if required is None or available is None:  # the older wording: 'Used 18.67G of 15.75G hbm'
        used = re.search(r"Used ([\d.]+)([KMGT]) of ([\d.]+)([KMGT]) hbm", message)
        if used is not None:
            required = round(float(used.group(1)) * _UNITS[used.group(2)])
            available = round(float(used.group(3)) * _UNITS[used.group(4)])
    return required, available


def is_compile_oom(error: Exception) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text and ("HbmOom" in text or "memory" in text.lower())


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}  # fmt: skip
_ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")


def _array_bytes(shape: str) -> int:
    """Bytes of the arrays an HLO shape names ('f32[128,32]{0,1:T(8,128)}', or a tuple of them); float8 types 1."""
    return sum(
        math.prod(int(size) for size in dims.split(",") if size) * _DTYPE_BYTES.get(dtype, 1)
        for dtype, dims in _ARRAY.findall(shape)
    )


def _shape_and_opcode(instruction: str) -> tuple[str, str]:
    """('f32[4]{0}', 'all-reduce') of an HLO instruction's text after its '= '."""
    if instruction.startswith("("):  # a tuple shape: up to its closing parenthesis
        depths = itertools.accumulate({"(": 1, ")": -1}.get(char, 0) for char in instruction)
        end = next(index for index, depth in enumerate(depths) if depth == 0) + 1
        shape, rest = instruction[:end], instruction[end:]
    else:
        shape, _, rest = instruction.partition(" ")
    return shape, rest.strip().split("(", 1)[0]


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes that each kind of collective (COLLECTIVES) produces on one chip in a compiled program's HLO text: the
    result shapes of its collective instructions, summed. An asynchronous pair counts its `-done` (the output; the
    `-start` also holds the operands); an instruction in a loop body (accumulation) counts once."""
    totals = dict.fromkeys(COLLECTIVES, 0)
    for line in hlo_text.splitlines():
        name, equals, instruction = line.strip().partition(" = ")
        if not equals or not name.startswith(("%", "ROOT")):
            continue
        shape, opcode = _shape_and_opcode(instruction)
        kind = opcode.removesuffix("-done")  # an "...-start" is no kind
        if kind in totals:
            totals[kind] += _array_bytes(shape)
    return totals


class Roofline(NamedTuple):
    """The roofline estimate of one step on one chip."""

    compute_s: float  # FLOPs at the chip's peak rate
    memory_s: float | None  # bytes accessed at its HBM bandwidth
    step_s: float  # the larger of the two (they overlap at best)
    tokens_per_s: float  # the batch's rows x length per step_s
    mfu: float  # the analytic FLOPs per chip over what the chip could do in step_s


def roofline(
    flops: float, bytes_accessed: float | None, chip: Chip, *, analytic_flops: float, rows: int, length: int
) -> Roofline:
    """The roofline estimate of a step that does `flops` (per chip; the compiler's count) and reads and writes
    `bytes_accessed` of HBM on `chip`, for a global batch of rows x length with `analytic_flops` per chip."""
    compute_s = flops / chip.peak_flops
    memory_s = None if bytes_accessed is None else bytes_accessed / chip.hbm_bandwidth
    step_s = max(compute_s, memory_s or 0.0)
    return Roofline(compute_s, memory_s, step_s, rows * length / step_s, analytic_flops / (step_s * chip.peak_flops))


def train_flops(model_cfg, rows: int, length: int) -> float:
    """Analytic FLOPs of one train step on a [rows, length] batch: the forward matmuls and a backward of twice
    as many (accounting.forward_flops; LayerNorm, softmax, the loss and Adam are left out)."""
    return 3.0 * forward_flops(model_cfg, rows, length, length)["total"]


# ------------------------------------------------------------------------------------------------------ planning
