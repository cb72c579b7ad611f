"""A pod run that loses a host: the real `transformer-jax train` on 2 processes x 2 CPU devices on 127.0.0.1.

- SIGTERM to one process (a scheduler evicting one VM): both stop at the same update, both save it, both exit 143;
  the relaunch resumes there and ends with the parameters of an uninterrupted run on the same 2 x 2 devices, bit
  for bit (another layout rounds its sums otherwise, and Adam amplifies that over a dozen updates).
- kill -9 of one process: the other ends within seconds with one line (PeerLostError: which update, the newest
  checkpoint, how to resume) and exit peers.PEER_LOST_EXIT_CODE, never a hang or "a bug in transformer_jax":
  by its failed collective, or by peers.PeerWatch when it is in none (compiling, say).
- SIGSTOP of one process (a host that hangs): no collective fails, so PeerWatch ends the other once the stopped one
  has missed its heartbeats for heartbeat_timeout seconds, with the same line and exit code.
A hang fails by the subprocess timeout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_run_overrides

from transformer_jax import peers
from transformer_jax.workdir import load_params

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("multihost")]

REPOSITORY = Path(__file__).resolve().parents[1]
STEPS = 12
RUN = {  # every update logged, no checkpoint but the ones a stop makes, the same numbers on any layout
    "train.checkpoint_every": 1000,
    "train.eval_every": 1000,
    "train.async_checkpoints": False,
    "model.dropout_rate": 0.0,
    "mesh.data": 1,
    "mesh.fsdp": -1,
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(workdir: Path, log: Path, devices: int, steps: int = STEPS, **distributed_settings) -> subprocess.Popen:
    overrides = tiny_run_overrides(steps, **RUN, **{f"distributed.{k}": v for k, v in distributed_settings.items()})
    command = [sys.executable, "-m", "transformer_jax", "--compilation-cache", "off", "train"]
    command += ["--config", "experiments/tiny.py", "--workdir", str(workdir)]
    command += [f"--config.{key}={value}" for key, value in overrides]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TJ_", "JAX_", "XLA_")) and "proxy" not in k.lower()
    }
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    with open(log, "w") as handle:
        return subprocess.Popen(command, cwd=REPOSITORY, stdout=handle, stderr=subprocess.STDOUT, env=env)


def pair(workdir: Path, logs: Path, name: str, steps: int = STEPS, **settings) -> list[subprocess.Popen]:
    port = free_port()
    common = dict(coordinator_address=f"127.0.0.1:{port}", num_processes=2, cpu_collectives="gloo", **settings)
    return [launch(workdir, logs / f"{name}{i}.log", 2, steps, process_id=i, **common) for i in range(2)]


def logged_update(workdir: Path) -> int:
    """The newest train row process 0 has logged (0 before the first)."""
    path = workdir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    rows = [json.loads(line) for line in lines[:-1]]  # the last line may be half written
    return max((row["step"] for row in rows if row["kind"] == "train"), default=0)


def wait_for_update(workdir: Path, update: int, processes: list[subprocess.Popen], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while logged_update(workdir) < update:
        assert all(p.poll() is None for p in processes), "a process ended before the fault was injected"
        assert time.monotonic() < deadline, f"update {update} was not reached within {timeout} s"
        time.sleep(0.2)


def finish(process: subprocess.Popen, log: Path, timeout: float = 300) -> tuple[int, str]:
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"{log.name} hung: still running after {timeout} s\n{log.read_text()[-3000:]}")
    return code, log.read_text()


def test_sigterm_to_one_process_stops_both_at_one_update_and_the_relaunch_resumes_exactly(tmp_path):
    reference = pair(tmp_path / "reference", tmp_path, "reference")
    workdir = tmp_path / "run"
    processes = pair(workdir, tmp_path, "first")
    wait_for_update(workdir, 3, processes)
    processes[1].send_signal(signal.SIGTERM)  # one host only
    signalled = time.monotonic()
    outcomes = [finish(p, tmp_path / f"first{i}.log") for i, p in enumerate(processes)]
    print(f"[faults] SIGTERM to process 1: both exited {time.monotonic() - signalled:.1f} s later")
    assert [code for code, _ in outcomes] == [143, 143], "\n\n".join(output[-3000:] for _, output in outcomes)
    stops = [output.strip().splitlines()[-1] for _, output in outcomes]
    assert all("stopped by SIGTERM" in line for line in stops), stops
    stopped_at = {re.search(r"update (\d+)", line).group(1) for line in stops}
    assert len(stopped_at) == 1, stops  # the same update on both processes
    update = int(stopped_at.pop())
    assert 3 <= update < STEPS
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == [update]
    print(f"[faults] both stopped at update {update}: {stops[0]}")

    processes = pair(workdir, tmp_path, "second")
    outcomes = [finish(p, tmp_path / f"second{i}.log") for i, p in enumerate(processes)]
    assert [code for code, _ in outcomes] == [0, 0], "\n\n".join(output[-3000:] for _, output in outcomes)
    assert f"resuming at update {update}" in outcomes[0][1]
    outcomes = [finish(p, tmp_path / f"reference{i}.log") for i, p in enumerate(reference)]
    assert [code for code, _ in outcomes] == [0, 0], "\n\n".join(output[-3000:] for _, output in outcomes)
    resumed, uninterrupted = _flat(load_params(workdir)), _flat(load_params(tmp_path / "reference"))
    assert sorted(resumed) == sorted(uninterrupted)
    for path, value in resumed.items():
        np.testing.assert_array_equal(value, uninterrupted[path], err_msg=path)


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _flat(value, f"{prefix}/{key}").items()}
    return {prefix: np.asarray(tree)}


def test_a_dead_process_ends_the_other_with_one_line_and_its_own_exit_code(tmp_path):
    workdir = tmp_path / "run"
    processes = pair(workdir, tmp_path, "run", steps=1000, heartbeat_timeout=10)
    wait_for_update(workdir, 3, processes)
    processes[1].kill()  # kill -9: no handler runs, its sockets close
    killed = time.monotonic()
    code, output = finish(processes[0], tmp_path / "run0.log", timeout=120)
    elapsed = time.monotonic() - killed
    print(f"[faults] kill -9 of process 1: process 0 exited {code} {elapsed:.1f} s later")
    assert code == peers.PEER_LOST_EXIT_CODE, f"exit {code}\n{output[-3000:]}"
    (line,) = [line for line in output.splitlines() if line.startswith("PeerLostError")]
    assert "process 0 of 2 lost process 1 at update" in line and "relaunch the same command" in line, line
    assert "no checkpoint yet" in line  # none was due: checkpoint_every is 1000
    assert "bug in transformer_jax" not in output and "Terminating process" not in output  # nor the runtime's abort
    assert elapsed < 10 + 20, f"the survivor took {elapsed:.0f} s"  # heartbeat_timeout + a margin, never a hang


def test_a_hung_process_ends_the_other_after_its_heartbeat_timeout(tmp_path):
    workdir = tmp_path / "run"
    processes = pair(workdir, tmp_path, "run", steps=1000, heartbeat_timeout=10)
    wait_for_update(workdir, 3, processes)
    processes[1].send_signal(signal.SIGSTOP)  # alive, its sockets open, answering nothing
    stopped = time.monotonic()
    try:
        code, output = finish(processes[0], tmp_path / "run0.log", timeout=120)
    finally:
        processes[1].kill()
        processes[1].wait()
    elapsed = time.monotonic() - stopped
    print(f"[faults] SIGSTOP of process 1: process 0 exited {code} {elapsed:.1f} s later")
    assert code == peers.PEER_LOST_EXIT_CODE, f"exit {code}\n{output[-3000:]}"
    (line,) = [line for line in output.splitlines() if line.startswith("PeerLostError")]
    assert "process 0 of 2 lost process 1 at update" in line and "no heartbeat for heartbeat_timeout=10 s" in line
    assert "relaunch the same command" in line, line
    assert "Terminating process" not in output  # the runtime's abort never comes first
    # Missed heartbeats count from the last one received, before the stop: the line comes within the timeout.
    assert elapsed < 10 + 20, f"the survivor took {elapsed:.0f} s"  # never a hang


def test_only_a_lost_peer_is_reported_as_one(monkeypatch):
    """The words of a failed collective count; another runtime error (out of memory) stays a bug, traceback and all."""
    monkeypatch.setattr(peers.jax, "process_count", lambda: 2)
    gone = RuntimeError("UNKNOWN: Gloo all-reduce failed: Read error [127.0.0.1]:16606: Connection reset by peer")
    assert peers.lost_a_peer(gone)
    assert not peers.lost_a_peer(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 2.1G"))
    monkeypatch.setattr(peers.jax, "process_count", lambda: 1)
    assert not peers.lost_a_peer(gone)  # one process has no peer to lose
