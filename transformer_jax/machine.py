"""What a run or a benchmark ran on, recorded beside its figures: speeds mean little without the machine (the same
machine kind is an Intel Xeon one day and an AMD EPYC the next)."""

from __future__ import annotations

import os
import platform

import jax


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; the platform's processor string elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def describe() -> dict:
    """{cpu, cpu_cores, devices, jax}: the CPU model, the cores this process may use, JAX's devices as
    '<count> x <kind>', and the jax version."""
    devices = jax.devices()
    return {
        "cpu": cpu_model(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "devices": f"{len(devices)} x {devices[0].device_kind}",
        "jax": jax.__version__,
    }
