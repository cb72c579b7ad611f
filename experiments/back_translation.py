"""Back-translation on Multi30k EN→DE: synthetic English by beam search against synthetic English by sampling.

    python experiments/back_translation.py /path/to/multi30k [--runs runs/bt] [--steps 1500] [--parallel 3]

Edunov et al. (2018), "Understanding Back-Translation at Scale", found that sources sampled from the reverse model
train a better forward model than beam-search sources, at scale. This is the small version of their comparison,
all with `transformer-jax` commands and experiments/multi30k.py's recipe at a fixed number of updates:

1. Split Multi30k's training pairs in two halves by line (odd lines: *real*, even lines: *mono*, whose English is
   set aside as if the German were monolingual).
2. Train DE→EN on the real half; average its 4 checkpoints of lowest validation perplexity.
3. Back-translate the mono half's German with it: beam 5 (α 1.0) and unrestricted sampling (temperature 1, one
   sample a sentence, seed 1) — timed, in sentences a second.
4. Train EN→DE on real + beam, on real + sampled, and on the real half alone (the baseline), same updates; average
   each run's best 4 and score test_2016_flickr with beam 5, α 1.0.

Validation and test are Multi30k's own, never back-translated. Writes RUNS/back_translation.json and prints the
table (experiments/results/back_translation.md keeps a measured one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from transformer_jax.machine import cpu_model
from transformer_jax.scoring import score

SCORES = ("bleu", "bleu_lowercase", "bleu_moses_lowercase", "chrf")

SPLITS = ("val", "test_2016_flickr")
BEAM = ["--beam-size", "5", "--alpha", "1.0"]
SAMPLING = ["--sample", "--seed", "1"]


def transformer_jax(*argv: str) -> None:
    """Runs one `transformer-jax` command in a process of its own; its failure ends the experiment."""
    command = [sys.executable, "-m", "transformer_jax.cli", *argv]
    print("+ transformer-jax " + " ".join(argv), flush=True)
    subprocess.run(command, check=True)


def write_corpus(directory: Path, data: Path, english: list[str], german: list[str]) -> Path:
    """A Multi30k directory: train.en/train.de as given, val and test linked to the real ones."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.en").write_text("".join(line + "\n" for line in english), encoding="utf-8")
    (directory / "train.de").write_text("".join(line + "\n" for line in german), encoding="utf-8")
    for split in SPLITS:
        for lang in ("en", "de"):
            link = directory / f"{split}.{lang}"
            if not link.exists():
                link.symlink_to((data / f"{split}.{lang}").resolve())
    return directory


def train_commands(workdir: Path, corpus: Path, source: str, target: str, steps: int) -> list[str]:
    return [
        "train",
        "--config",
        "experiments/multi30k.py",
        "--workdir",
        str(workdir),
        f"--config.data.path={corpus}",
        f"--config.data.source_lang={source}",
        f"--config.data.target_lang={target}",
        f"--config.train.steps={steps}",
        "--config.train.max_minutes=0",
        "--config.train.bleu_every=0",
    ]


def train_all(runs: list[tuple[Path, list[str]]], parallel: int) -> None:
    """Trains the runs, `parallel` at a time (each its own process); a finished run is not trained again."""
    waiting = [(workdir, argv) for workdir, argv in runs if not (workdir / "averaged.json").exists()]
    while waiting:
        batch, waiting = waiting[:parallel], waiting[parallel:]
        with contextlib.ExitStack() as logs:
            processes = []
            for workdir, argv in batch:
                print(f"+ transformer-jax {' '.join(argv)} > {workdir}.log", flush=True)
                log = logs.enter_context(open(f"{workdir}.log", "w"))
                command = [sys.executable, "-m", "transformer_jax.cli", *argv]
                processes.append((workdir, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)))
            for workdir, process in processes:
                if process.wait() != 0:
                    raise SystemExit(f"training {workdir} failed: see {workdir}.log")
        for workdir, _ in batch:
            transformer_jax("average", "--workdir", str(workdir), "--best", "4", "--metric", "perplexity")


def test_bleu(workdir: Path) -> dict:
    """The averaged checkpoint's scores on Multi30k's test split (beam 5, alpha 1.0); evaluated once."""
    done = list((workdir / "eval").glob("test.averaged.beam5*.json"))
    if not done:
        transformer_jax(
            "evaluate", "--workdir", str(workdir), "--checkpoint", "averaged", "--split", "test",
            "--batch-size", "100", "--samples", "0", *BEAM,
        )  # fmt: skip
        done = list((workdir / "eval").glob("test.averaged.beam5*.json"))
    scores = json.loads(done[0].read_text())
    return {key: scores[key] for key in SCORES}


def back_translate(reverse: Path, german: Path, output: Path, method: list[str]) -> float:
    """Translates `german` into `output` with the reverse model; returns sentences a second."""
    if not output.exists():
        started = time.perf_counter()
        transformer_jax(
            "translate",
            "--workdir",
            str(reverse),
            "--checkpoint",
            "averaged",
            "--input",
            str(german),
            "--output",
            str(output) + ".partial",
            "--batch-size",
            "100",
            *method,
        )
        seconds = time.perf_counter() - started
        os.replace(str(output) + ".partial", output)
        output.with_suffix(".seconds").write_text(f"{seconds}\n")
    lines = len(output.read_text(encoding="utf-8").splitlines())
    return lines / float(output.with_suffix(".seconds").read_text())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="the Multi30k directory (train/val/test_2016_flickr .en/.de)")
    parser.add_argument("--runs", type=Path, default=Path("runs/back_translation"))
    parser.add_argument("--steps", type=int, default=1500, help="updates of every training run")
    parser.add_argument("--parallel", type=int, default=3, help="EN→DE runs trained at once")
    args = parser.parse_args(argv)
    missing = [
        name
        for name in ("train.en", "train.de", *(f"{split}.{lang}" for split in SPLITS for lang in ("en", "de")))
        if not (args.data / name).is_file()
    ]
    if missing:
        raise SystemExit(f"{args.data} lacks {', '.join(missing)}: give the Multi30k task 1 directory.")

    english = (args.data / "train.en").read_text(encoding="utf-8").splitlines()
    german = (args.data / "train.de").read_text(encoding="utf-8").splitlines()
    runs = args.runs.resolve()
    real = write_corpus(runs / "data" / "real", args.data, english[0::2], german[0::2])
    mono_german = runs / "data" / "mono.de"
    mono_german.write_text("".join(line + "\n" for line in german[1::2]), encoding="utf-8")

    reverse = runs / "de-en"
    train_all([(reverse, train_commands(reverse, real, "de", "en", args.steps))], parallel=1)
    speeds, fidelity, corpora = {}, {}, {"real only": real}
    for name, method in (("beam", BEAM), ("sampled", SAMPLING)):
        synthetic = runs / "data" / f"mono.{name}.en"
        speeds[name] = back_translate(reverse, mono_german, synthetic, method)
        synthetic_english = synthetic.read_text(encoding="utf-8").splitlines()
        fidelity[name] = score(synthetic_english, english[1::2], moses_lang="en").bleu
        corpora[f"real + {name}"] = write_corpus(
            runs / "data" / name, args.data, english[0::2] + synthetic_english, german[0::2] + german[1::2]
        )

    forward = {name: runs / ("en-de." + name.replace(" ", "_").replace("+", "")) for name in corpora}
    train_all(
        [
            (forward[name], train_commands(forward[name], corpus, "en", "de", args.steps))
            for name, corpus in corpora.items()
        ],
        parallel=args.parallel,
    )
    reverse_bleu = test_bleu(reverse)
    report = {
        "cpu": cpu_model(),
        "steps": args.steps,
        "pairs": {"real": len(english[0::2]), "mono": len(german[1::2])},
        "reverse_de_en_test": reverse_bleu,
        "back_translation_sentences_per_sec": speeds,
        "back_translation_bleu_against_the_real_english": fidelity,
        "en_de_test": {name: test_bleu(workdir) for name, workdir in forward.items()},
    }
    (runs / "back_translation.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
