"""GPU memory fragmentation and host-to-device copy throughput (CUDA only).

A long-running inference server allocates and frees KV blocks, activations and temporary buffers
of every size; PyTorch's caching allocator keeps the freed blocks and splits them, so after a
while free memory is scattered over many small holes. A large transfer (a weight reload, a KV
swap-in, a warmup prefill) then either lands in many small pieces or forces the allocator to
reserve a new segment. This measures both against a clean contiguous destination:

1. **contiguous**: one ``size_mb`` tensor on a clean allocator; pinned host → device copies;
2. fragment the allocator: ``cycles`` rounds of allocating small tensors of random sizes
   (``small_kb`` range) and freeing a random half of them, leaving the survivors in place;
3. **fragmented**: the same bytes copied into small tensors allocated now (they land in the holes),
   one copy per piece, as a transfer into a fragmented region would be;
4. **contiguous after fragmentation**: one ``size_mb`` tensor allocated on the fragmented
   allocator (timed including the allocation) and filled with one copy.

Each copy is timed with CUDA events, median of ``repeats``; the allocator's reserved, allocated and
inactive-split bytes show how fragmented it was. Without CUDA it raises :class:`UnavailableError`.
"""

from __future__ import annotations

import random
import time
from typing import Any

from harness.common.errors import UnavailableError
from harness.common.model import StrictModel
from harness.common.stats import percentile


class FragRow(StrictModel):
    """One line of the table."""

    scenario: str
    bytes: int
    pieces: int
    seconds: float
    """Median copy time (allocation included where the scenario says so)."""
    gb_per_s: float
    vs_contiguous: float
    """Throughput ÷ the clean contiguous copy's."""


class FragReport(StrictModel):
    device: str
    size_mb: int
    cycles: int
    small_kb: tuple[int, int]
    reserved_bytes: int
    allocated_bytes: int
    inactive_split_bytes: int
    """Free bytes inside split segments: the allocator's own measure of fragmentation."""
    fragmentation: float
    """``inactive_split / reserved`` after fragmenting."""
    rows: list[FragRow]


def _timed_copy(torch: Any, dsts: list[Any], src: Any, repeats: int) -> float:
    """Median seconds of copying ``src`` (pinned, 1-D uint8) into the pieces ``dsts`` in order."""
    times: list[float] = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        off = 0
        for d in dsts:
            n = d.numel()
            d.copy_(src[off : off + n], non_blocking=True)
            off += n
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    return percentile(times, 50)


def run_fragmentation(
    *,
    size_mb: int = 256,
    cycles: int = 2000,
    small_kb: tuple[int, int] = (4, 1024),
    repeats: int = 5,
    device: str = "cuda",
    seed: int = 0,
) -> FragReport:
    """The four scenarios above on ``device``; needs CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise UnavailableError("GPU fragmentation needs CUDA; this machine has none", field="device")
    dev = torch.device(device)
    torch.cuda.set_device(dev)
    torch.cuda.empty_cache()
    rng = random.Random(seed)
    size = size_mb * 1024 * 1024
    src = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    src.fill_(7)

    # 1. a clean contiguous destination
    dst = torch.empty(size, dtype=torch.uint8, device=dev)
    _timed_copy(torch, [dst], src, 1)  # first touch
    base_s = _timed_copy(torch, [dst], src, repeats)
    del dst
    torch.cuda.empty_cache()

    # 2. fragment: allocate small tensors, free a random half, keep the rest
    survivors: list[Any] = []
    lo, hi = small_kb
    for _ in range(cycles):
        batch = [torch.empty(rng.randint(lo, hi) * 1024, dtype=torch.uint8, device=dev) for _ in range(16)]
        rng.shuffle(batch)
        survivors.extend(batch[:8])
        del batch
    stats = torch.cuda.memory_stats(dev)
    reserved = int(stats.get("reserved_bytes.all.current", 0))
    allocated = int(stats.get("allocated_bytes.all.current", 0))
    inactive = int(stats.get("inactive_split_bytes.all.current", 0))

    # 3. the same bytes into pieces that land in the holes
    pieces: list[Any] = []
    left = size
    while left > 0:
        n = min(left, rng.randint(lo, hi) * 1024)
        pieces.append(torch.empty(n, dtype=torch.uint8, device=dev))
        left -= n
    _timed_copy(torch, pieces, src, 1)
    frag_s = _timed_copy(torch, pieces, src, repeats)
    n_pieces = len(pieces)
    del pieces

    # 4. one large tensor on the fragmented allocator, allocation included
    alloc_times: list[float] = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        big = torch.empty(size, dtype=torch.uint8, device=dev)
        big.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        alloc_times.append(time.perf_counter() - t0)
        del big
    after_s = percentile(alloc_times, 50)
    del survivors
    torch.cuda.empty_cache()

    def row(name: str, seconds: float, n_pieces: int) -> FragRow:
        gbps = size / seconds / 1e9 if seconds > 0 else float("inf")
        base = size / base_s / 1e9 if base_s > 0 else float("inf")
        return FragRow(
            scenario=name,
            bytes=size,
            pieces=n_pieces,
            seconds=seconds,
            gb_per_s=gbps,
            vs_contiguous=gbps / base,
        )

    rows = [
        row("contiguous (clean allocator)", base_s, 1),
        row("fragmented (pieces in the holes)", frag_s, n_pieces),
        row("contiguous after fragmentation (alloc + copy)", after_s, 1),
    ]
    return FragReport(
        device=torch.cuda.get_device_name(dev),
        size_mb=size_mb,
        cycles=cycles,
        small_kb=small_kb,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        inactive_split_bytes=inactive,
        fragmentation=inactive / reserved if reserved else 0.0,
        rows=rows,
    )
