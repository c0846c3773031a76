"""Fixtures shared by the test modules."""

from pathlib import Path

import pytest

from pipeline.config import read_yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def defaults():
    """The project's params.yaml as loaded, once per session: deep-copy it before changing anything."""
    return read_yaml((ROOT / "params.yaml").read_text())
