"""Pods on paper: compile a run's real train step for a TPU slice or a GPU node on a machine without one, and say
what fits and how fast it could go (`transformer-jax plan`). targets.py: the chips, slices and GPU nodes;
compiling.py: `plan`, `search`; decoding.py: beam search on one chip, `plan_decode`, `largest_decode_batch`;
figures.py: memory, FLOPs and the roofline estimate of a compiled step; report.py: the tables.

    report = plan(load_experiment("experiments/base.py", overrides), "v5e:2x2")
    print(format_report(report))            # a table; report.to_dict() is the same as JSON-able data
    ranked = search(experiment, "v5e:4x4")  # every data x fsdp x tensor mesh of the slice, ranked
    print(format_search(ranked))            # ... with the --config.mesh.* overrides of each
    print(format_decode(largest_decode_batch(experiment, "v5e:2x2", source_length=128)))  # translation batch

`jax.experimental.topologies.get_topology_desc` gives the devices of a TPU slice (`v5e:2x2`, `v5p:2x2x2`, ...)
without any TPU present, and of NVIDIA GPUs (`h100:8`, `a100:2x8`) from a description of the GPU (XLA's
GpuTargetConfigProto, written from the public figures in CHIPS) without a GPU or CUDA. Over a Mesh of them the step
that `train` runs (train/compiled.py: same model, loss, optimizer, dtype, accum_steps, mesh section and rule table)
is lowered with the abstract state and batches as ShapeDtypeStructs and compiled by the target's compiler (libtpu:
`pip install 'jax[tpu]'`; the CUDA plugin: `pip install 'jax[cuda12-local]'`), once per static batch shape of the
data section (data/batching.train_shapes). From each compiled step:

- memory per chip (`memory_analysis`): arguments (the state and the batch shard), outputs, temporaries and the
  compiler's peak, against the chip's HBM. A step that does not fit a TPU fails to compile (CompileTimeHbmOom);
  that is reported as not fitting with the compiler's own figures (required vs available), not raised. The GPU
  compiler does not refuse: there the verdict is the memory analysis against the GPU's memory.
- FLOPs and HBM bytes per chip (`cost_analysis`; for a GPU, XLA's HLO cost analysis of the optimized program) beside
  our analytic count (accounting.forward_flops x 3: the forward pass and a backward pass of twice its matmuls).
- the bytes each kind of collective (all-reduce, all-gather, ...) produces per chip, from the compiled HLO.
- a roofline estimate: step time = max(FLOPs / peak FLOP/s, bytes / HBM bandwidth) per chip, from the public peak
  figures in CHIPS, and the tokens per second and model FLOPs utilisation (MFU: analytic FLOPs / (time x peak))
  that follow. It is rough: collectives over the chips' links (ICI, NVLink), the host's input and the compiler's
  schedule are not in it, and XLA's bytes accessed count every fused op's operands and results as HBM traffic
  (base on a v5e comes out HBM-bound); rank layouts by it rather than trust its absolute numbers.
"""

from transformer_jax.plan.compiling import mesh_shapes, plan, ranked, search
from transformer_jax.plan.decoding import DecodePlan, largest_decode_batch, plan_decode
from transformer_jax.plan.figures import (
    BucketPlan,
    CompiledMemory,
    PlanReport,
    Roofline,
    collective_bytes,
    compiled_memory,
    is_compile_oom,
    parse_oom,
    roofline,
    shard_bytes,
    tiled_bytes,
    train_flops,
)
from transformer_jax.plan.report import format_decode, format_report, format_search
from transformer_jax.plan.targets import CHIPS, TARGET_FORMS, Chip, Target, parse_target, target_devices

__all__ = [
    "CHIPS",
    "TARGET_FORMS",
    "BucketPlan",
    "CompiledMemory",
    "DecodePlan",
    "Chip",
    "PlanReport",
    "Roofline",
    "Target",
    "collective_bytes",
    "compiled_memory",
    "format_decode",
    "format_report",
    "format_search",
    "is_compile_oom",
    "largest_decode_batch",
    "mesh_shapes",
    "parse_oom",
    "parse_target",
    "plan",
    "plan_decode",
    "ranked",
    "roofline",
    "search",
    "shard_bytes",
    "target_devices",
    "tiled_bytes",
    "train_flops",
]
