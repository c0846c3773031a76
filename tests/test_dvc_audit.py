"""dvc.yaml as DVC runs it, on a tiny synthetic project in tmp_path (seconds): a stage reruns when what it reads
changes, and not otherwise. tests/test_pipeline_e2e.py runs the whole pipeline; this runs the spectral stages of
one synthetic dataset, one seed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import copy_project
from pipeline.config import dump_yaml, read_yaml

ROOT = Path(__file__).resolve().parents[1]
COPY = ["pipeline", "stages", "dvc.yaml", ".gitignore", ".dvcignore", ".dvc/config", ".dvc/.gitignore"]


def _dvc(args: list[str], cwd: Path, env: dict[str, str]) -> set[str]:
    proc = subprocess.run(["dvc", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"dvc {' '.join(args)} failed:\n{out[-4000:]}"
    return set(re.findall(r"Running stage '([^']+)'", out))


def _set(root: Path, section: str, key: str, value) -> None:
    params = read_yaml((root / "params.yaml").read_text())
    params["lgssm"][section][key] = value
    (root / "params.yaml").write_text(dump_yaml(params, flow_leaves=True))


@pytest.fixture
def project(tmp_path):
    if shutil.which("dvc") is None:
        pytest.skip("dvc is not installed")
    root = tmp_path / "project"
    copy_project(root, COPY)
    params = read_yaml((ROOT / "tests" / "fixtures" / "tiny_params.yaml").read_text())
    params.update(seeds=[0], datasets=["lgssm"])
    (root / "params.yaml").write_text(dump_yaml(params, flow_leaves=True))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    env.update(PYTHONPATH=str(root), DVC_NO_ANALYTICS="1", PYTHONDONTWRITEBYTECODE="1")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root, env


def test_decompose_reruns_for_the_layer_one_2sr_only(project):
    """decompose reads the depth-1 2SR (2sr/L1.npz) and the ranks: a `kf` param, which changes only the Kalman
    filter's 2sr/kf.npz, reruns two_stage and not decompose; a 2SR param reruns both."""
    root, env = project
    target = "decompose@lgssm-0"
    assert _dvc(["repro", target], root, env) == {"synthesize@lgssm", "features@lgssm-0", "two_stage@lgssm-0",
                                                  target}
    assert _dvc(["repro", target], root, env) == set()
    _set(root, "kf", "ridge", 0.002)
    assert _dvc(["repro", target], root, env) == {"two_stage@lgssm-0"}
    _set(root, "two_stage", "ridge", 0.02)
    assert {"two_stage@lgssm-0", target} <= _dvc(["repro", target], root, env)
