"""Principals and their API keys: who may call the service, in which role.

A *curator* registers datasets, creates analysts and grants budgets; an *analyst* queries the
datasets they were granted and sees only their own budgets and history. A key is shown once,
when it is made; the service table keeps only its hash (:mod:`dpkit.server.keys`), so a copy
of the database does not let anyone call the service. Keys are revoked, never deleted, and a
principal is never renamed or reused: the audit log's entries keep naming the same person.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from dpkit.errors import AuthError, InvalidParameterError
from dpkit.server.errors import NotFoundError
from dpkit.server.keys import KEY_ID, key_hash, key_id, looks_like_key, new_key
from dpkit.server.names import check_principal_name
from dpkit.server.store import ServiceStore, now

__all__ = ["Role", "Principal", "Principals"]

Role = Literal["curator", "analyst"]


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a curator or an analyst, and the id of the key they used."""

    name: str
    role: Role
    key_id: str | None = None


class Principals:
    """The ``principals`` and ``api_keys`` tables of one service store."""

    def __init__(self, store: ServiceStore) -> None:
        self._store = store

    def create(self, name: str, role: Role) -> tuple[Principal, str]:
        """Create a curator or analyst and its first key; the key is returned once and only its
        hash is stored."""
        check_principal_name(name)
        if role not in ("curator", "analyst"):
            raise InvalidParameterError("role", role, "'curator' or 'analyst'")
        key = new_key()
        with self._store.transaction(write=True) as tx:
            if tx.run("SELECT 1 FROM principals WHERE name = ?", (name,)):
                raise InvalidParameterError(
                    "name", name, "a name not already taken", "principals are never renamed or reused"
                )
            tx.run("INSERT INTO principals (name, role, created_at) VALUES (?, ?, ?)", (name, role, now()))
            tx.run(
                "INSERT INTO api_keys (key_id, key_hash, principal, created_at) VALUES (?, ?, ?, ?)",
                (key_id(key), key_hash(key), name, now()),
            )
        return Principal(name, role, key_id(key)), key

    def issue_key(self, name: str) -> str:
        """A new key for an existing principal (older keys stay valid until revoked)."""
        check_principal_name(name)
        key = new_key()
        with self._store.transaction(write=True) as tx:
            if not tx.run("SELECT 1 FROM principals WHERE name = ?", (name,)):
                raise NotFoundError(f"there is no principal named {name!r}")
            tx.run(
                "INSERT INTO api_keys (key_id, key_hash, principal, created_at) VALUES (?, ?, ?, ?)",
                (key_id(key), key_hash(key), name, now()),
            )
        return key

    def revoke_key(self, key_id: str) -> list[str]:
        """Revoke the key with id ``key_id`` (16 lower-case hex digits, as listed; never a
        principal's name): ``[key_id]``, or ``[]`` if it was already revoked."""
        if not isinstance(key_id, str) or not KEY_ID.fullmatch(key_id):
            raise InvalidParameterError("key_id", key_id, "a key id: 16 lower-case hex digits (see the key listing)")
        with self._store.transaction(write=True) as tx:
            rows = tx.run("SELECT revoked_at FROM api_keys WHERE key_id = ?", (key_id,))
            if not rows:
                raise NotFoundError(f"there is no key with id {key_id!r}")
            if rows[0][0] is not None:
                return []
            tx.run("UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", (now(), key_id))
        return [key_id]

    def revoke_principal(self, name: str) -> list[str]:
        """Revoke every key of the principal ``name``: the ids revoked now (``[]`` if all
        were already revoked)."""
        check_principal_name(name)
        stamp = now()
        with self._store.transaction(write=True) as tx:
            if not tx.run("SELECT 1 FROM principals WHERE name = ?", (name,)):
                raise NotFoundError(f"there is no principal named {name!r}")
            ids = [
                r[0]
                for r in tx.run(
                    "SELECT key_id FROM api_keys WHERE principal = ? AND revoked_at IS NULL ORDER BY key_id", (name,)
                )
            ]
            for kid in ids:
                tx.run("UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", (stamp, kid))
        return ids

    def authenticate(self, key: object) -> Principal:
        """The principal holding ``key``; :class:`~dpkit.errors.AuthError` for a missing,
        malformed, unknown or revoked key (the message does not say which)."""
        if not isinstance(key, str) or not looks_like_key(key):
            raise AuthError("a valid API key is required (Authorization: Bearer dpk_...)")
        with self._store.transaction() as tx:
            rows = tx.run(
                "SELECT p.name, p.role, k.key_id FROM api_keys k JOIN principals p ON p.name = k.principal "
                "WHERE k.key_hash = ? AND k.revoked_at IS NULL",
                (key_hash(key),),
            )
        if not rows:
            raise AuthError("a valid API key is required (this key is unknown or revoked)")
        name, role, kid = rows[0]
        return Principal(name, role, kid)

    def role(self, name: str) -> Role | None:
        """The role of the principal ``name``; None when there is none of that name."""
        with self._store.transaction() as tx:
            rows = tx.run("SELECT role FROM principals WHERE name = ?", (name,))
        return rows[0][0] if rows else None

    def listing(self) -> list[dict[str, Any]]:
        """Every principal with its keys' ids and states (never the keys)."""
        with self._store.transaction() as tx:
            people = tx.run("SELECT name, role, created_at FROM principals ORDER BY name")
            keys = tx.run("SELECT principal, key_id, created_at, revoked_at FROM api_keys ORDER BY created_at")
        out = {n: {"name": n, "role": r, "created_at": c, "keys": []} for n, r, c in people}
        for p, kid, c, rev in keys:
            if p in out:  # (a principal created between the two reads shows next time)
                out[p]["keys"].append({"id": kid, "created_at": c, "revoked_at": rev})
        return list(out.values())
