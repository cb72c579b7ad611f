"""The benchmarks on two (or more) installed stacks, alternating, on one machine: which JAX is faster here?

    python experiments/bench/stacks.py --stack lowest=.venv-lowest/bin/python --stack newest=.venv/bin/python \
        --data /path/to/multi30k --rounds 2

Each round runs every benchmark once per stack, the stacks taking turns (jax_vs_torch.py, matmul_forms.py and,
with --data, train_throughput.py on Multi30k), so slow drift of the machine's speed reaches both stacks alike. Each
run writes its usual JSON under --out-dir (`{bench}-{stack}-r{round}.json`); the table keeps, per stack, the best
round (a virtual machine's noise only ever slows a run down). Writes --out-dir/stacks.json. Run it alone on the
machine: it takes about 10 minutes a round on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT_DIR = HERE / "results" / "stacks"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", action="append", required=True, help="NAME=PYTHON, e.g. newest=.venv/bin/python")
    parser.add_argument("--data", help="the Multi30k directory; without it train_throughput.py is skipped")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--updates", type=int, default=200, help="updates of train_throughput.py")
    parser.add_argument("--jax-vs-torch-args", default="--rounds 2", help="extra arguments of jax_vs_torch.py")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    stacks = {}
    for entry in args.stack:
        name, sep, python = entry.partition("=")
        if not sep or not name or not Path(python).exists():
            parser.error(
                f"--stack {entry!r}: give NAME=PYTHON with an existing interpreter, e.g. newest=.venv/bin/python"
            )
        stacks[name] = python
    args.stacks = stacks
    return args


def benches(args) -> dict[str, list[str]]:
    """name -> the script and its arguments (--out is added per run)."""
    out = {
        "jax_vs_torch": [str(HERE / "jax_vs_torch.py"), *args.jax_vs_torch_args.split()],
        "matmul_forms": [str(HERE / "matmul_forms.py"), "--steps", "10"],
    }
    if args.data:
        out["train_throughput"] = [
            str(HERE / "train_throughput.py"),
            "--data",
            args.data,
            "--updates",
            str(args.updates),
        ]
    return out


def stack_versions(python: str) -> dict:
    code = (
        "import json, platform, jax, jaxlib, flax, optax, orbax.checkpoint as ocp; "
        "from transformer_jax.machine import cpu_model; print(json.dumps({'python': platform.python_version(), "
        "'jax': jax.__version__, 'jaxlib': jaxlib.__version__, 'flax': flax.__version__, 'optax': optax.__version__, "
        "'orbax-checkpoint': ocp.__version__, 'cpu': cpu_model()}))"
    )
    return json.loads(subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout)


def best(reports: list[dict], bench: str) -> dict:
    """The per-row best over rounds: the highest JAX rate of each row."""
    if bench == "jax_vs_torch":
        rows: dict = {}
        for report in reports:
            for row in report["results"]:
                key = (row["shape"], row["dtype"])
                if key not in rows or row["jax"]["tokens_per_s"] > rows[key]["jax"]["tokens_per_s"]:
                    rows[key] = row
        return {"rows": list(rows.values()), "matmul_gflops": max(r["matmul_gflops"]["jax"] for r in reports)}
    if bench == "matmul_forms":
        rows = {}
        for report in reports:
            for row in report["rows"]:
                key = (row["shape"], row["form"], row["dtype"])
                if key not in rows or row["jax_gflops"] > rows[key]["jax_gflops"]:
                    rows[key] = row
        return {"rows": list(rows.values())}
    return max(reports, key=lambda r: r["real_tokens_per_s_steps"])


def print_tables(summary: dict) -> None:
    names = list(summary["stacks"])
    head = " | ".join(f"{n} ({summary['stacks'][n]['versions']['jax']})" for n in names)
    print(f"\nCPU: {summary['cpu']}; best of {summary['rounds']} rounds per stack; JAX columns: {head}")
    results = {n: summary["stacks"][n]["best"] for n in names}
    if all("jax_vs_torch" in r for r in results.values()):
        print("\njax_vs_torch.py: JAX train step tokens/s (JAX / torch eager of the same run)")
        first = results[names[0]]["jax_vs_torch"]["rows"]
        for row in first:
            cells = []
            for n in names:
                other = next(
                    r
                    for r in results[n]["jax_vs_torch"]["rows"]
                    if (r["shape"], r["dtype"]) == (row["shape"], row["dtype"])
                )
                ratio = other["jax"]["tokens_per_s"] / other["torch_eager"]["tokens_per_s"]
                cells.append(f"{other['jax']['tokens_per_s']:>9,.0f} ({ratio:.2f}x)")
            print(f"  {row['shape']:<6} {row['dtype']:<9} " + "  ".join(cells))
        mm = "  ".join(f"{results[n]['jax_vs_torch']['matmul_gflops']:.0f}" for n in names)
        print(f"  2048^2 float32 matmul, JAX GFLOP/s: {mm}")
    if all("matmul_forms" in r for r in results.values()):
        print("\nmatmul_forms.py: JAX GFLOP/s (JAX / torch of the same run; * = XLA upcast the bfloat16 dot)")
        for row in results[names[0]]["matmul_forms"]["rows"]:
            cells = []
            for n in names:
                other = next(
                    r
                    for r in results[n]["matmul_forms"]["rows"]
                    if (r["shape"], r["form"], r["dtype"]) == (row["shape"], row["form"], row["dtype"])
                )
                star = "*" if other["xla_upcast"] else " "
                cells.append(f"{other['jax_gflops']:>6.0f}{star}({other['jax_gflops'] / other['torch_gflops']:.2f}x)")
            m, k, n_ = row["m_k_n"]
            print(f"  {f'{m}x{k}x{n_}':>15} {row['form']:<9} {row['dtype']:<8} " + "  ".join(cells))
    if all("train_throughput" in r for r in results.values()):
        print("\ntrain_throughput.py (Multi30k, whole train command): real source+target tokens/s of the steps")
        print("  " + "  ".join(f"{n}: {results[n]['train_throughput']['real_tokens_per_s_steps']:,.0f}" for n in names))


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stacks = {name: {"python": python, "versions": stack_versions(python)} for name, python in args.stacks.items()}
    summary = {
        "cpu": next(iter(stacks.values()))["versions"]["cpu"],
        "rounds": args.rounds,
        "load_average_at_start": os.getloadavg(),
        "stacks": stacks,
    }
    reports: dict = {name: {} for name in args.stacks}
    for round_index in range(1, args.rounds + 1):
        for bench, command in benches(args).items():
            for name, python in args.stacks.items():
                out = args.out_dir / f"{bench}-{name}-r{round_index}.json"
                print(f"round {round_index}: {bench} on {name} ...", file=sys.stderr, flush=True)
                subprocess.run([python, *command, "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
                reports[name].setdefault(bench, []).append(json.loads(out.read_text()))
    for name in args.stacks:
        summary["stacks"][name]["best"] = {bench: best(runs, bench) for bench, runs in reports[name].items()}
    summary["load_average_at_end"] = os.getloadavg()
    (args.out_dir / "stacks.json").write_text(json.dumps(summary, indent=2))
    print_tables(summary)
    print(f"\nwrote {args.out_dir / 'stacks.json'}")
    return summary


if __name__ == "__main__":
    main()
