"""``verify-log`` vouches for releases (issue 27, item 11, the release half): every release is
stored with a chained ``publish`` entry holding its publisher, dataset, spend, (ε, δ) and the
SHA-256 of its stored content and report, and verification checks each release against it.

Each tampering below is what someone who can write the database (but does not hold the chain's
key) could do; before this change ``verify_log`` passed after every one of them. Deterministic:
false-failure rate 0. Run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dpkit.errors import LedgerError
from server._api import World
from server._release_world import BODY, LEDGERS, execute, open_world

_RELEASE = "SELECT name, dataset, analyst, spend_id, epsilon, delta, created_at, columns, row_count, rows_json, report FROM releases WHERE name = 'p1'"
_INSERT = (
    "INSERT INTO releases (name, dataset, analyst, spend_id, epsilon, delta, created_at, columns, row_count, rows_json, report) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


@pytest.fixture(params=LEDGERS)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    """A world whose alice published ``p1`` (200 rows of age and sex)."""
    for w in open_world(request, tmp_path):  # (one world, closed when the test ends)
        w.service.allow_publish("alice")
        r = w.client().post("/v1/datasets/people/synthetic", json={**BODY, "publish": "p1"}, headers=w.h("alice"))
        assert r.status_code == 200, r.text
        yield w


def _replace_rows(world: World) -> None:
    ((csv_part, json_part),) = execute(world, "SELECT csv, json FROM release_parts WHERE name = 'p1'")
    rows = json.loads("[" + json_part + "]")
    rows[0][1] = "M" if rows[0][1] != "M" else "F"
    execute(world, "UPDATE release_parts SET json = ? WHERE name = 'p1'", (json.dumps(rows)[1:-1],))


def _cost(world: World) -> None:
    execute(world, "UPDATE releases SET epsilon = '100.0' WHERE name = 'p1'")


def _republish_as_bob(world: World) -> None:
    (row,) = execute(world, _RELEASE)
    execute(world, "DELETE FROM releases WHERE name = 'p1'")
    execute(world, _INSERT, (row[0], row[1], "bob", *row[3:]))


def _report(world: World) -> None:
    (report,) = execute(world, "SELECT report FROM releases WHERE name = 'p1'")[0]
    execute(world, "UPDATE releases SET report = ? WHERE name = 'p1'", (report.replace("aim", "mst"),))


def _delete(world: World) -> None:
    execute(world, "DELETE FROM release_parts WHERE name = 'p1'")
    execute(world, "DELETE FROM releases WHERE name = 'p1'")


def _forge(world: World) -> None:
    (row,) = execute(world, _RELEASE)
    execute(world, _INSERT, ("p2", *row[1:]))
    execute(
        world,
        "INSERT INTO release_parts (name, part, csv, json) SELECT 'p2', part, csv, json FROM release_parts WHERE name = 'p1'",
    )


TAMPERING: dict[str, tuple[Callable[[World], None], str]] = {
    "rows replaced": (_replace_rows, "release 'p1' .* differs from its publish entry \\d+ in its rows"),
    "ε set to 100": (_cost, "release 'p1' .* differs from its publish entry \\d+ in its ε"),
    "re-inserted under another publisher": (_republish_as_bob, "release 'p1' .*published by 'bob'.* in its publisher"),
    "report rewritten": (_report, "release 'p1' .* in its report"),
    "deleted": (_delete, "publication of release 'p1' by 'alice', which is not in the database"),
    "inserted without an entry": (_forge, "release 'p2' .* has no publish entry"),
}


def test_a_published_release_verifies(world: World) -> None:
    (entry,) = [e for e in world.entries() if e.action == "publish"]
    assert (entry.actor, entry.dataset, entry.detail["release"], entry.detail["epsilon"]) == (
        "alice",
        "people",
        "p1",
        "1.0",
    )
    assert entry.epsilon is None  # not a payment: the debit's own entry records the amount
    assert {"content_sha256", "report_sha256", "spend_id"} <= set(entry.detail)
    world.service.verify_log()


@pytest.mark.parametrize("how", list(TAMPERING))
def test_verify_log_finds_a_release_changed_in_the_database(world: World, how: str) -> None:
    tamper, found = TAMPERING[how]
    world.service.verify_log()
    tamper(world)
    with pytest.raises(LedgerError, match=found):
        world.service.verify_log()
