"""The bit sources: secure by default, reproducible only when asked."""

from __future__ import annotations

import numpy as np
import pytest

from dpkit.errors import InvalidParameterError
from dpkit.noise import SecureSource, SeededSource, resolve_rng


def test_default_is_the_secure_source() -> None:
    assert isinstance(resolve_rng(None), SecureSource)


def test_secure_words_are_fresh_and_balanced() -> None:
    src = SecureSource()
    a, b = src.words(100_000), src.words(100_000)
    assert a.dtype == np.uint64 and a.shape == (100_000,)
    assert not np.array_equal(a, b)
    # Every one of the 64 bit positions is set about half the time: 6.4M bits per position test;
    # a 6-sigma band fails by chance with probability ~64 * 2e-9.
    bits = np.unpackbits(a.view(np.uint8)).reshape(-1, 64).mean(axis=0)
    assert np.all(np.abs(bits - 0.5) < 6 * 0.5 / np.sqrt(a.size))


def test_large_requests_are_split_across_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    import dpkit.noise.source as source

    monkeypatch.setattr(source, "_MAX_WORDS_PER_KEY", 1000)
    w = SecureSource().words(2500)
    assert w.shape == (2500,)
    # distinct keys: the three segments are unrelated, and none is all zeros
    assert all(np.any(w[i : i + 1000]) for i in (0, 1000, 2000))


def test_seeded_source_is_reproducible() -> None:
    a = resolve_rng(np.random.default_rng(5)).words(10)
    b = resolve_rng(np.random.default_rng(5)).words(10)
    assert np.array_equal(a, b)
    assert isinstance(resolve_rng(np.random.default_rng(5)), SeededSource)


def test_a_source_passes_through() -> None:
    src = SecureSource()
    assert resolve_rng(src) is src


@pytest.mark.parametrize("bad", [42, "secure", np.random.RandomState(0), 1.5])
def test_other_rng_values_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidParameterError, match="rng"):
        resolve_rng(bad)
