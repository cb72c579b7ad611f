"""Running a search (greedy.GreedySearch, beam.BeamSearch): inside one jit, or in segments driven from the host.

A search is an object with `initial(cache, batch_size, max_decode_len)`, `step(step_fn, state, sentences)`,
`sentences_done(state, sentences)` [batch], `outputs(state)` (arrays with a leading batch axis) and
`rows_per_sentence`; its state is a NamedTuple with `step` and `cache`; `sentences` (sentences.Sentences) holds
each sentence's length limit, id and forced prefix.

run_search is the whole loop in one lax.while_loop (traceable, any step function). decode_in_segments runs a
Transformer's search as a few jitted segments of `decode.cache_segment` steps, and between them, on the host:
  - the cache grows (doubling) when the next segment needs more positions, so that a step's attention reads
    about the positions written, not the whole buffer;
  - the finished sentences leave the batch: their outputs are final (greedy: EOS or the limit; beam: exact early
    termination) and the rest continue in a batch of the active count rounded up to a multiple of ROW_STEP (at
    least MIN_ROWS), the way an inference engine drops finished sentences.
A sentence's output is computed by the same steps either way; each (rows, cache length) pair compiles once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.typing import ArrayLike

from transformer_jax import sharding
from transformer_jax.decoding.cache import Cache, constrain_cache, resize_cache
from transformer_jax.decoding.config import DecodeConfig, cache_lengths, per_sentence_limits, resolve_max_decode_len
from transformer_jax.decoding.sentences import Sentences, pad_prefixes, plain_sentences
from transformer_jax.decoding.steps import StepFn, as_params, encode, init_cache, transformer_step_fn

logger = logging.getLogger(__name__)

MIN_ROWS = 8  # a batch does not shrink below this many sentences (fewer compiled shapes, little to gain)
ROW_STEP = 8  # batch sizes a shrinking batch takes are multiples of this (each compiles once)


def _before(cond: Callable[[Any], jnp.ndarray], length: int, state: Any) -> jnp.ndarray:
    return cond(state) & (state.step < length)


def growing_cache_loop(
    cond: Callable[[Any], jnp.ndarray],
    body: Callable[[Any], Any],
    state: Any,
    lengths: Sequence[int],
    resize: Callable[[Cache, int], Cache] = resize_cache,
) -> Any:
    """lax.while_loop(cond, body, state) over a cache that grows, inside one jit: segment i runs while
    state.step < lengths[i] with a cache of lengths[i] positions (state.cache must start at lengths[0]). Once
    cond is False the later segments run no step. One segment, (max_decode_len,), is the plain loop."""
    for segment, length in enumerate(lengths):
        if segment:
            state = state._replace(cache=resize(state.cache, length))
        state = lax.while_loop(functools.partial(_before, cond, length), body, state)
    return state


def run_search(
    search,
    step_fn: StepFn,
    cache: Cache,
    batch_size: int,
    max_decode_len: int,
    max_lengths: jnp.ndarray | None,
    constrain: Callable[[Cache], Cache],
    lengths: Sequence[int] | None,
):
    """The final state of `search` over `step_fn`, in one jit: until every sentence is done or max_decode_len.
    max_lengths: [batch] per-sentence limits (default max_decode_len); lengths: growing_cache_loop's."""
    if max_lengths is None:
        max_lengths = jnp.full((batch_size,), max_decode_len, jnp.int32)
    sentences = plain_sentences(max_lengths)

    def cond(state):
        return (state.step < max_decode_len) & ~jnp.all(search.sentences_done(state, sentences))

    def body(state):
        state = search.step(step_fn, state, sentences)
        return state._replace(cache=constrain(state.cache))

    initial = search.initial(constrain(cache), batch_size, max_decode_len)
    return growing_cache_loop(cond, body, initial, lengths or (max_decode_len,))


class Carry(NamedTuple):
    """What a segment continues from; every array but the scalars has the sentences as its leading axis."""

    state: Any  # the search's state
    encoded: jnp.ndarray  # [batch, src_len, d_model]
    inputs: jnp.ndarray  # [batch, src_len] source ids
    sentences: Sentences  # limits, ids, forced prefixes


def _rows(inputs: jnp.ndarray, search) -> jnp.ndarray:
    """[batch * rows_per_sentence, src_len]: each source repeated for its decoded rows (adjacent)."""
    k = search.rows_per_sentence
    return jnp.repeat(inputs, k, axis=0) if k > 1 else inputs


@functools.partial(
    jax.jit, static_argnames=("model", "search", "max_decode_len", "cache_len", "extra_length", "mesh", "rules")
)
def _start(
    model, params, inputs, ids, prefix, prefix_lengths, *, search, max_decode_len, cache_len, extra_length, mesh, rules
) -> Carry:
    cfg = model.config
    encoded = encode(model, params, inputs)  # [batch, src_len, d_model], once per sentence
    k = search.rows_per_sentence
    cache = init_cache(model, params, encoded, _rows(inputs, search), cache_len, beam_size=k)
    state = search.initial(constrain_cache(cache, mesh, rules), inputs.shape[0], max_decode_len)
    limits = per_sentence_limits(inputs, cfg.pad_id, extra_length, max_decode_len)
    limits = jnp.clip(jnp.maximum(limits, prefix_lengths + 1), 1, max_decode_len)  # room for the prefix and a token
    return Carry(state, encoded, inputs, Sentences(limits, ids, prefix, prefix_lengths))


@functools.partial(jax.jit, static_argnames=("model", "search", "mesh", "rules"), donate_argnames=("carry",))
def _run(model, params, carry: Carry, stop, *, search, mesh, rules) -> Carry:
    """Steps until every sentence is done or `stop` ([] int32, not static) tokens are decoded. The carry is donated:
    the new one takes its buffers, so a segment holds the cache about twice (the loop's two states), not three
    times (plan --decode measured it)."""
    step_fn = transformer_step_fn(model, params, carry.encoded, _rows(carry.inputs, search))

    def cond(state):
        return (state.step < stop) & ~jnp.all(search.sentences_done(state, carry.sentences))

    def body(state):
        state = search.step(step_fn, state, carry.sentences)
        return state._replace(cache=constrain_cache(state.cache, mesh, rules))

    return carry._replace(state=lax.while_loop(cond, body, carry.state))


@functools.partial(jax.jit, static_argnames=("search",))
def _done(carry: Carry, *, search) -> jnp.ndarray:
    return search.sentences_done(carry.state, carry.sentences)


@functools.partial(jax.jit, static_argnames=("search",))
def _outputs(carry: Carry, rows, *, search) -> tuple:
    return tuple(x[rows] for x in search.outputs(carry.state))


@jax.jit
def _select(carry: Carry, keep) -> Carry:
    """The carry of the sentences `keep` [new_batch] only (every cache array has the sentences first)."""
    return jax.tree.map(lambda x: x if jnp.ndim(x) == 0 else x[keep], carry)


@functools.partial(jax.jit, static_argnames=("cache_len",))
def _resize(carry: Carry, *, cache_len: int) -> Carry:
    return carry._replace(state=carry.state._replace(cache=resize_cache(carry.state.cache, cache_len)))


class LargestSegments(NamedTuple):
    """decode_in_segments' two programs at their largest, compiled, and what the segment continues from."""

    start: jax.stages.Compiled  # the encoder, the cache allocated at its full length
    segment: jax.stages.Compiled  # search steps over every sentence with that cache
    carry: Carry  # of jax.ShapeDtypeStructs with the start's output shardings


def compile_largest_segments(
    model: nn.Module, params, inputs, search, *, max_decode_len: int, extra_length: int, mesh: Mesh, rules
) -> LargestSegments:
    """The two programs of decode_in_segments at their largest, compiled: the start (encoder, the cache allocated at
    its full length `max_decode_len`) and a segment over every sentence of `inputs` [batch, src_len] with that
    cache; a later segment holds fewer rows or a shorter cache. params and inputs may be jax.ShapeDtypeStructs with
    shardings on `mesh`'s devices, for planning on a machine that has none of them (transformer_jax.plan)."""
    batch, rules = inputs.shape[0], tuple(rules)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def ints(*shape: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=replicated)

    static = dict(search=search, mesh=mesh, rules=rules)
    start = _start.lower(
        model, params, inputs, ints(batch), ints(batch, 0), ints(batch), max_decode_len=max_decode_len,
        cache_len=max_decode_len, extra_length=extra_length, **static,
    ).compile()  # fmt: skip
    carry = jax.tree.map(
        lambda out, placed: jax.ShapeDtypeStruct(out.shape, out.dtype, sharding=placed),
        start.out_info,
        start.output_shardings,
    )
    return LargestSegments(start, _run.lower(model, params, carry, ints(), **static).compile(), carry)


def shrunk_rows(rows: int, active: int, shards: int) -> int:
    """The batch size a segment continues with when `active` of `rows` sentences still decode: the active count
    rounded up to a multiple of ROW_STEP (and of the mesh's batch shards), at least MIN_ROWS, at most `rows`."""
    step = int(np.lcm(ROW_STEP, shards))
    target = max(-(-active // step), -(-MIN_ROWS // step)) * step
    return target if target < rows else rows


def _batch_shards(mesh: Mesh | None, rules: sharding.Rules) -> int:
    """How many ways the mesh splits the batch: a decode batch must stay a multiple of it."""
    if mesh is None:
        return 1
    axes = dict(rules).get("batch") or ()
    axes = (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[axis] for axis in axes])) if axes else 1


def decode_in_segments(
    model: nn.Module,
    params,
    inputs: ArrayLike,
    search,
    *,
    max_decode_len: int | None = None,
    config: DecodeConfig | None = None,
    mesh: Mesh | None = None,
    rules: sharding.Rules = sharding.DEFAULT_RULES,
    prefixes: Sequence[Sequence[int]] | None = None,
    sentence_ids: ArrayLike | None = None,
) -> tuple[np.ndarray, ...]:
    """search.outputs(final state) for `inputs` [batch, src_len], as numpy arrays in the order of `inputs`.

    The buffer is `max_decode_len` long (default: padded source width + config.extra_length, clipped to the
    model's max_len, and long enough for the longest prefix); each sentence's limit is its source length +
    extra_length (§6.1), and at least its prefix and one more token. prefixes: per sentence (the first
    len(prefixes) rows), target tokens its outputs start with. sentence_ids: [batch] the sentences' ids in
    their corpus (default 0 .. batch-1), the seeds of a sampling search.
    """
    config = DecodeConfig() if config is None else config
    inputs = np.asarray(inputs, np.int32)
    if inputs.ndim != 2:
        raise ValueError(f"inputs must be [batch, src_len] token ids, got shape {inputs.shape}.")
    batch = inputs.shape[0]
    prefix, prefix_lengths = pad_prefixes([list(p) for p in prefixes or []], batch, model.config.pad_id)
    ids = np.arange(batch, dtype=np.int32) if sentence_ids is None else np.asarray(sentence_ids, np.int32)
    if ids.shape != (batch,):
        raise ValueError(f"sentence_ids must be [batch={batch}], got shape {ids.shape}.")
    length = resolve_max_decode_len(inputs.shape[1], config, max_decode_len, model.config.max_len)
    if max_decode_len is None and config.max_decode_len is None:  # room for the longest prefix and a token
        length = max(length, min(int(prefix_lengths.max(initial=0)) + 1, model.config.max_len))
    params, rules = as_params(params), tuple(rules)
    segment = config.cache_segment or length
    cache_len = cache_lengths(length, config.cache_segment)[0]
    static = dict(search=search, mesh=mesh, rules=rules)
    carry = _start(
        model,
        params,
        jnp.asarray(inputs),
        jnp.asarray(ids),
        jnp.asarray(prefix),
        jnp.asarray(prefix_lengths),
        max_decode_len=length,
        cache_len=cache_len,
        extra_length=config.extra_length,
        **static,
    )
    rows = batch
    origin = np.arange(batch)  # the sentence of each row
    shards = _batch_shards(mesh, rules)
    results: list[np.ndarray] = []
    stop = min(segment, length)

    def collect(rows_out: np.ndarray) -> None:
        arrays = jax.device_get(_outputs(carry, jnp.asarray(rows_out), search=search))
        if not results:
            results.extend(np.zeros((batch,) + a.shape[1:], a.dtype) for a in arrays)
        for result, array in zip(results, arrays):
            result[origin[rows_out]] = array

    step = 0
    while True:
        carry = _run(model, params, carry, jnp.int32(stop), **static)
        done = np.asarray(_done(carry, search=search))  # [rows]
        reached = int(carry.state.step)
        logger.debug("segment: %d sentences x steps %d-%d (cache %d)", rows, step, reached, cache_len)
        step = reached
        if done.all() or stop >= length:
            break
        active = np.flatnonzero(~done)
        target = shrunk_rows(rows, active.size, shards)
        if target < rows:  # the finished sentences leave; a few may stay to fill the smaller batch
            keep = np.concatenate([active, np.flatnonzero(done)[: target - active.size]])
            collect(np.setdiff1d(np.arange(rows), keep))
            carry, origin, rows = _select(carry, jnp.asarray(keep)), origin[keep], target
        stop = min(stop + segment, length)
        if stop > cache_len:
            cache_len = min(max(2 * cache_len, stop), length)
            carry = _resize(carry, cache_len=cache_len)
    collect(np.arange(rows))
    return tuple(results)
