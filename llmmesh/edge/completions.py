"""``POST /v1/chat/completions``: an OpenAI request becomes a ChatService
turn on the tenant's region, and its events become SSE chunks or one
``chat.completion``.

A streamed turn goes through the stream log (:mod:`edge.streams.hub`): the
response follows it, and the client can resume it by its id. A client that
disconnects cancels its turn, streamed or not, unless it asked for a
resumable stream (``x-llmmesh-resumable: true``). Its events are framed
as OpenAI's unless the client opts into event ids
(:mod:`edge.streams.framing`). Streamed or not, a turn whose region fails
mid-generation goes on in another region of the zone
(:mod:`edge.failover`); ``x-llmmesh-region`` names the region that accepted
it (of a whole completion, the one that finished it). :meth:`serve_turn`
also serves legacy text completions (:mod:`edge.text_completions`)."""

from __future__ import annotations

import asyncio
import secrets
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmmesh.core.errors import MeshError
from llmmesh.core.hop_timing import HopStamps
from llmmesh.core.json_logs import bind_request_id
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.edge.caller import authenticate
from llmmesh.edge.chunks import ChatFormat, ReplyFormat, blocked_categories
from llmmesh.edge.conversation_objects import turn_context_headers
from llmmesh.edge.failover import FailoverPolicy, FailoverTurn
from llmmesh.edge.json_body import read_json
from llmmesh.edge.mesh_client import MeshClient, Principal
from llmmesh.edge.ratelimit_headers import ratelimit_headers
from llmmesh.edge.reply_parts import ReplyCollector
from llmmesh.edge.retrieval_options import retrieval_fields
from llmmesh.edge.route_headers import AUTO_MODELS, route_headers
from llmmesh.edge.schemas import parse_chat_request
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.streams.framing import NOT_RESUMABLE, RESUMABLE_HEADER, header_set, wants_event_ids
from llmmesh.edge.streams.hub import StreamHub
from llmmesh.edge.streams.log import StreamInfo
from llmmesh.edge.streams.zones import build_zone_logs
from llmmesh.edge.turn_spans import TurnSpans
from llmmesh.edge.turns import open_turn
from llmmesh.v1 import chat_service_pb2


async def disconnected(request: Request) -> None:
    """Return once the client has gone (the body must have been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class CompletionsHandler:
    """Serves chat completions through the mesh."""

    def __init__(self, settings: EdgeSettings, mesh: MeshClient, streams: StreamHub | None = None) -> None:
        self._settings = settings
        self._mesh = mesh
        self.streams = streams if streams is not None else StreamHub(settings, build_zone_logs(settings))
        self._failover = FailoverPolicy(
            first_event_timeout_s=settings.first_event_timeout_ms / 1000,
            stall_timeout_s=settings.stall_timeout_ms / 1000,
            deadline_s=settings.failover_deadline_ms / 1000,
        )
        # Settlements of whole completions the mesh failed, running after their error answers.
        self._settling: set[asyncio.Task[None]] = set()

    async def handle(self, request: Request) -> Response:
        arrived = time.monotonic()
        principal = await authenticate(request, self._mesh)
        req = parse_chat_request(await read_json(request, self._settings.max_body_bytes))
        # Refusals and the messages' checks come before any call to the mesh.
        sampling = req.to_sampling()
        messages = req.to_messages()
        model = await self._mesh.models.resolve(req.model, principal.tenant.tier)
        # "auto" is the region's to decide (by the request's difficulty, among its models).
        auto = req.model in AUTO_MODELS
        start = chat_service_pb2.ChatStart(
            model="auto" if auto else model.name,
            messages=messages,
            sampling=sampling,
            user=req.end_user(),
        )
        if req.llmmesh_retrieval is not None:
            start.retrieval.CopyFrom(req.llmmesh_retrieval.to_proto())
        return await self.serve_turn(
            request,
            principal,
            start,
            "" if auto else model.name,
            stream=req.streaming(),
            include_usage=req.include_usage(),
            arrived=arrived,
        )

    async def serve_turn(
        self,
        request: Request,
        principal: Principal,
        start: chat_service_pb2.ChatStart,
        model: str,
        *,
        stream: bool,
        include_usage: bool,
        prefer_region: str = "",
        reply_format: ReplyFormat | None = None,
        arrived: float | None = None,
    ) -> Response:
        """Open ``start`` on the tenant's regions (``prefer_region`` first) and
        answer it in ``reply_format`` (by default a chat one: an SSE stream
        of ``chat.completion.chunk`` events, or one ``chat.completion``). The
        completion id is ``start.request_id`` (one is chosen when it is
        empty); it is also the stream id for resuming. ``arrived`` is when
        the request arrived (``time.monotonic()``; None: now).
        Errors before the region accepts the turn raise (OpenAIError or
        MeshError); later ones end the stream with an error event."""
        arrived = time.monotonic() if arrived is None else arrived
        if not start.request_id:
            start.request_id = "chatcmpl-" + secrets.token_hex(12)
        completion_id = start.request_id
        bind_request_id(completion_id)
        spans = TurnSpans(model, completion_id)
        try:
            with spans.current():
                opened = await open_turn(
                    self._mesh,
                    principal,
                    start,
                    model,
                    self._settings.first_event_timeout_ms / 1000,
                    prefer_region=prefer_region,
                )
        except BaseException as err:
            spans.fail(err)
            raise
        spans.opened(opened.started)
        if opened.started.model:
            # The model the region chose; a continuation elsewhere goes on with it.
            model = start.model = opened.started.model
        turn = FailoverTurn(self._mesh, principal, start, model, opened, self._failover, spans, arrived)
        headers = {"x-request-id": completion_id, "x-llmmesh-region": turn.started.region}
        headers.update(ratelimit_headers(turn.started))
        headers.update(turn_context_headers(turn.started))
        headers.update(route_headers(turn.started))
        created = int(time.time())
        shape = reply_format if reply_format is not None else ChatFormat(logprobs=start.sampling.logprobs)
        if not stream:
            return await self._complete(request, turn, shape, completion_id, created, model, headers)
        detached = header_set(request, RESUMABLE_HEADER)
        info = StreamInfo(principal.key_id, principal.tenant.id, turn.started.region)
        chunks = shape.frames(completion_id, created, model, include_usage)
        chunks.final_fields = retrieval_fields(turn.started)
        hops = HopStamps(arrived)
        hops.stamp("edge_in", opened.sent_s)
        zone = principal.tenant.zone
        resumable = await self.streams.begin(
            turn, chunks, info, zone=zone, detached=detached, arrived=arrived, hops=hops
        )
        if not resumable:
            headers.update(NOT_RESUMABLE)
        return self.streams.response(
            completion_id,
            -1,
            headers,
            zone=zone,
            cancel_on_drop=not (detached and resumable),
            event_ids=wants_event_ids(request),
        )

    async def _complete(
        self,
        request: Request,
        turn: FailoverTurn,
        shape: ReplyFormat,
        completion_id: str,
        created: int,
        model: str,
        headers: dict[str, str],
    ) -> Response:
        """The whole completion; a client that leaves first cancels the turn
        (the region still reports, and bills, what it produced)."""

        reply = ReplyCollector()

        async def collect() -> None:
            async for delta in turn.deltas():
                reply.add(delta)

        collecting = asyncio.create_task(collect())
        gone = asyncio.create_task(disconnected(request))
        try:
            await asyncio.wait((collecting, gone), return_when=asyncio.FIRST_COMPLETED)
            if not collecting.done():
                await turn.cancel("client disconnected")
                await asyncio.wait((collecting,), timeout=self._settings.cancel_grace_ms / 1000)
                if not collecting.done():
                    turn.close()
            await collecting
        except MeshError:
            if turn.lost_by_mesh:
                # The client gets an error and none of the reply: no output is billed.
                self._settle_later(turn, 0, completion_id)
            raise
        finally:
            await cancel_and_wait(gone)
            await cancel_and_wait(collecting)
            settles = turn.settles_when_done
            turn.close()
        if settles:
            # The client gets the whole reply; regions the turn left may have billed past it.
            self._settle_later(turn, turn.delivered_tokens, completion_id)
        body = shape.whole(
            completion_id, created, model, reply, turn.reason, turn.usage, blocked_categories(turn.safety)
        )
        body.update(retrieval_fields(turn.started))
        return JSONResponse(body, headers={**headers, "x-llmmesh-region": turn.region})

    def _settle_later(self, turn: FailoverTurn, delivered: int, completion_id: str) -> None:
        """Settle ``turn`` to ``delivered`` output tokens beside the reply."""
        settling = asyncio.create_task(turn.settle(delivered), name=f"settle-{completion_id}")
        self._settling.add(settling)
        settling.add_done_callback(self._settling.discard)
