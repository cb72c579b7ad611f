"""The translation side of a plan: beam search compiled for one chip of a target, and the largest batch that fits.

`translate` splits each batch over the process's devices along a data axis (`--devices`), each chip decoding its own
rows with the parameters replicated, so the question is per chip: how many sentences of a given source length one
chip can beam-search at once (times the host's chips: the --batch-size to give).
The programs are the ones `translate` runs (decoding/driver.py: the start, then segments), each at its largest: the
whole batch with the cache at its full length (source length + decode.extra_length, clipped to the model's max_len).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from transformer_jax import sharding
from transformer_jax.decoding.beam import BeamSearch
from transformer_jax.decoding.config import resolve_max_decode_len
from transformer_jax.decoding.driver import compile_largest_segments
from transformer_jax.errors import ConfigError
from transformer_jax.experiment import Experiment, MeshConfig
from transformer_jax.model import Transformer
from transformer_jax.plan.figures import CompiledMemory, compiled_memory, is_compile_oom, parse_oom, shard_bytes
from transformer_jax.plan.targets import Chip, Target, parse_target, target_devices
from transformer_jax.train.compiled import compiled_steps


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """Beam search of `batch` sentences of `source_length` tokens on one chip; bytes are the larger of the two
    programs' (start, segment), None where the compiler gave none (a program that does not fit)."""

    target: str
    chip: Chip
    batch: int
    source_length: int
    max_decode_len: int
    beam_size: int
    dtype: str  # activations; the parameters are float32, as saved
    fits: bool
    compile_s: float
    params_bytes: int  # the model's parameters, from their shapes
    carry_bytes: int | None = None  # what a segment continues from: the caches, the beams, the encoder output
    memory: CompiledMemory | None = None  # the larger program's ...
    program: str | None = None  # ... 'start' (the encoder, the cache) or 'segment' (search steps)
    required_bytes: int | None = None  # a program that does not fit: what the compiler needed ...
    available_bytes: int | None = None  # ... and what it had
    compiler_message: str | None = None

    @property
    def needed_bytes(self) -> int | None:
        return self.memory.needed_bytes if self.memory is not None else self.required_bytes

    @property
    def headroom_bytes(self) -> int | None:
        if self.required_bytes is not None and self.available_bytes is not None:
            return self.available_bytes - self.required_bytes
        return None if self.needed_bytes is None else self.chip.hbm_bytes - self.needed_bytes

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values.update(needed_bytes=self.needed_bytes, headroom_bytes=self.headroom_bytes)
        return values


def plan_decode(
    experiment: Experiment,
    target: str | Target,
    *,
    batch: int,
    source_length: int | None = None,
    devices: list | None = None,
) -> DecodePlan:
    """Compiles the beam search `translate` runs (experiment.decode's beam_size, alpha, extra_length; the model's
    dtype) for `batch` sentences of `source_length` tokens (default data.max_len) on one chip of `target`."""
    target = parse_target(target) if isinstance(target, str) else target
    devices = target_devices(target) if devices is None else devices
    model_cfg, decode_cfg = experiment.model, experiment.decode
    source_length = source_length or experiment.data.max_len
    if source_length > model_cfg.max_len:
        raise ConfigError(
            f"sources of {source_length} tokens: the model's positions end at model.max_len={model_cfg.max_len}; "
            "plan a shorter --source-length."
        )
    max_decode_len = resolve_max_decode_len(source_length, decode_cfg, None, model_cfg.max_len)
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices[:1])
    rules = tuple(sharding.rules_named("dp", mesh))
    one_chip = experiment.replace(mesh=MeshConfig(data=1, fsdp=1, tensor=1, rules="dp", mode="jit"))
    params = compiled_steps(model_cfg, one_chip, mesh, rules).abstract.params  # float32, whole on the chip
    search = BeamSearch(
        decode_cfg.beam_size, float(decode_cfg.alpha), model_cfg.bos_id, model_cfg.eos_id, model_cfg.pad_id,
        decode_cfg.gather == "one_hot", True, 1, decode_cfg.length_penalty,
    )  # fmt: skip
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    inputs = jax.ShapeDtypeStruct((batch, source_length), jnp.int32, sharding=replicated)  # [batch, src_len]
    facts = dict(
        target=target.name, chip=target.chip, batch=batch, source_length=source_length,
        max_decode_len=max_decode_len, beam_size=decode_cfg.beam_size, dtype=jnp.dtype(model_cfg.dtype).name,
        params_bytes=shard_bytes(params),
    )  # fmt: skip
    started = time.perf_counter()
    try:
        programs = compile_largest_segments(
            Transformer(model_cfg.replace(dropout_rate=0.0)), params, inputs, search,
            max_decode_len=max_decode_len, extra_length=decode_cfg.extra_length, mesh=mesh, rules=rules,
        )  # fmt: skip
    except jax.errors.JaxRuntimeError as error:
        if not is_compile_oom(error):
            raise
        required, available = parse_oom(str(error))
        return DecodePlan(
            **facts, fits=False, compile_s=time.perf_counter() - started, required_bytes=required,
            available_bytes=available, compiler_message=str(error).splitlines()[0],
        )  # fmt: skip
    memory, program = max(
        ((compiled_memory(programs.start), "start"), (compiled_memory(programs.segment), "segment")),
        key=lambda figures: figures[0].needed_bytes,
    )
    return DecodePlan(
        **facts,
        fits=memory.needed_bytes <= target.chip.hbm_bytes,
        compile_s=time.perf_counter() - started,
        carry_bytes=shard_bytes(programs.carry),
        memory=memory,
        program=program,
    )


def largest_decode_batch(
    experiment: Experiment,
    target: str | Target,
    *,
    source_length: int | None = None,
    smallest: int = 8,
    largest: int = 2**16,
    devices: list | None = None,
    progress: Callable[[DecodePlan], None] | None = None,
) -> list[DecodePlan]:
    """Plans batches from `smallest`, doubling while they fit (up to `largest`), then halves the gap between the
    largest that fits and the smallest that does not until it is within 1/16 of the former. Returns the plans,
    by batch; the answer is the largest batch whose plan fits (none if `smallest` does not)."""
    target = parse_target(target) if isinstance(target, str) else target
    devices = target_devices(target) if devices is None else devices
    plans: dict[int, DecodePlan] = {}

    def fits(batch: int) -> bool:
        plans[batch] = plan_decode(experiment, target, batch=batch, source_length=source_length, devices=devices)
        if progress is not None:
            progress(plans[batch])
        return plans[batch].fits

    low, high = None, None  # the largest batch that fits, the smallest that does not
    batch = smallest
    while batch <= largest:
        if not fits(batch):
            high = batch
            break
        low, batch = batch, 2 * batch
    while low is not None and high is not None and high - low > max(1, low // 16):
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return [plans[batch] for batch in sorted(plans)]
