"""A plan as tables: per bucket for one layout, the layouts of a search ranked, and beam search by batch."""

from __future__ import annotations

from collections.abc import Sequence

from transformer_jax import sharding
from transformer_jax.plan.decoding import DecodePlan
from transformer_jax.plan.figures import PlanReport
from transformer_jax.plan.targets import GiB


def _size(value: float | None) -> str:
    if value is None:
        return "-"
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value >= GiB / 10:
        return f"{sign}{value / GiB:.2f} GiB"
    return f"{sign}{value / 2**20:.1f} MiB" if value >= 2**20 / 10 else f"{sign}{value / 2**10:.1f} KiB"


def _number(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value / scale:,.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(str(cell).rjust(width) for cell, width in zip(row, widths)) for row in (header, *rows)]


def format_report(report: PlanReport) -> str:
    """The plan as text: the layout and state per chip, then one row per bucket."""
    chip = report.chip
    state = report.state_bytes
    lines = [
        f"{report.target}: {report.chips} x {chip.name} ({chip.peak_flops / 1e12:.0f} TFLOP/s bf16, "
        f"{_size(chip.hbm_bytes)} HBM at {chip.hbm_bandwidth / 1e9:,.0f} GB/s per chip)",
        f"layout {report.overrides} (rules {report.rules}, mode {report.mode}), {report.parameters:,} parameters, "
        f"activations {report.dtype}",
        f"state per chip from the shardings: params {_size(state['params'])}, Adam moments "
        f"{_size(state['optimizer'])}, other {_size(state['other'])}",
        "",
    ]
    header = (
        "bucket", "fits", "arguments", "outputs", "temp", "needed", "HBM left",
        "GFLOP", "analytic", "GB accessed", "GB collectives", "est. step ms", "tokens/s", "MFU", "compile s",
    )  # fmt: skip
    rows = []
    for bucket in report.buckets:
        rows.append(
            (
                f"{bucket.rows}x{bucket.length}",
                "yes" if bucket.fits else "NO",
                _size(bucket.argument_bytes),
                _size(bucket.output_bytes),
                _size(bucket.temp_bytes),
                _size(bucket.needed_bytes),
                _size(bucket.headroom_bytes),
                _number(bucket.flops, 1e9),
                _number(bucket.analytic_flops, 1e9),
                _number(bucket.bytes_accessed, 1e9, 2),
                _number(None if bucket.collective_bytes is None else sum(bucket.collective_bytes.values()), 1e9, 3),
                _number(bucket.step_s, 1e-3, 2),
                _number(bucket.tokens_per_s, 1, 0),
                "-" if bucket.mfu is None else f"{bucket.mfu:.0%}",
                f"{bucket.compile_s:.0f}",
            )
        )
    lines += _table(header, rows)
    for bucket in report.buckets:
        if bucket.compiler_message:
            lines.append(f"{bucket.rows}x{bucket.length} does not fit: {bucket.compiler_message}")
        elif bucket.expected_argument_bytes not in (None, bucket.argument_bytes):
            lines.append(
                f"{bucket.rows}x{bucket.length}: the compiler's arguments ({bucket.argument_bytes:,} B) differ from "
                f"our shardings' ({bucket.expected_argument_bytes:,} B in the chip's tiles)"
            )
    lines += [
        "",
        "Per chip. bucket: rows x length of the global batch. needed: the larger of the compiler's peak and its "
        "arguments + outputs - donated + temp (a step that does not fit: what the compiler required). GFLOP: the "
        "compiler's count; analytic: 3 x the model's forward matmuls. GB collectives: what the step's all-reduces, "
        "all-gathers, reduce-scatters, all-to-alls and permutes produce on the chip (each kind in the JSON). est. "
        "step: max(FLOPs / peak FLOP/s, bytes / HBM bandwidth), rough (the collectives' time over the chips' links "
        "and the input not counted). tokens/s: padded positions per side (data.tokens_per_batch) per second.",
    ]
    if chip.platform == "cuda":
        lines.append(
            "On a GPU, JAX takes 75% of its memory at start by default: a step that needs more runs with "
            "XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 (or XLA_PYTHON_CLIENT_PREALLOCATE=false)."
        )
    return "\n".join(lines)


def format_search(reports: Sequence[PlanReport]) -> str:
    """The ranked layouts of `search`, then the overrides that give `train` each layout that fits."""
    if not reports:
        return "no mesh of this slice divides the model and the batch."
    first = reports[0]
    lines = [f"{first.target}: {first.chips} x {first.chip.name}, layouts ranked by estimated tokens/s", ""]
    header = (
        "rank", "data", "fsdp", "tensor", "micro-batch", "accum", "fits", "needed", "HBM left", "est. tokens/s", "MFU",
    )  # fmt: skip
    rows = []
    for rank, report in enumerate(reports, start=1):
        worst = max(report.buckets, key=lambda bucket: bucket.needed_bytes or 0)
        mfu = min((bucket.mfu for bucket in report.buckets if bucket.mfu is not None), default=None)
        rows.append(
            (
                str(rank),
                *(str(report.mesh[axis]) for axis in sharding.MESH_AXES),
                f"{report.tokens_per_batch:,}",
                str(report.accum_steps),
                "yes" if report.fits else "NO",
                _size(worst.needed_bytes),
                _size(worst.headroom_bytes),
                _number(report.tokens_per_s, 1, 0) if report.fits else "-",
                "-" if mfu is None or not report.fits else f"{mfu:.0%}",
            )
        )
    overrides = [f"{rank:>4}  {report.overrides}" for rank, report in enumerate(reports, start=1) if report.fits]
    lines += _table(header, rows) + ["", "micro-batch: data.tokens_per_batch; accum: train.accum_steps. For train:"]
    return "\n".join(lines + overrides)


def format_decode(plans: Sequence[DecodePlan]) -> str:
    """Beam-search plans on one chip, by batch, and the largest batch among them that fits."""
    first = plans[0]
    lines = [
        f"{first.target}: beam search on one {first.chip.name} ({_size(first.chip.hbm_bytes)} HBM): beam "
        f"{first.beam_size}, sources of {first.source_length} tokens, outputs up to {first.max_decode_len}, "
        f"activations {first.dtype}, parameters {_size(first.params_bytes)} (float32)",
        "",
    ]
    header = ("batch", "fits", "cache and beams", "program", "arguments", "temp", "needed", "HBM left", "compile s")
    rows = [
        (
            str(plan.batch),
            "yes" if plan.fits else "NO",
            _size(plan.carry_bytes),
            plan.program or "-",
            _size(None if plan.memory is None else plan.memory.argument_bytes),
            _size(None if plan.memory is None else plan.memory.temp_bytes),
            _size(plan.needed_bytes),
            _size(plan.headroom_bytes),
            f"{plan.compile_s:.0f}",
        )
        for plan in plans
    ]
    lines += _table(header, rows)
    fitting = [plan.batch for plan in plans if plan.fits]
    refused = [plan.batch for plan in plans if not plan.fits]
    if fitting:
        verdict = f"largest batch that fits: {max(fitting)} sentences"
        if refused:
            verdict += (
                f" ({min(refused)} does not: {next(p for p in plans if not p.fits).compiler_message or 'over HBM'})"
            )
    else:
        verdict = f"no batch planned fits; the smallest, {first.batch}, needs {_size(first.needed_bytes)}"
    lines += [
        "",
        verdict,
        "Per chip, the larger of the two programs translate runs (start; a segment with the whole batch and the cache "
        "at full length). cache and beams: what a segment continues from. program: the larger one's figures follow. "
        "needed: the larger of the compiler's peak and its allocations (not fitting: what the compiler required).",
    ]
    return "\n".join(lines)
