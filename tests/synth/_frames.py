"""The small correlated table the synthesizer tests fit: sex, age (30 or 60 by sex) and city
(a or b for F, b or c for M), so a model that keeps the pairs is told from one that does not."""

from __future__ import annotations

import numpy as np
import pandas as pd


def correlated_frame(n: int = 4_000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    sex = rng.choice(["F", "M"], n)
    city = np.where(sex == "F", rng.choice(["a", "b"], n), rng.choice(["b", "c"], n))
    return pd.DataFrame({"sex": sex, "age": np.where(sex == "F", 30.0, 60.0) + rng.normal(0, 4, n), "city": city})
