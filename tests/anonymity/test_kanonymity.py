import pandas as pd
import pytest

from _seed_tables import hospital_a
from dpkit.anonymity import anonymity_report, equivalence_classes, k_anonymity, l_diversity
from dpkit.errors import InvalidDataError, InvalidParameterError

# Textbook table 5.2 (hospital A, names removed, age and zip generalised)
TABLE_5_2 = hospital_a()


def test_textbook_table_5_2():
    assert k_anonymity(TABLE_5_2, ["age", "sex", "zip"]) == 2
    assert k_anonymity(TABLE_5_2, ["age", "zip"]) == 4
    assert l_diversity(TABLE_5_2, ["age", "sex", "zip"], "dx") == 2
    sizes = equivalence_classes(TABLE_5_2, ["age", "sex"])
    assert sizes.to_dict() == {("50-60", "F"): 2, ("50-60", "M"): 2, ("60-70", "F"): 2, ("60-70", "M"): 3}


def test_hand_made_k_and_l():
    t = pd.DataFrame({"a": [1, 1, 1, 2, 2], "b": ["x", "x", "x", "y", "y"], "s": ["p", "p", "q", "r", "r"]})
    assert k_anonymity(t, ["a", "b"]) == 2
    assert k_anonymity(t, ["a"]) == 2
    assert l_diversity(t, ["a"], "s") == 1  # class a=2 has only "r"
    r = anonymity_report(t, ["a"], sensitive="s", target_k=3)
    assert (r.k, r.l, r.n_classes, r.n_rows, r.rows_below_target) == (2, 1, 2, 5, 2)
    assert not r.meets_target
    with pytest.raises(AttributeError):
        r.k = 5  # frozen


def test_unique_rows_are_1_anonymous():
    t = pd.DataFrame({"a": range(10)})
    assert k_anonymity(t, ["a"]) == 1


@pytest.mark.parametrize(
    "call",
    [
        lambda: k_anonymity(TABLE_5_2, ["nope"]),
        lambda: k_anonymity(TABLE_5_2, []),
        lambda: k_anonymity(TABLE_5_2, "age"),
        lambda: l_diversity(TABLE_5_2, ["age"], "nope"),
        lambda: l_diversity(TABLE_5_2, ["age"], "age"),
        lambda: anonymity_report(TABLE_5_2, ["age"], target_k=0),
    ],
)
def test_bad_parameters(call):
    with pytest.raises(InvalidParameterError):
        call()


def test_bad_data():
    with pytest.raises(InvalidDataError):
        k_anonymity([[1, 2]], ["a"])
    with pytest.raises(InvalidDataError):
        k_anonymity(TABLE_5_2.iloc[:0], ["age"])
