"""One matmul at a time: the three forms a train step runs, JAX (jit) against torch, float32 and bfloat16, on the CPU.

    .venv/bin/python experiments/bench/matmul_forms.py                # both threads
    .venv/bin/python experiments/bench/matmul_forms.py --threads 1    # per-core kernel quality

A Dense layer's step runs `x @ W` (forward, the "NN" form), `g @ W^T` (input gradient, "NT") and `x^T @ g` (kernel
gradient, "TN") on [tokens, features] matrices; the shapes below are the FFN and output projections of the
benchmark shapes in jax_vs_torch.py. bfloat16 rows take bfloat16 operands with a float32 result in JAX
(`preferred_element_type`, as a mixed-precision step wants) and bfloat16 `mm` in torch. The "XLA upcast" column
says whether XLA converted the bfloat16 operands to float32 before the dot (counted in the compiled HLO): on
this jaxlib only the NN form keeps bfloat16 and reaches the CPU's AMX units. Results go to
experiments/bench/results/matmul_forms.json; measure on an idle machine. No test asserts any of this.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from jax_vs_torch import set_threads, timed  # this directory; imports no jax

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "matmul_forms.json"

# name: (tokens M, d_in K, d_out N)
SHAPES = {
    "tiny FFN in": (2048, 128, 512),
    "small projection": (4096, 128, 128),
    "m30k FFN in": (4096, 256, 1024),
    "base FFN in": (2048, 512, 2048),
    "m30k vocab": (4096, 256, 8000),
}
FORMS = ("NN x@W", "NT g@W^T", "TN x^T@g")


def operands(form: str, x, w, g):
    """The two factors of `form` from x [M, K], W [K, N] and g [M, N] (jax or torch arrays alike)."""
    return {"NN x@W": (x, w), "NT g@W^T": (g, w.T), "TN x^T@g": (x.T, g)}[form]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both frameworks")
    parser.add_argument("--steps", type=int, default=20, help="timed calls per matmul, after two warm-up calls")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)

    def jax_form(form: str):
        def product(x, w, g):
            return jnp.matmul(*operands(form, x, w, g), preferred_element_type=jnp.float32)

        return jax.jit(product)

    def torch_form(form: str, x, w, g):
        a, b = operands(form, x, w, g)
        return lambda: a @ b

    load_at_start = os.getloadavg()
    print(
        f"{'shape':<17} {'M x K x N':>16} {'form':<9} {'dtype':<8} {'JAX GF/s':>9} {'torch GF/s':>10} "
        f"{'JAX/torch':>9}  XLA upcast"
    )
    rows = []
    for name, (m, k, n) in SHAPES.items():
        x32, w32, g32 = (rng.standard_normal(s, dtype=np.float32) for s in ((m, k), (k, n), (m, n)))
        for dtype in ("float32", "bfloat16"):
            jx, jw, jg = (jnp.asarray(a, dtype) for a in (x32, w32, g32))
            tx, tw, tg = (torch.from_numpy(a).to(getattr(torch, dtype)) for a in (x32, w32, g32))
            for form in FORMS:
                product = jax_form(form)
                compiled = product.lower(jx, jw, jg).compile().as_text()
                jax_s = timed(lambda p=product: p(jx, jw, jg).block_until_ready(), args.steps)
                torch_s = timed(torch_form(form, tx, tw, tg), args.steps)
                gflop = 2 * m * k * n / 1e9
                rows.append(
                    {
                        "shape": name,
                        "m_k_n": [m, k, n],
                        "form": form,
                        "dtype": dtype,
                        "jax_gflops": gflop / jax_s,
                        "torch_gflops": gflop / torch_s,
                        "xla_upcast": dtype == "bfloat16" and "convert(" in compiled,
                    }
                )
                print_row(rows[-1])
    report = {
        "threads": args.threads,
        "jax": jax.__version__,
        "torch": torch.__version__,
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.out}", file=sys.stderr)
    return report


def print_row(row: dict) -> None:
    m, k, n = row["m_k_n"]
    print(
        f"{row['shape']:<17} {f'{m}x{k}x{n}':>16} {row['form']:<9} {row['dtype']:<8} {row['jax_gflops']:>9.0f} "
        f"{row['torch_gflops']:>10.0f} {row['jax_gflops'] / row['torch_gflops']:>9.2f}  "
        f"{'yes' if row['xla_upcast'] else '-'}",
        flush=True,
    )


if __name__ == "__main__":
    main()
