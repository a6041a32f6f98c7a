"""What ``llmmesh up`` does for a model fleet: each pod's model and its
per-size settings, and the registry entries of the family's models.

A pod of a family model (:mod:`llmmesh.core.model_family`) gets the model's
name and, on the simulator, its per-size step costs; on vLLM, the model's
directory under ``$LLMMESH_HOME/models``, built on first use. A model the
topology deploys and the registry does not know is registered from the
family's definition (tier and prices); one outside the family must be
registered by the operator (``llmmesh admin model register``) before
``auto`` can choose it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import grpc
import grpc.aio

from llmmesh.cli.admin_model import MODEL_TIERS
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.home import mesh_home
from llmmesh.core.identity import Role, role_name
from llmmesh.core.model_family import FAMILY, TINY, FamilyModel
from llmmesh.core.mtls import MeshSecurity
from llmmesh.v1 import model_registry_service_pb2 as mpb
from llmmesh.v1 import model_registry_service_pb2_grpc


def pod_env(backend: str, model: str) -> dict[str, str]:
    """Environment of a pod serving ``model`` ("" for the engine's default) on ``backend``."""
    if not model:
        return {}
    env = {"LLMMESH_MODEL": model}
    member = FAMILY.get(model)
    if member is None:
        return env
    if backend == "sim":
        env.update({f"LLMMESH_{k.upper()}": repr(v) for k, v in member.sim_timing().items()})
    elif member is not TINY:
        env["LLMMESH_MODEL_PATH"] = str(_built(member))
    return env


def _built(member: FamilyModel) -> Path:
    """The member's vLLM model directory, built when missing (a few seconds to a minute)."""
    from llmmesh.engine.tiny_model import build_tiny_model, family_spec, is_tiny_model

    path = mesh_home() / "models" / member.name
    if not is_tiny_model(path):
        build_tiny_model(path, family_spec(member.name), member.name)
    return path


def registry_entry(member: FamilyModel) -> mpb.Model:
    """The registry's model for a family member: its tier and prices, no tier's default."""
    return mpb.Model(
        name=member.name,
        tier=MODEL_TIERS[member.tier],
        context_window=member.context_window,
        pricing=mpb.ModelPricing(
            input_per_1k_usd=member.input_per_1k_usd, output_per_1k_usd=member.output_per_1k_usd
        ),
        tokenizer_family="llmmesh-sim",
        chat_template_family="llmmesh-sim",
    )


async def ensure_family_models(
    global_address: str, models: Iterable[str], security: MeshSecurity
) -> list[str]:
    """Register the family models among ``models`` the registry lacks; the
    names of the models it still does not know (outside the family)."""
    unknown = []
    async with open_channel(global_address, security, role_name(Role.GLOBAL)) as channel:
        stub = model_registry_service_pb2_grpc.ModelRegistryServiceStub(channel)
        for name in sorted(set(models)):
            try:
                await stub.GetModel(mpb.GetModelRequest(name=name), timeout=10.0)
                continue
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
            member = FAMILY.get(name)
            if member is None:
                unknown.append(name)
                continue
            await stub.UpsertModel(mpb.UpsertModelRequest(model=registry_entry(member)), timeout=10.0)
    return unknown
