"""Stage ``report``: PNG figures, results.md and summary.json from the outputs of evaluate and refine (see
pipeline.report)."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Params


def report(params: Params, root: Path) -> dict[str, list[str]]:
    from pipeline.report import write_report

    return write_report(root, root / "reports", figures=params.report.get("figures"), datasets=params.selected)
