"""Differentially private synthetic data (``pip install 'dpkit[analytics]'``).

Release a whole table once — noisy marginals measured in DuckDB, a model that agrees with them,
rows sampled from the model — then analyse the rows freely: everything done with them is
post-processing. See :class:`Synthesizer` and the guide's "Synthetic data" page.
"""

from __future__ import annotations

from dpkit.synth.domain import Column, Domain
from dpkit.synth.evaluate import marginal_tvd, tstr_accuracy
from dpkit.synth.report import Measurement, SynthReport
from dpkit.synth.synthesizer import Synthesizer

__all__ = ["Column", "Domain", "Measurement", "SynthReport", "Synthesizer", "marginal_tvd", "tstr_accuracy"]
