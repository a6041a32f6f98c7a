"""``POST /v1/moderations``: OpenAI's moderation request becomes a
``ModerationService.Moderate`` call on the first region of the tenant's
zone, answered by that region's safety backends (:mod:`region.moderation`
says how), and its results an OpenAI ``moderation`` object.

``input`` is a string, an array of strings, or an array of OpenAI's
multimodal parts of which only ``{"type": "text", "text": ...}`` is served
(an image part is a 400: no backend here reads images). ``model`` may be
left out, name the region's model (``llmmesh-moderation``), or be one of
OpenAI's "current model" aliases (``omni-moderation-latest``,
``text-moderation-latest``, ``text-moderation-stable``), which the region's
backends answer under their own name; a dated OpenAI model is refused with
a 404 rather than answered by another classifier under its name. Any other
field is a 400.
"""

from __future__ import annotations

import secrets

import grpc.aio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmmesh.edge.caller import authenticate
from llmmesh.edge.json_body import read_json
from llmmesh.edge.mesh_client import MeshClient, Metadata
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.unary_requests import answer_headers, bad_request, object_of_fields
from llmmesh.edge.zone_calls import call_in_zone
from llmmesh.v1 import moderation_service_pb2 as pb
from llmmesh.v1 import moderation_service_pb2_grpc as pb_grpc

_FIELDS = frozenset({"input", "model"})
_TIMEOUT_S = 30.0


def _text_part(part: object, where: str) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("type") == "text":
        text = part.get("text")
        if isinstance(text, str):
            return text
        raise bad_request(f"{where}.text must be a string", "input", "invalid_type")
    if isinstance(part, dict) and part.get("type") == "image_url":
        raise bad_request(f"{where} is an image; this mesh moderates text only", "input", "unsupported_value")
    raise bad_request(f"{where} must be a string or a text part", "input", "invalid_type")


def parse_moderation_request(body: object) -> tuple[str, list[str]]:
    """The model (empty when not given) and the texts, or a 400 naming the field."""
    body = object_of_fields(body, _FIELDS)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model", "invalid_type")
    if "input" not in body:
        raise bad_request("input is required", "input", "missing_required_parameter")
    raw = body["input"]
    if isinstance(raw, str):
        return model or "", [raw]
    if not isinstance(raw, list) or not raw:
        raise bad_request("input must be a string or a non-empty array", "input", "invalid_type")
    return model or "", [_text_part(part, f"input[{i}]") for i, part in enumerate(raw)]


def moderation_object(response: pb.ModerateResponse) -> dict[str, object]:
    """OpenAI's ``moderation`` object for a region's answer."""
    results = []
    for result in response.results:
        results.append(
            {
                "flagged": result.flagged,
                "categories": {c.name: c.flagged for c in result.categories},
                "category_scores": {c.name: c.score for c in result.categories},
                "category_applied_input_types": {c.name: ["text"] for c in result.categories},
            }
        )
    return {"id": response.request_id, "model": response.model, "results": results}


class ModerationsHandler:
    """Serves ``/v1/moderations`` through the tenant's zone."""

    def __init__(self, settings: EdgeSettings, mesh: MeshClient) -> None:
        self._settings = settings
        self._mesh = mesh

    async def handle(self, request: Request) -> Response:
        principal = await authenticate(request, self._mesh)
        model, texts = parse_moderation_request(await read_json(request, self._settings.max_body_bytes))
        message = pb.ModerateRequest(request_id="modr-" + secrets.token_hex(12), model=model, inputs=texts)

        async def moderate(channel: grpc.aio.Channel, metadata: Metadata) -> pb.ModerateResponse:
            response: pb.ModerateResponse = await pb_grpc.ModerationServiceStub(channel).Moderate(
                message, metadata=metadata, timeout=_TIMEOUT_S
            )
            return response

        regions = await self._mesh.zone_regions(principal.tenant.id)
        answer, region = await call_in_zone(self._mesh, principal, regions, moderate)
        headers = answer_headers(answer.request_id, region, answer.rate_limit)
        return JSONResponse(moderation_object(answer), headers=headers)
