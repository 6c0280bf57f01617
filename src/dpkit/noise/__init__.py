"""Secure, exact, vectorised noise: the layer every guarantee rests on."""

from dpkit.noise.bernoulli_exp import bernoulli_exp
from dpkit.noise.discrete import discrete_gaussian, discrete_laplace
from dpkit.noise.integers import bernoulli, uniform_below
from dpkit.noise.source import RandomSource, SecureSource, SeededSource, resolve_rng

__all__ = [
    "RandomSource",
    "SecureSource",
    "SeededSource",
    "resolve_rng",
    "uniform_below",
    "bernoulli",
    "bernoulli_exp",
    "discrete_laplace",
    "discrete_gaussian",
]
