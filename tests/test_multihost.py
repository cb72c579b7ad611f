"""Multi-process training on CPU (2 processes x 2 devices on 127.0.0.1, gloo collectives), restarts, bad launches.

Oracle: the same training (same global batches, same initial state) in one process with 4 devices. The two-process
run stops after update 2 (orbax checkpoint written by both processes), both processes are restarted and resume to
update 4; losses of all four updates and the final parameters must match the single process (1e-5, float32).
The worker is tests/helpers/multihost_worker.py; each process reads only its own rows of every global batch.
The same stop / restart, through the real runner (train.loop.train, --loop), must log the single process's metrics.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from transformer_jax import distributed
from transformer_jax.experiment import DistributedConfig

# One subprocess run feeds the whole module: keep it on one xdist worker (pytest -n N --dist loadgroup).
pytestmark = pytest.mark.xdist_group("multihost")

WORKER = Path(__file__).parent / "helpers" / "multihost_worker.py"
TOLERANCE = 1e-5
ENV_NAMES = (
    "TJ_COORDINATOR_ADDRESS",
    "JAX_COORDINATOR_ADDRESS",
    "TJ_NUM_PROCESSES",
    "TJ_PROCESS_ID",
    "XLA_FLAGS",
    "JAX_PLATFORMS",
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES and not k.lower().endswith("_proxy")}
    env.update(extra)
    return env


class Launch:
    def __init__(self, name: str, args: list[str], logdir: Path, env: dict | None = None):
        self.name, self.log = name, logdir / f"{name}.log"
        self.started = time.monotonic()
        with open(self.log, "w") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, str(WORKER), *args], stdout=handle, stderr=subprocess.STDOUT, env=env or clean_env()
            )

    def wait(self, timeout: float = 300) -> tuple[int, str, float]:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        elapsed = time.monotonic() - self.started
        return code, self.log.read_text(), elapsed


def wait_ok(launches: list[Launch]) -> None:
    failures = []
    for launch in launches:
        code, output, _ = launch.wait()
        if code != 0:
            lines = [line for line in output.splitlines() if "SPMD" not in line]
            failures.append(f"{launch.name} exited {code}:\n" + "\n".join(lines[-25:]))
    assert not failures, "\n\n".join(failures)


def pair(name: str, root: Path, stop_at: int, params: bool) -> list[Launch]:
    port = free_port()
    return [
        Launch(
            f"{name}{i}",
            [
                "--process-id",
                str(i),
                "--num-processes",
                "2",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--timeout",
                "120",
                "--workdir",
                str(root / "run"),
                "--stop-at",
                str(stop_at),
                "--out",
                str(root / f"{name}{i}.json"),
                "--cache-dir",
                str(root / "xla_cache"),
            ]
            + (["--params", str(root / f"{name}{i}.npz")] if params else []),
            root,
        )
        for i in range(2)
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("multihost")
    reference = Launch(
        "reference",
        [
            "--num-processes",
            "1",
            "--devices",
            "4",
            "--workdir",
            str(root / "ref"),
            "--stop-at",
            "4",
            "--out",
            str(root / "reference.json"),
            "--params",
            str(root / "reference.npz"),
        ],
        root,
    )
    first = pair("first", root, stop_at=2, params=False)  # runs alongside the reference
    wait_ok([reference, *first])
    second = pair("second", root, stop_at=4, params=True)  # both processes restarted: resume from update 2
    wait_ok(second)
    load = lambda name: json.loads((root / f"{name}.json").read_text())  # noqa: E731
    return {
        "root": root,
        "reference": load("reference"),
        "first": [load(f"first{i}") for i in range(2)],
        "second": [load(f"second{i}") for i in range(2)],
    }


@pytest.mark.slow
def test_two_processes_train_like_one(runs):
    reference = {row["step"]: row for row in runs["reference"]["steps"]}
    assert sorted(reference) == [1, 2, 3, 4]
    for report in runs["first"] + runs["second"]:
        assert report["info"]["process_count"] == 2 and report["info"]["device_count"] == 4
        assert report["shard"] == [report["info"]["process_index"], 2]
        for row in report["steps"]:
            assert row["local_rows"] * 2 == row["global_rows"]  # each process fed only its half of the batch
            expected = reference[row["step"]]
            assert row["tokens"] == expected["tokens"]
            for key in ("loss", "nll", "grad_norm"):
                np.testing.assert_allclose(row[key], expected[key], rtol=TOLERANCE, err_msg=f"{key} {row['step']}")
    assert [row["step"] for row in runs["first"][0]["steps"]] == [1, 2]


@pytest.mark.slow
def test_restart_resumes_and_ends_with_the_same_parameters(runs):
    for report in runs["second"]:
        assert report["resumed_from"] == 2
        assert [row["step"] for row in report["steps"]] == [3, 4]
    reference = np.load(runs["root"] / "reference.npz")
    full = {}
    for key in reference.files:
        name, where = key.split("|")
        full.setdefault(name, {})[where] = reference[key]
    compared = 0
    for i in range(2):
        shards = np.load(runs["root"] / f"second{i}.npz")
        for key in shards.files:  # same mesh shape: every shard of a process has its twin in the reference
            name, where = key.split("|")
            np.testing.assert_allclose(shards[key], full[name][where], atol=TOLERANCE, rtol=0, err_msg=key)
            compared += 1
    assert compared == len(reference.files)


@pytest.mark.slow
def test_parameters_are_split_across_processes(runs):
    for report in runs["second"]:
        assert report["local_param_bytes"] * 2 == report["total_param_bytes"]  # fsdp over all 4 devices


def loop_pair(name: str, root: Path, stop_at: int, prepared: Path) -> list[Launch]:
    port = free_port()
    return [
        Launch(
            f"{name}{i}",
            [
                "--loop",
                "--process-id",
                str(i),
                "--num-processes",
                "2",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--timeout",
                "120",
                "--workdir",
                str(root / "run"),
                "--stop-at",
                str(stop_at),
                "--out",
                str(root / f"{name}{i}.json"),
                "--cache-dir",
                str(root / "xla_cache"),
                "--prepared",
                str(prepared),
            ],
            root,
        )
        for i in range(2)
    ]


@pytest.mark.slow
def test_the_training_loop_on_two_processes_resumes_and_logs_like_one(tmp_path):
    """train.loop.train end to end (distributed start-up from the config, training pairs prepared in two parts and
    read by each process for its own rows, the data position restored from the checkpoint, validation rows split,
    BLEU, process-0-only logs): stopped after update 2 and resumed to 4 on two processes, it logs the losses and BLEU
    of one process with the same four devices that encodes the text in memory."""
    reference = Launch(
        "loop_reference",
        ["--loop", "--num-processes", "1", "--devices", "4", "--workdir", str(tmp_path / "ref"), "--stop-at", "4"],
        tmp_path,
    )
    sys.path.insert(0, str(WORKER.parent))
    from multihost_worker import prepare_for_loop

    prepare_for_loop(tmp_path / "prepared")
    wait_ok([reference, *loop_pair("loop_first", tmp_path, stop_at=2, prepared=tmp_path / "prepared")])
    wait_ok(loop_pair("loop_second", tmp_path, stop_at=4, prepared=tmp_path / "prepared"))
    for i in range(2):
        report = json.loads((tmp_path / f"loop_second{i}.json").read_text())
        assert report["info"]["process_count"] == 2 and report["summary"]["start_step"] == 2
        assert report["summary"]["step"] == 4
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len({(row["kind"], row["step"]) for row in rows}) == len(rows)  # written once: by process 0 only
    expected = {
        (row["kind"], row["step"]): row
        for row in map(json.loads, (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines())
    }
    machines = sorted(row["step"] for row in rows if row["kind"] == "machine")
    assert machines == [0, 2] and [step for kind, step in expected if kind == "machine"] == [0]  # one per command
    rows = [row for row in rows if row["kind"] != "machine"]
    expected = {key: row for key, row in expected.items() if key[0] != "machine"}
    assert sorted(expected) == sorted((row["kind"], row["step"]) for row in rows)
    assert sorted(step for kind, step in expected if kind == "train") == [1, 2, 3, 4]
    for row in rows:
        for key in ("loss", "nll", "accuracy", "bleu", "chrf"):
            if key in row:
                np.testing.assert_allclose(
                    row[key],
                    expected[row["kind"], row["step"]][key],
                    rtol=1e-5,
                    atol=1e-6,
                    err_msg=f"{row['kind']} {row['step']} {key}",
                )


def test_bad_launches_fail_with_a_clear_message_in_bounded_time(tmp_path):
    timeout = 4
    common = ["--launch-only", "--timeout", str(timeout)]
    unreachable_port, lonely_port, mismatch_port = free_port(), free_port(), free_port()
    launches = {
        # settings from the environment: nobody serves the coordinator address
        "unreachable": Launch(
            "unreachable",
            common,
            tmp_path,
            clean_env(TJ_COORDINATOR_ADDRESS=f"127.0.0.1:{unreachable_port}", TJ_NUM_PROCESSES="2", TJ_PROCESS_ID="1"),
        ),
        # process 0 waits for a process 1 that never starts
        "lonely": Launch(
            "lonely",
            common + ["--process-id", "0", "--num-processes", "2", "--coordinator", f"127.0.0.1:{lonely_port}"],
            tmp_path,
        ),
        # the two processes disagree on the number of processes
        "mismatch0": Launch(
            "mismatch0",
            common + ["--process-id", "0", "--num-processes", "2", "--coordinator", f"127.0.0.1:{mismatch_port}"],
            tmp_path,
        ),
        "mismatch1": Launch(
            "mismatch1",
            common + ["--process-id", "1", "--num-processes", "3", "--coordinator", f"127.0.0.1:{mismatch_port}"],
            tmp_path,
        ),
    }
    expected = {
        "unreachable": "could not reach the coordinator at '127.0.0.1:",
        "lonely": "did not complete within initialization_timeout=4s",
        "mismatch0": "process 0 was launched with num_processes=2 but process(es) 1 with num_processes=3",
        "mismatch1": "process 1 was launched with num_processes=3 but process(es) 0 with num_processes=2",
    }
    for name, launch in launches.items():
        code, output, elapsed = launch.wait(timeout=120)
        assert code == distributed.STARTUP_FAILED_EXIT_CODE, f"{name}: exit {code}\n{output[-3000:]}"
        assert "DistributedStartupError" in output and expected[name] in output, f"{name}:\n{output[-3000:]}"
        assert elapsed < timeout + 40, f"{name} took {elapsed:.0f}s"  # imports + timeout, never a hang


# ---------------------------------------------------------------------------------------------- in-process


def test_settings_from_config_and_environment(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    cfg = distributed.resolve_config(
        DistributedConfig(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=0)
    )
    assert (cfg.coordinator_address, cfg.num_processes, cfg.process_id) == ("10.0.0.1:1234", 4, 0)
    monkeypatch.setenv("TJ_COORDINATOR_ADDRESS", "host:99")
    monkeypatch.setenv("TJ_NUM_PROCESSES", "2")
    monkeypatch.setenv("TJ_PROCESS_ID", "1")
    cfg = distributed.resolve_config(None)
    assert (cfg.coordinator_address, cfg.num_processes, cfg.process_id) == ("host:99", 2, 1)
    assert (
        distributed.resolve_config(DistributedConfig(process_id=0)).process_id == 0
    )  # config wins over the environment


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"coordinator_address": "no-port"}, "is not 'host:port'"),
        ({"num_processes": 2, "process_id": 2}, "must lie in \\[0, num_processes=2\\)"),
        ({"num_processes": 0}, "at least 1"),
        ({"initialization_timeout": 0}, "must be positive"),
        ({"cpu_collectives": "nccl"}, "gloo"),
    ],
)
def test_bad_settings_are_rejected_before_starting(monkeypatch, settings, message):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(distributed.DistributedStartupError, match=message):
        distributed.resolve_config(DistributedConfig(**settings))


def test_single_process_needs_no_coordinator(monkeypatch):
    for name in ENV_NAMES + distributed.CLUSTER_HINTS:
        monkeypatch.delenv(name, raising=False)
    info = distributed.initialize(DistributedConfig())
    assert info.process_count == 1 and not info.initialized
