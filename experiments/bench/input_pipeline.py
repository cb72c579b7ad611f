"""Training input at scale: encoding at start-up (data.source=local) against prepared data (`prepare`), per process.

    .venv/bin/python experiments/bench/input_pipeline.py --multi30k ../shared/data/multi30k \
        --pairs 100000,1600000,6400000 --in-memory-up-to 1600000 --scratch /tmp/input_bench

Makes WMT-like training pairs (two Multi30k pairs joined: about 24 words a side) in --scratch, then for each size:
  - in memory: `train` with experiments/base.py, one layer each side, data.source=local, batches of 4096 positions
    a side (so the step's own memory stays small), to its first update;
  - prepared: `prepare` (its wall time and pairs/s, --workers processes), then the same `train` with data.prepared;
  - the input alone: this process's batches of base's batching (`TrainBatches` over the prepared pairs, 2 threads),
    real source + target tokens a second over --batches batches, and padded positions a second per side.
Both trains start from the same spm.model (copied into the workdir), so neither counts training the tokenizer. Each
train runs in its own process; its peak RSS is that process's (wait4). Prints a table, writes JSON.
Run it alone: every figure is a time on the machine's shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_results  # noqa: E402

TRAIN_OVERRIDES = {  # a one-layer base, batches of 4096 positions a side (the step's memory small beside the data's)
    "model.num_encoder_layers": "1",
    "data.tokens_per_batch": "4096",
    "model.num_decoder_layers": "1",
    "data.source": "local",
    "data.vocab_size": "8000",
    "data.tokenizer_max_sentences": "200000",
    "data.max_eval_batches": "1",
    "train.steps": "1",
    "train.eval_every": "100000",
    "train.bleu_every": "0",
    "train.final_bleu": "none",
    "train.checkpoint_every": "100000",
    "train.progress": "false",
}


def write_pairs(multi30k: Path, scratch: Path, count: int) -> Path:
    """{scratch}/{count}/train.en|de: `count` pairs, each two random Multi30k training pairs joined; val from
    Multi30k."""
    directory = scratch / str(count)
    if (directory / "train.de").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    english = (multi30k / "train.en").read_text().splitlines()
    german = (multi30k / "train.de").read_text().splitlines()
    rng = np.random.default_rng(count)
    for lang, lines in (("en", english), ("de", german)):
        rng = np.random.default_rng(count)  # the same pairs of lines for both sides
        with open(directory / f"train.{lang}", "w") as file:
            for start in range(0, count, 100_000):
                first, second = rng.integers(0, len(lines), (2, min(100_000, count - start)))
                file.writelines(f"{lines[a]} {lines[b]}\n" for a, b in zip(first.tolist(), second.tolist()))
        shutil.copyfile(multi30k / f"val.{lang}", directory / f"validation.{lang}")
    return directory


def overrides(data: Path, extra: dict[str, str]) -> list[str]:
    values = dict(TRAIN_OVERRIDES, **{"data.path": str(data)}, **extra)
    return [f"--config.{key}={value}" for key, value in values.items()]


def timed(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in GB of that process, its output)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    output = process.stdout.read() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{output[-3000:]}")
    return time.perf_counter() - started, usage.ru_maxrss / 1e6, output


def first_update(data: Path, prepared: Path, workdir: Path, extra: dict[str, str]) -> dict:
    """`train` to its first update in a fresh workdir that holds the prepared spm.model: seconds, peak RSS, phases."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    shutil.copyfile(prepared / "spm.model", workdir / "spm.model")
    command = [sys.executable, __file__, "--child", str(workdir), *overrides(data, extra)]
    seconds, rss, output = timed(command)
    summary = json.loads(output.strip().splitlines()[-1])
    return {
        "command_s": round(seconds, 1),
        "time_to_first_update_s": round(summary["time_to_first_step"], 1),
        "phases_s": {name: round(value, 1) for name, value in summary["timings"].items()},
        "peak_rss_gb": round(rss, 2),
    }


def input_rate(prepared: Path, batches: int) -> dict:
    """Tokens a second of this process's batches alone (base's batching), after the first batch."""
    from transformer_jax.data.batching import TrainBatches
    from transformer_jax.data.prepared import PreparedPairs
    from transformer_jax.experiment import load_experiment

    data = load_experiment(str(ROOT / "experiments" / "base.py")).data
    started = time.perf_counter()
    iterator = TrainBatches(
        PreparedPairs(prepared),
        tokens_per_batch=data.tokens_per_batch,
        max_len=data.max_len,
        bucket_boundaries=tuple(data.bucket_boundaries) or None,
    )
    next(iterator)
    ready = time.perf_counter() - started
    real = padded = 0
    started = time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)
        real += int((batch["inputs"] != 0).sum() + (batch["targets"] != 0).sum())
        padded += batch["inputs"].size
    seconds = time.perf_counter() - started
    return {
        "first_batch_s": round(ready, 2),
        "real_tokens_per_s": round(real / seconds),
        "padded_positions_per_s_per_side": round(padded / seconds),
        "batches": batches,
    }


def child(workdir: str, extra: list[str]) -> None:
    from transformer_jax import cli
    from transformer_jax.experiment import load_experiment
    from transformer_jax.train import loop

    _, config_overrides = cli.split_overrides(extra)
    experiment = load_experiment(str(ROOT / "experiments" / "base.py"), config_overrides)
    summary = loop.train(experiment, workdir)
    print(json.dumps({"time_to_first_step": summary["time_to_first_step"], "timings": summary["timings"]}))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multi30k", type=Path, required=True)
    parser.add_argument("--pairs", default="100000,1600000,6400000")
    parser.add_argument("--in-memory-up-to", type=int, default=1_600_000, help="larger sizes: prepared only")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/input_bench"))
    parser.add_argument("--workers", type=int, default=0, help="prepare's processes (0: one per core)")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    load_average = os.getloadavg()
    rows = []
    for count in [int(size) for size in args.pairs.split(",")]:
        data = write_pairs(args.multi30k, args.scratch, count)
        prepared = args.scratch / f"{count}.prepared"
        shutil.rmtree(prepared, ignore_errors=True)
        prepare = [sys.executable, "-m", "transformer_jax", "prepare", "--config", "experiments/base.py"]
        prepare += ["--output", str(prepared), "--workers", str(args.workers), *overrides(data, {})]
        prepare_s, prepare_rss, _ = timed(prepare)
        row = {"pairs": count, "prepare_s": round(prepare_s, 1), "prepare_pairs_per_s": round(count / prepare_s)}
        row["prepared"] = first_update(data, prepared, args.scratch / "run", {"data.prepared": str(prepared)})
        row["input"] = input_rate(prepared, args.batches)
        if count <= args.in_memory_up_to:
            row["in_memory"] = first_update(data, prepared, args.scratch / "run", {})
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        "\n| pairs | path | time to first update | data phase | peak RSS | prepare (pairs/s) | input real tokens/s |\n"
        "|---|---|---|---|---|---|---|"
    )
    for row in rows:
        for path in ("in_memory", "prepared"):
            if path not in row:
                continue
            run = row[path]
            prepared_only = path == "prepared"
            print(
                f"| {row['pairs']:,} | {path.replace('_', ' ')} | {run['time_to_first_update_s']} s | "
                f"{run['phases_s'].get('data', 0)} s | {run['peak_rss_gb']} GB | "
                + (f"{row['prepare_s']} s ({row['prepare_pairs_per_s']:,}) | " if prepared_only else "- | ")
                + (f"{row['input']['real_tokens_per_s']:,} |" if prepared_only else "- |")
            )
    payload = {
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
        "load_average_at_start": load_average,
        "rows": rows,
    }
    print("wrote", write_results("input_pipeline", payload, args.out))


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
