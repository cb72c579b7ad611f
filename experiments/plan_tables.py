"""The measured tables of docs/SCALING.md ("Planning a pod run on a laptop"): base and big, bfloat16 activations, at
their configs' batch, planned with `transformer_jax.plan` for TPU slices and GPU nodes of 8, and on one v5e slice
at larger batches per chip.

    .venv-tpu/bin/python experiments/plan_tables.py [--out experiments/results/plan_tables.json] [--only h100]

Needs .venv-tpu (`make test-plan`: jax with libtpu and the CUDA plugin). Each row is one `plan` (what
`transformer-jax plan --config C --target T --config.model.dtype=bfloat16 OVERRIDES --lengths L` prints); rows are
written to the JSON as they finish, so a stopped run keeps what it compiled, and a row already there is not compiled
again. Prints the markdown table. The memory figures are the compilers'; the speeds are the roofline estimates.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # as `transformer-jax plan`: the compilers need no accelerator
import jax  # noqa: E402

from transformer_jax import plan as planning  # noqa: E402
from transformer_jax.experiment import load_experiment  # noqa: E402
from transformer_jax.plan.targets import GiB  # noqa: E402

EXPERIMENTS = Path(__file__).resolve().parent

# (config, target, overrides, bucket lengths): data parallelism on 8 chips, FSDP for big, and larger batches per v5e
# chip (the largest that fits); the rows most asked about first.
ROWS = [
    *((config, "h100:8", {"mesh.data": "8"}, (32, 256)) for config in ("base", "big")),
    ("big", "v5p:2x2x2", {"mesh.data": "8"}, (32, 256)),
    ("big", "v6e:2x4", {"mesh.data": "8"}, (256,)),
    ("big", "h100:8", {"mesh.data": "1", "mesh.fsdp": "8"}, (256,)),
    ("big", "v5e:2x2", {"mesh.data": "4", "data.tokens_per_batch": "50000"}, (32,)),
    ("base", "v5p:2x2x2", {"mesh.data": "8"}, (256,)),  # its 32-token bucket aborts libtpu 0.0.50 (a CHECK)
    ("base", "v6e:2x4", {"mesh.data": "8"}, (256,)),
    ("big", "v5p:2x2x2", {"mesh.data": "1", "mesh.fsdp": "8"}, (256,)),
    ("base", "v5e:2x2", {"mesh.data": "4", "data.tokens_per_batch": "70000"}, (32,)),
    ("big", "a100:8", {"mesh.data": "8"}, (256,)),
]


def row_key(config: str, target: str, overrides: dict[str, str], lengths) -> str:
    return " ".join([config, target, *(f"{k}={v}" for k, v in overrides.items()), ",".join(map(str, lengths))])


def markdown(results: dict[str, dict]) -> str:
    lines = [
        "| model | target | layout | tokens per chip | bucket | arguments | temp | needed | of | fits | "
        "est. tokens/s (all chips) | est. MFU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results.values():
        mesh = ", ".join(f"{axis}={size}" for axis, size in result["mesh"].items() if size > 1) or "one chip"
        per_chip = result["tokens_per_batch"] // (result["mesh"]["data"] * result["mesh"]["fsdp"])
        for bucket in result["buckets"]:
            gib = lambda value: "-" if value is None else f"{value / GiB:.2f} GiB"  # noqa: E731
            needed = gib(bucket["needed_bytes"]) + (" (compiler)" if bucket["compiler_message"] else "")
            rate, mfu = bucket["tokens_per_s"], bucket["mfu"]
            lines.append(
                f"| {result['model']} | {result['target']} | {mesh} | {per_chip:,} | {bucket['rows']} x "
                f"{bucket['length']} | {gib(bucket['argument_bytes'])} | {gib(bucket['temp_bytes'])} | {needed} | "
                f"{bucket['hbm_bytes'] / GiB:.0f} GiB | {'yes' if bucket['fits'] else 'no'} | "
                f"{'-' if rate is None else f'{rate:,.0f}'} | "
                f"{'-' if mfu is None else f'{mfu:.0%}'} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=EXPERIMENTS / "results" / "plan_tables.json")
    parser.add_argument("--only", default="", help="plan only the rows whose target starts with this")
    args = parser.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)  # a program for absent chips cannot be read back
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    for config, target, overrides, lengths in ROWS:
        key = row_key(config, target, overrides, lengths)
        if key in results or not target.startswith(args.only):
            continue
        print(f"planning {key}", flush=True)
        pairs = [("model.dtype", "bfloat16"), *overrides.items()]
        experiment = load_experiment(str(EXPERIMENTS / f"{config}.py"), pairs)
        report = planning.plan(experiment, target, lengths=lengths)
        print(planning.format_report(report), flush=True)
        results[key] = dict(report.to_dict(), model=config)
        args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    ordered = [row_key(*row) for row in ROWS]  # the table in ROWS' order, whatever order the rows were planned in
    print(markdown({key: results[key] for key in ordered if key in results}))


if __name__ == "__main__":
    main()
