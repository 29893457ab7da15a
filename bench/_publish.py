"""What every benchmark script does with its results: print them and append them to docs/benchmarks.md.

Each script measures the harness and its reference side by side in one run and renders a dated
Markdown section; :func:`publish` prints it and appends it (unless ``--no-append``), so the file is
the history of every run, in the order they ran.
"""

from __future__ import annotations

import argparse
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def add_publish_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--no-append", action="store_true", help="print only; do not append to docs/benchmarks.md"
    )


def publish(section: str, args: argparse.Namespace) -> None:
    """Print ``section`` and, unless ``args.no_append``, append it to docs/benchmarks.md."""
    text = section.strip("\n") + "\n"
    print(text)
    if not args.no_append:
        with BENCHMARKS.open("a", encoding="utf-8") as fh:
            fh.write("\n" + text)
        print(f"appended to {BENCHMARKS}")
