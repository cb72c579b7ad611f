"""No saved work lost: to a run that diverges, or to a second trainer on the same workdir (through the CLI)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
from conftest import tiny_run_overrides

from transformer_jax import cli
from transformer_jax.checkpoint import Checkpointer
from transformer_jax.workdir import LOCK_FILENAME, load_params

# A run that learns: checkpoints at 4 and 8; validation and BLEU off, so only the training decides.
GOOD = {
    "train.checkpoint_every": 4,
    "train.keep_checkpoints": 100,  # nothing rotates out by age: what goes missing, the divergence lost
    "train.eval_every": 100,
    "train.bleu_every": 0,
    "train.final_bleu": "none",
}


def train_argv(workdir, steps, **changes) -> list[str]:
    argv = ["train", "--config", "experiments/tiny.py", "--workdir", str(workdir)]
    return argv + [f"--config.{key}={value}" for key, value in tiny_run_overrides(steps, **{**GOOD, **changes})]


def saved_steps(workdir) -> list[int]:
    checkpointer = Checkpointer(workdir, keep=None, async_save=False)
    try:
        return checkpointer.all_steps()
    finally:
        checkpointer.close()


def checkpoint_files(workdir) -> dict:
    directory = workdir / "checkpoints"
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_diverging_run_stops_and_leaves_every_finite_checkpoint_intact(tmp_path, capsys):
    assert cli.main(train_argv(tmp_path, 8)) == 0
    before = checkpoint_files(tmp_path)
    # Resumed with a learning rate a million times too large, it diverges within a few updates.
    code = cli.main(train_argv(tmp_path, 40, **{"optimizer.lr_scale": 1e6, "optimizer.warmup_steps": 1}))
    err = capsys.readouterr().err
    assert code == 1, err
    assert "the run diverged and was stopped" in err and "Traceback" not in err
    diverged_at = int(re.search(r"error: update (\d+): loss", err).group(1))
    assert checkpoint_files(tmp_path).items() >= before.items()  # 4 and 8 byte for byte
    steps = saved_steps(tmp_path)
    assert steps[:2] == [4, 8] and max(steps) < diverged_at
    for step in steps:  # any checkpoint written before the loss turned holds finite numbers only
        assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(load_params(tmp_path, step))), step
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(row["loss"]) for row in rows if row["kind"] == "train")  # no NaN row was logged


def hold_lock(workdir) -> subprocess.Popen:
    """Another process that holds the workdir's lock as a trainer does, until killed."""
    code = (
        "import sys, time\nfrom transformer_jax.workdir import TrainerLock\n"
        f"with TrainerLock({str(workdir)!r}):\n    print('held', flush=True)\n    time.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_trainer_refuses_a_held_workdir_and_takes_over_a_stale_lock(tmp_path, capsys):
    holder = hold_lock(tmp_path)
    try:
        code = cli.main(train_argv(tmp_path, 2))
        err = capsys.readouterr().err
        assert code == 1, err
        assert f"in use by another trainer (process {holder.pid} on host {socket.gethostname()}" in err
        assert sorted(os.listdir(tmp_path)) == [LOCK_FILENAME]  # nothing else was written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    # The holder was killed: its lock is stale, and the next trainer takes it over and runs.
    started = time.monotonic()
    assert cli.main(train_argv(tmp_path, 2)) == 0, capsys.readouterr().err
    assert time.monotonic() - started < 300
    assert not (tmp_path / LOCK_FILENAME).exists()  # released at the end
    assert saved_steps(tmp_path) == [2]
