"""Where random bits come from.

The default source is a CSPRNG: OpenSSL's ChaCha20 keystream (through ``cryptography``), keyed
with a fresh 256-bit key and a random 96-bit nonce from the operating system's entropy pool on
every request (and every 2^30 words within one). Fresh keys per request mean no generator state
lives in the process: there is nothing to fork, leak or reseed.

``cryptography`` takes ChaCha20's 16-byte "nonce" as OpenSSL's IV: a 32-bit little-endian block
counter followed by the 96-bit nonce of RFC 8439, and OpenSSL refuses to let that counter wrap.
The counter therefore always starts at 0 (never at a random value, which would make a request
fail with probability about blocks/2^32); at most 2^27 blocks are drawn per key.

A seeded :class:`numpy.random.Generator` may be passed explicitly as ``rng=`` for tests and
teaching; it is never the default, and it is not cryptographically secure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from numpy.typing import NDArray

from dpkit.errors import InvalidParameterError

__all__ = ["RandomSource", "SecureSource", "SeededSource", "resolve_rng", "is_seeded", "RNG"]

# ChaCha20 in OpenSSL counts 64-byte blocks with a 32-bit counter that starts at 0 here: 256 GiB
# per key. Requests are split far below that (2^30 words = 2^27 blocks) so it never wraps.
_MAX_WORDS_PER_KEY = 1 << 30
_COUNTER_START = bytes(4)  # the IV's first 4 bytes: the little-endian block counter, from 0
assert _MAX_WORDS_PER_KEY * 8 // 64 < 2**32


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
            # A fresh 256-bit key and 96-bit nonce per chunk; the counter starts at 0 so that
            # the chunk's m/8 <= 2^27 blocks cannot reach OpenSSL's 2^32 limit.
            key = os.urandom(32)
            iv = _COUNTER_START + os.urandom(12)
            enc = Cipher(algorithms.ChaCha20(key, iv), mode=None).encryptor()
            buf = out[done : done + m].data.cast("B")
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


def is_seeded(rng: object) -> bool:
    """True for any randomness but the default: a seeded generator, or any source other than
    :class:`SecureSource` itself. Such noise may be replayable, so it never meets a ledger."""
    return rng is not None and type(rng) is not SecureSource
