"""What a training run reports: its run log (run_log.py), TensorBoard events, a tqdm bar, and the curves PNG.

TensorBoard tags are "{kind}/{name}" of the run log's rows. Only process 0 writes (ProgressLog(write=False)
elsewhere).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from transformer_jax.run_log import RunLogWriter, read_rows
from transformer_jax.train import loss as loss_lib

PLOT_FILENAME = "curves.png"
TENSORBOARD_DIR = "tensorboard"


def summarize_train_metrics(metrics: Sequence[dict]) -> dict:
    """Per-token means over host metrics of train steps, the last learning rate and the mean applied grad norm."""
    totals = {key: sum(float(m[key]) for m in metrics) for key in ("loss", "nll", "correct", "tokens")}
    values = loss_lib.summarize(totals)
    values["learning_rate"] = float(metrics[-1]["learning_rate"])
    applied = [float(m["grad_norm"]) for m in metrics if float(m["updated"])]
    values["grad_norm"] = float(np.mean(applied)) if applied else math.nan
    return values


class ProgressLog:
    """The run log (appended) + TensorBoard events + a tqdm progress bar of finished updates.

    write=False (processes other than 0 of a multi-process run): every method does nothing.
    """

    def __init__(
        self,
        workdir: Path,
        start: int,
        total: int | None,
        progress: bool,
        write: bool = True,
        started: float | None = None,
    ):
        """total: the update the run stops at (None: unknown, e.g. a time budget); started: perf_counter() at the
        start of the run (default now)."""
        self.started = time.perf_counter() if started is None else started
        self.run_log: RunLogWriter | None = None
        self.writer = self.bar = None
        if not write:
            return
        from tensorboardX import SummaryWriter

        self.run_log = RunLogWriter(workdir)
        self.writer = SummaryWriter(str(workdir / TENSORBOARD_DIR))
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)

    def log(self, kind: str, step: int, values: dict) -> None:
        """One run log row; numeric values also go to TensorBoard as "{kind}/{name}"."""
        if self.run_log is None or self.writer is None:
            return
        self.run_log.append(kind, step, time.perf_counter() - self.started, values)
        for key, value in values.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"{kind}/{key}", value, step)
        self.writer.flush()

    def progress(self, steps: int, postfix: dict | None = None) -> None:
        if self.bar is not None:
            self.bar.update(steps)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def message(self, text: str) -> None:
        if self.run_log is None:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.run_log is not None and self.writer is not None:
            self.writer.close()
            self.run_log.close()


def plot_training_curves(workdir: str | Path) -> Path | None:
    """{workdir}/curves.png: train loss and NLL, validation NLL and the learning rate against the update, from the
    run log; None (nothing drawn) before its first train row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(workdir)
    train_rows = [row for row in rows if row["kind"] == "train"]
    eval_rows = [row for row in rows if row["kind"] == "eval"]
    if not train_rows:
        return None
    figure, (loss_axis, lr_axis) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [row["step"] for row in train_rows]
    loss_axis.plot(steps, [row["loss"] for row in train_rows], label="train (label-smoothed)")
    loss_axis.plot(steps, [row["nll"] for row in train_rows], label="train NLL", alpha=0.7)
    if eval_rows:
        loss_axis.plot(
            [row["step"] for row in eval_rows], [row["nll"] for row in eval_rows], "o-", label="validation NLL"
        )
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("loss per target token (nats)")
    loss_axis.set_yscale("log")
    loss_axis.legend()
    loss_axis.grid(alpha=0.3)
    lr_axis.plot(steps, [row["learning_rate"] for row in train_rows])
    lr_axis.set_xlabel("step")
    lr_axis.set_ylabel("learning rate")
    lr_axis.grid(alpha=0.3)
    figure.tight_layout()
    path = Path(workdir) / PLOT_FILENAME
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
