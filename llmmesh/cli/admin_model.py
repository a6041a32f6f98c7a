"""``llmmesh admin model``: list, register, price, retire and weight models,
through the model registry's gRPC API (``ModelRegistryService``).

Every change is an ``UpsertModel`` of the whole model as the registry last
returned it with one thing changed, so the global plane checks and audits
it like any other operator change. ``register`` adds a model the registry
does not know; ``price`` records a new price revision (earlier turns keep
the price they were billed at); ``retire`` takes a model out of service
(``--undo`` brings it back); ``weight`` makes a model a canary of another,
taking a percent of the turns that resolve to it (0 stops it).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import grpc.aio

from llmmesh.cli.admin_output import _TIER_NAMES, _TIERS, CALL_TIMEOUT_S, AdminError, _as_dict, _table
from llmmesh.core.pages import collect_pages
from llmmesh.v1 import common_pb2, model_registry_service_pb2_grpc
from llmmesh.v1 import model_registry_service_pb2 as mpb

MODEL_TIERS = {
    "small": mpb.MODEL_TIER_SMALL,
    "large": mpb.MODEL_TIER_LARGE,
    "frontier": mpb.MODEL_TIER_FRONTIER,
}
_MODEL_TIER_NAMES = {v: k for k, v in MODEL_TIERS.items()}
MODEL_KINDS = {"chat": mpb.MODEL_KIND_CHAT, "embedding": mpb.MODEL_KIND_EMBEDDING}
# A model stored before models had a kind is a chat model.
_MODEL_KIND_NAMES = {v: k for k, v in MODEL_KINDS.items()} | {mpb.MODEL_KIND_UNSPECIFIED: "chat"}


def _tenant_tiers(text: str) -> list[common_pb2.Tier.ValueType]:
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in _TIERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown tier {unknown[0]!r}; expected a comma-separated list of {', '.join(_TIERS)}"
        )
    return [_TIERS[n] for n in names]


def _percent(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"a percent is a whole number from 0 to 100, got {text!r}")
    return value


def model_rows(models: Sequence[mpb.Model]) -> str:
    """Models as the table ``list`` and every change print."""
    rows = [
        (
            m.name,
            _MODEL_KIND_NAMES.get(m.kind, "?"),
            _MODEL_TIER_NAMES.get(m.tier, "?"),
            m.pricing.input_per_1k_usd,
            m.pricing.output_per_1k_usd,
            m.context_window,
            ",".join(_TIER_NAMES.get(t, "?") for t in m.default_for_tiers) or "-",
            "retired" if m.retired else "live",
            f"{m.canary_percent}% of {m.canary_of}" if m.canary_of else "-",
            ",".join(f"{d.region}:{d.engine_pods}" for d in m.deployments) or "-",
        )
        for m in models
    ]
    headers = (
        "NAME",
        "KIND",
        "TIER",
        "IN/1K USD",
        "OUT/1K USD",
        "WINDOW",
        "DEFAULT FOR",
        "STATE",
        "CANARY",
        "REGIONS",
    )
    return _table(headers, rows)


def _stub(channel: grpc.aio.Channel) -> model_registry_service_pb2_grpc.ModelRegistryServiceStub:
    return model_registry_service_pb2_grpc.ModelRegistryServiceStub(channel)


async def _upsert(channel: grpc.aio.Channel, model: mpb.Model, args: argparse.Namespace) -> Any:
    stored = (
        await _stub(channel).UpsertModel(mpb.UpsertModelRequest(model=model), timeout=CALL_TIMEOUT_S)
    ).model
    if not args.json:
        print(model_rows([stored]))
    return _as_dict(stored)


async def _current(channel: grpc.aio.Channel, name: str) -> mpb.Model:
    response = await _stub(channel).GetModel(mpb.GetModelRequest(name=name), timeout=CALL_TIMEOUT_S)
    model = mpb.Model()
    model.CopyFrom(response.model)
    return model


async def _list(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    stub = _stub(channel)

    async def fetch(token: str) -> tuple[Sequence[mpb.Model], str]:
        page = await stub.ListModels(
            mpb.ListModelsRequest(page_size=500, page_token=token), timeout=CALL_TIMEOUT_S
        )
        return page.models, page.next_page_token

    models = await collect_pages(fetch)
    if not args.json:
        print(model_rows(models) if models else "no models")
    return [_as_dict(m) for m in models]


async def _register(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    try:
        await _current(channel, args.name)
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.NOT_FOUND:
            raise
    else:
        raise AdminError(
            f"model {args.name!r} is registered already; change it with price, weight or retire",
            "MODEL_EXISTS",
            2,
        )
    model = mpb.Model(
        name=args.name,
        tier=MODEL_TIERS[args.tier],
        context_window=args.context_window,
        pricing=mpb.ModelPricing(input_per_1k_usd=args.input_price, output_per_1k_usd=args.output_price),
        tokenizer_family=args.family,
        chat_template_family=args.family,
        default_for_tiers=args.default_for,
        allowed_tiers=args.allowed_tiers,
        kind=MODEL_KINDS[args.kind],
    )
    return await _upsert(channel, model, args)


async def _price(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    model = await _current(channel, args.name)
    model.pricing.input_per_1k_usd = args.input_price
    model.pricing.output_per_1k_usd = args.output_price
    return await _upsert(channel, model, args)


async def _retire(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    model = await _current(channel, args.name)
    model.retired = not args.undo
    return await _upsert(channel, model, args)


async def _weight(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    model = await _current(channel, args.name)
    model.canary_of = args.canary_of if args.percent else ""
    model.canary_percent = args.percent
    return await _upsert(channel, model, args)


def add_model_arguments(groups: Any, common: argparse.ArgumentParser) -> None:
    """Add ``admin model ACTION`` to the admin ``groups`` (subparsers), each with ``common``'s flags."""
    actions = groups.add_parser(
        "model", help="list, register, price, retire and weight models"
    ).add_subparsers(dest="model_action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=[common], help="the registry's models")
    listing.set_defaults(admin_command=_list)

    register = actions.add_parser("register", parents=[common], help="add a model the registry does not know")
    register.add_argument("name", help="the name clients ask for, like llmmesh-large")
    register.add_argument("--tier", required=True, choices=sorted(MODEL_TIERS), help="size class")
    register.add_argument(
        "--kind", default="chat", choices=sorted(MODEL_KINDS), help="what it serves: chat turns or embeddings"
    )
    register.add_argument("--input-price", required=True, help="USD per 1,000 input tokens, a decimal")
    register.add_argument("--output-price", required=True, help="USD per 1,000 output tokens, a decimal")
    register.add_argument("--context-window", type=int, default=4096, help="most tokens of prompt and output")
    register.add_argument("--family", default="llmmesh-sim", help="tokenizer and chat template family")
    register.add_argument(
        "--default-for", type=_tenant_tiers, default=[], help="tenant tiers whose auto resolves to it"
    )
    register.add_argument(
        "--allowed-tiers", type=_tenant_tiers, default=[], help="tenant tiers that may use it; empty: all"
    )
    register.set_defaults(admin_command=_register)

    price = actions.add_parser("price", parents=[common], help="set a model's prices (a new price revision)")
    price.add_argument("name", help="the model")
    price.add_argument("--input-price", required=True, help="USD per 1,000 input tokens, a decimal")
    price.add_argument("--output-price", required=True, help="USD per 1,000 output tokens, a decimal")
    price.set_defaults(admin_command=_price)

    retire = actions.add_parser("retire", parents=[common], help="take a model out of service")
    retire.add_argument("name", help="the model")
    retire.add_argument("--undo", action="store_true", help="bring a retired model back into service")
    retire.set_defaults(admin_command=_retire)

    weight = actions.add_parser(
        "weight", parents=[common], help="make a model a canary taking a percent of another model's turns"
    )
    weight.add_argument("name", help="the canary (a new version)")
    weight.add_argument("--canary-of", required=True, help="the model whose turns it shares")
    weight.add_argument("--percent", required=True, type=_percent, help="its share, 0 to 100; 0 ends it")
    weight.set_defaults(admin_command=_weight)
