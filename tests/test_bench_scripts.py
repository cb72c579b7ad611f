"""The benchmark scripts run (their --smoke modes), so they cannot rot; no timing is asserted."""

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "bench"))

from device import peak_tflops  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_peak_table_matches_device_kinds_as_jax_names_them():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert peak_tflops("TPU v5 lite") == 197.0
    assert peak_tflops("cpu") is None


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
    report = json.loads(out.read_text())
    (row,) = report["results"]
    assert report["smoke"] and row["model"] == "tiny" and row["compute_dtype"] == "bfloat16"
    assert row["param_dtype"] == "float32" and row["tokens_per_s"] > 0 and row["beam4_sentences_per_s"] > 0
    assert row["mfu"] is None  # no peak for a CPU
