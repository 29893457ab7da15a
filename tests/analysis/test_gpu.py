"""GPU fragmentation: measured on CUDA (marked ``gpu``), a clear exit 5 without it."""

from __future__ import annotations

import pytest
import torch

from harness.analysis.gpu_frag import run_fragmentation
from harness.cli import main
from harness.common.errors import UnavailableError


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; this machine has none")
def test_fragmentation_table_on_cuda() -> None:
    report = run_fragmentation(size_mb=64, cycles=200, repeats=3)
    names = [r.scenario for r in report.rows]
    assert names[0].startswith("contiguous (clean") and len(names) == 3
    base, frag, _ = report.rows
    assert base.vs_contiguous == pytest.approx(1.0) and base.pieces == 1
    assert frag.pieces > 1 and all(r.gb_per_s > 0 for r in report.rows)
    assert report.reserved_bytes >= report.allocated_bytes > 0
    assert 0.0 <= report.fragmentation <= 1.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_without_cuda_it_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UnavailableError, match="needs CUDA"):
        run_fragmentation()
    with pytest.raises(SystemExit) as exc:
        main(["analysis", "gpu-frag"])
    assert exc.value.code == 5
    assert "needs CUDA" in capsys.readouterr().err
