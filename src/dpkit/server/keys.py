"""API keys: random, high-entropy, shown once, stored only as a hash.

A key is ``dpk_`` followed by 32 random bytes from the OS CSPRNG (base64url, 43 characters):
256 bits, so a plain SHA-256 is the right way to store it — there is nothing to brute-force, and
a slow password hash would only slow every request down. The key's public *id* (the first 16 hex
digits of that hash) names it in listings, the audit log and ``revoke``; the key itself is never
stored, logged or shown again.

>>> key = new_key()
>>> key.startswith("dpk_") and len(key) == 47
True
>>> key_hash(key) == key_hash(key) and key_id(key) == key_hash(key)[:16]
True
"""

from __future__ import annotations

import hashlib
import re
import secrets

__all__ = ["new_key", "key_hash", "key_id", "looks_like_key", "KEY_ID"]

_PREFIX = "dpk_"
_SHAPE = re.compile(r"dpk_[A-Za-z0-9_-]{43}")
#: The shape of a key's public id: 16 lower-case hex digits (:func:`key_id`).
KEY_ID = re.compile(r"[0-9a-f]{16}")


def new_key() -> str:
    """A fresh API key (256 random bits)."""
    return _PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    """The stored form of a key: SHA-256, hex."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_id(key: str) -> str:
    """The key's public identifier."""
    return key_hash(key)[:16]


def looks_like_key(value: str) -> bool:
    """Whether ``value`` has the shape of a dpkit key (checked before touching the store)."""
    return bool(_SHAPE.fullmatch(value))
