"""The secure source never fails at random: ChaCha20's block counter starts at 0 under every key.

``cryptography`` passes ChaCha20's 16-byte nonce to OpenSSL as a 32-bit little-endian block counter
followed by a 96-bit nonce, and OpenSSL raises ValueError rather than let the counter wrap. Before
the fix all 16 bytes were random, so a request of w words failed with probability about
(w/8)/2^32. These tests pin the random bytes so that the old layout would have started the
counter at 0xFFFFFFF0 (16 blocks from the end), and check the words against the keystream
computed independently with ``cryptography``.
"""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

import dpkit.noise.source as source
from dpkit.noise.source import SecureSource

KEY = bytes(range(32))
# The first 4 bytes are what the old layout took as the block counter: 0xFFFFFFF0 little-endian.
HOSTILE = b"\xf0\xff\xff\xff" + bytes(range(100, 112))


class FakeUrandom:
    """Deterministic stand-in for os.urandom: keys are KEY (then KEY with a changed last byte, so
    successive keys differ), every other request is a prefix of HOSTILE."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, n: int) -> bytes:
        self.calls.append(n)
        if n == 32:
            return KEY[:31] + bytes([len(self.calls)])
        return HOSTILE[:n]


def keystream(key: bytes, iv: bytes, n_words: int) -> np.ndarray:
    """ChaCha20 keystream words for (key, 16-byte iv), straight from ``cryptography``."""
    enc = Cipher(algorithms.ChaCha20(key, iv), mode=None).encryptor()
    return np.frombuffer(enc.update(bytes(8 * n_words)), dtype=np.uint64)


def test_hostile_random_bytes_would_have_overflowed_the_old_layout() -> None:
    # The power check: with the old 16 random bytes the counter starts 16 blocks (128 words) from
    # the end, so 1000 words raise. The new layout must not use these bytes as the counter.
    with pytest.raises(ValueError):
        keystream(KEY, HOSTILE, 1000)


def test_counter_starts_at_zero_whatever_the_random_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeUrandom()
    monkeypatch.setattr(source.os, "urandom", fake)
    words = SecureSource().words(1000)  # raised ValueError with the old layout
    assert fake.calls == [32, 12]  # a 256-bit key and a 96-bit nonce, nothing else
    key = KEY[:31] + bytes([1])
    expected = keystream(key, bytes(4) + HOSTILE[:12], 1000)  # counter 0, then the random nonce
    assert np.array_equal(words, expected)


def test_every_chunk_gets_a_fresh_key_and_a_zero_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeUrandom()
    monkeypatch.setattr(source.os, "urandom", fake)
    monkeypatch.setattr(source, "_MAX_WORDS_PER_KEY", 1000)
    words = SecureSource().words(2500)
    assert fake.calls == [32, 12] * 3
    iv = bytes(4) + HOSTILE[:12]
    parts = [keystream(KEY[:31] + bytes([2 * i + 1]), iv, m) for i, m in enumerate((1000, 1000, 500))]
    assert np.array_equal(words, np.concatenate(parts))


def test_chunk_limit_keeps_the_counter_far_from_wrapping() -> None:
    blocks_per_key = source._MAX_WORDS_PER_KEY * 8 // 64
    assert blocks_per_key <= 2**27 < 2**32
