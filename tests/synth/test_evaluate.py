"""dpkit.synth.evaluate: marginal distances checked against hand counts and a pandas reference,
and train-on-synthetic accuracy on toy problems.

Deterministic: every random table comes from a fixed seed. The two accuracy tests that could fail
by chance state their false-failure rate for a fresh seed (below 1e-6 each)."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from dpkit.errors import InvalidParameterError
from dpkit.synth.evaluate import marginal_tvd, tstr_accuracy


def _table(n: int, seed: int, columns: int = 5, levels: int = 4) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({f"c{j}": rng.integers(0, levels, n).astype(str) for j in range(columns)})


def _reference(real: pd.DataFrame, synthetic: pd.DataFrame, way: int) -> float:
    """The same distance the slow way: pandas value counts per column set."""
    out = []
    for group in combinations(real.columns, way):
        p = real.value_counts(list(group), normalize=True, dropna=False)
        q = synthetic.value_counts(list(group), normalize=True, dropna=False)
        p, q = p.align(q, fill_value=0.0)
        out.append(0.5 * float((p - q).abs().sum()))
    return float(np.mean(out))


# -- marginal_tvd ---------------------------------------------------------------------------------


@pytest.mark.parametrize("way", [1, 2, 3])
def test_identical_tables_are_at_distance_zero(way: int) -> None:
    t = _table(500, seed=1)
    assert marginal_tvd(t, t, way=way) == 0.0
    # the same rows in another order, and twice over: the same distribution
    shuffled = t.sample(frac=1.0, random_state=2)
    assert marginal_tvd(t, pd.concat([shuffled, shuffled]), way=way) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("way", [1, 2])
def test_disjoint_tables_are_at_distance_one(way: int) -> None:
    a = pd.DataFrame({"x": ["a", "b", "a"], "y": [1, 2, 3]})
    b = pd.DataFrame({"x": ["c", "d"], "y": [4, 5]})
    assert marginal_tvd(a, b, way=way) == 1.0


def test_a_small_case_by_hand() -> None:
    real = pd.DataFrame({"x": ["a", "a", "b", "b"], "y": ["u", "v", "u", "v"], "z": ["s", "s", "s", "t"]})
    synthetic = pd.DataFrame({"x": ["a", "b"], "y": ["u", "u"], "z": ["s", "t"]})
    # one-way: x 0, y ½·(½ + ½) = ½, z ½·(¼ + ¼) = ¼
    assert marginal_tvd(real, synthetic, way=1) == pytest.approx((0 + 0.5 + 0.25) / 3)
    # two-way: (x, y) ½·(¼+¼+¼+¼) = ½; (x, z) real {as: ½, bs: ¼, bt: ¼} vs {as: ½, bt: ½} → ¼;
    # (y, z) real {us: ½, vs: ¼, vt: ¼} vs {us: ½, ut: ½} → ½·(0 + ¼ + ¼ + ½) = ½
    assert marginal_tvd(real, synthetic, way=2) == pytest.approx((0.5 + 0.25 + 0.5) / 3)
    assert marginal_tvd(real, synthetic, way=2, columns=["x", "z"]) == pytest.approx(0.25)


@pytest.mark.parametrize("way", [1, 2, 3])
def test_agrees_with_a_pandas_reference(way: int) -> None:
    real, synthetic = _table(2_000, seed=3), _table(1_500, seed=4, levels=5)
    real.loc[::7, "c1"] = None  # missing values: a cell of their own
    synthetic.loc[::5, "c1"] = np.nan
    assert marginal_tvd(real, synthetic, way=way) == pytest.approx(_reference(real, synthetic, way), abs=1e-12)


def test_large_marginals_are_compacted_not_allocated() -> None:
    """Three columns of 3,000 distinct values: 2.7·10¹⁰ joint cells, counted over the ones that occur."""
    rng = np.random.default_rng(5)
    real = pd.DataFrame({c: rng.integers(0, 3_000, 4_000) for c in "abc"})
    synthetic = pd.DataFrame({c: rng.integers(0, 3_000, 3_000) for c in "abc"})
    synthetic.iloc[:1_000] = real.iloc[:1_000].to_numpy()
    assert marginal_tvd(real, synthetic, way=3) == pytest.approx(_reference(real, synthetic, 3), abs=1e-12)


def test_sampled_marginals_are_reproducible_with_a_seed() -> None:
    real, synthetic = _table(1_000, seed=6, columns=8), _table(1_000, seed=7, columns=8)
    first = marginal_tvd(real, synthetic, way=3, max_marginals=10, rng=np.random.default_rng(0))
    again = marginal_tvd(real, synthetic, way=3, max_marginals=10, rng=np.random.default_rng(0))
    seed_int = marginal_tvd(real, synthetic, way=3, max_marginals=10, rng=0)
    other = marginal_tvd(real, synthetic, way=3, max_marginals=10, rng=np.random.default_rng(1))
    assert first == again == seed_int
    assert other != first  # 10 of 56 triples: another seed draws another sample (checked for these seeds)
    # the sample is exactly the triples the generator picks, averaged
    sets = list(combinations(real.columns, 3))
    picked = np.sort(np.random.default_rng(0).choice(len(sets), size=10, replace=False))
    by_hand = np.mean([marginal_tvd(real, synthetic, way=3, columns=list(sets[i])) for i in picked])
    assert first == pytest.approx(by_hand, abs=1e-12)


def test_asking_for_more_marginals_than_exist_takes_them_all() -> None:
    real, synthetic = _table(300, seed=8), _table(300, seed=9)
    assert marginal_tvd(real, synthetic, way=2, max_marginals=10) == marginal_tvd(real, synthetic, way=2)
    assert marginal_tvd(real, synthetic, way=2, max_marginals=1_000) == marginal_tvd(real, synthetic, way=2)


def test_bin_edges_clip_to_the_edge_bins_and_keep_missing_apart() -> None:
    edges = [0, 10, 20]
    # bins [0, 10), [10, 20]: below 0 -> first, above 20 -> last, an edge opens the upper bin
    real = pd.DataFrame({"v": [-5.0, 0.0, 9.999, 10.0, 20.0, 25.0, np.nan, None]})
    same = pd.DataFrame({"v": [1.0, 2.0, 3.0, 11.0, 12.0, 13.0, np.nan, np.nan]})
    assert marginal_tvd(real, same, way=1, bins={"v": edges}) == 0.0
    # the missing cell is not a bin: moving the two missing rows into a bin costs 2/8
    filled = pd.DataFrame({"v": [1.0, 2.0, 3.0, 11.0, 12.0, 13.0, 14.0, 15.0]})
    assert marginal_tvd(real, filled, way=1, bins={"v": edges}) == pytest.approx(0.25)
    # without edges the exact values are compared: nothing in common but the missing rows
    assert marginal_tvd(real, same, way=1) == pytest.approx(0.75)
    # a text that is not a number counts as missing in a binned column
    text = pd.DataFrame({"v": ["1", "2", "3", "11", "12", "13", "n/a", "?"]})
    assert marginal_tvd(real, text, way=1, bins={"v": edges}) == 0.0


def test_bins_work_inside_higher_way_marginals() -> None:
    real = pd.DataFrame({"age": [18, 25, 33, 47, 52, 61], "sex": ["F", "M", "F", "M", "F", "M"]})
    synthetic = pd.DataFrame({"age": [19.5, 29.9, 30.0, 40.0, 59.0, 65.0], "sex": ["F", "M", "F", "M", "F", "M"]})
    edges = {"age": [17, 30, 50, 90]}
    assert marginal_tvd(real, synthetic, way=2, bins=edges) == 0.0
    assert marginal_tvd(real, synthetic, way=2) == 1.0  # exact ages: nothing in common


def test_the_common_columns_by_default() -> None:
    real = pd.DataFrame({"a": ["x", "y"], "b": ["u", "u"], "only_real": [1, 2]})
    synthetic = pd.DataFrame({"b": ["u", "u"], "a": ["y", "y"], "only_synthetic": [3, 4]})
    assert marginal_tvd(real, synthetic, way=1) == pytest.approx((0.5 + 0.0) / 2)
    assert marginal_tvd(real, synthetic, way=2) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"way": 0}, "way"),
        ({"way": 4}, "way"),
        ({"way": True}, "way"),
        ({"way": 1.0}, "way"),
        ({"columns": ["a", "nope"]}, "columns"),
        ({"columns": "a"}, "columns"),
        ({"columns": ["a", "a"]}, "columns"),
        ({"columns": []}, "columns"),
        ({"bins": {"nope": [0, 1]}}, "bins.nope"),
        ({"bins": {"a": [1, 1]}}, "bins.a"),
        ({"bins": {"a": [0]}}, "bins.a"),
        ({"bins": {"a": [0, float("inf")]}}, "bins.a"),
        ({"bins": {"a": ["low", "high"]}}, "bins.a"),
        ({"bins": [0, 1]}, "bins"),
        ({"max_marginals": 0}, "max_marginals"),
        ({"max_marginals": 2.5}, "max_marginals"),
    ],
)
def test_bad_parameters_are_refused_by_name(kwargs: dict, name: str) -> None:
    t = pd.DataFrame({"a": [1, 2], "b": ["x", "y"], "c": ["u", "v"]})
    with pytest.raises(InvalidParameterError) as info:
        marginal_tvd(t, t, **kwargs)
    assert info.value.name == name
    assert "must be" in str(info.value)


def test_bad_tables_are_refused_by_name() -> None:
    t = pd.DataFrame({"a": [1, 2]})
    for real, synthetic, name in (
        (t.iloc[:0], t, "real"),
        (t, t.iloc[:0], "synthetic"),
        ({"a": [1, 2]}, t, "real"),
        (t, t.to_numpy(), "synthetic"),
        (t, pd.DataFrame({"b": [1]}), "columns"),  # no column in common
    ):
        with pytest.raises(InvalidParameterError) as info:
            marginal_tvd(real, synthetic)
        assert info.value.name == name


# -- tstr_accuracy --------------------------------------------------------------------------------


def _separable(n: int, seed: int) -> pd.DataFrame:
    """income is "high" exactly for the two upper education levels, or for more than 45 hours;
    a third column is pure noise."""
    rng = np.random.default_rng(seed)
    education = rng.choice(["primary", "secondary", "bachelor", "master"], n)
    hours = rng.integers(10, 80, n).astype(float)
    noise = rng.choice(["red", "green", "blue"], n)
    high = np.isin(education, ["bachelor", "master"]) | (hours > 45)
    return pd.DataFrame(
        {"education": education, "hours": hours, "colour": noise, "income": np.where(high, "high", "low")}
    )


def test_tstr_learns_a_separable_problem() -> None:
    pytest.importorskip("sklearn")
    train, test = _separable(2_000, seed=10), _separable(2_000, seed=11)
    # hours binned at the rule's threshold: the classes are separable in the one-hot features
    accuracy = tstr_accuracy(train, test, target="income", bins={"hours": [0, 45.5, 100]})
    assert accuracy > 0.99
    # Without the bins, the hours are one-hot by value: still separable (each value seen in training)
    assert tstr_accuracy(train, test, target="income") > 0.9


def test_tstr_on_shuffled_labels_is_a_coin_flip() -> None:
    """Labels shuffled in training carry no information: the predictions are independent of the
    test labels. With 4,000 test rows whose classes are balanced, the accuracy has sd <= 0.008;
    a fresh seed lands outside 0.5 ± 0.05 with probability below 1e-9 (the seed is fixed anyway)."""
    pytest.importorskip("sklearn")
    rng = np.random.default_rng(12)
    train, test = _separable(4_000, seed=13), _separable(4_000, seed=14)
    train["income"] = rng.permutation(train["income"].to_numpy())
    # balance the test classes so that any constant or random predictor scores 0.5
    high, low = test[test.income == "high"], test[test.income == "low"]
    k = min(len(high), len(low))
    test = pd.concat([high.iloc[:k], low.iloc[:k]])
    accuracy = tstr_accuracy(train, test, target="income", bins={"hours": [0, 45.5, 100]})
    assert abs(accuracy - 0.5) < 0.05


def test_tstr_with_one_label_predicts_it() -> None:
    pytest.importorskip("sklearn")
    test = _separable(1_000, seed=15)
    train = test.assign(income="low")
    assert tstr_accuracy(train, test, target="income") == pytest.approx(float(np.mean(test.income == "low")))


def test_tstr_features_and_one_hot_over_both_tables() -> None:
    pytest.importorskip("sklearn")
    train = pd.DataFrame({"a": ["x", "y"] * 20, "b": ["p"] * 40, "label": [0, 1] * 20})
    # a category the training table never saw ("z"), and a feature the model must ignore
    test = pd.DataFrame({"a": ["x", "y", "z", "x"], "b": ["q", "q", "q", "q"], "label": [0, 1, 0, 0]})
    assert tstr_accuracy(train, test, target="label", features=["a"]) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"target": "nope"}, "target"),
        ({"target": "label", "features": ["a", "nope"]}, "features"),
        ({"target": "label", "features": ["a", "label"]}, "features"),
        ({"target": "label", "features": []}, "features"),
        ({"target": "label", "bins": {"a": [3, 2]}}, "bins.a"),
    ],
)
def test_tstr_bad_parameters_are_refused_by_name(kwargs: dict, name: str) -> None:
    pytest.importorskip("sklearn")
    t = pd.DataFrame({"a": [1, 2], "label": ["x", "y"]})
    with pytest.raises(InvalidParameterError) as info:
        tstr_accuracy(t, t, **kwargs)
    assert info.value.name == name


def test_tstr_refuses_a_table_with_only_the_target() -> None:
    pytest.importorskip("sklearn")
    t = pd.DataFrame({"label": ["x", "y"]})
    with pytest.raises(InvalidParameterError) as info:
        tstr_accuracy(t, t, target="label")
    assert info.value.name == "features"
    with pytest.raises(InvalidParameterError) as info:
        tstr_accuracy(t.iloc[:0], t, target="label")
    assert info.value.name == "synthetic"
