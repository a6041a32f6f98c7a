"""What the catalog requires of a model's fleet fields: retirement and canaries.

A canary is a new version of a model taking a share of the turns that
resolve to it; the shares of one model's canaries add up to at most 100. A
retired model is kept (its prices explain costs billed earlier) but never
served, so it cannot be a tier's default nor have a canary pointed at it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.errors import FailedPrecondition, InvalidArgument, Reason
from llmmesh.globalplane import schema

if TYPE_CHECKING:
    from llmmesh.globalplane.model_catalog import Model


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def require_fleet_fields(model: Model) -> None:
    """INVALID_ARGUMENT for fleet fields that contradict each other on their own."""
    if not 0 <= model.canary_percent <= 100:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"canary_percent must be from 0 to 100, got {model.canary_percent}",
            metadata={"param": "canary_percent"},
        )
    if model.canary_percent and not model.canary_of:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            "canary_percent needs canary_of: the model whose turns the canary shares",
            metadata={"param": "canary_of"},
        )
    if model.canary_of == model.name:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, "a model cannot be a canary of itself", metadata={"param": "canary_of"}
        )
    if model.retired and model.default_for_tiers:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"model {model.name!r} is the default of tiers "
            f"{', '.join(sorted(t.value for t in model.default_for_tiers))}: make another model their "
            "default before retiring it",
            metadata={"param": "retired"},
        )


def require_consistent(conn: Connection, model: Model) -> None:
    """FAILED_PRECONDITION unless ``model``'s canary relation fits the stored catalog."""
    m = schema.models
    if model.canary_of:
        target = conn.execute(
            sa.select(m.c.name, m.c.retired, m.c.canary_of, m.c.kind).where(m.c.name == model.canary_of)
        ).first()
        if target is None or target.retired or target.canary_of:
            what = "unknown" if target is None else "retired" if target.retired else "itself a canary"
            raise FailedPrecondition(
                Reason.INVALID_REQUEST,
                f"canary_of names {model.canary_of!r}, which is {what}",
                metadata={"param": "canary_of"},
            )
        kind = schema.stored_kind(target.kind)
        if kind != model.kind.value:
            raise FailedPrecondition(
                Reason.INVALID_REQUEST,
                f"canary_of names {model.canary_of!r}, {_a(kind)} model; "
                f"this one is {_a(model.kind.value)} model",
                metadata={"param": "kind"},
            )
        others = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(m.c.canary_percent), 0)).where(
                m.c.canary_of == model.canary_of, m.c.name != model.name, sa.not_(m.c.retired.is_(True))
            )
        ).scalar_one()
        if int(others) + model.canary_percent > 100:
            raise FailedPrecondition(
                Reason.INVALID_REQUEST,
                f"the canaries of {model.canary_of!r} would take {int(others) + model.canary_percent}% "
                "of its turns; at most 100",
                metadata={"param": "canary_percent"},
            )
    has_canaries = conn.execute(
        sa.select(m.c.name).where(m.c.canary_of == model.name, sa.not_(m.c.retired.is_(True))).limit(1)
    ).first()
    if has_canaries is not None and (model.canary_of or model.retired):
        raise FailedPrecondition(
            Reason.INVALID_REQUEST,
            f"model {model.name!r} has canary {has_canaries.name!r}: retire or promote it first",
            metadata={"param": "canary_of" if model.canary_of else "retired"},
        )
