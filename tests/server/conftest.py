"""The service's shared fixture: a fresh world (service, dataset, curator and analysts; see
``server/_api.py``) per test, closed after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Any]:
    # Imported here: the modules that use the fixture skip without FastAPI, the others need not.
    from server._api import make_world

    w = make_world(tmp_path)
    try:
        yield w
    finally:
        w.close()
