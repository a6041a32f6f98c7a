"""The model catalog: what the mesh serves, at what price, for which tiers.

Backed by the global store. Prices are exact decimals with a history: a
price change adds a revision, so costs billed earlier stay explained. Where a
model runs is not stored but read from whatever reports deployments (the
region directory), so it is never stale.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, Reason
from llmmesh.globalplane import schema
from llmmesh.globalplane.clock import Clock, utc_now
from llmmesh.globalplane.model_fleet_rules import require_consistent, require_fleet_fields
from llmmesh.globalplane.paging import Page, page_of, page_window
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.globalplane.store import GlobalStore
from llmmesh.globalplane.tiers import TenantTier

R = TypeVar("R")

AUTO = "auto"
"""The model name that asks for the tenant tier's default."""

SIM_FAMILY = "llmmesh-sim"
"""Tokenizer and chat template family of the project's own small model and the simulator."""

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_NAME_RULE = "1 to 128 letters, digits and . _ : / -, the first a letter or digit"


def _shown(name: str) -> str:
    """``name`` quoted for a message, cut short: an error echoing a huge
    name would outgrow the metadata limits of the status that carries it."""
    return repr(name if len(name) <= 64 else name[:64] + "...")


def require_model_name(name: str, param: str = "name") -> str:
    """``name`` if it could name a model; INVALID_ARGUMENT otherwise."""
    if not _MODEL_NAME.match(name):
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"{_shown(name)} cannot be a model name: a name is {_NAME_RULE}",
            metadata={"param": param},
        )
    return name


class ModelTier(StrEnum):
    """A model's size class."""

    SMALL = "small"
    LARGE = "large"
    FRONTIER = "frontier"


class ModelKind(StrEnum):
    """What a model is for: chat (text generation) or embedding."""

    CHAT = "chat"
    EMBEDDING = "embedding"


@dataclass(frozen=True)
class ModelDeployment:
    """A model served in one region by ``engine_pods`` pods."""

    region: str
    engine_pods: int


@dataclass(frozen=True)
class Model:
    """A servable model. ``deployments`` is filled when the catalog hands a model out."""

    name: str
    tier: ModelTier
    context_window: int
    input_per_1k_usd: Decimal
    output_per_1k_usd: Decimal
    tokenizer_family: str = SIM_FAMILY
    chat_template_family: str = SIM_FAMILY
    default_for_tiers: frozenset[TenantTier] = frozenset()
    """Tenant tiers whose "auto" resolves to this model."""
    allowed_tiers: frozenset[TenantTier] = frozenset()
    """Tenant tiers that may use it; empty means all."""
    deployments: tuple[ModelDeployment, ...] = ()
    retired: bool = False
    """Listed but no longer served; no tier's default."""
    canary_of: str = ""
    """The model this one is a canary of (a new version taking a share of its turns)."""
    canary_percent: int = 0
    """Percent of ``canary_of``'s turns this canary takes, 0 to 100."""
    canaries: tuple[tuple[str, int], ...] = ()
    """Live canaries of this model and their percents, filled when the catalog hands it out."""
    kind: ModelKind = ModelKind.CHAT
    """The endpoints that may use it: chat ones or embedding ones."""

    def allows(self, tier: TenantTier) -> bool:
        """Whether tenants of ``tier`` may use this model."""
        return not self.allowed_tiers or tier in self.allowed_tiers


def parse_price(text: str, param: str) -> Decimal:
    """A price given as a decimal string; INVALID_ARGUMENT unless finite and >= 0."""
    try:
        price = Decimal(text.strip())
    except InvalidOperation:
        price = Decimal("NaN")
    if not price.is_finite() or price < 0:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, f"{param} must be a decimal >= 0, got {text!r}", metadata={"param": param}
        )
    return price


def default_model(settings: GlobalSettings) -> Model:
    """The model every mesh starts with, from ``settings``: small, default for every tier."""
    return Model(
        name=settings.default_model,
        tier=ModelTier.SMALL,
        context_window=settings.default_model_context_window,
        input_per_1k_usd=parse_price(
            settings.default_model_input_per_1k_usd, "default_model_input_per_1k_usd"
        ),
        output_per_1k_usd=parse_price(
            settings.default_model_output_per_1k_usd, "default_model_output_per_1k_usd"
        ),
        default_for_tiers=frozenset(TenantTier),
    )


DeploymentSource = Callable[[str], Sequence[ModelDeployment]]
"""Where a model (by name) is deployed right now."""


def _no_deployments(_model: str) -> Sequence[ModelDeployment]:
    return ()


def _priced_models() -> sa.Select[Any]:
    """Models joined with their current (highest-revision) price."""
    m, p = schema.models, schema.model_prices
    latest = sa.select(p.c.model, sa.func.max(p.c.revision).label("revision")).group_by(p.c.model).subquery()
    return (
        sa.select(m, p.c.input_per_1k_usd, p.c.output_per_1k_usd, p.c.revision)
        .join(latest, latest.c.model == m.c.name)
        .join(p, sa.and_(p.c.model == latest.c.model, p.c.revision == latest.c.revision))
    )


def _model_of(row: sa.Row[Any]) -> Model:
    return Model(
        name=row.name,
        tier=ModelTier(row.tier),
        context_window=row.context_window,
        input_per_1k_usd=row.input_per_1k_usd,
        output_per_1k_usd=row.output_per_1k_usd,
        tokenizer_family=row.tokenizer_family,
        chat_template_family=row.chat_template_family,
        default_for_tiers=frozenset(TenantTier(t) for t in row.default_for_tiers),
        allowed_tiers=frozenset(TenantTier(t) for t in row.allowed_tiers),
        retired=bool(row.retired),
        canary_of=row.canary_of or "",
        canary_percent=row.canary_percent or 0,
        kind=ModelKind(schema.stored_kind(row.kind)),
    )


def _with_canaries(conn: Connection, model: Model) -> Model:
    """``model`` with its live canaries, by name."""
    m = schema.models
    rows = conn.execute(
        sa.select(m.c.name, m.c.canary_percent, m.c.retired)
        .where(m.c.canary_of == model.name)
        .order_by(m.c.name)
    ).all()
    canaries = tuple((r.name, r.canary_percent or 0) for r in rows if not r.retired and r.canary_percent)
    return dataclasses.replace(model, canaries=canaries)


def _tiers(tiers: frozenset[TenantTier]) -> list[str]:
    return sorted(t.value for t in tiers)


def find_model(conn: Connection, name: str) -> Model:
    """The model ``name`` at its current price; NOT_FOUND ``UNKNOWN_MODEL`` otherwise."""
    row = conn.execute(_priced_models().where(schema.models.c.name == name)).first()
    if row is None:
        raise NotFound(Reason.UNKNOWN_MODEL, f"unknown model {_shown(name)}", metadata={"model": name[:128]})
    return _with_canaries(conn, _model_of(row))


def _described(model: Model) -> list[object]:
    """``model``'s stored fields in a fixed order, sets sorted (what :meth:`ModelCatalog.version` hashes)."""
    return [
        model.name,
        model.tier.value,
        model.context_window,
        str(model.input_per_1k_usd),
        str(model.output_per_1k_usd),
        model.tokenizer_family,
        model.chat_template_family,
        sorted(t.value for t in model.default_for_tiers),
        sorted(t.value for t in model.allowed_tiers),
        model.retired,
        model.canary_of,
        model.canary_percent,
        model.kind.value,
    ]


def _store_model(conn: Connection, model: Model, now: datetime) -> None:
    """Insert or replace ``model``, taking its default tiers from other models.

    A changed (or first) price becomes a new price revision.
    """
    m, p = schema.models, schema.model_prices
    for other in conn.execute(_priced_models().where(m.c.name != model.name)).all():
        claimed = _model_of(other).default_for_tiers
        if claimed & model.default_for_tiers:
            conn.execute(
                sa.update(m)
                .where(m.c.name == other.name)
                .values(default_for_tiers=_tiers(claimed - model.default_for_tiers))
            )
    values = {
        "tier": model.tier.value,
        "context_window": model.context_window,
        "tokenizer_family": model.tokenizer_family,
        "chat_template_family": model.chat_template_family,
        "default_for_tiers": _tiers(model.default_for_tiers),
        "allowed_tiers": _tiers(model.allowed_tiers),
        "retired": model.retired,
        "canary_of": model.canary_of or None,
        "canary_percent": model.canary_percent or None,
        "kind": model.kind.value,
    }
    current = conn.execute(_priced_models().where(m.c.name == model.name)).first()
    if current is None:
        conn.execute(sa.insert(m).values(name=model.name, **values))
        revision = 1
    else:
        conn.execute(sa.update(m).where(m.c.name == model.name).values(**values))
        prices = (current.input_per_1k_usd, current.output_per_1k_usd)
        if prices == (model.input_per_1k_usd, model.output_per_1k_usd):
            return
        revision = current.revision + 1
    conn.execute(
        sa.insert(p).values(
            model=model.name,
            revision=revision,
            input_per_1k_usd=model.input_per_1k_usd,
            output_per_1k_usd=model.output_per_1k_usd,
            effective_time=now,
        )
    )


class ModelCatalog:
    """Models by name; each tenant tier has at most one default model."""

    def __init__(
        self, store: GlobalStore, deployments: DeploymentSource = _no_deployments, clock: Clock = utc_now
    ) -> None:
        self._store = store
        self._deployments = deployments
        self._clock = clock

    async def add_missing(self, models: Iterable[Model]) -> None:
        """Add those of ``models`` the catalog lacks; models it has keep their
        stored definition, except that one stored before models had a kind
        takes the kind given here."""
        wanted = list(models)
        for model in wanted:
            self._validate(model)
        now = self._clock()

        def add(conn: Connection) -> None:
            m = schema.models
            for model in wanted:
                stored = conn.execute(sa.select(m.c.name, m.c.kind).where(m.c.name == model.name)).first()
                if stored is None:
                    _store_model(conn, model, now)
                elif stored.kind is None:
                    conn.execute(sa.update(m).where(m.c.name == model.name).values(kind=model.kind.value))

        await self._transaction_retrying_races(add)

    async def list_models(self, page_size: int = 0, page_token: str = "") -> Page[Model]:
        """Models ordered by name, with their current deployments."""
        after, size = page_window(page_size, page_token)
        query = _priced_models().order_by(schema.models.c.name).limit(size + 1)
        if after is not None:
            query = query.where(schema.models.c.name > after)

        def read(conn: Connection) -> list[Model]:
            return [_with_canaries(conn, _model_of(r)) for r in conn.execute(query).all()]

        page = page_of(await self._store.transaction(read), lambda m: m.name, size)
        return Page([self._deployed(m) for m in page.items], page.next_page_token)

    async def version(self) -> str:
        """A fingerprint of what the catalog says of every model (current
        prices included): it changes whenever the catalog does, and is the
        same on every global plane over one store. Regions compare it in
        heartbeat answers to forget cached registry answers at once."""

        def read(conn: Connection) -> list[Model]:
            return [_model_of(r) for r in conn.execute(_priced_models().order_by(schema.models.c.name))]

        digest = hashlib.sha256()
        for model in await self._store.transaction(read):
            digest.update(json.dumps(_described(model)).encode())
        return digest.hexdigest()[:16]

    async def get_model(self, name: str) -> Model:
        """The model ``name``; NOT_FOUND ``UNKNOWN_MODEL`` otherwise, and
        INVALID_ARGUMENT for a name no model could have."""
        require_model_name(name)
        return self._deployed(await self._store.transaction(lambda conn: find_model(conn, name)))

    async def upsert_model(self, model: Model) -> Model:
        """Add or replace ``model`` after validating it.

        A tier it claims as default stops being the default of any other
        model, so "auto" stays unambiguous. A changed price becomes a new
        price revision.
        """
        self._validate(model)
        now = self._clock()

        def upsert(conn: Connection) -> Model:
            require_consistent(conn, model)
            _store_model(conn, model, now)
            return find_model(conn, model.name)

        return self._deployed(await self._transaction_retrying_races(upsert))

    async def resolve(self, name: str, tenant_tier: TenantTier) -> Model:
        """The model a request for ``name`` means for a tenant of ``tenant_tier``.

        ``"auto"`` (or empty) is the tier's default. NOT_FOUND
        ``UNKNOWN_MODEL`` for an unknown name or a tier without default;
        PERMISSION_DENIED ``MODEL_NOT_ALLOWED`` when the model excludes the
        tier; INVALID_ARGUMENT for a name no model could have.
        """
        if name in ("", AUTO):
            # Catalogs are small; JSON containment differs per database, so filter here.
            rows = await self._store.transaction(lambda conn: conn.execute(_priced_models()).all())
            chosen = next(
                (m for m in map(_model_of, rows) if tenant_tier in m.default_for_tiers and not m.retired),
                None,
            )
            if chosen is None:
                raise NotFound(
                    Reason.UNKNOWN_MODEL,
                    f"no default model for tier {tenant_tier.value!r}",
                    metadata={"model": AUTO, "tier": tenant_tier.value},
                )
            default = chosen
            return self._deployed(await self._store.transaction(lambda conn: _with_canaries(conn, default)))
        model = await self.get_model(name)
        if model.retired:
            raise FailedPrecondition(
                Reason.MODEL_RETIRED,
                f"model {name!r} is retired",
                metadata={"model": name, "param": "model"},
            )
        if not model.allows(tenant_tier):
            raise PermissionDenied(
                Reason.MODEL_NOT_ALLOWED,
                f"model {name!r} is not available to the {tenant_tier.value} tier",
                metadata={"model": name, "tier": tenant_tier.value},
            )
        return model

    async def _transaction_retrying_races(self, work: Callable[[Connection], R]) -> R:
        # Two first-time upserts of one model race on its primary key; the
        # loser retries and then finds the row.
        try:
            return await self._store.transaction(work)
        except sa.exc.IntegrityError:
            return await self._store.transaction(work)

    def _validate(self, model: Model) -> None:
        require_model_name(model.name)
        if model.name == AUTO:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                "'auto' is reserved: no model can be named so",
                metadata={"param": "name"},
            )
        if model.context_window <= 0:
            raise InvalidArgument(
                Reason.INVALID_REQUEST, "context_window must be > 0", metadata={"param": "context_window"}
            )
        for param, price in (
            ("pricing.input_per_1k_usd", model.input_per_1k_usd),
            ("pricing.output_per_1k_usd", model.output_per_1k_usd),
        ):
            parse_price(str(price), param)
        require_fleet_fields(model)
        if model.kind is ModelKind.EMBEDDING and model.default_for_tiers:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                'an embedding model cannot be a tier\'s default: "auto" names a chat model',
                metadata={"param": "default_for_tiers"},
            )
        if model.allowed_tiers and not model.default_for_tiers <= model.allowed_tiers:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                "default_for_tiers must be a subset of allowed_tiers",
                metadata={"param": "default_for_tiers"},
            )

    def _deployed(self, model: Model) -> Model:
        return dataclasses.replace(model, deployments=tuple(self._deployments(model.name)))
