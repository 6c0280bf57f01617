"""How a QueryResult is shown: the whole table in text and HTML, and a chart of its intervals."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer

import dpkit as dp
from dpkit.analytics import Categorical, Count, Mean, Metadata, Numeric, QuantileAgg
from dpkit.errors import InvalidParameterError

KEYS = tuple(f"k{i:02d}" for i in range(29)) + ("<b>x</b>",)


def frame() -> pd.DataFrame:
    rng = np.random.default_rng(1)
    n = 600
    return pd.DataFrame({"cat": rng.choice(np.array(KEYS), n), "age": rng.integers(18, 90, n)})


META = Metadata(columns={"cat": Categorical(KEYS), "age": Numeric(0, 100)})


def session() -> dp.Session:
    return dp.Session(
        frame(), budget=dp.Budget(epsilon=10.0), metadata=META, row_level=True, rng=np.random.default_rng(0)
    )


@pytest.fixture
def grouped() -> dp.analytics.QueryResult:
    return session().group_by("cat").aggregate([Count(), Mean("age")], epsilon=2.0)


def test_str_shows_every_group_whatever_pandas_display_options(grouped) -> None:  # type: ignore[no-untyped-def]
    with pd.option_context("display.max_rows", 5, "display.max_columns", 2, "display.width", 40):
        text = str(grouped)
    assert len(grouped.table) == len(KEYS)
    for key in KEYS:
        assert key in text
    assert "..." not in text
    for col in ("count", "count_low", "count_high", "mean_age", "mean_age_low", "mean_age_high"):
        assert col in text
    # Everything repr shows is kept.
    assert repr(grouped).splitlines()[:2] == text.splitlines()[:2]
    assert "privacy unit: a row" in text and "SEEDED" in text and "ε=2" in text
    assert "mean_age: mean(age)" in text


def test_repr_html_is_the_whole_escaped_table(grouped) -> None:  # type: ignore[no-untyped-def]
    with pd.option_context("display.max_rows", 5):
        page = grouped._repr_html_()
    assert "<table" in page and "<script" not in page.lower()
    for key in KEYS[:-1]:
        assert key in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert "SEEDED" in page and "privacy unit" in page


def _intervals(ax) -> list[tuple[float, float, float]]:  # type: ignore[no-untyped-def]
    (container,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    segments = container.lines[2][0].get_segments()
    return [(float(s[0][0]), float(min(s[0][1], s[1][1])), float(max(s[0][1], s[1][1]))) for s in segments]


@pytest.mark.parametrize("aggregate", [None, "mean_age"])
def test_plot_draws_a_bar_per_group_with_the_released_intervals(grouped, aggregate) -> None:  # type: ignore[no-untyped-def]
    ax = grouped.plot(aggregate=aggregate)
    try:
        name = aggregate or "count"
        (bars,) = [c for c in ax.containers if isinstance(c, BarContainer)]
        assert len(bars.patches) == len(KEYS)
        np.testing.assert_allclose([p.get_height() for p in bars.patches], grouped.table[name])
        got = _intervals(ax)
        assert [x for x, _, _ in got] == list(range(len(KEYS)))
        np.testing.assert_allclose([lo for _, lo, _ in got], grouped.table[f"{name}_low"])
        np.testing.assert_allclose([hi for _, _, hi in got], grouped.table[f"{name}_high"])
        assert [t.get_text() for t in ax.get_xticklabels()] == list(grouped.table["cat"])
        assert name in ax.get_title() and "ε=2" in ax.get_title() and "0.95" in ax.get_title()
    finally:
        plt.close(ax.figure)


def test_plot_without_group_by_and_without_interval() -> None:
    s = session()
    single = s.aggregate([Count(), QuantileAgg("age", 0.5)], epsilon=1.0)
    fig, ax = plt.subplots()
    try:
        assert single.plot(ax=ax) is ax
        (bars,) = [c for c in ax.containers if isinstance(c, BarContainer)]
        assert len(bars.patches) == 1
        ((x, lo, hi),) = _intervals(ax)
        assert (lo, hi) == pytest.approx((single.table["count_low"][0], single.table["count_high"][0]))
        ax.clear()
        single.plot(ax=ax, aggregate=single.aggregates[1].name)  # a quantile: no interval, no error bar
        assert not [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert len(ax.patches) == 1
    finally:
        plt.close(fig)


def test_plot_unknown_aggregate_names_the_parameter(grouped) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match="aggregate") as info:
        grouped.plot(aggregate="median")
    assert info.value.name == "aggregate" and "count" in str(info.value) and "mean_age" in str(info.value)


def _outside(fig, texts) -> list[str]:  # type: ignore[no-untyped-def]
    """The texts drawn (partly) outside the figure, as last saved."""
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    out = []
    for t in texts:
        if not t.get_text():
            continue
        e = t.get_window_extent(renderer)
        if e.x0 < box.x0 - 0.5 or e.y0 < box.y0 - 0.5 or e.x1 > box.x1 + 0.5 or e.y1 > box.y1 + 0.5:
            out.append(t.get_text())
    return out


def test_a_saved_plot_holds_its_rotated_labels_whole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A histogram's bin labels are rotated (more than 8 groups); the figure the plot makes lays
    itself out, so ``savefig`` with no other option writes every label, the title and the axis
    labels inside the image (they were once cut at its bottom edge)."""
    h = session().histogram("age", bins=10, epsilon=1.0)
    ax = h.plot()
    fig = ax.figure
    try:
        fig.savefig(tmp_path / "age.png")
        labels = ax.get_xticklabels()
        assert len(labels) == 10 and all(t.get_rotation() == 90 for t in labels)
        texts = [*labels, ax.title, ax.xaxis.label, ax.yaxis.label]
        assert _outside(fig, texts) == []
        # The check itself: the same plot on a figure without a layout cuts the labels.
        bare, bare_ax = plt.subplots()
        try:
            h.plot(ax=bare_ax)
            bare.savefig(tmp_path / "bare.png")
            assert _outside(bare, bare_ax.get_xticklabels())
        finally:
            plt.close(bare)
    finally:
        plt.close(fig)
