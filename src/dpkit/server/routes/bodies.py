"""The base of every request body: unknown fields are refused, and no value is coerced
(``strict``: ``"1"`` is not an ε)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Body"]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
