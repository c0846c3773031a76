"""Fixtures shared by the test modules, and where the raw-data mirror is (``from conftest import MIRROR``)."""

import os
import re
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


# ----------------------------------------------------------------------- the Python API's tests (pipeline.api)

#: the arguments of a fit_model call that takes well under a second
SMALL = dict(state_dim=3, obs_dim=3, n_features=32, horizon=1, epochs=1, lr=0.1, device="cpu")


def refused(message, call, *args, **kwargs):
    """``call`` raises a ValueError whose whole message is ``message``."""
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        call(*args, **kwargs)


@pytest.fixture(scope="module")
def symbols():
    """A small discrete dataset: a 3-state HMM over 4 symbols, 6 train and 2 test sequences of 40."""
    from pipeline.data.synthetic import make_hmm_dataset

    return make_hmm_dataset(n_states=3, n_symbols=4, n_train=6, n_test=2, length=40, seed=0)[0]


@pytest.fixture(scope="module")
def features():
    """A small continuous dataset: a 2-d linear-Gaussian system, 6 train and 2 test trajectories of 40."""
    from pipeline.data.synthetic import make_lgssm_dataset

    return make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=6, n_test=2, length=40, seed=0)[0]


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if fit_model gets as far as 2SR or training: the checks must come first."""
    import pipeline.api
    import pipeline.train

    def ran(*args, **kwargs):
        raise AssertionError("2SR or training ran before the input was refused")

    for name in ("multilayer_two_stage", "linear_two_stage", "cp_decompose"):
        monkeypatch.setattr(pipeline.api, name, ran)
    monkeypatch.setattr(pipeline.train, "fit", ran)


@pytest.fixture
def figures(monkeypatch):
    """The figures ``pipeline.report.write_report`` saves, by file name (still written to disk)."""
    import pipeline.report as report

    saved = {}
    real = report._save

    def save(fig, path):
        saved[Path(path).name] = fig
        real(fig, path)

    monkeypatch.setattr(report, "_save", save)
    return saved
