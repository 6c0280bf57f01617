import pandas as pd
import pytest

from _seed_tables import hospital_a
from dpkit.anonymity import generalise, k_anonymity
from dpkit.attacks import linkage_attack
from dpkit.errors import InvalidParameterError

# Textbook tables 5.2 (hospital A) and 5.3 (hospital B), generalised releases
HOSPITAL_A = hospital_a()
HOSPITAL_B = pd.DataFrame(
    {
        "age": ["50-60"] * 3 + ["60-70"] * 3,
        "sex": ["F"] * 3 + ["M"] * 3,
        "zip": ["1901**"] * 6,
        "dx": ["HIV", "lupus", "Sjogren's syndrome", "pancreatic cancer", "cirrhosis", "gout"],
    }
)
QI = ["age", "sex", "zip"]


@pytest.mark.parametrize("match", ["overlap", "equality"])
def test_textbook_story_classes(match):
    assert k_anonymity(HOSPITAL_A, QI) == 2 and k_anonymity(HOSPITAL_B, QI) == 3
    res = linkage_attack(HOSPITAL_A, HOSPITAL_B, QI, "dx", match=match)
    pinned = res.pinned
    assert len(pinned) == 1
    row = pinned.iloc[0]
    assert (row["age"], row["sex"], row["value"]) == ("50-60", "F", "HIV")
    assert (row["rows_a"], row["rows_b"]) == (2, 3)
    assert res.fraction_reidentified == pytest.approx(2 / 9)


def test_textbook_story_known_person():
    # Zhao Lina: 56, female, zip 190103, known to have visited both hospitals
    known = pd.DataFrame(
        {"name": ["Zhao Lina", "Li Guoqiang"], "age": [56, 64], "sex": ["F", "M"], "zip": ["190103", "190146"]}
    )
    res = linkage_attack(HOSPITAL_A, HOSPITAL_B, QI, "dx", known=known, identifier="name")
    m = res.matches.set_index("name")
    assert m.loc["Zhao Lina", "value"] == "HIV"
    assert m.loc["Zhao Lina", "candidates"] == ("HIV",)
    # Li Guoqiang's classes share no diagnosis: nothing pinned (and candidates empty)
    assert m.loc["Li Guoqiang", "value"] is None
    assert res.fraction_reidentified == 0.5


def test_no_overlap_no_pin():
    b = HOSPITAL_B.assign(dx=["x", "y", "z", "u", "v", "w"])
    res = linkage_attack(HOSPITAL_A, b, QI, "dx")
    assert res.pinned.empty and res.fraction_reidentified == 0.0


def test_overlap_of_mondrian_ranges():
    a = pd.DataFrame({"age": ["[20-30]", "[20-30]", "[31-40]", "[31-40]"], "dx": list("abcd")})
    b = pd.DataFrame({"age": ["[25-35]", "[25-35]"], "dx": ["a", "z"]})
    over = linkage_attack(a, b, ["age"], "dx")
    assert over.pinned["age"].tolist() == ["[20-30]"]
    eq = linkage_attack(a, b, ["age"], "dx", match="equality")
    assert eq.pinned.empty


def test_two_mondrian_releases_leak():
    # the same population released twice with different k: intersections pin values
    import numpy as np

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"age": rng.integers(20, 70, 400), "dx": rng.choice(list("abcdefgh"), 400)})
    a, _ = generalise(df, ["age"], 5)
    b, _ = generalise(df, ["age"], 7)
    res = linkage_attack(a, b, ["age"], "dx")
    assert len(res.matches) == a.groupby("age").ngroups
    assert 0.0 <= res.fraction_reidentified <= 1.0


def test_bad_input():
    with pytest.raises(InvalidParameterError):
        linkage_attack(HOSPITAL_A, HOSPITAL_B, ["nope"], "dx")
    with pytest.raises(InvalidParameterError):
        linkage_attack(HOSPITAL_A, HOSPITAL_B, [], "dx")
    with pytest.raises(InvalidParameterError):
        linkage_attack(HOSPITAL_A, HOSPITAL_B, QI, "dx", match="fuzzy")
    with pytest.raises(InvalidParameterError):
        linkage_attack(HOSPITAL_A, HOSPITAL_B, QI, "age")
