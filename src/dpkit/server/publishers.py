"""The analysts the curator names as publishers: the only principals who may store a release.

Publishing puts a table in front of every analyst granted its dataset and stores it in the
service's database, so it is a right the curator gives (``dpkit admin allow-publish NAME``, or
``POST /v1/publishers``) and takes back (``--revoke``, ``POST /v1/publishers/{name}/revoke``),
not something every granted analyst may do. Each change is written with its chained audit
entry (``allow_publish`` / ``revoke_publish``, by the curator who made it) in one transaction,
like a grant: the table and the log cannot disagree about who was named when. Taking the right
back stops new publications; releases already published stay.
"""

from __future__ import annotations

from typing import Any

from dpkit.errors import InvalidParameterError
from dpkit.server.audit_log import Chain, entry_fields
from dpkit.server.errors import NotFoundError
from dpkit.server.names import check_principal_name
from dpkit.server.principals import Principals
from dpkit.server.store import ServiceStore, now

__all__ = ["Publishers"]


class Publishers:
    """The ``publishers`` table of a service store; each change chained with ``chain``."""

    def __init__(self, store: ServiceStore, principals: Principals, *, chain: Chain) -> None:
        self._store = store
        self._principals = principals
        self._chain = chain

    def allow(self, name: object, *, actor: str | None = None, revoke: bool = False) -> bool:
        """Name the analyst ``name`` a publisher (``revoke``: no longer one); whether anything
        changed. The change and its entry commit together; an unchanged state is still chained
        (the curator's action is recorded either way)."""
        name = check_principal_name(name)
        role = self._principals.role(name)
        if role is None:
            raise NotFoundError(f"there is no analyst named {name!r}")
        if role != "analyst":
            raise InvalidParameterError("name", name, "an analyst (curators do not publish: they grant budgets)")
        with self._store.transaction(write=True) as tx:
            was = bool(tx.run("SELECT 1 FROM publishers WHERE name = ?", (name,)))
            if revoke and was:
                tx.run("DELETE FROM publishers WHERE name = ?", (name,))
            elif not revoke and not was:
                tx.run("INSERT INTO publishers (name, allowed_by, created_at) VALUES (?, ?, ?)", (name, actor, now()))
            changed = was == revoke
            if revoke:
                outcome = "revoked" if changed else "was not a publisher"
            else:
                outcome = "allowed" if changed else "already a publisher"
            self._chain(
                tx,
                [
                    entry_fields(
                        actor=actor,
                        action="revoke_publish" if revoke else "allow_publish",
                        status=200,
                        outcome=outcome,
                        detail={"publisher": name},
                    )
                ],
            )
        return changed

    def is_publisher(self, name: str) -> bool:
        with self._store.transaction() as tx:
            return bool(tx.run("SELECT 1 FROM publishers WHERE name = ?", (name,)))

    def listing(self) -> list[dict[str, Any]]:
        """Every publisher: name, who named them, when."""
        with self._store.transaction() as tx:
            rows = tx.run("SELECT name, allowed_by, created_at FROM publishers ORDER BY name")
        return [{"name": n, "allowed_by": by, "created_at": at} for n, by, at in rows]
