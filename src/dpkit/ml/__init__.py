"""Private machine learning with scikit-learn-style estimators (fit, predict, score).

* :class:`KMeans` — DP Lloyd's algorithm: the textbook's Laplace version and a Gaussian/zCDP
  default with private initialisation.
* :class:`LogisticRegression`, :class:`LinearRegression` — noisy (mini-batch) gradient descent
  with clipping, Poisson subsampling and RDP/PLD accounting (Abadi et al. 2016).
* :class:`BoundsScaler` — features mapped from their declared bounds onto [-1, 1], so that a
  ``data_norm`` of √d holds for every row (no data read, no budget spent).
"""

from dpkit.ml.kmeans import KMeans
from dpkit.ml.linear import LinearRegression
from dpkit.ml.logistic import LogisticRegression
from dpkit.ml.scaling import BoundsScaler

__all__ = ["BoundsScaler", "KMeans", "LogisticRegression", "LinearRegression"]
