"""Write examples/custom_series.parquet: the example of a user's own dataset (README, "Adding your own dataset").

A damped pendulum, θ'' = -(g/l) sin θ - c θ', integrated by RK4 at 0.05 s from random starts and observed with
noise: 25 trajectories ("swing-00" ...) of 120 steps, columns ``trajectory``, ``step``, ``angle`` (rad) and
``angular_velocity`` (rad/s), no ``split`` column (the custom section's ``test_fraction`` draws the test set).
Deterministic (numpy seed 0); run it again to rewrite the same file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

N_TRAJECTORIES, LENGTH, DT = 25, 120, 0.05
G_OVER_L, DAMPING, NOISE = 9.81 / 0.8, 0.15, 0.01


def _derivative(state: np.ndarray) -> np.ndarray:
    theta, omega = state
    return np.array([omega, -G_OVER_L * np.sin(theta) - DAMPING * omega])


def pendulum(rng: np.random.Generator) -> np.ndarray:
    state = np.array([rng.uniform(-2.5, 2.5), rng.uniform(-2.0, 2.0)])
    out = np.empty((LENGTH, 2))
    for t in range(LENGTH):
        out[t] = state
        k1 = _derivative(state)
        k2 = _derivative(state + DT / 2 * k1)
        k3 = _derivative(state + DT / 2 * k2)
        k4 = _derivative(state + DT * k3)
        state = state + DT / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return out + rng.normal(0.0, NOISE, out.shape)


def main(path: Path = Path(__file__).with_suffix(".parquet")) -> Path:
    rng = np.random.default_rng(0)
    series = [pendulum(rng) for _ in range(N_TRAJECTORIES)]
    table = pa.table({
        "trajectory": [f"swing-{i:02d}" for i in range(N_TRAJECTORIES) for _ in range(LENGTH)],
        "step": np.tile(np.arange(LENGTH, dtype=np.int64), N_TRAJECTORIES),
        "angle": np.concatenate([s[:, 0] for s in series]),
        "angular_velocity": np.concatenate([s[:, 1] for s in series]),
    })
    pq.write_table(table, path)
    return path


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Deterministic: the same file every time.")
    parser.add_argument("output", nargs="?", type=Path, default=Path(__file__).with_suffix(".parquet"),
                        help="the Parquet file to write (default: examples/custom_series.parquet beside this script)")
    print(main(parser.parse_args().output))
