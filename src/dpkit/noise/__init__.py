"""Secure, exact, vectorised noise: the layer every guarantee rests on."""

from dpkit.noise.integers import bernoulli, uniform_below
from dpkit.noise.source import RandomSource, SecureSource, SeededSource, resolve_rng

__all__ = [
    "RandomSource",
    "SecureSource",
    "SeededSource",
    "resolve_rng",
    "uniform_below",
    "bernoulli",
]
