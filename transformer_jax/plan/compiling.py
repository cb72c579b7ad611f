"""The run's train step compiled for a target, once per static batch shape (`plan`), and over the slice's meshes
(`search`)."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from transformer_jax import sharding
from transformer_jax.accounting import count_parameters
from transformer_jax.data.batching import train_shapes
from transformer_jax.errors import ConfigError
from transformer_jax.experiment import Experiment, MeshConfig
from transformer_jax.plan.figures import (
    BucketPlan,
    PlanReport,
    collective_bytes,
    compiled_memory,
    is_compile_oom,
    parse_oom,
    roofline,
    shard_bytes,
    tiled_bytes,
    train_flops,
)
from transformer_jax.plan.targets import Chip, Target, parse_target, target_devices
from transformer_jax.train.compiled import compiled_steps
from transformer_jax.train.step import PACKING_KEYS


def _batch_keys(pack: bool) -> tuple[str, ...]:
    return ("inputs", "targets", "decoder_inputs") + (tuple(PACKING_KEYS) if pack else ())


def plan(
    experiment: Experiment, target: str | Target, *, lengths: Sequence[int] | None = None, devices: list | None = None
) -> PlanReport:
    """Compiles the train step of `experiment` (as `train` builds it) for `target` once per bucket shape of its data
    section (only the bucket `lengths` given, if any) and reports per chip what fits and how fast it could run.

    Raises UserError for an unknown target or without libtpu, ConfigError when the mesh section does not fit the
    slice, the model does not divide over it, or a bucket cannot hold a row per data x fsdp device. A step that does
    not fit in HBM is a bucket with fits=False, not an error. `devices`: the target's devices, if already made.
    """
    target = parse_target(target) if isinstance(target, str) else target
    devices = target_devices(target) if devices is None else devices
    model_cfg, train_cfg, data_cfg = experiment.model, experiment.train, experiment.data
    try:
        mesh = sharding.make_mesh(experiment.mesh.shape, devices)
        rules = tuple(sharding.rules_named(experiment.mesh.rules, mesh))
        sharding.check_model_fits_mesh(model_cfg, mesh, rules)
    except ValueError as error:
        raise ConfigError(f"mesh section on {target.name} ({target.chips} chips): {error}") from None
    batch_axes = mesh.shape["data"] * mesh.shape["fsdp"]
    try:
        shapes = train_shapes(
            data_cfg.tokens_per_batch, data_cfg.max_len, data_cfg.bucket_boundaries or None, data_cfg.pack, batch_axes
        )
    except ValueError as error:
        raise ConfigError(f"data section on the mesh {dict(mesh.shape)}: {error}") from None
    if lengths is not None:
        unknown = sorted(set(lengths) - set(shapes))
        if unknown:
            raise ConfigError(
                f"bucket lengths {unknown} are not buckets of the data section, whose are {sorted(shapes)}."
            )
        shapes = {length: rows for length, rows in shapes.items() if length in lengths}

    compiled = compiled_steps(model_cfg, experiment, mesh, rules)  # the steps `train` runs, not yet compiled
    step, abstract = compiled.train_step, compiled.abstract
    batch_sharding = sharding.batch_sharding(mesh, rules)
    keys = _batch_keys(data_cfg.pack)
    chip = target.chip
    buckets, batch_bytes = [], {}
    for length, rows in sorted(shapes.items()):
        batch = {key: jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=batch_sharding) for key in keys}
        batch_bytes[length] = shard_bytes(batch)
        analytic = train_flops(model_cfg, rows, length) / target.chips
        buckets.append(_compile_bucket(step, abstract, batch, chip, length, rows, analytic))
    other = {name: getattr(abstract, name) for name in ("step", "rng", "grad_accum", "accum_tokens")}
    return PlanReport(
        target=target.name,
        chip=chip,
        chips=target.chips,
        mesh=dict(mesh.shape),
        rules=next((name for name, table in sharding.RULE_TABLES.items() if tuple(table) == rules), "custom"),
        mode=experiment.mesh.mode,
        dtype=jnp.dtype(model_cfg.dtype).name,
        tokens_per_batch=data_cfg.tokens_per_batch,
        accum_steps=train_cfg.accum_steps,
        parameters=count_parameters(model_cfg).total,
        state_bytes={
            "params": shard_bytes(abstract.params),
            "optimizer": shard_bytes(abstract.opt_state),
            "other": shard_bytes(other),
        },
        batch_bytes=batch_bytes,
        buckets=buckets,
    )


def _compile_bucket(step, abstract, batch, chip: Chip, length: int, rows: int, analytic: float) -> BucketPlan:
    started = time.perf_counter()
    try:
        compiled = step.lower(abstract, batch).compile()
    except jax.errors.JaxRuntimeError as error:
        if not is_compile_oom(error):
            raise
        required, available = parse_oom(str(error))
        message = str(error).splitlines()[0]
        return BucketPlan(
            length, rows, False, time.perf_counter() - started, chip.hbm_bytes,
            required_bytes=required, available_bytes=available, compiler_message=message, analytic_flops=analytic,
        )  # fmt: skip
    compile_s = time.perf_counter() - started
    memory = compiled_memory(compiled)
    try:  # the arguments' layouts on the chip (a TPU pads small dimensions to its tiles)
        formats = jax.tree.leaves(compiled.input_formats[0])
        leaves = jax.tree.leaves((abstract, batch))
        expected = sum(tiled_bytes(leaf.sharding.shard_shape(leaf.shape), leaf.dtype, form.layout)
                       for leaf, form in zip(leaves, formats, strict=True))  # fmt: skip
    except (AttributeError, TypeError, ValueError):
        expected = None
    cost = _cost_analysis(compiled)
    flops = float(cost["flops"]) if cost.get("flops", -1) >= 0 else None
    bytes_accessed = float(cost["bytes accessed"]) if cost.get("bytes accessed", -1) >= 0 else None
    estimate = roofline(
        analytic if flops is None else flops, bytes_accessed, chip, analytic_flops=analytic, rows=rows, length=length
    )
    return BucketPlan(
        length,
        rows,
        fits=memory.needed_bytes <= chip.hbm_bytes,
        compile_s=compile_s,
        hbm_bytes=chip.hbm_bytes,
        expected_argument_bytes=expected,
        **memory._asdict(),
        flops=flops,
        analytic_flops=analytic,
        bytes_accessed=bytes_accessed,
        collective_bytes=collective_bytes(compiled.as_text()),
        **estimate._asdict(),
    )


def _cost_analysis(compiled) -> dict:
    """The compiler's FLOPs and bytes accessed per chip. The GPU compiler reports none without a GPU; there, XLA's
    generic HLO cost analysis of the optimized program (the one each backend starts from), run by the host's CPU
    client. {} where neither is available."""
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):  # older jax: one dict per program
        cost = cost[0] if cost else {}
    if cost:
        return cost
    try:
        from jax._src.lib import xla_client

        (module,) = compiled.runtime_executable().hlo_modules()
        return dict(xla_client._xla.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module))
    except (AttributeError, ValueError, RuntimeError):  # another jax's internals
        return {}


# -------------------------------------------------------------------------------------------------------- search


def mesh_shapes(chips: int, model_cfg=None) -> list[dict[str, int]]:
    """Every {data, fsdp, tensor} whose product is `chips`; with a model config, those whose rule table ('auto')
    divides the model (sharding.check_model_fits_mesh), data parallel first."""
    shapes = []
    for fsdp, tensor in itertools.product(range(1, chips + 1), repeat=2):
        if chips % (fsdp * tensor):
            continue
        shape = {"data": chips // (fsdp * tensor), "fsdp": fsdp, "tensor": tensor}
        if model_cfg is not None and not _divides(model_cfg, shape):
            continue
        shapes.append(shape)
    return sorted(shapes, key=lambda shape: (shape["tensor"], shape["fsdp"]))


def _divides(model_cfg, shape: dict[str, int]) -> bool:
    """Whether the 'auto' rule table of a mesh of this shape divides every model dimension it shards."""
    rules = sharding.make_rules(fsdp=shape["fsdp"] > 1, tensor=shape["tensor"] > 1)
    for name, size in sharding.logical_axis_sizes(model_cfg).items():
        axes = sharding.mesh_axis_names(next(axes for logical, axes in rules if logical == name))  # the first rule
        if size % math.prod(shape[axis] for axis in axes):
            return False
    return True


MICRO_BATCHES = (1, 2, 4, 8, 16, 32)  # the splits of an update's batch `search` tries, fewest first


def search(
    experiment: Experiment,
    target: str | Target,
    *,
    lengths: Sequence[int] | None = None,
    meshes: Sequence[dict[str, int]] | None = None,
    progress=None,
) -> list[PlanReport]:
    """`plan` of every mesh of the slice that divides the model (`mesh_shapes`; or the {data, fsdp, tensor} `meshes`
    given), with 'auto' rules and mode 'jit', ranked (`ranked`).

    The update's batch stays the experiment's (data.tokens_per_batch x train.accum_steps tokens a side): each mesh
    takes it in one micro-batch if that fits, else in 2, 4, ... accumulated micro-batches (MICRO_BATCHES,
    train.accum_steps), the first that fits ending the mesh's search (smaller micro-batches only run slower); the
    attempts that do not fit are reported too. Compiles the shortest and the longest bucket unless `lengths` says
    which (the memory peak can be at either end: base needs more at 32 than at 256). A mesh whose micro-batch
    cannot hold a row per data x fsdp device is left out. progress(report): called after each compile."""
    target = parse_target(target) if isinstance(target, str) else target
    devices = target_devices(target)
    data = experiment.data
    update_tokens = data.tokens_per_batch * experiment.train.accum_steps
    buckets = train_shapes(data.tokens_per_batch, data.max_len, data.bucket_boundaries or None, data.pack)
    lengths = lengths or sorted({min(buckets), max(buckets)})
    reports = []
    for shape in mesh_shapes(target.chips, experiment.model) if meshes is None else meshes:
        for micro_batches in MICRO_BATCHES:
            tokens = -(-update_tokens // micro_batches)
            try:
                train_shapes(
                    tokens, data.max_len, data.bucket_boundaries or None, data.pack, shape["data"] * shape["fsdp"]
                )
            except ValueError:  # a bucket cannot hold a row per data x fsdp device
                break
            layout = experiment.replace(
                mesh=MeshConfig(**shape, rules="auto", mode="jit"),
                data=data.replace(tokens_per_batch=tokens),
                train=experiment.train.replace(accum_steps=micro_batches),
            )
            report = plan(layout, target, lengths=lengths, devices=devices)
            reports.append(report)
            if progress is not None:
                progress(report)
            if report.fits:
                break
    return ranked(reports)


def ranked(reports: Sequence[PlanReport]) -> list[PlanReport]:
    """The layouts that fit, fastest first (estimated tokens per second), then those that do not."""
    return sorted(reports, key=lambda report: (not report.fits, -(report.tokens_per_s or 0.0)))


# ---------------------------------------------------------------------------------------------------------- text
