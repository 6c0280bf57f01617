"""Small synthetic example data for the demo, the examples and the docs — generated, never downloaded.

The generators are deterministic: each takes an explicit integer ``seed`` (with a fixed default)
and uses its own ``numpy.random.default_rng(seed)``. That randomness only *makes up data*; it is
never used to protect anything. Privacy noise always comes from the mechanisms' own ``rng``
(the CSPRNG unless a seeded generator is passed explicitly).

* :func:`cheating_survey` — the exam-cheating survey of randomized response (Warner 1965): ``n`` students with a
  sensitive yes/no answer, exactly ``round(n · true_rate)`` of them "yes", so the true rate is
  known exactly and estimates can be checked against it.
* :func:`people` — a table of ages and yearly incomes for counting and histogram queries
  (Dwork & Roth 2014, §3.3).
* :func:`census` — a census-like table in the shape of UCI Adult, with several rows (jobs) per
  person, for private analytics with a user-level privacy unit (``make demo``).
* :func:`hospital` — a hospital's tables (visits, prescriptions, and the public regions and
  wards), for queries over several tables (joins), with :data:`HOSPITAL_METADATA`.

>>> s = cheating_survey(n=1000, true_rate=0.3)
>>> s.n, int(s.answers.sum()), s.true_rate
(1000, 300, 0.3)
>>> t = people(n=500)
>>> t.n, bool(t.age.min() >= 18), bool(t.age.max() <= 90)
(500, True, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dpkit import _validate as v
from dpkit.errors import InvalidParameterError

__all__ = [
    "Survey",
    "People",
    "cheating_survey",
    "people",
    "census",
    "CENSUS_METADATA",
    "hospital",
    "HOSPITAL_METADATA",
    "AGE_MIN",
    "AGE_MAX",
    "DEFAULT_SEED",
]

#: The seed the demo and the examples use for their example data.
DEFAULT_SEED = 20240607
AGE_MIN = 18
AGE_MAX = 90


def _frozen(a: NDArray) -> NDArray:
    a.setflags(write=False)
    return a


def _seed(seed: object) -> int:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise InvalidParameterError("seed", seed, "an integer >= 0")
    return int(seed)


@dataclass(frozen=True, eq=False)
class Survey:
    """Answers to one sensitive yes/no question ("have you ever cheated in an exam?").

    Attributes:
        answers: int64 array of 0 (no) / 1 (yes), one per student — the private data.
        true_rate: the exact fraction of "yes" answers in ``answers``.
    """

    answers: NDArray[np.int64]
    true_rate: float

    @property
    def n(self) -> int:
        return int(self.answers.size)


@dataclass(frozen=True, eq=False)
class People:
    """A table of people: integer ``age`` in [18, 90] and yearly ``income`` (a float, > 0)."""

    age: NDArray[np.int64]
    income: NDArray[np.float64]

    @property
    def n(self) -> int:
        return int(self.age.size)


def cheating_survey(n: int = 10_000, true_rate: float = 0.3, *, seed: int = DEFAULT_SEED) -> Survey:
    """``n`` students of whom exactly ``round(n · true_rate)`` answer "yes", in random order."""
    n = v.positive_int(n, "n")
    rate = v.probability(true_rate, "true_rate", low_open=False, high_open=False)
    yes = round(n * rate)
    answers = np.zeros(n, dtype=np.int64)
    answers[:yes] = 1
    answers = np.random.default_rng(_seed(seed)).permutation(answers)
    return Survey(answers=_frozen(answers), true_rate=yes / n)


def people(n: int = 5_000, *, seed: int = DEFAULT_SEED) -> People:
    """``n`` adults: ages from a smooth, working-age-heavy distribution on [18, 90] and incomes
    from a log-normal whose median rises with age until about 50 (values in currency units)."""
    n = v.positive_int(n, "n")
    rng = np.random.default_rng(_seed(seed))
    ages = np.arange(AGE_MIN, AGE_MAX + 1)
    weight = np.exp(-(((ages - 42.0) / 22.0) ** 2))  # a broad hump around 40
    age = rng.choice(ages, size=n, p=weight / weight.sum()).astype(np.int64)
    median = 28_000.0 + 900.0 * np.minimum(age - AGE_MIN, 32)
    income = median * np.exp(rng.normal(0.0, 0.55, size=n))
    return People(age=_frozen(age), income=_frozen(np.round(income, 2)))


_EDUCATION = ("Preschool", "Primary", "Lower-secondary", "HS-grad", "Some-college", "Bachelors", "Masters", "Doctorate")
_EDU_WEIGHT = (0.01, 0.05, 0.09, 0.32, 0.23, 0.19, 0.09, 0.02)
_MARITAL = ("Never-married", "Married", "Divorced", "Separated", "Widowed")
_SECTOR = ("Private", "Public", "Self-employed", "Non-profit")

#: The curator's metadata for :func:`census` (bounds and public category lists), as the JSON
#: ``dpkit query --metadata`` reads.
CENSUS_METADATA: dict = {
    "privacy_unit": "person_id",
    "max_groups": 2,
    "max_rows": 2,
    "columns": {
        "age": {"type": "numeric", "lower": AGE_MIN, "upper": AGE_MAX},
        "hours_per_week": {"type": "numeric", "lower": 1, "upper": 80},
        "income": {"type": "numeric", "lower": 0, "upper": 250_000},
        "sex": {"type": "categorical", "categories": ["Female", "Male"]},
        "education": {"type": "categorical", "categories": list(_EDUCATION)},
        "marital_status": {"type": "categorical", "categories": list(_MARITAL)},
        "sector": {"type": "categorical", "categories": list(_SECTOR)},
    },
}


def census(people: int = 20_000, *, seed: int = DEFAULT_SEED):
    """A census-like pandas DataFrame: one row per (person, job), 1–3 jobs per person.

    Columns: ``person_id`` (the privacy unit), ``age``, ``sex``, ``education``,
    ``marital_status`` (per person), ``sector``, ``hours_per_week`` and yearly ``income`` (per
    job). Ages follow a working-age hump on [18, 90]; education shifts income up; hours and
    incomes are drawn per job, so a person's rows differ. Generated, not sampled from anyone.

    >>> t = census(people=1000)
    >>> t["person_id"].nunique(), bool(t.groupby("person_id").size().max() <= 3)
    (1000, True)
    """
    import pandas as pd

    n = v.positive_int(people, "people")
    rng = np.random.default_rng(_seed(seed))
    ages = np.arange(AGE_MIN, AGE_MAX + 1)
    weight = np.exp(-(((ages - 40.0) / 17.0) ** 2))
    age = rng.choice(ages, size=n, p=weight / weight.sum())
    sex = rng.choice(np.array(["Female", "Male"]), size=n, p=[0.48, 0.52])
    edu_idx = rng.choice(len(_EDUCATION), size=n, p=np.array(_EDU_WEIGHT) / sum(_EDU_WEIGHT))
    married_p = np.clip((age - 18) / 40.0, 0.05, 0.65)
    u = rng.random(n)
    marital = np.where(
        u < married_p, 1, np.where(age < 30, 0, rng.choice([0, 2, 3, 4], size=n, p=[0.4, 0.35, 0.1, 0.15]))
    )
    jobs = rng.choice([1, 2, 3], size=n, p=[0.7, 0.22, 0.08])
    pid = np.repeat(np.arange(1, n + 1), jobs)
    m = pid.size
    person = pid - 1
    hours = np.clip(np.round(rng.normal(40.0 / np.sqrt(jobs[person]), 9.0)), 1, 80)
    base = 18_000.0 + 6_000.0 * edu_idx[person] + 700.0 * np.minimum(age[person] - AGE_MIN, 30)
    income = np.round(base * (hours / 40.0) * np.exp(rng.normal(0.0, 0.45, size=m)), 0)
    return pd.DataFrame(
        {
            "person_id": pid,
            "age": age[person],
            "sex": sex[person],
            "education": np.array(_EDUCATION)[edu_idx[person]],
            "marital_status": np.array(_MARITAL)[marital[person]],
            "sector": rng.choice(np.array(_SECTOR), size=m, p=[0.7, 0.15, 0.1, 0.05]),
            "hours_per_week": hours.astype(np.int64),
            "income": income,
        }
    )


# ---- A hospital's tables, for queries over several tables (joins) --------------------------------

#: Wards and the diagnoses treated there (the diagnoses of the textbook's hospital tables, §5.1).
#: ``paediatrics`` treats none of this adult hospital's patients: an empty group of the key table.
_WARDS: dict[str, tuple[str, ...]] = {
    "cardiology": ("heart disease",),
    "endocrinology": ("diabetes",),
    "gastroenterology": ("Crohn's disease", "ulcerative gastritis", "cirrhosis"),
    "infectious diseases": ("HIV",),
    "oncology": ("lung cancer", "pancreatic cancer"),
    "paediatrics": (),
    "respiratory": ("allergic rhinitis",),
    "rheumatology": ("arthritis", "lupus", "Sjögren's syndrome", "gout"),
}
#: The drugs prescribed for each ward's diagnoses, with their usual daily doses in mg.
_DRUGS: dict[str, tuple[tuple[str, tuple[float, ...]], ...]] = {
    "cardiology": (("atorvastatin", (20, 40, 80)), ("bisoprolol", (5, 10))),
    "endocrinology": (("metformin", (500, 850, 1000)), ("insulin glargine", (10, 20, 30))),
    "gastroenterology": (("mesalazine", (400, 800)), ("omeprazole", (20, 40))),
    "infectious diseases": (("tenofovir", (245,)), ("dolutegravir", (50,))),
    "oncology": (("cisplatin", (50, 75, 100)), ("ondansetron", (8, 16))),
    "respiratory": (("cetirizine", (10,)), ("fluticasone", (0.1, 0.2))),
    "rheumatology": (("methotrexate", (7.5, 15)), ("ibuprofen", (400, 600, 800))),
}
#: Typical cost of a visit per ward (the median of a log-normal, in currency units).
_VISIT_COST = {
    "cardiology": 900.0,
    "endocrinology": 300.0,
    "gastroenterology": 700.0,
    "infectious diseases": 500.0,
    "oncology": 2200.0,
    "respiratory": 250.0,
    "rheumatology": 400.0,
}
#: The districts of the city and their postcodes; nobody in the data lives in ``Harbour`` yet.
_REGIONS = {
    "Centre": range(190101, 190111),
    "North": range(190111, 190121),
    "East": range(190121, 190131),
    "South": range(190131, 190141),
    "West": range(190141, 190151),
    "Harbour": range(190151, 190156),
}
#: Postcodes of patients from out of town (not in the regions table: a LEFT JOIN keeps their rows).
_AWAY = ("200031", "310002", "510640")

#: The curator's metadata for :func:`hospital`, as :meth:`DatasetMetadata.from_dict
#: <dpkit.analytics.DatasetMetadata.from_dict>` (and ``dpkit query --metadata``) reads it: two
#: private tables of one patient, two public tables, and the dataset's contribution bounds.
HOSPITAL_METADATA: dict = {
    "max_groups": 1,
    "max_rows": 10,
    "tables": {
        "visits": {
            "privacy_unit": "patient_id",
            "join_rows": 4,
            "columns": {
                "age": {"type": "numeric", "lower": AGE_MIN, "upper": AGE_MAX},
                "sex": {"type": "categorical", "categories": ["F", "M"]},
                "postcode": {"type": "categorical"},
                "ward": {"type": "categorical"},
                "diagnosis": {"type": "categorical"},
                "cost": {"type": "numeric", "lower": 0, "upper": 5000},
            },
        },
        "prescriptions": {
            "privacy_unit": "patient_id",
            "join_rows": 2,
            "columns": {"drug": {"type": "categorical"}, "dose": {"type": "numeric", "lower": 0, "upper": 1000}},
        },
        "regions": {
            "public": True,
            "max_matches": 1,
            "columns": {"postcode": {"type": "categorical"}, "region": {"type": "categorical"}},
        },
        "wards": {"public": True, "max_matches": 1, "columns": {"ward": {"type": "categorical"}}},
    },
}


def hospital(patients: int = 2_000, *, seed: int = DEFAULT_SEED) -> dict:
    """A hospital's tables as pandas DataFrames, by name: ``visits`` and ``prescriptions``
    (private: rows of patients, ``patient_id`` the privacy unit), ``regions`` and ``wards``
    (public: a postcode → district list and the hospital's wards).

    * ``visits``: 1–6 per patient — ``patient_id``, ``age``, ``sex``, ``postcode`` (the
      patient's: one of the city's 190101–190150, or for about 4 % of patients one from out of
      town that ``regions`` does not list), ``ward``, ``diagnosis`` (mostly the patient's own,
      now and then another) and ``cost``;
    * ``prescriptions``: 0–4 per patient — ``patient_id``, ``drug`` (one for the patient's main
      ward) and daily ``dose`` in mg;
    * ``regions``: one row per postcode (so ``max_matches`` is 1) — ``postcode``, ``region``;
      the ``Harbour`` district has no patients;
    * ``wards``: one row per ward — ``ward``; ``paediatrics`` has no visits.

    Generated, not sampled from anyone; the textbook's tables (§5.1) lent the diagnoses and the
    postcodes' shape.

    >>> t = hospital(patients=500)
    >>> sorted(t), t["visits"]["patient_id"].nunique()
    (['prescriptions', 'regions', 'visits', 'wards'], 500)
    >>> t["regions"]["postcode"].is_unique, bool(t["visits"]["ward"].isin(t["wards"]["ward"]).all())
    (True, True)
    """
    import pandas as pd

    n = v.positive_int(patients, "patients")
    rng = np.random.default_rng(_seed(seed))
    pid = np.arange(1, n + 1)
    ages = np.arange(AGE_MIN, AGE_MAX + 1)
    weight = np.exp(-(((ages - 62.0) / 18.0) ** 2))  # a hospital's patients are older
    age = rng.choice(ages, size=n, p=weight / weight.sum())
    sex = rng.choice(np.array(["F", "M"]), size=n)
    codes = np.arange(190101, 190151)
    near = np.exp(-(codes - 190101) / 30.0)  # denser near the centre
    postcode = rng.choice(codes, size=n, p=near / near.sum()).astype(str).astype(object)
    away = rng.random(n) < 0.04  # visitors from out of town: postcodes the regions table lacks
    postcode[away] = rng.choice(np.array(_AWAY), size=int(away.sum()))
    diagnoses = np.array([d for ds in _WARDS.values() for d in ds])
    ward_of = {d: w for w, ds in _WARDS.items() for d in ds}
    main = rng.integers(0, diagnoses.size, size=n)
    # visits: a patient's own diagnosis mostly, another one now and then
    visits = rng.choice(np.arange(1, 7), size=n, p=[0.35, 0.25, 0.17, 0.11, 0.07, 0.05])
    vp = np.repeat(np.arange(n), visits)
    other = rng.integers(0, diagnoses.size, size=vp.size)
    dx = diagnoses[np.where(rng.random(vp.size) < 0.85, main[vp], other)]
    ward = np.array([ward_of[d] for d in dx])
    median = np.array([_VISIT_COST[w] for w in ward])
    cost = np.round(median * np.exp(rng.normal(0.0, 0.6, size=vp.size)), 2)
    # prescriptions: drugs of the patient's main ward
    count = rng.choice(np.arange(0, 5), size=n, p=[0.25, 0.35, 0.2, 0.12, 0.08])
    pp = np.repeat(np.arange(n), count)
    drugs, doses = [], []
    for i in pp:
        options = _DRUGS[ward_of[diagnoses[main[i]]]]
        drug, usual = options[rng.integers(len(options))]
        drugs.append(drug)
        doses.append(float(usual[rng.integers(len(usual))]))
    return {
        "visits": pd.DataFrame(
            {
                "patient_id": pid[vp],
                "age": age[vp],
                "sex": sex[vp],
                "postcode": postcode[vp],
                "ward": ward,
                "diagnosis": dx,
                "cost": cost,
            }
        ),
        "prescriptions": pd.DataFrame(
            {"patient_id": pid[pp], "drug": np.array(drugs, dtype=object), "dose": np.array(doses)}
        ),
        "regions": pd.DataFrame(
            [(str(code), region) for region, codes_ in _REGIONS.items() for code in codes_],
            columns=["postcode", "region"],
        ),
        "wards": pd.DataFrame({"ward": list(_WARDS)}),
    }


# ---- UCI Adult: the public schema, for encoding the file where it is available ------------------

#: Numeric columns of UCI Adult with their census domains (from ``adult.names``: declared, not measured).
ADULT_NUMERIC: dict[str, tuple[float, float]] = {
    "age": (17, 90),
    "fnlwgt": (0, 1_500_000),
    "education-num": (1, 16),
    "capital-gain": (0, 99_999),
    "capital-loss": (0, 4_356),
    "hours-per-week": (1, 99),
}
#: Categorical columns of UCI Adult with their public category lists (``adult.names``).
ADULT_CATEGORICAL: dict[str, tuple[str, ...]] = {
    name: tuple(c.strip() for c in cats.split(","))
    for name, cats in {
        "workclass": "Private, Self-emp-not-inc, Self-emp-inc, Federal-gov, Local-gov, State-gov, Without-pay, Never-worked",
        "marital-status": "Married-civ-spouse, Divorced, Never-married, Separated, Widowed, Married-spouse-absent, Married-AF-spouse",
        "occupation": "Tech-support, Craft-repair, Other-service, Sales, Exec-managerial, Prof-specialty, Handlers-cleaners, "
        "Machine-op-inspct, Adm-clerical, Farming-fishing, Transport-moving, Priv-house-serv, Protective-serv, Armed-Forces",
        "relationship": "Wife, Own-child, Husband, Not-in-family, Other-relative, Unmarried",
        "race": "White, Asian-Pac-Islander, Amer-Indian-Eskimo, Other, Black",
        "sex": "Female, Male",
        "native-country": "United-States, Cambodia, England, Puerto-Rico, Canada, Germany, Outlying-US(Guam-USVI-etc), India, "
        "Japan, Greece, South, China, Cuba, Iran, Honduras, Philippines, Italy, Poland, Jamaica, Vietnam, Mexico, Portugal, "
        "Ireland, France, Dominican-Republic, Laos, Ecuador, Taiwan, Haiti, Columbia, Hungary, Guatemala, Nicaragua, Scotland, "
        "Thailand, Yugoslavia, El-Salvador, Trinadad&Tobago, Peru, Hong, Holand-Netherlands",
    }.items()
}
#: ‖x‖₂ bound of :func:`adult_features` rows: each numeric column is in [0, 1] and each one-hot
#: group adds at most 1 to ‖x‖².
ADULT_DATA_NORM = float(np.sqrt(len(ADULT_NUMERIC) + len(ADULT_CATEGORICAL)))


def adult_features(path) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Features and 0/1 labels (income > 50K) from a UCI Adult file (``adult.data`` or
    ``adult.test``, header line first), encoded from the public schema only: numeric columns
    scaled by their declared domains and clipped to [0, 1], categoricals one-hot over their
    declared lists (missing '?' and unknown values: all zeros). Rows have ‖x‖₂ <= ADULT_DATA_NORM."""
    import pandas as pd

    frame = pd.read_csv(path, skipinitialspace=True, dtype=str, encoding="latin-1", on_bad_lines="skip")
    blocks = []
    for name, (lo, hi) in ADULT_NUMERIC.items():
        values = pd.to_numeric(frame[name], errors="coerce").fillna(lo).to_numpy(dtype=np.float64)
        blocks.append(np.clip((values - lo) / (hi - lo), 0.0, 1.0)[:, None])
    for name, cats in ADULT_CATEGORICAL.items():
        index = {c: i for i, c in enumerate(cats)}
        # -1: missing or unknown (pandas deprecates values outside a Categorical's categories)
        codes = frame[name].str.strip().map(index).fillna(-1).to_numpy(dtype=np.int64)
        onehot = np.zeros((len(frame), len(cats)))
        rows = np.flatnonzero(codes >= 0)
        onehot[rows, codes[rows]] = 1.0
        blocks.append(onehot)
    y = (frame["Y"].str.strip().str.rstrip(".") == ">50K").to_numpy(dtype=np.int64)
    return np.hstack(blocks), y
