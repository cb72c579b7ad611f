"""What a run or a benchmark ran on, recorded beside its figures: speeds mean little without the machine (the same
machine kind is an Intel Xeon one day and an AMD EPYC the next)."""

from __future__ import annotations

import os
import platform

import jax


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name and, where the name is all a virtual machine shows (e.g. 'AMD EPYC' for a Zen 4 and a
    Zen 5 alike), its x86 family and model numbers: 'AMD EPYC (family 26, model 2)'. From /proc/cpuinfo on Linux;
    the platform's processor string elsewhere."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            first = f.read().split("\n\n", 1)[0]  # the first processor's block
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


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
