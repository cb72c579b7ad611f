"""JAX against PyTorch end to end: the same recipe trained in both for the same wall-clock budget, validation BLEU
and perplexity against minutes, and the minutes each takes to reach a few BLEU thresholds.

    python experiments/bench/time_to_bleu.py --config experiments/multi30k.py --workdir runs/ttb \\
        --minutes 20 --config.data.path=/path/to/multi30k [--torch-compile] [--device cuda]

JAX trains with the project's own loop (`transformer-jax train`, budget train.max_minutes) in WORKDIR/jax. Then,
never at the same time, torch trains in WORKDIR/torch on exactly what JAX saw: the same SentencePiece model, the
same batches in the same order (the project's pipeline, same seed), the same initial weights (converted exactly,
interop.torch), the same label-smoothed loss over the same target tokens, torch.optim.Adam with the same β/ε and
the §5.3 schedule, the same dropout rate, float32, the same threads. Both are evaluated every --eval-every
updates on the validation split: perplexity from their own forward pass, BLEU (greedy, the first
train.bleu_max_sentences pairs) from the project's decoder, the torch weights converted back, so decoding is
identical and only training differs. Minutes are wall clock from the start of each run, compiling and the
evaluations included (JAX's also its tokenizer and data set-up, a few seconds; torch's first evaluation reuses
the decoder JAX's run compiled). Writes WORKDIR/time_to_bleu.json and .png. Run it alone on an idle machine. A
second call on the same WORKDIR, with the same settings on the same CPU, keeps the finished runs and trains the
missing ones (one cut short starts again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import jax
import numpy as np

from transformer_jax import cli
from transformer_jax.errors import UserError
from transformer_jax.experiment import load_experiment
from transformer_jax.machine import cpu_model
from transformer_jax.run_log import read_rows
from transformer_jax.train import loop
from transformer_jax.visualize import plot_validation_against_minutes

THRESHOLDS = (20.0, 30.0, 35.0)


def jax_run(experiment, workdir: Path) -> dict:
    """Trains with the project's loop; the curve from its run log."""
    loop.train(experiment, workdir)
    return curve_from_metrics(workdir)


def curve_from_metrics(workdir: Path) -> dict:
    """{"perplexity": [(minutes, update, perplexity)], "bleu": [(minutes, update, BLEU)], "updates", "tokens_per_s"}
    of the run in `workdir`, from its run log."""
    rows = read_rows(workdir)
    train = [row for row in rows if row["kind"] == "train"]
    return {
        "perplexity": [
            (row["elapsed_s"] / 60, row["step"], row["perplexity"]) for row in rows if row["kind"] == "eval"
        ],
        "bleu": [(row["elapsed_s"] / 60, row["step"], row["bleu"]) for row in rows if row["kind"] == "bleu"],
        "updates": max((row["step"] for row in rows), default=0),  # the budget stops on an eval row
        "tokens_per_s": float(np.median([row["tokens_per_sec"] for row in train[1:]] or [0.0])),
    }


def batch_tensors(batch, device: str = "cpu") -> list:
    """(inputs, decoder_inputs, targets) of a pipeline batch as torch int64 tensors."""
    import torch

    return [
        torch.as_tensor(np.asarray(batch[k]), dtype=torch.long, device=device)
        for k in ("inputs", "decoder_inputs", "targets")
    ]


def torch_update_fn(experiment, model, step_model):
    """update(tensors, lr) -> (target tokens, source tokens): one torch update of `model` (its forward through
    `step_model`, the model itself or its torch.compile), the recipe's loss, Adam (AdamW with weight decay) and
    clipping."""
    import torch

    cfg, train_cfg, opt_cfg = model.config, experiment.train, experiment.optimizer
    adam_class = torch.optim.AdamW if opt_cfg.weight_decay > 0 else torch.optim.Adam  # as make_optimizer
    adam = adam_class(
        model.parameters(),
        lr=0.0,
        betas=(opt_cfg.adam_b1, opt_cfg.adam_b2),
        eps=opt_cfg.adam_eps,
        weight_decay=opt_cfg.weight_decay,
    )
    smoothed = torch.nn.CrossEntropyLoss(
        label_smoothing=train_cfg.label_smoothing, ignore_index=cfg.pad_id, reduction="sum"
    )

    def update(tensors, lr: float) -> tuple[int, int]:
        inputs, decoder_inputs, targets = tensors
        adam.param_groups[0]["lr"] = lr
        adam.zero_grad(set_to_none=True)
        count = (targets != cfg.pad_id).sum()
        loss = smoothed(step_model(inputs, decoder_inputs).reshape(-1, cfg.vocab_size), targets.reshape(-1)) / count
        loss.backward()
        if opt_cfg.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg.clip_grad_norm)
        adam.step()
        return int(count), int((inputs != cfg.pad_id).sum())

    return update


def torch_run(experiment, jax_workdir: Path, workdir: Path, *, compile_model: bool, device: str) -> dict:
    """Trains TorchTransformer on the JAX run's batches from its initial weights; the same evaluations."""
    import torch

    from transformer_jax.interop.torch import flax_to_torch_state_dict, torch_to_flax_params
    from transformer_jax.interop.torch_reference import TorchTransformer
    from transformer_jax.train.optimizer import transformer_schedule
    from transformer_jax.train.validation import validation_bleu

    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(jax_workdir / "spm.model", workdir / "spm.model")  # the same vocabulary
    torch.manual_seed(experiment.train.seed)
    train_cfg, opt_cfg = experiment.train, experiment.optimizer
    with loop.assemble(experiment, workdir) as trainer:  # the project's data, tokenizer and initial weights
        started = time.perf_counter()  # torch's clock starts with its data ready (JAX's includes its set-up)
        cfg = trainer.model_cfg
        model = TorchTransformer(cfg, device=device)
        model.load_state_dict(flax_to_torch_state_dict(jax.device_get(trainer.state.params), cfg))
        train_update = torch_update_fn(experiment, model, torch.compile(model) if compile_model else model)
        schedule = transformer_schedule(cfg.d_model, opt_cfg.warmup_steps, opt_cfg.lr_scale)
        nll_sum = torch.nn.CrossEntropyLoss(ignore_index=cfg.pad_id, reduction="sum")

        def minutes() -> float:
            return (time.perf_counter() - started) / 60

        curve: dict = {"perplexity": [], "bleu": [], "tokens_per_s": 0.0}
        pairs = trainer.data.valid_pairs[: train_cfg.bleu_max_sentences]

        def evaluate(update: int) -> None:
            model.eval()
            totals = np.zeros(2)
            with torch.no_grad():
                for batch in trainer.data.valid:
                    inputs, decoder_inputs, targets = batch_tensors(batch, device)
                    logits = model(inputs, decoder_inputs)
                    totals += [
                        float(nll_sum(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))),
                        float((targets != cfg.pad_id).sum()),
                    ]
            curve["perplexity"].append((minutes(), update, float(np.exp(totals[0] / totals[1]))))
            params = torch_to_flax_params({k: v.cpu() for k, v in model.state_dict().items()}, cfg)
            scores = validation_bleu(cfg, params, trainer.tokenizer, pairs, experiment.decode, "greedy")
            curve["bleu"].append((minutes(), update, scores.bleu))
            print(
                f"torch update {update} at {minutes():.1f} min: validation perplexity "
                f"{curve['perplexity'][-1][2]:.2f}, greedy BLEU {scores.bleu:.2f}",
                flush=True,
            )
            model.train()

        update, tokens, train_seconds = 0, 0, 0.0
        budget = train_cfg.max_minutes or float("inf")
        while update < train_cfg.steps and minutes() < budget:
            began = time.perf_counter()
            target_tokens, source_tokens = train_update(
                batch_tensors(next(trainer.data.batches), device), float(schedule(update))
            )
            update += 1
            if update > 1:  # the first update compiles (torch.compile) or warms up
                tokens += target_tokens + source_tokens
                train_seconds += time.perf_counter() - began
            if update % train_cfg.eval_every == 0:
                evaluate(update)
        if not curve["bleu"] or curve["bleu"][-1][1] != update:
            evaluate(update)
    curve["updates"] = update
    curve["tokens_per_s"] = tokens / train_seconds if train_seconds else 0.0
    return curve


def first_batch_losses(experiment, workdir: Path) -> dict:
    """The label-smoothed loss of the first training batch at the initial weights, without dropout, in both
    frameworks: the parity check that the comparison trains the same model on the same data."""
    import jax.numpy as jnp
    import torch

    from transformer_jax.interop.torch import flax_to_torch_state_dict
    from transformer_jax.interop.torch_reference import TorchTransformer
    from transformer_jax.model import Transformer
    from transformer_jax.train.loss import cross_entropy_sums

    with loop.assemble(experiment, workdir) as trainer:
        cfg, params, batch = trainer.model_cfg, jax.device_get(trainer.state.params), next(trainer.data.batches)
    eps = experiment.train.label_smoothing
    logits = Transformer(cfg.replace(dropout_rate=0.0)).apply(
        {"params": params}, batch["inputs"], batch["decoder_inputs"]
    )
    sums = cross_entropy_sums(logits, jnp.asarray(batch["targets"]), label_smoothing=eps, pad_id=cfg.pad_id)
    model = TorchTransformer(cfg)
    model.load_state_dict(flax_to_torch_state_dict(params, cfg))
    model.eval()
    inputs, decoder_inputs, targets = (
        torch.as_tensor(np.asarray(batch[k]), dtype=torch.long) for k in ("inputs", "decoder_inputs", "targets")
    )
    with torch.no_grad():
        loss = (
            torch.nn.functional.cross_entropy(
                model(inputs, decoder_inputs).reshape(-1, cfg.vocab_size),
                targets.reshape(-1),
                ignore_index=cfg.pad_id,
                label_smoothing=eps,
                reduction="sum",
            )
            / (targets != cfg.pad_id).sum()
        )
    return {"jax": float(sums.loss / sums.tokens), "torch": float(loss)}


def minutes_to(curve: dict, threshold: float) -> float | None:
    return next((minute for minute, _, bleu in curve["bleu"] if bleu >= threshold), None)


REPORT = "time_to_bleu.json"
SETTINGS = ("config", "minutes", "updates", "eval_every", "device", "threads")  # what every run of a WORKDIR shares


def write_report(workdir: Path, settings: dict, parity: dict | None, runs: dict) -> dict:
    """WORKDIR/time_to_bleu.json: the machine, the settings, the parity check, each finished run's curves and
    minutes to BLEU."""
    import torch

    report = {
        "cpu": cpu_model(),
        "jax": jax.__version__,
        "torch": torch.__version__,
        "load_average_at_end": os.getloadavg(),
        "settings": settings,
        "first_batch_loss": parity,
        "runs": runs,
        "minutes_to_bleu": {name: {str(t): minutes_to(curve, t) for t in THRESHOLDS} for name, curve in runs.items()},
    }
    (workdir / REPORT).write_text(json.dumps(report, indent=2))
    return report


def finished_runs(workdir: Path, settings: dict) -> tuple[dict, dict | None]:
    """(runs, parity) already in WORKDIR's report, after checking that it was made with these settings on this CPU
    (runs from two machines are no comparison)."""
    path = workdir / REPORT
    if not workdir.exists():
        return {}, None
    if not path.is_file():
        raise UserError(f"--workdir {workdir} exists but holds no {REPORT}; give a new directory")
    earlier = json.loads(path.read_text())
    then = {"cpu": earlier.get("cpu"), **earlier.get("settings", {})}
    now = {"cpu": cpu_model(), **settings}
    changed = [f"{key}: {then.get(key)!r} -> {value!r}" for key, value in now.items() if then.get(key) != value]
    if changed:
        raise UserError(
            f"{path} was made with other settings ({'; '.join(changed)}); use them again or a new --workdir"
        )
    return earlier["runs"], earlier["first_batch_loss"]


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    rest, overrides = cli.split_overrides(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="an experiment file, e.g. experiments/multi30k.py")
    parser.add_argument(
        "--workdir",
        required=True,
        help="WORKDIR/jax, WORKDIR/torch, ... are created; a WORKDIR of an earlier call with the same settings keeps "
        "its finished runs and trains the missing ones (e.g. add --torch-compile later)",
    )
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--minutes", type=float, help="wall-clock budget of each framework")
    budget.add_argument("--updates", type=int, help="or an update budget (both frameworks the same updates)")
    parser.add_argument("--eval-every", type=int, default=500, help="updates between evaluations")
    parser.add_argument("--torch-compile", action="store_true", help="also train with torch.compile (a third run)")
    parser.add_argument("--device", default="cpu", help="torch's device (cuda on a GPU; JAX uses its own backend)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
    args = parser.parse_args(rest)
    import torch

    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    settings = {key: getattr(args, key) for key in SETTINGS} | {"overrides": [list(pair) for pair in overrides]}
    budget_overrides = [("train.max_minutes", repr(args.minutes or 0.0))]
    budget_overrides += [("train.steps", repr(args.updates if args.updates else 1_000_000))]
    eval_overrides = [(f"train.{k}", repr(args.eval_every)) for k in ("eval_every", "bleu_every")]
    try:
        experiment = load_experiment(
            args.config, overrides + budget_overrides + eval_overrides + [("train.final_bleu", "none")]
        )
        runs, parity = finished_runs(workdir, settings)
    except UserError as error:
        parser.error(str(error))
    if experiment.data.pack:
        parser.error("the torch reference has no packed batches: set --config.data.pack=false")

    workdir.mkdir(parents=True, exist_ok=True)
    if "jax" not in runs:  # a timed run cut short is not resumed: it starts again
        shutil.rmtree(workdir / "jax", ignore_errors=True)
        runs["jax"] = jax_run(experiment, workdir / "jax")
    if parity is None:
        shutil.rmtree(workdir / "parity", ignore_errors=True)
        (workdir / "parity").mkdir()
        shutil.copy(workdir / "jax" / "spm.model", workdir / "parity" / "spm.model")
        parity = first_batch_losses(experiment, workdir / "parity")
    torch_runs = [("torch eager", "torch", False)] + [("torch.compile", "torch_compile", True)] * args.torch_compile
    for name, directory, compile_model in torch_runs:
        if name in runs:
            continue
        write_report(workdir, settings, parity, runs)  # the finished runs stand if a later one fails
        shutil.rmtree(workdir / directory, ignore_errors=True)
        runs[name] = torch_run(
            experiment, workdir / "jax", workdir / directory, compile_model=compile_model, device=args.device
        )
    report = write_report(workdir, settings, parity, runs)
    plot_validation_against_minutes(
        {
            name: {key: [(minute, value) for minute, _, value in curve[key]] for key in ("bleu", "perplexity")}
            for name, curve in runs.items()
        },
        workdir / "time_to_bleu.png",
    )
    print(f"first-batch loss: JAX {parity['jax']:.6f}, torch {parity['torch']:.6f}")
    print(f"{'framework':14} {'updates':>8} {'tok/s':>8} " + " ".join(f"{'min to ' + str(t):>10}" for t in THRESHOLDS))
    for name, curve in runs.items():
        cells = [minutes_to(curve, t) for t in THRESHOLDS]
        print(
            f"{name:14} {curve['updates']:8d} {curve['tokens_per_s']:8.0f} "
            + " ".join(f"{c:10.1f}" if c is not None else f"{'-':>10}" for c in cells)
        )
    print(f"wrote {workdir / 'time_to_bleu.json'} and {workdir / 'time_to_bleu.png'}")
    return report


if __name__ == "__main__":
    main()
