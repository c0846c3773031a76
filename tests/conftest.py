"""Fixtures shared by the test modules, and where the raw-data mirror is (``from conftest import MIRROR``)."""

import os
import shutil
from pathlib import Path

import pytest

from pipeline.config import read_yaml

ROOT = Path(__file__).resolve().parents[1]
#: the raw-data mirror, as the download stage finds it: $PSRNN_DATA_MIRROR, else ../shared/data beside the project
#: (tests that need a data set skip when its folder is absent)
MIRROR = Path(os.environ.get("PSRNN_DATA_MIRROR") or ROOT.parent / "shared" / "data")


#: what a copy of the project needs to run its stages under DVC (no tests, data or outputs)
PROJECT_FILES = ("pipeline", "stages", "dvc.yaml", "pyproject.toml", ".gitignore", ".dvcignore", ".dvc/config",
                 ".dvc/.gitignore")


def copy_project(root: Path, items=PROJECT_FILES) -> Path:
    """Copy ``items`` of the project (folders without ``__pycache__``; a missing one skipped) into ``root``."""
    for item in items:
        src, dst = ROOT / item, root / item
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, dst)
    return root


@pytest.fixture(scope="session")
def defaults():
    """The project's params.yaml as loaded, once per session: deep-copy it before changing anything."""
    return read_yaml((ROOT / "params.yaml").read_text())


@pytest.fixture
def float64():
    """torch's default dtype float64 for the test (for exact comparisons), restored after it."""
    import torch   # here, not at the top: the data and params tests do not import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
