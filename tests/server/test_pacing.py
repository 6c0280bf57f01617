"""Paid answers at a fixed time, the heavy pool, and the per-principal limits
(:mod:`dpkit.server.pacing`), against real servers on loopback ports.

The timing test is the one of the issue: two datasets that differ in one hostile person (who
owns 150,000 rows: contribution bounding has twice the rows to go through), the same paid COUNT
200 times on each, interleaved; the two latency distributions are compared with a two-sample
Kolmogorov–Smirnov test at α = 0.001. When the answers are held to their time the null
hypothesis is true by construction (a latency is the pre-debit work, which does not read the
rows, plus a budget computed from public facts), so the test fails falsely with probability
0.001. Its power: the same service with answers released as soon as they are ready — the
service before fixed times — is caught by the same test (p < 10⁻⁶ in practice).

Elsewhere only lower bounds of time are asserted (an answer never leaves before its budget), and
orderings (``/v1/me`` answers while paid requests are held); waits are bounded generously.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest

from _live_server import live_server
from dpkit._cancel import Cancelled
from dpkit.server import Service, create_app
from dpkit.server.pacing import AnswerTimes, Pacer, SynthLimits
from server._api import World, error_of

N = 150_000
SAMPLES = 200
ALPHA = 0.001
ANSWER_SECONDS = 2.0
META = {"privacy_unit": "pid", "max_rows": 1, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}}
SYNTH = {"epsilon": 1.0, "delta": 1e-6, "columns": ["age", "sex"], "bins": {"age": 5}, "rows": 50}


def _app(world: World, **settings: Any) -> Any:
    """The app with the service's real pacing (answers held), generous rates."""
    return create_app(world.service, rate=1e9, burst=10**9, **settings)


def _spends(world: World, analyst: str = "alice") -> int:
    return len(world.service.ledger.list_spends("people", analyst))


# -- the budgets ---------------------------------------------------------------------------------


def test_budgets_come_from_public_facts_only() -> None:
    times = AnswerTimes(answer_seconds=0.5, synth_seconds=60.0)
    count = times.query("medium", "duckdb", 0, False, ["count"])
    assert count == 0.5
    assert times.query("small", "duckdb", 0, False, ["count"]) == 0.25
    assert times.query("large", "duckdb", 0, False, ["count"]) == 2.0
    assert times.query("medium", "duckdb", 1, True, ["count", "mean"]) == 0.5 * 3.5
    assert times.query("medium", "duckdb", 0, False, ["quantile"]) == 1.5
    assert times.query("medium", "spark", 0, False, ["count"]) == 0.5 * 4 + 2
    assert times.synthesis("medium", "duckdb", 40) == 240.0


def test_a_ticket_whose_time_ran_out_never_pays() -> None:
    pacer = Pacer()
    try:
        from dpkit.server.pacing import Ticket

        ticket = Ticket(pacer, "alice")
        ticket.arm(0.1)
        assert ticket.cancel() is False
        with pytest.raises(Cancelled), ticket.paying():
            pytest.fail("paid after the time ran out")
        assert not ticket.paid
    finally:
        pacer.close()


def test_synthesis_limits_name_their_settings() -> None:
    limits = SynthLimits(max_rounds=10, max_cells=100)

    class Domain:
        shape = (5, 5, 5)

    limits.check_synthesis(10, Domain())  # 15 + 75 = 90 cells
    with pytest.raises(Exception, match="max_synth_rounds"):
        limits.check_synthesis(11, Domain())
    Domain.shape = (5, 5, 6)
    with pytest.raises(Exception, match="max_synth_cells"):
        limits.check_synthesis(1, Domain())


# -- answers held to their time ------------------------------------------------------------------


def test_a_paid_answer_never_leaves_before_its_budget(world: World) -> None:
    # people is "medium": a COUNT's budget is answer_seconds; a refusal is not held.
    with live_server(_app(world, answer_seconds=0.6)) as base, httpx.Client(base_url=base, timeout=60) as c:
        for _ in range(3):
            t0 = time.monotonic()
            r = c.post(
                "/v1/datasets/people/query",
                json={"sql": "SELECT COUNT(*) FROM people", "epsilon": 0.01},
                headers=world.h("alice"),
            )
            assert r.status_code == 200, r.text
            assert time.monotonic() - t0 >= 0.6
        t0 = time.monotonic()
        r = c.post(
            "/v1/datasets/people/query",
            json={"sql": "SELECT COUNT(*) FROM people", "epsilon": 100.0},
            headers=world.h("alice"),
        )
        assert r.status_code == 409


def test_work_past_its_time_is_cancelled_and_the_spend_stands(world: World) -> None:
    """Item 2: a synthetic table whose fit outruns its time is stopped (the thread returns to
    the pool: nothing left in flight) and answered with the fixed query_failed naming its spend."""
    app = _app(world, synth_seconds=0.01)
    with live_server(app) as base, httpx.Client(base_url=base, timeout=60) as c:
        r = c.post(
            "/v1/datasets/people/synthetic", json={**SYNTH, "method": "aim", "rounds": 20}, headers=world.h("alice")
        )
        assert r.status_code == 500, r.text
        err = error_of(r)
        assert err["code"] == "query_failed" and isinstance(err["spend_id"], int)
        assert _spends(world) == 1
        deadline = time.monotonic() + 60
        while app.state.pacer.inflight("alice") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app.state.pacer.inflight("alice") == 0  # the fit stopped at a checkpoint
    world.service.verify_log()


def test_an_answer_ready_in_time_is_not_failed_when_its_thread_wakes_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under load (hundreds of threads per process) a thread holding a finished answer could get
    the interpreter lock back only after the deadline and its grace: the answer was failed as an
    overrun (``query_failed``, the spend kept). Whether the work finished in time decides, not
    when its thread wakes: here every thread of the pool sleeps 0.4 s past what it asked."""
    import asyncio
    import types

    from dpkit.server import pacing

    late = types.SimpleNamespace(monotonic=time.monotonic, sleep=lambda s: time.sleep(s + 0.4))
    monkeypatch.setattr(pacing, "time", late)
    pacer = Pacer(AnswerTimes(answer_seconds=0.2), threads=2)

    def work(ticket: Any) -> str:
        ticket.arm(0.2)
        with ticket.paying() as paid:
            paid(7)
        return "answer"

    async def answer() -> tuple[str, float]:
        t0 = time.monotonic()
        return await pacer.run("alice", work), time.monotonic() - t0

    try:
        out, took = asyncio.run(answer())
    finally:
        pacer.close()
    assert out == "answer" and took >= 0.2
    assert pacer.inflight("alice") == 0  # its place is free once answered


def test_a_thousand_rounds_are_refused_before_paying(world: World) -> None:
    """Item 2: ``rounds: 1000`` ran 510 s of CPU and answered 200; now the service's limit
    refuses it, unpaid, naming the setting."""
    c = world.client(max_synth_rounds=100)
    r = c.post(
        "/v1/datasets/people/synthetic", json={**SYNTH, "epsilon": 0.003, "rounds": 1000}, headers=world.h("alice")
    )
    assert r.status_code == 400
    err = error_of(r)
    assert err["code"] == "limit_exceeded" and err["setting"] == "max_synth_rounds" and err["limit"] == 100
    # age in 5 bins (+ missing) and sex (3 + missing): 6 + 4 + 24 = 34 marginal cells.
    r = world.client(max_synth_cells=33).post("/v1/datasets/people/synthetic", json=SYNTH, headers=world.h("alice"))
    assert r.status_code == 400 and error_of(r)["setting"] == "max_synth_cells"
    assert _spends(world) == 0
    r = world.client(max_synth_cells=34).post("/v1/datasets/people/synthetic", json=SYNTH, headers=world.h("alice"))
    assert r.status_code == 200, r.text  # the limit is exact
    assert _spends(world) == 1


# -- per principal -------------------------------------------------------------------------------


def _post_all(base: str, key: str, n: int, path: str = "/v1/datasets/people/query") -> list[httpx.Response]:
    body = {"sql": "SELECT COUNT(*) FROM people", "epsilon": 0.01}
    with (
        httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {key}"}) as c,
        concurrent.futures.ThreadPoolExecutor(n) as pool,
    ):
        return list(pool.map(lambda _: c.post(path, json=body), range(n)))


def test_a_principal_has_at_most_max_concurrent_paid_requests(world: World) -> None:
    with live_server(_app(world, answer_seconds=3.0, max_concurrent=3)) as base:
        results: dict[str, list[httpx.Response]] = {}
        bob = threading.Thread(target=lambda: results.setdefault("bob", _post_all(base, world.keys["bob"], 2)))
        alice = threading.Thread(target=lambda: results.setdefault("alice", _post_all(base, world.keys["alice"], 6)))
        alice.start()
        time.sleep(0.5)
        bob.start()
        alice.join(60)
        bob.join(60)
    statuses = sorted(r.status_code for r in results["alice"])
    assert statuses.count(200) >= 3 and 429 in statuses, statuses
    refused = [r for r in results["alice"] if r.status_code == 429]
    assert all(error_of(r)["setting"] == "max_concurrent" for r in refused)
    assert _spends(world, "alice") == statuses.count(200)  # a refusal spent nothing
    assert [r.status_code for r in results["bob"]] == [200, 200]  # another principal is not held back


def test_answer_time_per_hour_is_bounded_before_paying(world: World) -> None:
    c = world.client(answer_seconds=0.4, cpu_seconds_per_hour=1.0, _hold_answers=False)
    body = {"sql": "SELECT COUNT(*) FROM people", "epsilon": 0.01}
    statuses = [c.post("/v1/datasets/people/query", json=body, headers=world.h("alice")).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    r = c.post("/v1/datasets/people/query", json=body, headers=world.h("alice"))
    assert r.status_code == 429 and error_of(r)["setting"] == "cpu_seconds_per_hour" and "Retry-After" in r.headers
    assert _spends(world) == 2
    assert c.post("/v1/datasets/people/query", json=body, headers=world.h("bob")).status_code == 200
    # A budget beyond the whole allowance can never be paid: a limit, not a wait.
    r = world.client(answer_seconds=10.0, cpu_seconds_per_hour=1.0).post(
        "/v1/datasets/people/query", json=body, headers=world.h("bob")
    )
    assert r.status_code == 400 and error_of(r)["setting"] == "cpu_seconds_per_hour"


def test_me_does_not_wait_behind_held_answers(world: World) -> None:
    """Item 2: 45 cheap synthetic requests made another analyst's ``GET /v1/me`` take 9 s (one
    shared thread pool). Now paid work runs in its own pool: with every heavy thread taken
    (answers held for 5 s), ``/v1/me`` still answers — before any of them."""
    app = _app(world, answer_seconds=5.0, heavy_threads=4, max_concurrent=100)
    with live_server(app) as base:
        done: list[float] = []
        pool = concurrent.futures.ThreadPoolExecutor(8)

        def held_request() -> None:
            _post_all(base, world.keys["alice"], 1)
            done.append(time.monotonic())

        held = [pool.submit(held_request) for _ in range(8)]
        deadline = time.monotonic() + 30
        while app.state.pacer.inflight("alice") < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert app.state.pacer.inflight("alice") >= 4
        with httpx.Client(base_url=base, timeout=60) as c:
            r = c.get("/v1/me", headers=world.h("bob"))
            me_at = time.monotonic()
        assert r.status_code == 200
        for f in held:
            f.result(120)
        pool.shutdown()
    assert done and me_at < min(done)


# -- the timing test -----------------------------------------------------------------------------


def _timing_service(tmp_path: Path) -> tuple[Service, str]:
    rng = np.random.default_rng(27)
    people = pd.DataFrame({"pid": np.arange(N).astype(str), "age": rng.integers(18, 90, N)})
    hostile = pd.DataFrame({"pid": ["hostile"] * N, "age": np.full(N, 50)})  # one person, 150,000 rows
    people.to_csv(tmp_path / "d.csv", index=False)
    pd.concat([people, hostile]).to_csv(tmp_path / "d_plus.csv", index=False)
    service = Service(f"sqlite:///{tmp_path / 'ledger.sqlite'}", audit_key=tmp_path / "audit.key")
    # "medium" (up to 10⁶ rows): both datasets fit it, and its budget leaves the 20 concurrent
    # clients room on two busy cores; an answer that overruns its budget fails the test.
    service.register_dataset("d", tmp_path / "d.csv", META, size_class="medium")
    service.register_dataset("d_plus", tmp_path / "d_plus.csv", META, size_class="medium")
    _, key = service.create_principal("timer", "analyst")
    service.grant("timer", "d", epsilon=10.0)
    service.grant("timer", "d_plus", epsilon=10.0)
    return service, key


def _latencies(
    service: Service, key: str, *, hold: bool, samples: int = SAMPLES, clients: int = 20
) -> dict[str, list[float]]:
    """``samples`` paid COUNTs on each dataset, from ``clients`` threads each alternating between
    the two (so both see the same load), after two warm-up queries each."""
    settings = {"answer_seconds": ANSWER_SECONDS, "max_concurrent": 1000, "cpu_seconds_per_hour": 1e9}
    app = create_app(service, rate=1e9, burst=10**9, _hold_answers=hold, **settings)
    out: dict[str, list[float]] = {"d": [], "d_plus": []}
    lock = threading.Lock()
    with live_server(app) as base:

        def client(k: int) -> None:
            with httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:
                for i in range(2 * samples // clients):
                    name = ("d", "d_plus")[(i + k) % 2]
                    t0 = time.perf_counter()
                    r = c.post(
                        f"/v1/datasets/{name}/query", json={"sql": f"SELECT COUNT(*) FROM {name}", "epsilon": 1e-4}
                    )
                    took = time.perf_counter() - t0
                    assert r.status_code == 200, r.text
                    with lock:
                        out[name].append(took)

        with httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:
            for name in ("d", "d_plus", "d", "d_plus"):  # warm-up: each dataset's copy opened
                assert (
                    c.post(
                        f"/v1/datasets/{name}/query", json={"sql": f"SELECT COUNT(*) FROM {name}", "epsilon": 1e-4}
                    ).status_code
                    == 200
                )
        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return out


@pytest.mark.slow
@pytest.mark.statistical
def test_the_time_of_a_paid_answer_does_not_depend_on_one_person(tmp_path: Path) -> None:
    """Item 15. False-failure rate 0.001 (the KS test's α; see the module docstring)."""
    from scipy.stats import ks_2samp

    service, key = _timing_service(tmp_path)
    try:
        held = _latencies(service, key, hold=True)
        assert len(held["d"]) == len(held["d_plus"]) == SAMPLES
        assert min(held["d"] + held["d_plus"]) >= ANSWER_SECONDS  # × 1 (medium)
        assert ks_2samp(held["d"], held["d_plus"]).pvalue > ALPHA

        # Power: the service before fixed times (answers leave when ready) fails the same test.
        ready = _latencies(service, key, hold=False)
        assert ks_2samp(ready["d"], ready["d_plus"]).pvalue < ALPHA
    finally:
        service.close()


# -- the size class ------------------------------------------------------------------------------


def test_the_size_class_is_declared_public_and_checked(world: World, tmp_path: Path) -> None:
    from dpkit.errors import InvalidParameterError
    from server._api import PEOPLE_METADATA

    with pytest.raises(InvalidParameterError, match="size_class") as refused:
        world.service.register_dataset("p2", world.people, PEOPLE_METADATA, size_class="tiny")
    assert "'small'" in str(refused.value) and "100,000" in str(refused.value)
    assert all(d.name != "p2" for d in world.service.datasets())
    # 300 rows fit "small", and the public schema shows the class; 100,001 rows do not: a
    # problem in the curator's data check, naming the class that fits.
    info = world.service.register_dataset("p3", world.people, PEOPLE_METADATA, size_class="small")
    assert info.public()["size_class"] == "small" and info.check is not None
    assert not any("size class" in p for p in info.check.problems)
    big = tmp_path / "big.csv"
    pd.DataFrame({"age": np.zeros(100_001, dtype=int)}).to_csv(big, index=False)
    meta = {"row_level": True, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}}
    info = world.service.register_dataset("big", big, meta, size_class="small")
    assert info.check is not None
    assert any("exceed the size class 'small'" in p and "'medium'" in p for p in info.check.problems)
