"""The benchmark scripts run (their --smoke modes), so they cannot rot; no timing is asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_jax.accounting import forward_flops
from transformer_jax.config import tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "bench"))

from device import peak_tflops  # noqa: E402
from train_throughput import steps_tokens_per_s  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_peak_table_matches_device_kinds_as_jax_names_them():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert peak_tflops("TPU v5 lite") == 197.0
    assert peak_tflops("cpu") is None


def test_train_throughput_is_the_median_window_after_the_first():
    windows = [
        {"tokens_per_sec": rate} for rate in (100.0, 50.0, 200.0, 210.0, 190.0)
    ]  # 100: first compile; 50: a new shape
    assert steps_tokens_per_s(windows) == 195.0  # by hand: the median of 50, 190, 200, 210
    assert steps_tokens_per_s(windows[:1]) == 0.0


SMOKE_TOKENS, SMOKE_LENGTH = 256, 16  # device.py --smoke: 256 source tokens per batch in rows of 16


def check_device_report(report):
    """The --smoke report on one CPU: its shapes follow the smoke arguments and its rates follow its own timings."""
    assert report["smoke"] and report["backend"] == "cpu" and report["devices"] == 1
    assert report["peak_tflops_per_device"] is None
    (row,) = report["results"]  # cuDNN's kernel needs a GPU: skipped, and the report says so
    assert report["skipped"] == ["attention_impl='cudnn': needs an NVIDIA GPU, this is cpu"]
    assert row["model"] == "tiny" and row["attention_impl"] == "einsum"
    assert row["compute_dtype"] == "bfloat16" and row["param_dtype"] == "float32"
    assert row["rows"] == SMOKE_TOKENS // SMOKE_LENGTH and row["length"] == SMOKE_LENGTH
    seconds = row["step_s"]
    assert row["tokens_per_s"] == pytest.approx(2 * row["rows"] * row["length"] / seconds)  # source + target
    # Training = forward + backward = 3 x the forward FLOPs (tests/test_accounting.py checks forward_flops).
    flops = 3 * forward_flops(tiny(vocab_size=512), row["rows"], row["length"], row["length"])["total"]
    assert row["tflops"] == pytest.approx(flops / seconds / 1e12)
    assert row["mfu"] is None  # no peak for a CPU
    assert row["greedy_sentences_per_s"] > 0 and row["beam4_sentences_per_s"] > 0


@pytest.mark.newest_stack  # the device machines run the newest stack; what the script calls is tested on both
def test_device_benchmark_smoke_runs_on_cpu(tmp_path):
    out = tmp_path / "device.json"
    proc = subprocess.run(
        ["bash", str(ROOT / "experiments/bench/device.sh"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PY": sys.executable, "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    check_device_report(json.loads(out.read_text()))
