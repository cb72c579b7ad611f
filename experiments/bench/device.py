"""One-command accelerator benchmark: base and big train steps in bfloat16 (float32 master weights), model-FLOPs
utilisation against the chip's peak, and greedy / beam-4 decode speed. Writes JSON.

    python experiments/bench/device.py                 # on a GPU or TPU machine: under 8 minutes
    python experiments/bench/device.py --smoke         # tiny shapes, a few steps: any machine, CPU included

Train step, once per --attention-impls kernel (default: the einsum path and cuDNN's fused attention, which is
skipped, and said so, without a GPU): the library's `make_train_step` + `make_optimizer` (Adam, §5.3 schedule,
label smoothing 0.1, dropout 0.1) under `jit_train_step` on a mesh over all local devices (data parallel), batches of
`--tokens` source + target tokens (the paper's §5.1 batch is 25k + 25k). MFU = 3 x analytic forward FLOPs
(`accounting.forward_flops`) per second / (devices x the chip's dense bf16 peak from PEAK_TFLOPS; unknown chips
report no MFU). Decode: sentences/s of `greedy_decode` and `beam_search` (beam 4, alpha 0.6) on random sources
of --decode-len tokens, compile time excluded.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from library_step import LibraryStep, synthetic_batch  # noqa: E402 - this directory, imports no jax

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "device.json"

# Dense bfloat16 peak TFLOP/s per chip (vendor figures, without sparsity).
PEAK_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L4": 121.0,
    "A10": 125.0,
    "V100": 125.0,
    "T4": 65.0,
    "TPU v4": 275.0,
    "TPU v5 lite": 197.0,
    "TPU v5e": 197.0,
    "TPU v5p": 459.0,
    "TPU v6 lite": 918.0,
    "TPU v6e": 918.0,
}


def peak_tflops(device_kind: str) -> float | None:
    for name, peak in sorted(PEAK_TFLOPS.items(), key=lambda item: -len(item[0])):
        if name.lower() in device_kind.lower():
            return peak
    return None


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny model, 2 steps: checks the script anywhere")
    parser.add_argument("--models", default="base,big")
    parser.add_argument("--tokens", type=int, default=16384, help="source (and target) tokens per batch")
    parser.add_argument("--length", type=int, default=64, help="sentence length of the synthetic batch")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--decode-batch", type=int, default=64)
    parser.add_argument("--decode-len", type=int, default=24)
    parser.add_argument(
        "--attention-impls",
        default="einsum,cudnn",
        help="ModelConfig.attention_impl values to time the train step with ('cudnn' only where a GPU is)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        args.models, args.tokens, args.length, args.steps = "tiny", 256, 16, 2
        args.decode_batch, args.decode_len = 4, 8

    import jax
    import jax.numpy as jnp

    from transformer_jax import config as presets
    from transformer_jax import sharding
    from transformer_jax.accounting import forward_flops
    from transformer_jax.decoding import beam_search, greedy_decode
    from transformer_jax.model import Transformer

    devices = jax.devices()
    kind = devices[0].device_kind
    peak = peak_tflops(kind)
    mesh = sharding.make_mesh()
    report = {
        "backend": jax.default_backend(),
        "device_kind": kind,
        "devices": len(devices),
        "peak_tflops_per_device": peak,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "smoke": args.smoke,
        "results": [],
        "skipped": [],
    }
    print(f"{len(devices)} x {kind} ({report['backend']}), peak {peak or '?'} TFLOP/s bf16 each", flush=True)

    def timed(fn, repeats):
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats

    impls = args.attention_impls.split(",")
    if "cudnn" in impls and report["backend"] != "gpu":
        impls.remove("cudnn")
        report["skipped"].append(f"attention_impl='cudnn': needs an NVIDIA GPU, this is {report['backend']}")
    for name in args.models.split(","):
        for impl in impls:
            vocab = 512 if args.smoke else 37000
            cfg = presets.PRESETS[name](
                vocab_size=vocab,
                dtype="bfloat16",
                dropout_rate=0.1,
                max_len=max(args.length, args.decode_len * 2 + 8),
                attention_impl=impl,
            )
            rows = max(len(devices), args.tokens // args.length // len(devices) * len(devices))
            batch = sharding.global_batch(synthetic_batch(cfg, rows, args.length), mesh, sharding.DEFAULT_RULES)
            library_step = LibraryStep(cfg, mesh)

            def train_once():
                library_step.run(batch)

            start = time.perf_counter()
            train_once()
            first = time.perf_counter() - start
            seconds = timed(train_once, args.steps)
            flops = 3 * forward_flops(cfg, batch=rows, src_len=args.length, tgt_len=args.length)["total"]
            row = {
                "model": name,
                "attention_impl": impl,
                "rows": rows,
                "length": args.length,
                "first_step_s": first,
                "step_s": seconds,
                "tokens_per_s": 2 * rows * args.length / seconds,
                "tflops": flops / seconds / 1e12,
                "param_dtype": str(jnp.dtype(cfg.param_dtype)),
                "compute_dtype": str(jnp.dtype(cfg.dtype)),
            }
            row["mfu"] = row["tflops"] / (peak * len(devices)) if peak else None
            decoding = ""
            if impl == impls[0]:  # decoding reads the cache with the einsum path whatever the kernel
                params = jax.device_get(library_step.state.params)
                model = Transformer(cfg.replace(dropout_rate=0.0))
                sources = jnp.asarray(synthetic_batch(cfg, args.decode_batch, args.decode_len, seed=1)["inputs"])
                greedy_s = timed(lambda: jax.block_until_ready(greedy_decode(model, params, sources)), 2)
                beam_s = timed(
                    lambda: jax.block_until_ready(beam_search(model, params, sources, beam_size=4, alpha=0.6)), 2
                )
                row.update(
                    greedy_sentences_per_s=args.decode_batch / greedy_s,
                    beam4_sentences_per_s=args.decode_batch / beam_s,
                )
                decoding = (
                    f"; greedy {row['greedy_sentences_per_s']:.1f} sent/s, beam 4 "
                    f"{row['beam4_sentences_per_s']:.1f} sent/s"
                )
            report["results"].append(row)
            mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
            print(
                f"{name} ({impl} attention): {rows}x{args.length}+{args.length} tokens, {seconds * 1e3:.1f} ms/step, "
                f"{row['tokens_per_s']:,.0f} tokens/s, {row['tflops']:.1f} TFLOP/s, MFU {mfu}, first step "
                f"{first:.1f} s" + decoding,
                flush=True,
            )
    for line in report["skipped"]:
        print(f"skipped {line}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
