"""Where the train step's time goes: per-op timings of the library's step, grouped by what each op is,
beside torch.profiler's table for the same step in PyTorch eager.

    .venv/bin/python experiments/bench/profile_step.py --shape m30k        # or tiny, small, base
    .venv/bin/python experiments/bench/profile_step.py --shape base --no-torch

JAX: the jitted step of `make_train_step` is traced with jax.profiler (perfetto JSON); every XLA op of the
trace is matched to its HLO instruction in the compiled module and grouped by its source (the `op_name`
metadata: the JAX function that emitted it) and kind. Op times are summed over --steps steps and divided by
them; with two threads some ops overlap, so the sum can exceed the step's wall time. torch: the same model
and batch (interop.TorchTransformer), torch.profiler's self CPU time per operator. Writes JSON to
experiments/bench/results/profile_{shape}.json. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jax_vs_torch import SHAPES, set_threads  # noqa: E402
from library_step import LibraryStep  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

# (group, test on the HLO text of the op and its fused computation, its source op_name and its result type)
GROUPS = (
    ("dropout bits (PRNG)", lambda text, source, _: "rng" in source or "threefry" in source),
    ("output projection (vocab matmul)", lambda text, source, _: "attend" in source and "dot" in text),
    (
        "loss: log-softmax, its gradient",
        lambda text, source, vocab: (
            f",{vocab}]" in text.split("\n")[0] or "cross_entropy" in source or "_token_losses" in source
        ),
    ),
    (
        "attention scores, softmax, values",
        lambda text, source, _: (
            "bqhd,bkhd" in source
            or "bhqk" in source
            or "softmax" in source
            or "attention_weights" in source
            or "read_values" in source
        ),
    ),
    ("projections and FFN matmuls", lambda text, source, _: "dot(" in text or "ynn_fusion" in text),
    ("LayerNorm", lambda text, source, _: "LayerNorm" in source or "_norm" in source),
    (
        "Adam update",
        lambda text, source, _: (
            "adam" in source.lower() or "apply_updates" in source or "tree.norm" in source or "sqrt" in text
        ),
    ),
    ("copies / transposes", lambda text, source, _: "copy" in text or "transpose" in text),
)


def hlo_instructions(hlo: str) -> dict[str, tuple[str, str]]:
    """{instruction name: (its line plus its fused computation's body, op_name metadata)}."""
    bodies, current = {}, None
    for line in hlo.splitlines():
        header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header and not line.startswith(" "):
            current = header.group(1)
            bodies[current] = []
        elif current:
            bodies[current].append(line)
    instructions = {}
    for line in hlo.splitlines():
        match = re.match(r"\s+(?:ROOT )?%?([\w.\-]+) = ", line)
        if match:
            called = re.search(r"calls=%?([\w.\-]+)", line)
            body = "\n".join(bodies.get(called.group(1), [])) if called else ""
            source = re.search(r'op_name="([^"]+)"', line)
            instructions[match.group(1)] = (line + "\n" + body, source.group(1) if source else "")
    return instructions


def traced_op_ms(run, instructions: dict, per: int) -> tuple[collections.Counter, collections.Counter]:
    """Runs `run()` under jax.profiler; (ms, calls) of each HLO instruction in `instructions`, divided by `per`."""
    import jax

    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            run()
        with gzip.open(next(Path(trace_dir).rglob("*perfetto_trace.json.gz"))) as trace:
            events = json.load(trace)
    events = events["traceEvents"] if isinstance(events, dict) else events
    ms: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for event in events:
        if event.get("ph") == "X" and event["name"] in instructions:
            ms[event["name"]] += event["dur"] / 1e3 / per
            calls[event["name"]] += 1 / per
    return ms, calls


def group_of(text: str, source: str, vocab: int) -> str:
    for name, test in GROUPS:
        if test(text, source, vocab):
            return name
    return "other elementwise"


def profile_jax(cfg, batch, steps: int) -> dict:
    import jax

    from transformer_jax import sharding

    library_step = LibraryStep(cfg, sharding.make_mesh())
    step, state = library_step.step, library_step.state
    instructions = hlo_instructions(step.lower(state, batch).compile().as_text())
    for _ in range(3):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    wall = (time.perf_counter() - start) / steps

    def run_traced():
        nonlocal state
        for _ in range(steps):
            state, metrics = step(state, batch)
        jax.block_until_ready(metrics)

    per_op, _ = traced_op_ms(run_traced, instructions, steps)
    groups, sources = collections.Counter(), collections.Counter()
    for name, ms in per_op.items():
        text, source = instructions[name]
        groups[group_of(text, source, cfg.vocab_size)] += ms
        sources[re.sub(r"layer_\d+", "layer_#", source.replace("jit(train_step)/", ""))[:120]] += ms
    return {
        "step_ms": wall * 1e3,
        "op_ms": sum(per_op.values()),
        "groups_ms": dict(groups.most_common()),
        "top_sources_ms": dict(sources.most_common(25)),
    }


def profile_torch(cfg, batch, steps: int) -> dict:
    import jax
    import torch
    from torch.profiler import ProfilerActivity, profile

    from transformer_jax import sharding
    from transformer_jax.experiment import OptimizerConfig, TrainConfig
    from transformer_jax.interop import torch as interop
    from transformer_jax.train.optimizer import make_optimizer
    from transformer_jax.train.state import create_train_state

    train_cfg, optimizer_cfg = TrainConfig(), OptimizerConfig()
    params = jax.device_get(
        create_train_state(cfg, make_optimizer(optimizer_cfg, cfg.d_model)[0], 0, sharding.make_mesh())[0].params
    )
    model = interop.TorchTransformer(cfg)
    model.load_state_dict(interop.flax_to_torch_state_dict(params, cfg))
    model.train()
    adam = torch.optim.Adam(
        model.parameters(), lr=1e-4, betas=(optimizer_cfg.adam_b1, optimizer_cfg.adam_b2), eps=optimizer_cfg.adam_eps
    )
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=train_cfg.label_smoothing, ignore_index=cfg.pad_id)
    src, tgt_in, tgt = (torch.as_tensor(batch[k], dtype=torch.long) for k in ("inputs", "decoder_inputs", "targets"))

    def one():
        adam.zero_grad(set_to_none=True)
        loss = criterion(model(src, tgt_in).reshape(-1, cfg.vocab_size), tgt.reshape(-1))
        loss.backward()
        adam.step()
        loss.item()

    for _ in range(3):
        one()
    start = time.perf_counter()
    for _ in range(steps):
        one()
    wall = (time.perf_counter() - start) / steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            one()
    rows = sorted(prof.key_averages(), key=lambda row: row.self_cpu_time_total, reverse=True)
    return {"step_ms": wall * 1e3, "top_ops_ms": {row.key: row.self_cpu_time_total / 1e3 / steps for row in rows[:25]}}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="m30k", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    set_threads(args.threads)

    import numpy as np

    from transformer_jax import config as presets

    overrides, rows, length = SHAPES[args.shape]
    cfg = presets.base(**overrides, dropout_rate=0.1)
    rng = np.random.default_rng(0)
    targets = rng.integers(3, cfg.vocab_size, (rows, length)).astype(np.int32)  # [rows, length]
    batch = {
        "inputs": rng.integers(3, cfg.vocab_size, (rows, length)).astype(np.int32),
        "targets": targets,
        "decoder_inputs": np.concatenate([np.full((rows, 1), cfg.bos_id, np.int32), targets[:, :-1]], 1),
    }
    report = {
        "shape": args.shape,
        "rows": rows,
        "length": length,
        "load_average": os.getloadavg(),
        "jax": profile_jax(cfg, batch, args.steps),
    }
    if not args.no_torch:
        import torch

        torch.set_num_threads(args.threads)
        report["torch"] = profile_torch(cfg, batch, args.steps)
    out = args.out or RESULTS / f"profile_{args.shape}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print_report(report)
    print(f"\nwrote {out}")
    return report


def print_report(report: dict) -> None:
    jax_part = report["jax"]
    print(
        f"{report['shape']} ({report['rows']}x{report['length']}+{report['length']}): JAX step "
        f"{jax_part['step_ms']:.0f} ms (sum of op times {jax_part['op_ms']:.0f} ms)"
    )
    for name, ms in jax_part["groups_ms"].items():
        print(f"  {name:<36} {ms:8.1f} ms  {ms / jax_part['op_ms']:6.1%}")
    print("  top sources:")
    for name, ms in list(jax_part["top_sources_ms"].items())[:12]:
        print(f"    {ms:7.1f} ms  {name}")
    if "torch" in report:
        print(f"torch eager step {report['torch']['step_ms']:.0f} ms; top operators (self CPU time):")
        for name, ms in list(report["torch"]["top_ops_ms"].items())[:12]:
            print(f"    {ms:7.1f} ms  {name}")


if __name__ == "__main__":
    main()
