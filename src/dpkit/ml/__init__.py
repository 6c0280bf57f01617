"""Private machine learning with scikit-learn-style estimators (fit, predict, score).

* :class:`KMeans` — DP Lloyd's algorithm: the textbook's Laplace version and a Gaussian/zCDP
  default with private initialisation.
"""

from dpkit.ml.kmeans import KMeans

__all__ = ["KMeans"]
