"""Where random bits come from.

The default source is a CSPRNG: OpenSSL's ChaCha20 keystream (through ``cryptography``), keyed
with a fresh 256-bit key and nonce from the operating system's entropy pool on every request.
Fresh keys per request mean no generator state lives in the process: there is nothing to fork,
leak or reseed. A seeded :class:`numpy.random.Generator` may be passed explicitly as ``rng=`` for
tests and teaching; it is never the default, and it is not cryptographically secure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from numpy.typing import NDArray

from dpkit.errors import InvalidParameterError

__all__ = ["RandomSource", "SecureSource", "SeededSource", "resolve_rng", "RNG"]

# ChaCha20 in OpenSSL counts 64-byte blocks with a 32-bit counter: 256 GiB per key. Requests are
# split well below that so the counter never wraps.
_MAX_WORDS_PER_KEY = 1 << 30


@runtime_checkable
class RandomSource(Protocol):
    """Anything that can hand out uniformly random 64-bit words."""

    def words(self, n: int) -> NDArray[np.uint64]:
        """Return ``n`` independent uniform words in [0, 2**64)."""
        ...


@dataclass(frozen=True)
class SecureSource:
    """Cryptographically secure words: ChaCha20 keystream keyed from ``os.urandom``."""

    def words(self, n: int) -> NDArray[np.uint64]:
        out = np.empty(n, dtype=np.uint64)
        done = 0
        while done < n:
            m = min(n - done, _MAX_WORDS_PER_KEY)
            key, nonce = os.urandom(32), os.urandom(16)
            enc = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
            buf = memoryview(out[done : done + m]).cast("B")
            # Encrypting zeros yields the raw keystream; written straight into the output array.
            enc.update_into(bytes(8 * m), buf) if m else None
            done += m
        return out


@dataclass(frozen=True)
class SeededSource:
    """Reproducible, *insecure* words from a seeded numpy Generator (tests and teaching only)."""

    generator: np.random.Generator

    def words(self, n: int) -> NDArray[np.uint64]:
        return self.generator.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)


RNG = RandomSource | np.random.Generator | None


def resolve_rng(rng: object) -> RandomSource:
    """``None`` → the secure default; a numpy ``Generator`` → a seeded source; a source → itself."""
    if rng is None:
        return SecureSource()
    if isinstance(rng, np.random.Generator):
        return SeededSource(rng)
    if isinstance(rng, RandomSource):
        return rng
    raise InvalidParameterError(
        "rng", rng, "None (secure default), a numpy.random.Generator (tests only) or a RandomSource"
    )
