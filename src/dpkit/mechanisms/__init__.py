"""Calibrated, immutable mechanisms: each has ``.release()``, ``.event`` and accuracy helpers."""

from dpkit.mechanisms import local_sensitivity, sensitivity
from dpkit.mechanisms.candidate_quantile import CandidateQuantile
from dpkit.mechanisms.gaussian import Gaussian, GaussianNoisePlan
from dpkit.mechanisms.laplace import Geometric, Laplace, LaplaceNoisePlan
from dpkit.mechanisms.mean import BoundedMean, MeanRelease
from dpkit.mechanisms.ptr import ProposeTestRelease, PTRMean, PTRMedian, PTRResult
from dpkit.mechanisms.quantiles import Median, Quantile, Quantiles
from dpkit.mechanisms.randomized_response import ForcedResponse, FrequencyEstimate, RandomizedResponse
from dpkit.mechanisms.sample_aggregate import SampleAndAggregate
from dpkit.mechanisms.selection import Exponential, ReportNoisyMax
from dpkit.mechanisms.smooth_sensitivity import (
    SmoothSensitivityMedian,
    smooth_sensitivity_median,
    smooth_sensitivity_order_statistic,
)
from dpkit.mechanisms.sparse_vector import AboveThreshold, NumericSparse, Sparse
from dpkit.mechanisms.svt_applications import (
    SVTMeanResult,
    choose_clipping_bound,
    range_queries_above_threshold,
    svt_private_mean,
)

__all__ = [
    "sensitivity",
    "local_sensitivity",
    "ProposeTestRelease",
    "PTRMean",
    "PTRMedian",
    "PTRResult",
    "Quantile",
    "CandidateQuantile",
    "Median",
    "Quantiles",
    "SampleAndAggregate",
    "SmoothSensitivityMedian",
    "smooth_sensitivity_median",
    "smooth_sensitivity_order_statistic",
    "AboveThreshold",
    "Sparse",
    "NumericSparse",
    "SVTMeanResult",
    "choose_clipping_bound",
    "svt_private_mean",
    "range_queries_above_threshold",
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
