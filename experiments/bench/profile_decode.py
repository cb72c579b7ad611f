"""Where a decode step's time goes: per-op timings of the jitted greedy and beam loops, grouped by what each op is.

    .venv/bin/python experiments/bench/profile_decode.py --workdir runs/m30k --source test.en   # a trained model
    .venv/bin/python experiments/bench/profile_decode.py                                          # m30k shape, random

Each search runs `--steps` steps on one batch (EOS made unreachable and early stopping off, so every run takes
the same steps), once to compile and warm, then traced with jax.profiler. Every XLA op of the trace is matched to
its HLO instruction (profile_step.hlo_instructions) and grouped by its source (the JAX function or Flax module
that emitted it). 'loop overhead' is the wall time per step that no op accounts for: the while loop's own control,
the runtime's dispatch between ops, threads waiting. With --source, the report also counts the row-steps spent on
finished rows when the same sentences are translated for real (length-sorted batches, early termination).
Writes JSON to experiments/bench/results/profile_decode.json. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_step import hlo_instructions, traced_op_ms  # noqa: E402
from results_file import write_results  # noqa: E402

from transformer_jax.decoding import (  # noqa: E402
    DecodeConfig,
    beam_search_core,
    greedy_search,
    init_cache,
    transformer_step_fn,
)
from transformer_jax.decoding.config import cache_lengths  # noqa: E402
from transformer_jax.decoding.steps import encode  # noqa: E402
from transformer_jax.model import Transformer  # noqa: E402

NEVER = -1  # an EOS id no step can produce

# (group, test on the op's HLO text (its line plus its fused body) and its source op_name), first match wins
GROUPS = (
    ("encoder (once per batch)", lambda text, source: "/encode" in source or "encoder" in source),
    ("output projection (vocab matmul)", lambda text, source: "attend" in source),
    ("top-k over the vocabulary (beam)", lambda text, source: "top_k" in source or "TopK" in text),
    ("log-softmax normaliser, argmax", lambda text, source: "logsumexp" in source or "body/reduce" in source),
    ("lineage mask (once a step)", lambda text, source: "_decode_step" in source or "advance" in source),
    ("cache writes", lambda text, source: "dynamic-update-slice" in text and "keys_values" in source),
    (
        "attention scores, softmax, values",
        lambda text, source: any(k in source for k in ("shgqk", "sgqhd", "softmax", "attention_weights")),
    ),
    (
        "Q/K/V/output projections, FFN",
        lambda text, source: any(f"/{name}/" in source for name in ("query", "key", "value", "out", "ffn")),
    ),
    ("LayerNorm", lambda text, source: "LayerNorm" in source or "_norm" in source),
    ("embedding lookup, positions", lambda text, source: "embed" in source or "position" in source),
    (
        "search bookkeeping (gathers, top-2k, scores)",
        lambda text, source: "while/body" in source and "decode" not in source,
    ),
)


def group_of(text: str, source: str) -> str:
    for name, test in GROUPS:
        if test(text, source):
            return name
    return "other"


def load_model(args):
    """(model, params, tokenizer or None): a trained workdir's, or the Multi30k shape randomly initialised."""
    if args.workdir:
        from transformer_jax.workdir import load_model_for_inference

        cfg, params, tokenizer = load_model_for_inference(args.workdir, args.checkpoint)
    else:
        import flax.linen as nn

        from transformer_jax.experiment import load_config_file

        cfg, tokenizer = load_config_file(Path(__file__).resolve().parents[1] / "multi30k.py").model, None
        dummy = jnp.ones((1, 2), jnp.int32)
        params = nn.unbox(jax.jit(Transformer(cfg).init)(jax.random.key(0), dummy, dummy)["params"])
    return Transformer(cfg.replace(dropout_rate=0.0)), params, tokenizer


def make_search(model, *, beam: int, steps: int, cache_len: int, cache_segment: int):
    """A jitted search of exactly `steps` steps with a cache (and output buffer) of `cache_len` positions."""
    cfg = model.config

    @jax.jit
    def search(params, inputs):
        encoded = encode(model, params, inputs)  # [batch, src_len, d_model]
        rows = jnp.repeat(inputs, beam, axis=0) if beam > 1 else inputs  # [batch * beam, src_len]
        lengths = cache_lengths(cache_len, cache_segment)
        cache = init_cache(model, params, encoded, rows, lengths[0], beam_size=beam)
        step_fn = transformer_step_fn(model, params, encoded, rows)
        limits = jnp.full((inputs.shape[0],), steps, jnp.int32)  # [batch]
        common = dict(
            max_decode_len=cache_len,
            max_lengths=limits,
            bos_id=cfg.bos_id,
            eos_id=NEVER,
            pad_id=cfg.pad_id,
            cache_lengths=lengths,
        )
        if beam == 1:
            return greedy_search(step_fn, cache, batch_size=inputs.shape[0], **common)[0]
        return beam_search_core(
            step_fn, cache, batch_size=inputs.shape[0], beam_size=beam, alpha=0.6, early_stopping=False, **common
        )[0]

    return search


def profile_search(
    model, params, inputs, *, beam: int, steps: int, cache_len: int, cache_segment: int, repeats: int
) -> dict:
    search = make_search(model, beam=beam, steps=steps, cache_len=cache_len, cache_segment=cache_segment)
    instructions = hlo_instructions(search.lower(params, inputs).compile().as_text())
    jax.block_until_ready(search(params, inputs))
    start = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(search(params, inputs))
    wall_ms = (time.perf_counter() - start) / repeats * 1e3

    def run_traced():
        for _ in range(repeats):
            jax.block_until_ready(search(params, inputs))

    per_op, calls = traced_op_ms(run_traced, instructions, repeats)  # per search
    groups: collections.Counter = collections.Counter()
    sources: collections.Counter = collections.Counter()
    for name, ms in per_op.items():
        text, source = instructions[name]
        groups[group_of(text, source)] += ms
        sources[re.sub(r"layer_\d+", "layer_#", re.sub(r"^jit\([^)]*\)/", "", source))[:110]] += ms
    encoder_ms = groups.get("encoder (once per batch)", 0.0)
    op_ms = sum(per_op.values())
    loop_ms = wall_ms - encoder_ms
    return {
        "beam": beam,
        "rows": int(inputs.shape[0]) * beam,
        "steps": steps,
        "cache_len": cache_len,
        "cache_lengths": cache_lengths(cache_len, cache_segment),
        "search_ms": wall_ms,
        "step_ms": loop_ms / steps,
        "ops_per_step": sum(calls.values()) / steps,
        "op_ms_per_step": (op_ms - encoder_ms) / steps,
        "loop_overhead_ms_per_step": max(0.0, loop_ms - (op_ms - encoder_ms)) / steps,
        "groups_ms_per_step": {name: ms / steps for name, ms in groups.most_common()},
        "top_sources_ms_per_step": {name: ms / steps for name, ms in sources.most_common(20)},
        "top_ops_ms_per_step": {
            f"{name}: {instructions[name][0].split(chr(10))[0].strip()[:160]}": ms / steps
            for name, ms in per_op.most_common(20)
        },
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=None, help="a trained run (default: the Multi30k shape, random weights)")
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--source", default=None, help="sentences for the batch (and the finished-rows count)")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--src-len", type=int, default=16, help="padded source width")
    parser.add_argument("--steps", type=int, default=24, help="decode steps per search")
    parser.add_argument(
        "--cache-len", type=int, default=None, help="cache and output length (default src-len + 50, as §6.1's limit)"
    )
    parser.add_argument("--beams", default="1,4", help="1 = greedy")
    parser.add_argument(
        "--cache-segment", type=int, default=DecodeConfig().cache_segment, help="decode.cache_segment (0 = fixed)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    model, params, tokenizer = load_model(args)
    cfg = model.config
    rng = np.random.default_rng(0)
    inputs = rng.integers(4, cfg.vocab_size, (args.batch, args.src_len)).astype(np.int32)  # [batch, src_len]
    inputs[:, -1] = cfg.eos_id
    report: dict = {"load_average": os.getloadavg(), "jax": jax.__version__, "searches": []}
    cache_len = args.cache_len or args.src_len + 50
    for beam in (int(b) for b in args.beams.split(",")):
        result = profile_search(
            model,
            params,
            jnp.asarray(inputs),
            beam=beam,
            steps=args.steps,
            cache_len=cache_len,
            cache_segment=args.cache_segment,
            repeats=args.repeats,
        )
        report["searches"].append(result)
        print_search(result)
    out = write_results("profile_decode", report, args.out)
    print(f"wrote {out}")
    return report


def print_search(result: dict) -> None:
    name = "greedy" if result["beam"] == 1 else f"beam {result['beam']}"
    print(
        f"{name}: {result['rows']} rows, {result['steps']} steps: {result['step_ms']:.2f} ms a step "
        f"({result['ops_per_step']:.0f} ops; op time {result['op_ms_per_step']:.2f} ms, "
        f"loop overhead {result['loop_overhead_ms_per_step']:.2f} ms)"
    )
    for group, ms in result["groups_ms_per_step"].items():
        print(f"  {group:<46} {ms:7.3f} ms")
    print("  top sources:")
    for source, ms in list(result["top_sources_ms_per_step"].items())[:14]:
        print(f"    {ms:7.3f} ms  {source}")


if __name__ == "__main__":
    main()
