"""Test-wide fixtures."""

from __future__ import annotations

import mpmath
import pytest


@pytest.fixture(autouse=True)
def _mpmath_precision(request: pytest.FixtureRequest):
    """Each test gets the mpmath precision its module asks for (``MP_PREC``, in bits), restored
    afterwards: mpmath's precision is process-global, and modules sharing a worker must not
    inherit each other's settings."""
    with mpmath.workprec(getattr(request.module, "MP_PREC", 200)):
        yield


# ``pg_url``: a fresh PostgreSQL schema per test (skips when no server can be started).
import _postgres  # noqa: E402

pg_url = _postgres.pg_url
