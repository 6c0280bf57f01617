"""Registration opens its source once: a file swapped for a symlink out of the data root while
``register_dataset`` runs is either refused or copied from the file under the root — never from
the file the link leads to.

The race is real (a second process swaps the name in a tight loop, so the swap does not wait for
this process's lock on the interpreter), so whether any one registration meets a swap is chance;
"nothing outside was copied" holds for every interleaving. Registrations are tried until 30 were
accepted, at most 300 times, and at least one must be, so that the test cannot pass by refusing
the swap every time: with 6 to 19 of 60 registrations accepted under the swap in our runs (about
1 in 12 at the least), the chance that none of 300 is is below 1e-10 — the test's false-failure
rate. The power check: with the source read by its path after the check (the code before), the
same test found the outside file copied in each of 12 runs, 2 of them over HTTP (1 to 8 leaks
per run)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pytest

from dpkit.errors import InvalidDataError, InvalidParameterError
from dpkit.server import Service
from dpkit.server.datasets import copy_name, default_dataset_dir

#: The outside file's value (it stands in for a secret the data root must keep out).
SECRET = 4242
META = {"row_level": True, "columns": {"age": {"type": "numeric", "lower": 0, "upper": 100}}}
#: Registrations are tried until ACCEPTED were accepted, at most TRIES times.
ACCEPTED, TRIES = 30, 300


def _swap(name: str, inside: str, outside: str, started: Any, stop: Any) -> None:
    """Swap ``name`` between a hard link of ``inside`` and a symlink to ``outside`` until ``stop``
    is set (each swap an atomic rename, so the name always exists)."""
    link, real = name + ".link", name + ".real"
    started.set()
    while not stop.is_set():
        for tmp, make in ((link, lambda p: os.symlink(outside, p)), (real, lambda p: os.link(inside, p))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            make(tmp)
            os.replace(tmp, name)


def _values(url: str, name: str, created_at: str) -> set[int]:
    copy = default_dataset_dir(url) / copy_name(name, created_at)
    conn = duckdb.connect(str(copy), read_only=True)
    try:
        return {int(float(r[0])) for r in conn.execute(f'SELECT DISTINCT age FROM "{name}"').fetchall()}
    finally:
        conn.close()


@pytest.mark.parametrize(("fmt", "via"), [("csv", "service"), ("parquet", "service"), ("csv", "http")])
def test_a_source_swapped_for_a_link_out_of_the_root_is_never_copied(tmp_path: Path, fmt: str, via: str) -> None:
    """``via="http"``: ``POST /v1/datasets`` with a curator's key on a real server (the data
    check in its answer is searched for the outside value too)."""
    root, outside = tmp_path / "data", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    inside_rows = pd.DataFrame({"age": list(range(1, 51)) * 20})
    secret_rows = pd.DataFrame({"age": [SECRET] * 1000})
    inside, secret = root / f"inside.{fmt}", outside / f"secret.{fmt}"
    if fmt == "csv":
        inside_rows.to_csv(inside, index=False)
        secret_rows.to_csv(secret, index=False)
    else:
        inside_rows.to_parquet(inside, index=False)
        secret_rows.to_parquet(secret, index=False)
    name = root / f"swap.{fmt}"
    os.link(inside, name)
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    ctx = multiprocessing.get_context("spawn")
    started, stop = ctx.Event(), ctx.Event()
    swapper = ctx.Process(target=_swap, args=(str(name), str(inside), str(secret), started, stop), daemon=True)
    accepted, refused, leaked = 0, 0, []
    with Service(url, data_root=root) as svc, _registrar(svc, via) as register:
        swapper.start()
        assert started.wait(timeout=120)
        try:
            for i in range(TRIES):
                if accepted >= ACCEPTED:
                    break
                check = register(f"d{i}", f"swap.{fmt}")
                if check is None:
                    refused += 1
                    continue
                accepted += 1
                values = _values(url, f"d{i}", svc.dataset(f"d{i}").created_at)
                if SECRET in values or str(SECRET) in check:
                    leaked.append(f"d{i}")
        finally:
            stop.set()
            swapper.join(timeout=30)
    assert not leaked, f"{len(leaked)} of {accepted} registrations copied the file outside the data root"
    assert accepted > 0, f"every one of {refused} registrations was refused: the swap was never raced"


@contextlib.contextmanager
def _registrar(svc: Service, via: str) -> Iterator[Callable[[str, str], str | None]]:
    """Registers a dataset and returns its data check as text, or None when refused (as the
    curator is: 400 naming ``source``, or InvalidParameterError / InvalidDataError)."""
    if via == "service":

        def direct(dataset: str, source: str) -> str | None:
            try:
                return str(svc.register_dataset(dataset, source, META).check)
            except (InvalidParameterError, InvalidDataError):
                return None

        yield direct
        return
    import httpx

    from _live_server import live_server
    from dpkit.server import create_app

    _, key = svc.create_principal("carol", "curator")
    app = create_app(svc, rate=1e6, burst=1_000_000, address_rate=1e6, address_burst=1_000_000)
    with live_server(app) as base, httpx.Client(base_url=base, timeout=60) as client:

        def posted(dataset: str, source: str) -> str | None:
            body = {"name": dataset, "source": source, "metadata": META}
            r = client.post("/v1/datasets", json=body, headers={"Authorization": f"Bearer {key}"})
            if r.status_code == 400:
                assert r.json()["error"]["parameter"] == "source", r.text
                return None
            assert r.status_code == 201, r.text
            return json.dumps(r.json()["check"])

        yield posted
