"""The module that :meth:`pipeline.tracking.RunTracker.log_model` logs with ``mlflow.pytorch``: a trained model with
the data units it was trained in, so that MLflow's pyfunc flavour (the UI's snippet,
``mlflow.pyfunc.load_model(uri).predict(frame)``) gives predictions in the user's units.

MLflow's pytorch pyfunc turns the frame into a float32 array and calls ``module(tensor)``, expecting one tensor
back; the pipeline's models take ``(x, state)`` in model units (standardised features, vocabulary indices) and give
``(outputs, state)``. :class:`ServedModel` answers both calls:

* ``served(x, state[, reset])``: the wrapped model's own call, unchanged (``served.model`` is the model;
  ``init_state`` and ``config`` are its own), as ``mlflow.pytorch.load_model`` users call it.
* ``served(x)``, what pyfunc calls: ONE trajectory, rows the time steps in order, filtered from the initial state;
  returns its one-step predictions (row t predicts o_{t+1}) as :meth:`pipeline.inference.TrainedRun.predict` gives
  them, which does the work. Continuous data: the columns are the training features in order, in their original
  units, and so are the predictions. Discrete data: one column ``symbol_index``, each step's symbol as its index in
  the run's vocabulary (``served.units["vocab"]``; pyfunc passes numbers only), and the output's column j is the
  probability that the next symbol is ``vocab[j]``.

Nothing here is part of a run's fingerprint: the logged weights are the trained model's, the wrapper only reads
and writes its data."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: the pyfunc input column of a discrete run: each step's symbol as its index in the run's vocabulary
SYMBOL_INDEX = "symbol_index"


class ServedModel(torch.nn.Module):
    """A trained :class:`pipeline.models.SequenceModel` (``model``) with the units of its data (``units``: a run's
    ``data_units.json``, :func:`pipeline.workflow.refine.units_to_keep` with ``dataset``, ``variant``, ``seed`` and
    ``epoch``)."""

    def __init__(self, model: torch.nn.Module, units: dict[str, Any]) -> None:
        super().__init__()
        if units.get("kind") not in ("continuous", "discrete"):
            raise ValueError(f"units of kind {units.get('kind')!r}; expected 'continuous' or 'discrete'")
        self.model = model
        self.units = dict(units)   # plain lists and numbers, pickled with the module

    @property
    def config(self) -> Any:
        return self.model.config

    def init_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return self.model.init_state(batch_size)

    @property
    def discrete(self) -> bool:
        return self.units["kind"] == "discrete"

    def input_columns(self) -> list[str]:
        """The pyfunc input's columns, in order."""
        return [SYMBOL_INDEX] if self.discrete else [str(f) for f in self.units["features"]]

    def signature(self) -> Any:
        """The MLflow model signature of the pyfunc call: the input columns (double features, or the long
        ``symbol_index``; pyfunc refuses other types, e.g. integer features: ``astype(float)``); the output's columns, named
        ``predicted_<feature>`` (continuous) or, for discrete data, one tensor of next-symbol probabilities
        (steps x vocabulary size, in the order of ``units["vocab"]``). pyfunc checks the input's column names
        against it; the output frame's columns are numbered 0, 1, ... in that order."""
        from mlflow.models import ModelSignature
        from mlflow.types import ColSpec, Schema, TensorSpec

        inputs = Schema([ColSpec("long" if self.discrete else "double", name) for name in self.input_columns()])
        if self.discrete:
            outputs = Schema([TensorSpec(np.dtype(np.float64), (-1, len(self.units["vocab"])), "probabilities")])
        else:
            outputs = Schema([ColSpec("double", f"predicted_{name}") for name in self.input_columns()])
        return ModelSignature(inputs=inputs, outputs=outputs)

    def trained_run(self) -> Any:
        """The model as a :class:`pipeline.inference.TrainedRun`, which reads and writes data in these units."""
        from pipeline.inference import TrainedRun

        u = self.units
        return TrainedRun.from_units(self.model, u, dataset=str(u.get("dataset", "")), variant=str(u.get("variant", "")),
                                     seed=int(u.get("seed", -1)), epoch=int(u.get("epoch", -1)))

    def forward(self, x: torch.Tensor, state: Any = None, reset: torch.Tensor | None = None) -> Any:
        if state is not None:   # the model's own call, in model units
            return self.model(x, state, reset)
        if reset is not None:
            raise ValueError("reset without a state; expected served(x, state, reset) (the model's call) or served(x) "
                             "(one trajectory in the data's units)")
        return self.predict_trajectory(x)

    def predict_trajectory(self, x: torch.Tensor) -> torch.Tensor:
        """One trajectory (T rows, the :meth:`input_columns`) in the data's units -> its one-step predictions
        (float64, on the CPU): (T, features) in the data's units, or (T, vocabulary size) probabilities."""
        values = x.detach().cpu().numpy().astype(np.float64) if isinstance(x, torch.Tensor) \
            else np.asarray(x, dtype=np.float64)
        columns = self.input_columns()
        if values.ndim != 2 or values.shape[1] != len(columns) or len(values) == 0:
            raise ValueError(f"input of shape {values.shape}; expected one trajectory, one row per time step and the "
                             f"columns {columns} (served(x, state) is the model's own call)")
        if self.discrete:
            vocab = self.units["vocab"]
            codes = values[:, 0]
            bad = ~((codes >= 0) & (codes < len(vocab)) & (codes == np.round(codes)))
            if bad.any():
                t = int(np.argmax(bad))
                raise ValueError(f"{SYMBOL_INDEX} is {codes[t]:g} at row {t}; expected the index of a symbol in the "
                                 f"run's vocabulary, an integer 0 to {len(vocab) - 1} (vocab in data_units.json)")
            trajectory: Any = np.asarray(vocab, dtype=object)[codes.astype(np.int64)]
        else:
            trajectory = values
        device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
        try:
            (out,) = self.trained_run().predict([trajectory], device=str(device))
        except ValueError as exc:   # "trajectories[0]: ...": there is only the one
            message = str(exc)
            raise ValueError(message.removeprefix("trajectories[0]: ")) from None
        return torch.from_numpy(np.ascontiguousarray(out))
