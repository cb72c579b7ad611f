"""Where arrays live: logical-axis rules and NamedShardings over a device Mesh, and a batch over processes.

Model parameters carry logical axis names ('vocab', 'embed', 'heads', 'kv', 'mlp', see layers/init.py); batches
use 'batch' and 'length'; the decode cache names its own (layers/kv_cache.py). A rule table maps each logical name
to mesh axes (or None = replicated), and every sharding is derived from it, so a new parallelism scheme is a new
table:

    mesh axes: ('data', 'fsdp', 'tensor')     default: one device, all sizes 1

Rule tables: DEFAULT_RULES (data parallel), FSDP_RULES, TENSOR_RULES, FSDP_TENSOR_RULES (`make_rules`,
`rules_for_mesh`, `rules_named`); arrays that name their axes themselves: `logical_tree_shardings`. A run's
`Layout` (`make_layout`: mesh, table, this process's rows); `data_shard`, `local_rows`, `global_batch` give each
process its rows of a global batch and assemble them (docs/SCALING.md). The per-device step lives in
train/step.py, multi-host start-up in distributed.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

Rules = Sequence[tuple[str, Any]]

# Data parallel only: every parameter replicated, the batch split over ('data', 'fsdp').
DEFAULT_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("vocab", None),
    ("embed", None),
    ("heads", None),
    ("kv", None),
    ("mlp", None),
)


def make_mesh(shape: Mapping[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Mesh with axes MESH_AXES. `shape` maps axis -> size; one size may be -1 (= the remaining devices).

    Default: {'data': -1, 'fsdp': 1, 'tensor': 1}, i.e. all devices data parallel (one device on a CPU).
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = dict({"data": -1, "fsdp": 1, "tensor": 1}, **(shape or {}))
    unknown = set(shape) - set(MESH_AXES)
    if unknown:
        raise ValueError(f"mesh axes {sorted(unknown)} are unknown; the mesh axes are {MESH_AXES}.")
    sizes = [int(shape[axis]) for axis in MESH_AXES]
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh shape {shape}: at most one axis may be -1.")
    known = int(np.prod([size for size in sizes if size != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"mesh shape {shape} does not divide the {len(devices)} devices.")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(
            f"mesh shape {dict(zip(MESH_AXES, sizes))} needs {int(np.prod(sizes))} devices, "
            f"but {len(devices)} are visible; set the sizes so their product is {len(devices)} (or use -1)."
        )
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def mesh_axis_names(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry: None -> (), 'data' -> ('data',), ('data', 'fsdp') as is."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def logical_sharding(mesh: Mesh, logical_axes: Sequence[str | None], rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """NamedSharding of one array whose dimensions have the given logical names."""
    return NamedSharding(mesh, _mesh_spec(logical_axes, rules))


def _mesh_spec(logical_axes: Sequence[str | None], rules: Rules) -> PartitionSpec:
    spec = nn.logical_to_mesh_axes(tuple(logical_axes), rules)
    assert spec is not None  # None only for logical_axes=None
    return spec


def tree_shardings(boxed_tree: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """NamedShardings for a tree whose leaves may be `nn.LogicallyPartitioned` boxes (e.g. from eval_shape).

    Unboxed leaves (step counters, rng keys, Adam's count) are replicated.
    """
    logical_specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


def batch_sharding(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """Sharding of every [batch, length] array of a batch: split on the first axis ('batch')."""
    return logical_sharding(mesh, ("batch", "length"), rules)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


# ---------------------------------------------------------------------------------------------------------------
# FSDP and tensor-parallel rule tables; the table for a mesh or a config (mesh.rules); whether a model divides over a
# mesh; shardings of arrays that name their own axes (the decode cache).
#
# Rules are applied in order (flax `logical_to_mesh_axes`): a logical axis takes the first rule whose mesh axes are
# not already used by another dimension of the same array, so later rules act as fallbacks. Every parameter of the
# model has an 'embed' (d_model) dimension except the FFN's first bias ['mlp'] and the attention biases
# ['heads', 'kv'] (off by default), so sharding 'embed' over 'fsdp' splits about 1/fsdp of the parameter bytes.
#
#   parameter            logical axes              FSDP          tensor (Megatron)      FSDP + tensor
#   embedding            [vocab, embed]            [-, fsdp]     [tensor, -]            [tensor, fsdp]
#   query/key/value      [embed, heads, kv]        [fsdp, -, -]  [-, tensor, -]         [fsdp, tensor, -]
#   attention out        [heads, kv, embed]        [-, -, fsdp]  [tensor, -, -]         [tensor, -, fsdp]
#   ffn wi / wo          [embed, mlp] / [mlp, embed]  embed->fsdp  mlp->tensor            both
#   ffn bias_i           [mlp]                     [fsdp]        [tensor]               [tensor]
#   LayerNorm, biases    [embed]                   [fsdp]        [-]                    [fsdp]
#
# Tensor parallelism follows Megatron-LM: column-parallel Q/K/V and FFN-in (heads / mlp split), row-parallel
# attention-out and FFN-out, one all-reduce after each; the shared embedding / softmax projection is split along
# the vocabulary. XLA's SPMD partitioner inserts the collectives from these parameter shardings.
# ---------------------------------------------------------------------------------------------------------------

PARAM_AXES = ("vocab", "embed", "heads", "kv", "mlp")


def make_rules(fsdp: bool = False, tensor: bool = False) -> Rules:
    """Rule table for data parallelism plus, optionally, FSDP (ZeRO-3 style) and Megatron tensor parallelism.

    The batch is always split over ('data', 'fsdp') and replicated over 'tensor'. Optimizer moments follow the
    parameters (they inherit the parameters' logical boxes), so FSDP shards them too.
    """
    rules: list[tuple[str, Any]] = [("batch", ("data", "fsdp")), ("length", None)]
    if tensor:
        rules += [("vocab", "tensor"), ("heads", "tensor"), ("mlp", "tensor")]
    if fsdp:
        rules += [("embed", "fsdp"), ("mlp", "fsdp"), ("vocab", "fsdp")]  # 'mlp', 'vocab': vectors w/o 'embed'
    rules += [(name, None) for name in PARAM_AXES]  # whatever is left is replicated
    return tuple(rules)


FSDP_RULES: Rules = make_rules(fsdp=True)
TENSOR_RULES: Rules = make_rules(tensor=True)
FSDP_TENSOR_RULES: Rules = make_rules(fsdp=True, tensor=True)
RULE_TABLES: dict[str, Rules] = {
    "dp": DEFAULT_RULES,
    "fsdp": FSDP_RULES,
    "tensor": TENSOR_RULES,
    "fsdp_tensor": FSDP_TENSOR_RULES,
}


def rules_for_mesh(mesh: Mesh) -> Rules:
    """The table that uses every mesh axis of size > 1: FSDP when fsdp > 1, tensor rules when tensor > 1."""
    return make_rules(fsdp=mesh.shape["fsdp"] > 1, tensor=mesh.shape["tensor"] > 1)


def rules_named(name: str, mesh: Mesh) -> Rules:
    """The rule table 'auto' | 'dp' | 'fsdp' | 'tensor' | 'fsdp_tensor' (the `mesh.rules` of an experiment).

    'auto' = `rules_for_mesh(mesh)`. A named table must fit the mesh: 'dp' on a mesh with fsdp > 1 would silently
    replicate what the user asked to shard, so it is an error.
    """
    if name == "auto":
        return rules_for_mesh(mesh)
    if name not in RULE_TABLES:
        raise ValueError(f"mesh.rules={name!r} is unknown; use 'auto' or one of {sorted(RULE_TABLES)}.")
    needs_fsdp, needs_tensor = "fsdp" in name, "tensor" in name
    for axis, wanted in (("fsdp", needs_fsdp), ("tensor", needs_tensor)):
        if (mesh.shape[axis] > 1) != wanted:
            raise ValueError(
                f"mesh.rules={name!r} does not fit the mesh {dict(mesh.shape)}: the {axis!r} axis has size "
                f"{mesh.shape[axis]}; use mesh.rules='auto' or set mesh.{axis} "
                f"{'> 1' if wanted else '= 1'}."
            )
    return RULE_TABLES[name]


def logical_axis_sizes(model_cfg: Any) -> dict[str, int]:
    """Size of every parameter logical axis of a ModelConfig."""
    return {
        "vocab": model_cfg.vocab_size,
        "embed": model_cfg.d_model,
        "heads": model_cfg.num_heads,
        "kv": model_cfg.head_dim,
        "mlp": model_cfg.d_ff,
    }


def check_model_fits_mesh(model_cfg: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> None:
    """Raises ValueError naming every model dimension that the mesh axes it is sharded over do not divide."""
    problems = []
    for name, size in logical_axis_sizes(model_cfg).items():
        axes = mesh_axis_names(_mesh_spec((name,), rules)[0])
        shards = int(np.prod([mesh.shape[axis] for axis in axes])) if axes else 1
        if size % shards:
            problems.append(f"'{name}' (size {size}) is split over mesh axes {axes} of total size {shards}")
    if problems:
        raise ValueError(
            "the model does not divide over the mesh "
            f"{dict(mesh.shape)}: "
            + "; ".join(problems)
            + ". Choose mesh sizes that divide these dimensions (e.g. tensor | num_heads, d_ff and vocab_size; "
            "fsdp | d_model and d_ff) or round vocab_size up to a multiple of them."
        )


def logical_tree_shardings(logical_specs: Any, tree: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """NamedShardings of the arrays (or ShapeDtypeStructs) of `tree` whose dimensions have the logical names in
    `logical_specs` (a PartitionSpec of names per array, in the tree's structure), from the rules like the
    parameters' shardings. A dimension its mesh axes do not divide (e.g. a decode batch smaller than data x fsdp)
    is replicated instead. The decode cache declares its names (decoding/cache.cache_shardings).
    """

    def sharding(logical: PartitionSpec, leaf) -> NamedSharding:
        spec = []
        for size, entry in zip(leaf.shape, _mesh_spec(tuple(logical), rules)):
            names = mesh_axis_names(entry)
            shards = int(np.prod([mesh.shape[name] for name in names])) if names else 1
            spec.append(entry if size % shards == 0 else None)
        return NamedSharding(mesh, PartitionSpec(*spec))

    return jax.tree.map(sharding, logical_specs, tree, is_leaf=lambda node: isinstance(node, PartitionSpec))


def per_device_bytes(tree: Any) -> dict[str, int]:
    """{str(device): bytes of the tree's shards held on that device}, from each array's `addressable_shards`."""
    totals: dict[str, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in getattr(leaf, "addressable_shards", ()):
            key = str(shard.device)
            totals[key] = totals.get(key, 0) + int(shard.data.size) * shard.data.dtype.itemsize
    return totals


class Layout(NamedTuple):
    """Where a run's arrays live."""

    mesh: Mesh
    rules: tuple  # the rule table
    shard: tuple[int, int]  # (index, count): this process's rows of every global batch (`data_shard`)

    @property
    def batch_axes(self) -> int:
        """Devices a batch is split over (data x fsdp): batches have a multiple of this many rows."""
        return self.mesh.shape["data"] * self.mesh.shape["fsdp"]


def make_layout(shape: Mapping[str, int], rules: str = "auto", model_cfg: Any = None) -> Layout:
    """A mesh of every device (`make_mesh(shape)`), the rule table named `rules` (`rules_named`) and this process's
    rows; with `model_cfg`, checked to divide the model (`check_model_fits_mesh`). ValueError names what does not
    fit."""
    mesh = make_mesh(shape)
    table = tuple(rules_named(rules, mesh))
    if model_cfg is not None:
        check_model_fits_mesh(model_cfg, mesh, table)
    return Layout(mesh, table, data_shard(mesh, table))


# ------------------------------------------------------------------------------------- batches over processes


def data_shard(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> tuple[int, int]:
    """(shard_index, shard_count) of this process's rows of every global batch.

    The global batch is split over the mesh's batch axes; this process holds the rows of its own devices, which
    must form one contiguous block (true for `make_mesh`, whose devices are ordered by process). Feed the
    pair to `data.batching.TrainBatches(shard_index=, shard_count=)`: it yields rows
    [index * rows / count, (index + 1) * rows / count) of each global batch, which is this block.
    Processes that hold the same rows (a tensor axis spanning hosts) get the same index and must read the same data.
    """
    sharding = batch_sharding(mesh, rules)
    spec = sharding.spec[0] if len(sharding.spec) else None
    names = mesh_axis_names(spec)
    shards = int(np.prod([mesh.shape[name] for name in names])) if names else 1
    index_map = sharding.addressable_devices_indices_map((shards, 1))
    rows = sorted({(index[0].start or 0) for index in index_map.values() if index is not None})
    if rows != list(range(rows[0], rows[0] + len(rows))):
        raise ValueError(
            f"the batch rows of process {jax.process_index()} ({rows}) are not contiguous on the mesh "
            f"{dict(mesh.shape)}; order the mesh's devices by process (make_mesh does)."
        )
    count = shards // len(rows)
    return rows[0] // len(rows), count


def local_rows(batch: Mapping[str, np.ndarray], shard_index: int, shard_count: int) -> dict:
    """Rows [index * rows / count, (index + 1) * rows / count) of a batch that every process holds whole (e.g. a
    validation batch): this process's part of it, for `global_batch`."""
    out = {}
    for name, value in batch.items():
        rows = value.shape[0]
        if rows % shard_count:
            raise ValueError(f"batch[{name!r}] has {rows} rows, not a multiple of the {shard_count} data shards.")
        size = rows // shard_count
        out[name] = value[shard_index * size : (shard_index + 1) * size]
    return out


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh, rules: Rules = DEFAULT_RULES) -> dict:
    """This process's rows (from `data_shard`) -> global jax.Arrays sharded over the batch axes.

    Every process must call it with the same shapes.
    """
    sharding = batch_sharding(mesh, rules)
    out = {}
    for name, value in local_batch.items():
        value = np.asarray(value)
        try:
            out[name] = jax.make_array_from_process_local_data(sharding, value)
        except ValueError as error:
            raise ValueError(
                f"batch[{name!r}] of local shape {value.shape} does not fit the batch sharding "
                f"{sharding.spec} over {dict(mesh.shape)} on process {jax.process_index()} "
                f"of {jax.process_count()}: {error}"
            ) from error
    return out
