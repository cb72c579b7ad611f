"""Greedy decode speed with and without the key/value cache.

Both variants are jitted whole (encoder, then a lax.while_loop of decoder steps) and run for exactly N output
tokens (EOS disabled). 'cached' feeds one token per step through the decode cache; 'uncached' re-runs the
decoder over the full [batch, N] prefix buffer at every step (static shapes), as a no-cache baseline.
Times are wall-clock medians after one compiling call. No numbers are asserted anywhere.

  python experiments/bench/decode_speed.py --models tiny,small --lengths 32,64,128 --batch 8
  python experiments/bench/decode_speed.py --models base --out experiments/bench/results/decode_base.json
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax import config as config_lib
from transformer_jax.decoding import greedy_search, init_cache, transformer_step_fn, uncached_step_fn
from transformer_jax.model import Transformer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_results  # noqa: E402

MODELS = {
    "tiny": lambda: config_lib.tiny(dropout_rate=0.0),
    # between tiny and base, for machines where base is slow: half width, half depth
    "small": lambda: config_lib.base(
        d_model=256, num_heads=4, d_ff=1024, num_encoder_layers=3, num_decoder_layers=3, dropout_rate=0.0
    ),
    "base": lambda: config_lib.base(dropout_rate=0.0),
}
NEVER = -1  # an EOS id no step can produce: every run decodes exactly max_decode_len tokens


@functools.partial(jax.jit, static_argnames=("model", "length", "cached"))
def decode(model, params, inputs, *, length: int, cached: bool):
    cfg = model.config
    encoded = model.apply({"params": params}, inputs, method="encode")  # [batch, src_len, d_model]
    if cached:
        step_fn = transformer_step_fn(model, params, encoded, inputs)
        cache = init_cache(model, params, encoded, inputs, length)
    else:
        step_fn, cache = uncached_step_fn(model, params, encoded, inputs, length, cfg.pad_id)
    tokens, _, _ = greedy_search(
        step_fn,
        cache,
        batch_size=inputs.shape[0],
        max_decode_len=length,
        bos_id=cfg.bos_id,
        eos_id=NEVER,
        pad_id=cfg.pad_id,
    )
    return tokens


def time_call(fn, repeats: int):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return compile_s, statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,small", help=f"comma-separated, from {sorted(MODELS)}")
    parser.add_argument("--lengths", default="32,64,128", help="output tokens per sentence")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--uncached-max",
        type=int,
        default=None,
        help="skip the (slow) uncached runs above this many tokens; their fields are null",
    )
    parser.add_argument(
        "--out", default=None, help="JSON path (default experiments/bench/results/decode_speed_<time>.json)"
    )
    args = parser.parse_args(argv)

    lengths = [int(n) for n in args.lengths.split(",")]
    rows = []
    print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}  batch={args.batch} src_len={args.src_len}")
    print(
        f"{'model':6} {'tokens':>6} {'cached s':>9} {'uncached s':>10} {'speed-up':>8} {'cached tok/s':>12} "
        f"{'compile c/u s':>13}"
    )
    for name in args.models.split(","):
        cfg = MODELS[name]()
        if max(lengths) > cfg.max_len:
            raise SystemExit(f"--lengths up to {max(lengths)} exceed {name}'s max_len={cfg.max_len}")
        model = Transformer(cfg)
        rng = jax.random.key(0)
        inputs = jax.random.randint(rng, (args.batch, args.src_len), 3, cfg.vocab_size, jnp.int32)
        params = jax.jit(model.init)(rng, inputs[:, :2], inputs[:, :2])["params"]
        params = jax.tree.map(jnp.asarray, nn.unbox(params))
        for length in lengths:
            result = {"model": name, "tokens": length, "batch": args.batch, "src_len": args.src_len}
            for cached in (True, False):
                if not cached and args.uncached_max is not None and length > args.uncached_max:
                    result.update(uncached_s=None, uncached_compile_s=None, uncached_tokens_per_s=None)
                    continue
                compile_s, run_s = time_call(
                    lambda: decode(model, params, inputs, length=length, cached=cached), args.repeats
                )
                key = "cached" if cached else "uncached"
                result[f"{key}_s"], result[f"{key}_compile_s"] = run_s, compile_s
                result[f"{key}_tokens_per_s"] = args.batch * length / run_s
            uncached = result["uncached_s"]
            result["speedup"] = None if uncached is None else uncached / result["cached_s"]
            rows.append(result)
            show = lambda value, spec: "-" if value is None else format(value, spec)
            print(
                f"{name:6} {length:6d} {result['cached_s']:9.3f} {show(uncached, '10.3f'):>10} "
                f"{show(result['speedup'], '7.2f'):>7}x {result['cached_tokens_per_s']:12.0f} "
                f"{result['cached_compile_s']:6.1f}/{show(result['uncached_compile_s'], '.1f'):<6}",
                flush=True,
            )

    payload = {
        "jax": jax.__version__,
        "device": jax.devices()[0].device_kind,
        "platform": platform.platform(),
        "devices": jax.device_count(),
        "args": vars(args),
        "rows": rows,
    }
    out = write_results("decode_speed", payload, args.out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
