"""Calibrated, immutable mechanisms: each has ``.release()``, ``.event`` and accuracy helpers."""

from dpkit.mechanisms import sensitivity
from dpkit.mechanisms.gaussian import Gaussian, GaussianNoisePlan
from dpkit.mechanisms.laplace import Geometric, Laplace, LaplaceNoisePlan
from dpkit.mechanisms.mean import BoundedMean, MeanRelease
from dpkit.mechanisms.randomized_response import ForcedResponse, FrequencyEstimate, RandomizedResponse
from dpkit.mechanisms.selection import Exponential, ReportNoisyMax

__all__ = [
    "sensitivity",
    "Laplace",
    "LaplaceNoisePlan",
    "Geometric",
    "Gaussian",
    "GaussianNoisePlan",
    "RandomizedResponse",
    "ForcedResponse",
    "FrequencyEstimate",
    "Exponential",
    "ReportNoisyMax",
    "BoundedMean",
    "MeanRelease",
]
