"""``harness analysis gpu-frag``: H2D copy throughput into contiguous vs fragmented GPU memory."""

from __future__ import annotations

from typing import Annotated

import typer

from harness.analysis.cli_common import JSON_HELP, console, echo_json, pct
from harness.common.console import table


def gpu_frag(
    *,
    size_mb: Annotated[int, typer.Option("--size-mb", help="Bytes copied per transfer, MiB.")] = 256,
    cycles: Annotated[int, typer.Option("--cycles", help="Alloc/free rounds (16 tensors each).")] = 2000,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed copies per scenario.")] = 5,
    device: Annotated[str, typer.Option("--device", help="CUDA device.")] = "cuda",
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """H2D copy throughput into contiguous vs fragmented GPU memory (CUDA only; exit 5 without)."""
    from harness.analysis.gpu_frag import run_fragmentation

    report = run_fragmentation(size_mb=size_mb, cycles=cycles, repeats=repeats, device=device)
    if as_json:
        echo_json(report.model_dump())
        return
    rows = [
        (
            r.scenario,
            f"{r.pieces:,}",
            f"{r.seconds * 1000:.2f}",
            f"{r.gb_per_s:.2f}",
            f"{r.vs_contiguous:.2f}×",
        )
        for r in report.rows
    ]
    columns = ("scenario", "pieces", "ms", "GB/s", "vs contiguous")
    title = f"GPU fragmentation — {report.device}, {size_mb} MiB transfers"
    console.print(table(title, columns, rows, left={"scenario"}))
    console.print(
        f"allocator after fragmenting: reserved {report.reserved_bytes / 2**20:.0f} MiB, "
        f"allocated {report.allocated_bytes / 2**20:.0f} MiB, "
        f"inactive split {report.inactive_split_bytes / 2**20:.0f} MiB ({pct(report.fragmentation)})",
        highlight=False,
    )
