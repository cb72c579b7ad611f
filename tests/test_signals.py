"""SIGTERM at chosen moments (compiling, steps, asynchronous saves, a second signal during the save): every time
the process exits within a bounded time, with 143 or the signal, no traceback, and a checkpoint that loads whole.

The run resumes in the same workdir trial after trial, so later signals land in the middle of training and of
checkpoint saves (one every 2 updates, asynchronous). The default test signals at four fixed moments read from the
process's output and its checkpoint directory; `pytest -m stress` adds 20 seeded random moments.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import tiny_run_overrides

from transformer_jax import checkpoint as ckpt
from transformer_jax import run_log
from transformer_jax.workdir import load_params

ROOT = Path(__file__).resolve().parents[1]
TRIALS = 20
STARTED_TRAINING = "time to first step"
pytestmark = pytest.mark.xdist_group("signals")


class _Collector:
    """Reads a process's stdout and stderr in threads; `wait_for` waits for a line containing some text."""

    def __init__(self, process: subprocess.Popen):
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.threads = [
            threading.Thread(target=self._read, args=(stream,), daemon=True)
            for stream in (process.stdout, process.stderr)
        ]
        for thread in self.threads:
            thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()

    def wait_for(self, text: str, timeout: float = 180) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: any(text in line for line in self.lines), timeout)

    def done(self) -> None:
        for thread in self.threads:
            thread.join(timeout=30)

    def text(self) -> str:
        with self.changed:
            return "".join(self.lines)


def saved_steps(workdir: Path) -> list[int]:
    if not (workdir / "checkpoints").is_dir():
        return []
    checkpointer = ckpt.Checkpointer(workdir, keep=None, async_save=False)
    try:
        return checkpointer.all_steps()
    finally:
        checkpointer.close()


def save_in_flight(workdir: Path, after: int) -> bool:
    """Whether orbax is writing the checkpoint of a step > `after` (its temporary directory exists)."""
    directory = workdir / "checkpoints"
    names = os.listdir(directory) if directory.is_dir() else []
    return any(
        ".orbax-checkpoint-tmp" in name and name.split(".")[0].isdigit() and int(name.split(".")[0]) > after
        for name in names
    )


def wait_until(condition, timeout: float = 180) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def last_logged_update(workdir: Path) -> int:
    return max((row["step"] for row in run_log.read_rows(workdir) if row["kind"] == "train"), default=0)


def train_command(tmp_path: Path, checkpoint_every: int = 2) -> list[str]:
    overrides = tiny_run_overrides(
        10_000,
        **{
            "train.checkpoint_every": checkpoint_every,
            "train.eval_every": 1000,
            "train.async_checkpoints": True,
            "train.bleu_every": 0,
            "train.final_bleu": "none",
        },
    )
    return [
        sys.executable,
        "-m",
        "transformer_jax",
        "--compilation-cache",
        str(tmp_path / "xla"),
        "train",
        "--config",
        "experiments/tiny.py",
        "--workdir",
        str(tmp_path / "run"),
        *[f"--config.{key}={value}" for key, value in overrides],
    ]


@contextlib.contextmanager
def training(command: list[str]):
    """A training process and its output; afterwards it is gone and its pipes are closed."""
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    output = _Collector(process)
    try:
        yield process, output
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        output.done()
        process.stdout.close()
        process.stderr.close()


def check_exit(process: subprocess.Popen, output: _Collector, workdir: Path, trial) -> int:
    """Bounded exit with 143 or the signal, no traceback; the newest checkpoint (if any) reads back whole, and
    after 143 it is the update the run stopped at, where the next run resumes."""
    process.wait(timeout=120)  # bounded: the hang of an orbax thread would fail here
    output.done()
    err = output.text()
    assert process.returncode in (143, -signal.SIGTERM), (trial, process.returncode, err[-2000:])
    assert "Traceback" not in err, (trial, err[-2000:])
    if process.returncode == 143 and last_logged_update(workdir) > 0:
        assert saved_steps(workdir)[-1:] == [last_logged_update(workdir)], (trial, err[-2000:])
    if saved_steps(workdir):
        load_params(workdir)
    return process.returncode


def test_sigterm_while_compiling_training_and_saving_leaves_a_loadable_checkpoint(tmp_path):
    workdir = tmp_path / "run"
    command = train_command(tmp_path, checkpoint_every=1000)  # the handler's save is the only one
    with training(command) as (process, output):  # the first step compiles; the handler is being installed
        assert output.wait_for("model: "), output.text()[-2000:]
        process.send_signal(signal.SIGTERM)
        check_exit(process, output, workdir, "compiling")
    with training(command) as (process, output):  # training: the handler saves and exits
        assert output.wait_for(STARTED_TRAINING), output.text()[-2000:]
        process.send_signal(signal.SIGTERM)
        assert check_exit(process, output, workdir, "training") == 143
    command = train_command(tmp_path)  # an asynchronous save every 2 updates
    for trial in ("async save", "second signal during the save"):
        before = saved_steps(workdir)[-1]
        with training(command) as (process, output):
            assert wait_until(functools.partial(save_in_flight, workdir, before)), output.text()[-2000:]
            process.send_signal(signal.SIGTERM)
            if trial == "second signal during the save":
                assert output.wait_for("SIGTERM received"), output.text()[-2000:]
                process.send_signal(signal.SIGTERM)
            assert check_exit(process, output, workdir, trial) == 143
        assert saved_steps(workdir)[-1] > before  # training advanced; the newest save completed


@pytest.mark.stress
def test_sigterm_at_random_moments_leaves_a_loadable_checkpoint(tmp_path):
    rng = random.Random(0)
    command, workdir = train_command(tmp_path), tmp_path / "run"
    outcomes = []
    for trial in range(TRIALS):
        with training(command) as (process, output):
            if trial % 2:  # anywhere in start-up or training
                time.sleep(rng.uniform(0.2, 8.0))
            else:  # surely inside the training loop: steps, and an asynchronous save every 2 updates
                assert output.wait_for(STARTED_TRAINING), (trial, output.text()[-2000:])
                time.sleep(rng.uniform(0.0, 3.0))
            process.send_signal(signal.SIGTERM)
            if trial % 4 == 2:  # a second signal while the first one's save is running
                time.sleep(rng.uniform(0.0, 0.5))
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            outcomes.append(check_exit(process, output, workdir, trial))
    assert 143 in outcomes  # the handler saved and exited at least once (not only kills during start-up)
    assert saved_steps(workdir)[-1] > 2  # training advanced across the trials
