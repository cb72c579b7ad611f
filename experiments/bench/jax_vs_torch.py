"""JAX (jit) against PyTorch (eager and torch.compile) on the same Transformer, side by side, on the CPU.

    .venv/bin/python experiments/bench/jax_vs_torch.py                  # tiny
    .venv/bin/python experiments/bench/jax_vs_torch.py --base --base-batch 4   # tiny and base (slow on 2 cores)

Both frameworks run in this one process with the same ModelConfig (dropout as configured), the same weights
(converted with transformer_jax.interop.torch), the same float32 batches and the same thread count:
`--threads N` sets torch.set_num_threads(N) (and one inter-op thread) and, before jax is imported,
XLA_FLAGS="--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=N"; JAX runs on the CPU
(JAX_PLATFORMS=cpu) because the torch build here is CPU-only; with --threads 1 the Eigen multi-threading
is off too. The two frameworks take turns, never overlap. On a shared, loaded machine use --threads 1:
torch's OpenMP workers collapse when the cores are oversubscribed (measured here: tiny fwd+bwd 0.14 s at one
thread against 0.8-4 s at two threads with a load average of 8 on 2 cores).

Measured per config:
- train step: forward + backward + Adam with the §5.3 schedule, label-smoothed loss (§5.4); tokens/s counts
  source + target tokens of the batch (no padding), over --steps steps after the first;
  `first_step_s` is the time to the first finished step from nothing compiled (jit tracing and compilation,
  or torch.compile's tracing and code generation; eager torch has no such cost).
- greedy decode: output tokens/s at 32, 64 and 128 output tokens (batch x length / time), EOS never chosen
  so that every row runs the full length: our jitted cached decoder (transformer_jax.decoding.greedy_search
  over the key/value cache) against the torch reference re-running the decoder over the whole prefix at
  each step (interop.torch_greedy_decode). JAX timings exclude the one-off compile per output length.
If torch.compile fails here, the JSON records the error instead of a number. Timings are wall clock and
depend on what else runs on the machine (the JSON records the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "jax_vs_torch.json"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both frameworks")
    parser.add_argument("--batch", type=int, default=16, help="train batch (sentences) for tiny")
    parser.add_argument("--length", type=int, default=32, help="source = target length of the train batch")
    parser.add_argument("--steps", type=int, default=10, help="timed train steps after the first")
    parser.add_argument("--decode-batch", type=int, default=8)
    parser.add_argument("--decode-lengths", default="32,64,128")
    parser.add_argument("--base", action="store_true", help="also run the 'base' preset (slow on 2 cores)")
    parser.add_argument("--base-batch", type=int, default=4, help="train and decode batch for base")
    parser.add_argument("--base-steps", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (minutes on 2 cores)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    return parser.parse_args(argv)


def set_threads(threads: int) -> None:
    """Before jax is imported: one thread count for XLA's CPU backend; torch is set after its import."""
    multi = "true" if threads > 1 else "false"
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (flags + f" --xla_cpu_multi_thread_eigen={multi} "
                               f"intra_op_parallelism_threads={threads}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv=None) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import torch
    from flax.linen import unbox

    from transformer_jax import config as presets
    from transformer_jax.decoding import greedy_search, init_cache, transformer_step_fn
    from transformer_jax.interop import torch as interop
    from transformer_jax.model import Transformer
    from transformer_jax.train.loss import cross_entropy_sums
    from transformer_jax.train.optimizer import make_optimizer

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    try:
        from transformer_jax.experiment import default_config

        train_cfg = default_config().train  # the paper's Adam, schedule and label smoothing (§5.3, §5.4)
    except Exception:  # noqa: BLE001 - fall back to the same constants if the loop module changes
        import types

        train_cfg = types.SimpleNamespace(warmup_steps=4000, lr_scale=1.0, adam_b1=0.9, adam_b2=0.98,
                                          adam_eps=1e-9, clip_grad_norm=0.0, label_smoothing=0.1)
    decode_lengths = [int(n) for n in args.decode_lengths.split(",")]

    def synthetic(cfg, batch, length, seed):
        rng = np.random.default_rng(seed)
        src = rng.integers(3, cfg.vocab_size, (batch, length)).astype(np.int32)  # [batch, src_len], no pad
        tgt = rng.integers(3, cfg.vocab_size, (batch, length)).astype(np.int32)  # [batch, tgt_len]
        tgt_in = np.concatenate([np.full((batch, 1), cfg.bos_id, np.int32), tgt[:, :-1]], axis=1)
        return src, tgt_in, tgt

    def run_config(name, cfg, batch, steps, decode_batch):
        result = {"config": name, "d_model": cfg.d_model, "layers": cfg.num_encoder_layers, "batch": batch,
                  "length": args.length, "tokens_per_step": 2 * batch * args.length,
                  "dropout_rate": cfg.dropout_rate}
        src, tgt_in, tgt_out = synthetic(cfg, batch, args.length, 0)
        tokens = 2 * batch * args.length
        model = Transformer(cfg)
        params = unbox(jax.jit(model.init)(jax.random.key(0), src[:1], tgt_in[:1])["params"])
        state_dict = interop.flax_to_torch_state_dict(params, cfg)
        ls = float(train_cfg.label_smoothing)

        # ---------------------------------------------------------------- JAX train step
        tx, _ = make_optimizer(train_cfg, cfg.d_model)

        def loss_fn(p, rng):
            logits = model.apply({"params": p}, src, tgt_in, deterministic=False, rngs={"dropout": rng})
            sums = cross_entropy_sums(logits, tgt_out, label_smoothing=ls, pad_id=cfg.pad_id)
            return sums.loss / sums.tokens

        def train_step(p, opt_state, rng):
            loss, grads = jax.value_and_grad(loss_fn)(p, rng)
            updates, opt_state = tx.update(grads, opt_state, p)
            return optax.apply_updates(p, updates), opt_state, loss

        step = jax.jit(train_step, donate_argnums=(0, 1))
        p, opt_state = jax.tree.map(jnp.copy, params), tx.init(params)
        start = time.perf_counter()
        p, opt_state, loss = step(p, opt_state, jax.random.key(1))
        loss.block_until_ready()
        first = time.perf_counter() - start
        start = time.perf_counter()
        for index in range(steps):
            p, opt_state, loss = step(p, opt_state, jax.random.key(2 + index))
        loss.block_until_ready()
        elapsed = time.perf_counter() - start
        result["jax_train"] = {"first_step_s": first, "step_s": elapsed / steps, "tokens_per_s": tokens * steps / elapsed}
        del p, opt_state

        # ---------------------------------------------------------------- torch train step (eager, compiled)
        src_t, tgt_in_t, tgt_out_t = (torch.as_tensor(a, dtype=torch.long) for a in (src, tgt_in, tgt_out))
        criterion = torch.nn.CrossEntropyLoss(label_smoothing=ls, ignore_index=cfg.pad_id)

        def torch_train(compiled: bool):
            reference = interop.TorchTransformer(cfg)
            reference.load_state_dict(state_dict)
            reference.train()
            adam = torch.optim.Adam(reference.parameters(), lr=1.0, betas=(train_cfg.adam_b1, train_cfg.adam_b2),
                                    eps=train_cfg.adam_eps)
            d_model, warmup, scale = cfg.d_model, train_cfg.warmup_steps, train_cfg.lr_scale
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                adam, lambda e: scale * d_model ** -0.5 * min((e + 1) ** -0.5, (e + 1) * warmup ** -1.5))
            forward = torch.compile(reference) if compiled else reference

            def one_step():
                adam.zero_grad(set_to_none=True)
                logits = forward(src_t, tgt_in_t)
                loss = criterion(logits.reshape(-1, cfg.vocab_size), tgt_out_t.reshape(-1))
                loss.backward()
                adam.step()
                scheduler.step()
                return loss.item()

            start = time.perf_counter()
            one_step()
            first = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(steps):
                one_step()
            elapsed = time.perf_counter() - start
            return {"first_step_s": first, "step_s": elapsed / steps, "tokens_per_s": tokens * steps / elapsed}

        result["torch_eager_train"] = torch_train(False)
        if args.no_compile:
            result["torch_compile_train"] = {"error": "skipped (--no-compile)"}
        else:
            try:
                result["torch_compile_train"] = torch_train(True)
            except Exception as error:  # noqa: BLE001 - record why, keep the rest of the run
                result["torch_compile_train"] = {
                    "error": f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}",
                    "traceback_tail": traceback.format_exc().strip().splitlines()[-3:],
                }

        # ---------------------------------------------------------------- greedy decode
        dsrc, _, _ = synthetic(cfg, decode_batch, args.length, 1)
        reference = interop.TorchTransformer(cfg).eval()
        reference.load_state_dict(state_dict)
        result["decode"] = []
        interop.torch_greedy_decode(reference, torch.as_tensor(dsrc, dtype=torch.long), 4)  # warm-up (allocator, threads)
        for length in decode_lengths:
            if length > cfg.max_len:
                continue

            @jax.jit
            def jax_greedy(p, inputs, length=length):
                encoded = model.apply({"params": p}, inputs, method="encode")
                cache = init_cache(model, p, encoded, inputs, length)
                inner = transformer_step_fn(model, p, encoded, inputs)

                def step_fn(last, cache):  # EOS never chosen: every row decodes `length` tokens
                    logits, cache = inner(last, cache)
                    return logits.at[:, cfg.eos_id].set(-1e9), cache

                return greedy_search(step_fn, cache, batch_size=inputs.shape[0], max_decode_len=length,
                                     bos_id=cfg.bos_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id)[0]

            start = time.perf_counter()
            jax_greedy(params, dsrc).block_until_ready()
            jax_first = time.perf_counter() - start
            repeats = 3
            start = time.perf_counter()
            for _ in range(repeats):
                out = jax_greedy(params, dsrc)
            out.block_until_ready()
            jax_s = (time.perf_counter() - start) / repeats
            start = time.perf_counter()
            interop.torch_greedy_decode(reference, torch.as_tensor(dsrc, dtype=torch.long), length, stop_early=False)
            torch_s = time.perf_counter() - start
            generated = decode_batch * length
            result["decode"].append({
                "output_tokens": length, "batch": decode_batch,
                "jax_cached": {"s": jax_s, "tokens_per_s": generated / jax_s, "first_call_s": jax_first},
                "torch_recompute": {"s": torch_s, "tokens_per_s": generated / torch_s},
            })
        return result

    runs = [("tiny", presets.tiny(), args.batch, args.steps, args.decode_batch)]
    if args.base:
        runs.append(("base", presets.base(), args.base_batch, args.base_steps, args.base_batch))
    report = {
        "threads": args.threads,
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "jax": jax.__version__, "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.machine(), "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "results": [],
    }
    for name, cfg, batch, steps, decode_batch in runs:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        report["results"].append(run_config(name, cfg, batch, steps, decode_batch))
    report["load_average_at_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print_table(report)
    print(f"\nwrote {args.out}")
    return report


def print_table(report: dict) -> None:
    def cell(entry, key="tokens_per_s"):
        if entry is None:
            return "-"
        if "error" in entry:
            return "failed"
        return f"{entry[key]:,.0f}"

    print(f"\nthreads={report['threads']}  jax {report['jax']}  torch {report['torch']}  "
          f"load avg {report['load_average_at_start'][0]:.1f} -> {report['load_average_at_end'][0]:.1f}")
    print(f"{'config':<6} {'measure':<34} {'JAX jit':>12} {'torch eager':>12} {'torch.compile':>14}")
    for r in report["results"]:
        train = f"train tokens/s (batch {r['batch']}x{r['length']}+{r['length']})"
        print(f"{r['config']:<6} {train:<34} {cell(r['jax_train']):>12} {cell(r['torch_eager_train']):>12} "
              f"{cell(r['torch_compile_train']):>14}")
        firsts = [r["jax_train"], r["torch_eager_train"], r["torch_compile_train"]]
        row = [("failed" if "error" in e else f"{e['first_step_s']:.2f}") for e in firsts]
        print(f"{r['config']:<6} {'time to first step (s)':<34} {row[0]:>12} {row[1]:>12} {row[2]:>14}")
        for d in r["decode"]:
            label = f"greedy {d['output_tokens']} tok/s (batch {d['batch']})"
            print(f"{r['config']:<6} {label:<34} {cell(d['jax_cached']):>12} {cell(d['torch_recompute']):>12} "
                  f"{'-':>14}")
        if "error" in r["torch_compile_train"]:
            print(f"       torch.compile: {r['torch_compile_train']['error']}")
    print("JAX greedy: jitted, key/value cache; torch greedy: eager, recomputes the prefix each step.")


if __name__ == "__main__":
    main()
