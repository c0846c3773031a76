"""Sequence models: PSRNN / factorized PSRNN, the RNN, GRU and LSTM baselines, and the Kalman filter."""

from pipeline.models.common import MODEL_NAMES, ModelConfig, SequenceModel, detach_state
from pipeline.models.psrnn import PSRNN, FactorizedPSRNNLayer, PSRNNLayer
from pipeline.models.baselines import RecurrentBaseline
from pipeline.models.kalman import KalmanFilter


def build_model(config: ModelConfig) -> SequenceModel:
    """An uninitialised model of the right shapes (parameters are then set by an init or a checkpoint)."""
    if config.model in ("psrnn", "factorized_psrnn"):
        return PSRNN(config)
    if config.model == "kf":
        return KalmanFilter(config)
    return RecurrentBaseline(config)


__all__ = ["MODEL_NAMES", "ModelConfig", "SequenceModel", "detach_state", "PSRNN", "PSRNNLayer",
           "FactorizedPSRNNLayer", "RecurrentBaseline", "KalmanFilter", "build_model"]
