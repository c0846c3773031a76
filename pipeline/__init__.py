"""psrnn-pipeline: Predictive State Recurrent Neural Networks (Downey et al., NeurIPS 2017).

The library is importable without DVC or MLflow; ``import pipeline`` imports neither (nor torch).
See ``pipeline.api`` for the short fit/predict interface.
"""

__version__ = "0.1.0"
