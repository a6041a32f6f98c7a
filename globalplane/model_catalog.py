"""The model catalog: what the mesh serves, at what price, for which tiers.

Prices are exact decimals. Where a model runs is not stored here but read
from whatever reports deployments (the region directory), so it is never
stale. Public methods are coroutines so a SQL-backed catalog can replace
this in-memory one without touching the servicers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import StrEnum

from globalplane.paging import Page, paginate
from globalplane.settings import GlobalSettings
from globalplane.tiers import TenantTier
from llmmesh.errors import InvalidArgument, NotFound, PermissionDenied, Reason

AUTO = "auto"
"""The model name that asks for the tenant tier's default."""

SIM_FAMILY = "llmmesh-sim"
"""Tokenizer and chat template family of the project's own small model and the simulator."""

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


class ModelTier(StrEnum):
    """A model's size class."""

    SMALL = "small"
    LARGE = "large"
    FRONTIER = "frontier"


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


class ModelCatalog:
    """Models by name; each tenant tier has at most one default model."""

    def __init__(self, models: Iterable[Model] = (), deployments: DeploymentSource = _no_deployments) -> None:
        self._models: dict[str, Model] = {}
        self._deployments = deployments
        for model in models:
            self._store(model)

    async def list_models(self, page_size: int = 0, page_token: str = "") -> Page[Model]:
        """Models ordered by name, with their current deployments."""
        page = paginate(self._models.values(), lambda m: m.name, page_size, page_token)
        return Page([self._deployed(m) for m in page.items], page.next_page_token)

    async def get_model(self, name: str) -> Model:
        """The model ``name``; NOT_FOUND ``UNKNOWN_MODEL`` otherwise."""
        model = self._models.get(name)
        if model is None:
            raise NotFound(Reason.UNKNOWN_MODEL, f"unknown model {name!r}", metadata={"model": name})
        return self._deployed(model)

    async def upsert_model(self, model: Model) -> Model:
        """Add or replace ``model`` after validating it.

        A tier it claims as default stops being the default of any other
        model, so "auto" stays unambiguous.
        """
        self._validate(model)
        self._store(model)
        return self._deployed(self._models[model.name])

    async def resolve(self, name: str, tenant_tier: TenantTier) -> Model:
        """The model a request for ``name`` means for a tenant of ``tenant_tier``.

        ``"auto"`` (or empty) is the tier's default. NOT_FOUND
        ``UNKNOWN_MODEL`` for an unknown name or a tier without default;
        PERMISSION_DENIED ``MODEL_NOT_ALLOWED`` when the model excludes the tier.
        """
        if name in ("", AUTO):
            chosen = next((m for m in self._models.values() if tenant_tier in m.default_for_tiers), None)
            if chosen is None:
                raise NotFound(
                    Reason.UNKNOWN_MODEL,
                    f"no default model for tier {tenant_tier.value!r}",
                    metadata={"model": AUTO, "tier": tenant_tier.value},
                )
            return self._deployed(chosen)
        model = await self.get_model(name)
        if not model.allows(tenant_tier):
            raise PermissionDenied(
                Reason.MODEL_NOT_ALLOWED,
                f"model {name!r} is not available to the {tenant_tier.value} tier",
                metadata={"model": name, "tier": tenant_tier.value},
            )
        return model

    def _validate(self, model: Model) -> None:
        if model.name == AUTO or not _MODEL_NAME.match(model.name):
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"invalid model name {model.name!r} ('auto' is reserved)",
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
        if model.allowed_tiers and not model.default_for_tiers <= model.allowed_tiers:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                "default_for_tiers must be a subset of allowed_tiers",
                metadata={"param": "default_for_tiers"},
            )

    def _store(self, model: Model) -> None:
        for other in list(self._models.values()):
            if other.name != model.name and other.default_for_tiers & model.default_for_tiers:
                self._models[other.name] = dataclasses.replace(
                    other, default_for_tiers=other.default_for_tiers - model.default_for_tiers
                )
        self._models[model.name] = dataclasses.replace(model, deployments=())

    def _deployed(self, model: Model) -> Model:
        return dataclasses.replace(model, deployments=tuple(self._deployments(model.name)))
