"""What every sequence model shares: its config, the state interface and the reset convention."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch
from torch import nn

from pipeline.messages import brief

MODEL_NAMES = ("psrnn", "factorized_psrnn", "lstm", "gru", "rnn", "kf")
DECODER_INPUTS = ("top", "all")


@dataclass
class ModelConfig:
    """Shapes and options from which a model is built (and rebuilt from a checkpoint).

    ``input_dim`` is the vocabulary size (discrete) or the number of features (continuous); ``output_dim`` is the
    same size (logits or predicted observation). ``obs_dim`` is the encoder output d_o, ``state_dim`` the state d.
    """

    model: str
    discrete: bool
    input_dim: int
    output_dim: int
    state_dim: int = 20
    obs_dim: int = 20
    n_layers: int = 1
    rank: int | None = None
    n_rff: int = 2000
    init: str = "2sr"          # "2sr" or "random" (PSRNNs); baselines: "xavier"; kf: "2sr"
    bias_scale: float = 0.0
    decoder_input: str = "top"  # PSRNN: the decoder reads the top layer's state ("top") or every layer's ("all")
    delta: bool = False        # continuous, not kf: the decoder predicts the change, ô_{t+1} = o_t + decoder(q)

    def __post_init__(self) -> None:
        if self.model not in MODEL_NAMES:
            raise ValueError(f"model {brief(self.model)}: expected one of {MODEL_NAMES}")
        if self.decoder_input not in DECODER_INPUTS:
            raise ValueError(f"decoder_input {brief(self.decoder_input)}: expected one of {DECODER_INPUTS}")
        if self.decoder_input == "all" and self.model not in ("psrnn", "factorized_psrnn"):
            raise ValueError(f"decoder_input 'all' is a PSRNN option (layer skip connections); {self.model} has "
                             "one recurrent layer")
        if not isinstance(self.delta, bool):   # "false" would be truthy
            raise ValueError(f"delta {brief(self.delta)}: expected True or False")
        if self.delta and self.output_dim != self.input_dim:
            raise ValueError(f"delta: the change is added to the observation, so output_dim ({self.output_dim}) must "
                             f"equal input_dim ({self.input_dim})")
        if self.delta and (self.discrete or self.model == "kf"):
            raise ValueError("delta (predict the change o_{t+1} - o_t) is an option of continuous data and of the "
                             "PSRNN, RNN, GRU and LSTM models; " + ("the data are discrete" if self.discrete else
                                                                     "kf predicts through its observation model"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def apply_reset(state: torch.Tensor, init: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rows of ``state`` where ``mask`` is true become ``init`` (broadcast over the batch)."""
    m = mask.reshape(mask.shape[0], *([1] * (state.dim() - 1)))
    return torch.where(m, init.expand_as(state), state)


class SequenceModel(nn.Module):
    """Interface: ``outputs, state = model(x, state, reset)``.

    x is (L, B) int64 symbols or (L, B, m) floats; outputs (L, B, output_dim) are the logits / predictions of the
    *next* observation after consuming each input. ``reset[t, b]`` restarts element b at its initial state before
    step t (a new trajectory begins). ``state`` is a tuple of tensors with the batch in dimension 0.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config

    def init_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def emit(self, decoded: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The outputs from the decoder's ``decoded`` (L, B, m) and the inputs ``x`` (L, B, m): the prediction
        itself, or, with ``config.delta``, the predicted change added to the observation just consumed,
        ô_{t+1} = o_t + Δ̂_t (a residual output: the zero decoder is the last-value predictor)."""
        return decoded + x if self.config.delta else decoded

    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def detach_state(state: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Cut the graph between truncated-BPTT windows (the ``repackage_hidden`` of word_language_model)."""
    return tuple(s.detach() for s in state)
