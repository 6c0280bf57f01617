"""Query size limits (QueryLimits): public keys, result rows, response size and SQL nesting.

Every refusal here is decided on the request and the declared metadata before anything is paid:
each test that expects one checks that the budget (or the ledger) is unchanged. Tests are
deterministic (false-failure rate 0) unless their docstring says otherwise; the two resource
bounds the limits exist for are checked by work and memory, never by time: a 10^9-key preview
is answered within a tracemalloc peak far below what building the keys takes, and deep SQL is
refused without the tokenizer or the parser being called.
"""

from __future__ import annotations

import itertools
import json
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest
import sqlglot

import dpkit as dp
from dpkit.analytics import Categorical, Count, Mean, Metadata, Numeric, QueryLimits, Session
from dpkit.analytics.limits import json_text_bound, json_text_bounds, public_key_count
from dpkit.analytics.plan import Compare, Not
from dpkit.analytics.sql_parse import parse_predicate, query_depth
from dpkit.errors import InvalidParameterError, LimitExceededError

THOUSAND = list(range(1000))  # 999 bins per column: three columns make 997,002,999 keys
BILLION_BINS = {"x": THOUSAND, "y": THOUSAND, "z": THOUSAND}
MEMORY_BOUND = 20 * 1024 * 1024


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    n = 400
    return pd.DataFrame(
        {
            "x": rng.uniform(0, 1000, n),
            "y": rng.uniform(0, 1000, n),
            "z": rng.uniform(0, 1000, n),
            "sex": rng.choice(["Female", "Male"], n),
            "city": rng.choice(["Zürich", "Genève", "Basel"], n),
        }
    )


META = Metadata(
    columns={
        "x": Numeric(0, 1000),
        "y": Numeric(0, 1000),
        "z": Numeric(0, 1000),
        "sex": Categorical(["Female", "Male"]),
        "city": Categorical(["Zürich", "Genève", "Basel"]),
    },
    row_level=True,
)


def _session(limits: QueryLimits | None = None, **kwargs: Any) -> Session:
    kwargs.setdefault("budget", dp.Budget(epsilon=10.0, delta=1e-3))
    kwargs.setdefault("rng", np.random.default_rng(0))
    return Session(_frame(), metadata=kwargs.pop("metadata", META), limits=limits, **kwargs)


def _measure(call: Callable[[], Any]) -> tuple[BaseException | None, int]:
    """What ``call`` raised and its peak traced memory (bytes)."""
    tracemalloc.start()
    error: BaseException | None = None
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - returned to the test, which asserts on it
        error = exc
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return error, peak


# -- QueryLimits ---------------------------------------------------------------------------------


def test_defaults_and_validation() -> None:
    """False-failure rate 0."""
    limits = QueryLimits()
    assert (limits.max_keys, limits.max_result_rows, limits.max_response_bytes, limits.max_query_depth) == (
        100_000,
        100_000,
        16 * 1024 * 1024,
        32,
    )
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(InvalidParameterError, match="max_keys"):
            QueryLimits(max_keys=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="limits"):
        _session(limits={"max_keys": 10})  # type: ignore[arg-type]
    assert _session().limits == QueryLimits()
    assert _session(QueryLimits(max_keys=5)).limits.max_keys == 5


def test_key_count_is_an_exact_integer_product() -> None:
    """False-failure rate 0."""
    assert public_key_count([]) == 1
    assert public_key_count([999, 999, 999]) == 997_002_999
    assert public_key_count([10**6] * 5) == 10**30  # exact, no overflow, nothing listed


def test_json_text_bounds_hold_for_both_encodings() -> None:
    """The bound is at least the encoded size, ASCII-escaped or UTF-8. False-failure rate 0."""
    texts = ["", "Male", 'a"b\\c', "Zürich", "北京", "😀 smile", "tab\there", "\x00\x1f", "x" * 300]
    vector = json_text_bounds(pd.Series(texts + [None], dtype=object))
    for text, bound in zip(texts, vector[:-1], strict=True):
        assert bound == max(json_text_bound(text), len("null"))  # a column's NULL takes 4
        assert bound >= len(json.dumps(text)) and bound >= len(json.dumps(text, ensure_ascii=False).encode())
    assert vector[-1] == len("null")


# -- public keys: refused before anything is built or paid -----------------------------------------


def test_a_billion_key_preview_is_refused_quickly_without_building_the_keys() -> None:
    """The issue's request: three columns × range(1000) edges (10^9 keys). Refused with
    LimitExceededError naming the key count and max_keys, in well under MEMORY_BOUND bytes (the
    keys would take tens of GB). False-failure rate 0 (a memory margin of ~100×)."""
    s = _session()
    error, peak = _measure(lambda: s.query().group_by("x", "y", "z", bins=BILLION_BINS).cost([Count()], epsilon=0.001))
    assert isinstance(error, LimitExceededError), error
    assert (error.name, error.value, error.limit, error.setting) == ("group_by keys", 999**3, 100_000, "max_keys")
    assert "max_keys=100000" in str(error)
    assert peak < MEMORY_BOUND
    assert s.spent == (0.0, 0.0)


def test_a_billion_key_query_is_refused_and_nothing_is_debited(tmp_path: Any) -> None:
    """The paid variant, on a ledger: refused before the debit (no spend recorded).
    False-failure rate 0."""
    ledger = dp.open_ledger(tmp_path / "ledger.sqlite")
    ledger.create_budget("data", "ann", epsilon=1.0, delta=1e-6)
    s = Session(_frame(), metadata=META, ledger=ledger, dataset="data", analyst="ann")
    error, peak = _measure(lambda: s.group_by("x", "y", "z", bins=BILLION_BINS).count(epsilon=0.001))
    assert isinstance(error, LimitExceededError) and error.setting == "max_keys"
    assert peak < MEMORY_BOUND
    assert s.spent == (0.0, 0.0) and ledger.list_spends("data", "ann") == []


def test_declared_categories_count_as_their_product_in_sql() -> None:
    """Three declared columns of 1000 categories each, grouped in SQL: refused in the preview
    and the query. False-failure rate 0."""
    cats = {c: Categorical([f"{c}{i}" for i in range(1000)]) for c in ("a", "b", "c")}
    frame = pd.DataFrame({c: [f"{c}0", f"{c}1"] for c in ("a", "b", "c")})
    s = Session(frame, metadata=Metadata(columns=cats, row_level=True), budget=dp.Budget(epsilon=1.0))
    text = "SELECT a, b, c, COUNT(*) FROM data GROUP BY a, b, c"
    for call in (lambda: s.sql_cost(text, epsilon=0.1), lambda: s.sql(text, epsilon=0.1)):
        error, peak = _measure(call)
        assert isinstance(error, LimitExceededError) and error.value == 10**9 and error.setting == "max_keys"
        assert peak < MEMORY_BOUND
    assert s.spent == (0.0, 0.0)


def test_power_the_memory_measure_sees_a_product_being_built() -> None:
    """Power check for the two tests above: listing a mere 10^6 keys, as the cost preview used
    to, is over MEMORY_BOUND under the same measure. False-failure rate 0."""
    _, peak = _measure(lambda: tuple(itertools.product(range(100), range(100), range(100))))
    assert peak > MEMORY_BOUND


def test_power_raising_the_limits_accepts_the_same_preview_still_without_building_keys() -> None:
    """With max_keys raised the same request is judged by the next limit (result rows); with
    every limit raised the preview is priced — still without listing a key, because pricing
    needs only their number. False-failure rate 0."""
    s = _session(QueryLimits(max_keys=10**9))
    with pytest.raises(LimitExceededError) as info:
        s.query().group_by("x", "y", "z", bins=BILLION_BINS).cost([Count()], epsilon=0.001)
    assert info.value.setting == "max_result_rows"
    s = _session(QueryLimits(max_keys=10**9, max_result_rows=10**9, max_response_bytes=2**62))
    error, peak = _measure(lambda: s.query().group_by("x", "y", "z", bins=BILLION_BINS).cost([Count()], epsilon=0.001))
    assert error is None and peak < MEMORY_BOUND


def test_keys_just_under_the_limit_are_answered_and_one_more_is_refused() -> None:
    """99 × 999 = 98,901 keys: answered with one row per key under the defaults; with max_keys
    one below that, refused. False-failure rate 0."""
    bins = {"x": list(range(0, 991, 10)), "y": THOUSAND}
    assert public_key_count([len(bins["x"]) - 1, len(bins["y"]) - 1]) == 98_901
    s = _session()
    r = s.group_by("x", "y", bins=bins).count(epsilon=0.5)
    assert len(r.table) == 98_901 and not r.truncated
    s = _session(QueryLimits(max_keys=98_900))
    with pytest.raises(LimitExceededError) as info:
        s.group_by("x", "y", bins=bins)
    assert (info.value.value, info.value.limit) == (98_901, 98_900)
    assert (
        _session(QueryLimits(max_keys=98_901))
        .query()
        .group_by("x", "y", bins=bins)
        .cost([Count()], epsilon=0.5)
        .epsilon
        == 0.5
    )


def test_one_column_of_too_many_bins_is_refused_before_its_edges_are_read() -> None:
    """False-failure rate 0."""
    s = _session(QueryLimits(max_keys=10))
    with pytest.raises(LimitExceededError, match="max_keys"):
        s.histogram("x", bins=list(range(12)), epsilon=0.1)
    assert s.histogram("x", bins=list(range(11)), epsilon=0.1).table.shape[0] == 10
    assert s.spent[0] == pytest.approx(0.1)


def test_explicit_keys_are_counted_and_an_endless_iterable_is_not_listed() -> None:
    """``keys=`` longer than max_keys is refused; an endless iterable is read only up to
    max_keys + 1 (the test would hang otherwise). False-failure rate 0."""
    s = _session(QueryLimits(max_keys=3))
    with pytest.raises(LimitExceededError, match="max_keys"):
        s.group_by("sex", keys=["Female", "Male", "x", "y"])
    with pytest.raises(LimitExceededError, match="max_keys"):
        s.group_by("x", keys=itertools.count())
    assert s.group_by("sex", keys=["Female", "Male", "x"]).count(epsilon=0.1).table.shape[0] == 3


def test_a_key_beyond_the_doubles_is_refused_as_a_parameter() -> None:
    """An integer key no double can equal is a bad parameter, not an internal error.
    False-failure rate 0."""
    with pytest.raises(InvalidParameterError, match="keys"):
        _session().group_by("x", keys=[10**400])


def test_result_rows_with_public_keys_are_refused_before_paying() -> None:
    """Public keys: the row count is known, so an answer over max_result_rows is refused (the
    budget unchanged); at the limit it is answered. False-failure rate 0."""
    s = _session(QueryLimits(max_result_rows=5))
    q = s.query().group_by("sex", "city")  # 6 keys
    with pytest.raises(LimitExceededError) as info:
        q.cost([Count()], epsilon=0.1)
    assert (info.value.name, info.value.value, info.value.setting) == ("result rows", 6, "max_result_rows")
    with pytest.raises(LimitExceededError):
        q.count(epsilon=0.1)
    assert s.spent == (0.0, 0.0)
    assert _session(QueryLimits(max_result_rows=6)).group_by("sex", "city").count(epsilon=0.1).table.shape[0] == 6


# -- response size ---------------------------------------------------------------------------------


def _answer_bytes(result: Any) -> int:
    d = result.to_dict()
    return max(len(json.dumps(d)), len(json.dumps(d, ensure_ascii=False).encode()))


@pytest.mark.parametrize("aggregates", [[Count()], [Count(), Mean("x")]])
def test_the_response_bound_is_an_upper_bound_and_not_far_above(aggregates: list[Any]) -> None:
    """The answer's actual JSON (both encodings) never exceeds the bound: with the limit one byte
    below the actual size the query is refused before paying. With twice the size plus 16 KiB
    it is answered (the bound is not vacuous). False-failure rate 0 (the bound depends on the
    request and metadata only, never on the noise)."""
    bins = {"x": list(np.linspace(0, 1000, 300))}
    actual = _answer_bytes(_session().group_by("x", "city", bins=bins).aggregate(aggregates, epsilon=1.0))
    s = _session(QueryLimits(max_response_bytes=actual - 1))
    with pytest.raises(LimitExceededError) as info:
        s.group_by("x", "city", bins=bins).aggregate(aggregates, epsilon=1.0)
    assert info.value.setting == "max_response_bytes" and info.value.value > actual - 1
    assert s.spent == (0.0, 0.0)
    r = (
        _session(QueryLimits(max_response_bytes=2 * actual + 16 * 1024))
        .group_by("x", "city", bins=bins)
        .aggregate(aggregates, epsilon=1.0)
    )
    assert _answer_bytes(r) <= 2 * actual + 16 * 1024


def test_a_private_key_answer_that_cannot_hold_one_row_is_refused_before_paying() -> None:
    """False-failure rate 0."""
    meta = Metadata(columns={"name": Categorical()}, row_level=True)
    s = Session(
        pd.DataFrame({"name": ["a", "b"]}),
        metadata=meta,
        budget=dp.Budget(epsilon=1.0, delta=1e-3),
        limits=QueryLimits(max_response_bytes=1024),
    )
    with pytest.raises(LimitExceededError, match="max_response_bytes"):
        s.group_by("name").count(epsilon=0.5, delta=1e-6)
    assert s.spent == (0.0, 0.0)


# -- private keys: cut after the release, in key order -----------------------------------------------


def _many_keys(n_keys: int, length: int = 3) -> tuple[pd.DataFrame, Metadata]:
    """n_keys distinct text keys, 200 rows (each its own unit) under every one: every key is
    released with probability 1 − (tiny) at ε = 1, δ = 1e-6."""
    names = [f"k{i:0{length}d}" for i in range(n_keys)]
    frame = pd.DataFrame({"name": np.repeat(names, 200)})
    return frame, Metadata(columns={"name": Categorical()}, row_level=True)


def test_privately_selected_rows_are_cut_to_max_result_rows_in_key_order() -> None:
    """40 keys, all released (each held by 200 units: the truncated-geometric rule keeps a group
    of 200 units with probability 1 at ε = 1, δ = 1e-6), cut to the first 7 in key order; the
    result says so. Without the cap nothing is cut. False-failure rate 0 (the keep probability
    is exactly 1 for these counts)."""
    frame, meta = _many_keys(40)
    s = Session(
        frame,
        metadata=meta,
        budget=dp.Budget(epsilon=10.0, delta=1e-3),
        limits=QueryLimits(max_result_rows=7),
        rng=np.random.default_rng(1),
    )
    r = s.group_by("name").count(epsilon=1.0, delta=1e-6)
    assert r.table["name"].tolist() == sorted(set(frame["name"]))[:7]
    assert r.truncated and r.to_dict()["truncated"] is True
    assert any("TRUNCATED" in note and "7 of the 40" in note for note in r.notes)
    assert s.spent[0] == pytest.approx(1.0)  # paid: the cut is post-processing of the release
    full = (
        Session(frame, metadata=meta, budget=dp.Budget(epsilon=10.0, delta=1e-3), rng=np.random.default_rng(1))
        .group_by("name")
        .count(epsilon=1.0, delta=1e-6)
    )
    assert len(full.table) == 40 and not full.truncated and full.to_dict()["truncated"] is False


def test_privately_selected_text_keys_are_cut_to_the_response_size() -> None:
    """Keys of undeclared length (2,000 characters each): the answer keeps the first keys in key
    order whose encoded size fits max_response_bytes, and its JSON does fit. Power check: the
    same query without the limit is larger than it. False-failure rate 0 (as above)."""
    frame, meta = _many_keys(30, length=2000)
    limit = 32 * 1024
    s = Session(
        frame,
        metadata=meta,
        budget=dp.Budget(epsilon=10.0, delta=1e-3),
        limits=QueryLimits(max_response_bytes=limit),
        rng=np.random.default_rng(2),
    )
    r = s.group_by("name").count(epsilon=1.0, delta=1e-6)
    assert r.truncated and 0 < len(r.table) < 30
    assert r.table["name"].tolist() == sorted(set(frame["name"]))[: len(r.table)]
    assert _answer_bytes(r) <= limit
    unlimited = (
        Session(frame, metadata=meta, budget=dp.Budget(epsilon=10.0, delta=1e-3), rng=np.random.default_rng(2))
        .group_by("name")
        .count(epsilon=1.0, delta=1e-6)
    )
    assert not unlimited.truncated and _answer_bytes(unlimited) > limit


# -- SQL and predicate nesting ---------------------------------------------------------------------------

DEEP = {
    "5000 parentheses": "(" * 5000 + "x > 1" + ")" * 5000,
    "5000 NOTs": "NOT " * 5000 + "x > 1",
    "2000 ANDs": " AND ".join(["x > 1"] * 2001),
    "5000 brackets": "x IN " + "[" * 5000 + "1" + "]" * 5000,
}


@pytest.mark.parametrize("condition", DEEP.values(), ids=DEEP.keys())
def test_deep_sql_is_refused_by_the_scan_before_parsing(condition: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's requests (a 500 before: Python's recursion limit). Refused with
    LimitExceededError naming the nesting and max_query_depth, in the preview, the query, a
    text ``where`` and parse_predicate, by the linear scan alone: the tokenizer and the parser
    (which recurse per level) are never called. Nothing is spent. False-failure rate 0."""
    entered: list[str] = []

    def counting(name: str) -> Callable[..., Any]:
        real = getattr(sqlglot, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            entered.append(name)
            return real(*args, **kwargs)

        return call

    for name in ("tokenize", "parse", "parse_one"):
        monkeypatch.setattr(sqlglot, name, counting(name))
    s = _session()
    text = f"SELECT COUNT(*) FROM data WHERE {condition}"
    for call in (lambda: s.sql_cost(text, epsilon=0.1), lambda: s.sql(text, epsilon=0.1)):
        error, _ = _measure(call)
        assert isinstance(error, LimitExceededError), error
        assert error.name == "sql nesting depth" and error.setting == "max_query_depth" and error.value > 32
    for call in (lambda: s.where(condition), lambda: parse_predicate(condition)):
        error, _ = _measure(call)
        assert isinstance(error, LimitExceededError) and error.name == "where nesting depth", error
    assert entered == []
    assert s.spent == (0.0, 0.0)
    parse_predicate("x > 1 AND y < 2")  # power check: the counters see a condition being parsed
    assert "tokenize" in entered


def test_what_the_scan_cannot_see_is_still_refused_as_too_deep() -> None:
    """A chain of unary minus signs is not counted by the scan but recurses in the parser: the
    recursion is caught and refused with the same error, not a 500. Power check: with
    max_query_depth raised past the scan's count, the 5000 parentheses reach the parser and are
    refused the same way. False-failure rate 0."""
    s = _session()
    with pytest.raises(LimitExceededError, match="max_query_depth"):
        s.sql("SELECT COUNT(*) FROM data WHERE x > " + "- " * 3000 + "1", epsilon=0.1)
    deep = _session(QueryLimits(max_query_depth=10**6))
    with pytest.raises(LimitExceededError, match="more than the parser can follow"):
        deep.sql_cost("SELECT COUNT(*) FROM data WHERE " + DEEP["5000 parentheses"], epsilon=0.1)
    with pytest.raises(LimitExceededError, match="more than the parser can follow"):
        parse_predicate(DEEP["5000 NOTs"], limits=QueryLimits(max_query_depth=10**6))
    assert s.spent == (0.0, 0.0) and deep.spent == (0.0, 0.0)


@pytest.mark.parametrize(
    "condition",
    [
        "(" * 31 + "x > 1" + ")" * 31,
        "NOT " * 31 + "x > 1",
        " AND ".join(["x > 1"] * 32),
        "NOT " + "(NOT " * 15 + "x > 1" + ")" * 15,
    ],
    ids=["31 parentheses", "31 NOTs", "31 ANDs", "NOT 15 (NOT"],
)
def test_nesting_at_the_limit_is_answered_even_from_a_deep_call_stack(condition: str) -> None:
    """Depth 32 exactly is accepted, from a caller already 200 frames deep (a server's own stack);
    one level more is refused. False-failure rate 0."""
    text = f"SELECT COUNT(*) FROM data WHERE {condition}"
    assert query_depth(text) == 32

    def nested(frames: int) -> Any:
        return nested(frames - 1) if frames else _session().sql_cost(text, epsilon=0.1)

    assert nested(200).epsilon == 0.1
    assert sys.getrecursionlimit() >= 1000
    with pytest.raises(LimitExceededError):
        _session().sql_cost(f"SELECT COUNT(*) FROM data WHERE NOT ({condition})", epsilon=0.1)


def test_query_depth_skips_strings_identifiers_and_comments() -> None:
    """Brackets and keywords inside literals, quoted names and comments are not nesting; an
    unterminated literal or comment ends the scan (the parser refuses the text). False-failure
    rate 0."""
    assert query_depth("name = '((((( and or not )))))'") == 1
    assert query_depth('"odd (( and" = 1') == 1
    assert query_depth("x > 1 -- (((( and and\n") == 1
    assert query_depth("x > 1 /* (((( not */ AND y < 2") == 2
    assert query_depth("x > 1 /* (((( unterminated") == 1
    assert query_depth("name = 'it''s (' AND (x > 1)") == 3
    assert query_depth("x_and_y > 1 AND notes = 'x'") == 2
    s = _session()
    assert s.where("city = '((((((((((((((((((((((((((((((((((((((((((and))))' OR sex = 'Male'").predicate is not None


def test_deep_predicate_objects_are_refused() -> None:
    """The Python API's predicate objects are measured without recursion. False-failure rate 0."""
    p: Any = Compare("x", ">", 1)
    for _ in range(5000):
        p = Not(p)
    with pytest.raises(LimitExceededError, match="max_query_depth"):
        _session().where(p)
    shallow: Any = Compare("x", ">", 1)
    for _ in range(31):
        shallow = Not(shallow)
    assert _session().where(shallow).predicate == shallow


# -- constructors --------------------------------------------------------------------------------------


def test_every_constructor_takes_limits(tmp_path: Any) -> None:
    """Session, from_csv and from_duckdb carry the limits to their queries. False-failure rate 0."""
    import duckdb

    limits = QueryLimits(max_result_rows=1)
    path = tmp_path / "data.csv"
    _frame().to_csv(path, index=False)
    con = duckdb.connect()
    con.register("data", _frame())
    sessions = [
        _session(limits),
        Session.from_csv(path, metadata=META, budget=dp.Budget(epsilon=1.0), limits=limits),
        Session.from_duckdb(con, "data", metadata=META, budget=dp.Budget(epsilon=1.0), limits=limits),
    ]
    for s in sessions:
        assert s.limits is limits
        with pytest.raises(LimitExceededError, match="max_result_rows"):
            s.group_by("sex").count(epsilon=0.1)
        assert s.spent == (0.0, 0.0)
