"""Tables of the source texts' worked examples that more than one test reads."""

from __future__ import annotations

import pandas as pd


def hospital_a() -> pd.DataFrame:
    """Textbook table 5.2: hospital A's release, names removed, age and ZIP code generalised
    (2-anonymous on age, sex and ZIP; the linkage attack's target). A fresh frame per call."""
    return pd.DataFrame(
        {
            "age": ["60-70"] * 5 + ["50-60"] * 4,
            "sex": ["M", "F", "M", "F", "M", "F", "M", "M", "F"],
            "zip": ["1901**"] * 9,
            "dx": [
                "heart disease",
                "arthritis",
                "lung cancer",
                "Crohn's disease",
                "lung cancer",
                "HIV",
                "diabetes",
                "allergic rhinitis",
                "gastritis",
            ],
        }
    )
