"""``/v1/vector_stores/{id}/file_batches``: files added to a vector store
together, in OpenAI's shapes, recorded in the tenant's zone.

Honoured: ``file_ids`` with one ``chunking_strategy`` for all, or ``files``
each with its own ``chunking_strategy`` (the two are exclusive); a list's
``filter``, ``limit``, ``after`` and ``order=desc``. Refused with a 400
naming the field: ``attributes`` (top-level or a file's), as adding one
file refuses them, and a top-level ``chunking_strategy`` beside ``files``.
Each file is chunked and embedded before the answer, so a batch is
``completed`` when it is returned, and cancelling it is a 400 as
cancelling any finished batch is.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmmesh.edge.json_body import read_json
from llmmesh.edge.retrieval_calls import RetrievalCalls, list_page, list_query
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.unary_requests import bad_request, object_of_fields
from llmmesh.edge.vector_stores import chunking, store_file_object
from llmmesh.v1 import retrieval_service_pb2 as pb

MAX_BATCH_FILES = 500
_CREATE = frozenset({"file_ids", "files", "attributes", "chunking_strategy"})
_FILE = frozenset({"file_id", "attributes", "chunking_strategy"})


def batch_object(batch: pb.VectorStoreFileBatch) -> dict[str, object]:
    counts = batch.file_counts
    return {
        "id": batch.id,
        "object": "vector_store.files_batch",
        "created_at": batch.created_at,
        "vector_store_id": batch.vector_store_id,
        "status": batch.status,
        "file_counts": {
            "in_progress": counts.in_progress,
            "completed": counts.completed,
            "failed": counts.failed,
            "cancelled": counts.cancelled,
            "total": counts.total,
        },
    }


def _unsupported(param: str) -> Exception:
    return bad_request(f"{param} is not supported by this mesh", param, "unsupported_parameter")


def batch_files(body: dict[str, object]) -> list[pb.VectorStoreFileBatchFile]:
    """The files of a create body: ``file_ids`` under its ``chunking_strategy``,
    or ``files`` each under its own."""
    if body.get("attributes") is not None:
        raise _unsupported("attributes")
    file_ids, files = body.get("file_ids"), body.get("files")
    if (file_ids is None) == (files is None):
        raise bad_request("give either file_ids or files", "file_ids", "missing_required_parameter")
    if file_ids is not None:
        if not isinstance(file_ids, list) or not all(isinstance(f, str) and f for f in file_ids):
            raise bad_request("file_ids must be an array of file ids", "file_ids", "invalid_type")
        if not 1 <= len(file_ids) <= MAX_BATCH_FILES:
            raise bad_request(f"file_ids holds 1 to {MAX_BATCH_FILES} files", "file_ids")
        size, overlap = chunking(body.get("chunking_strategy"))
        return [
            pb.VectorStoreFileBatchFile(file_id=f, max_chunk_chars=size, chunk_overlap_chars=overlap)
            for f in file_ids
        ]
    if body.get("chunking_strategy") is not None:
        raise bad_request(
            "with files, give each file its own chunking_strategy",
            "chunking_strategy",
            "unsupported_parameter",
        )
    if not isinstance(files, list) or not 1 <= len(files) <= MAX_BATCH_FILES:
        raise bad_request(f"files must be an array of 1 to {MAX_BATCH_FILES} files", "files", "invalid_type")
    entries = []
    for position, raw in enumerate(files):
        where = f"files[{position}]"
        if not isinstance(raw, dict):
            raise bad_request(f"{where} must be an object with a file_id", where, "invalid_type")
        for key in raw:
            if key not in _FILE:
                raise bad_request(f"{where} has no field {key!r}", f"{where}.{key}", "unknown_parameter")
        if raw.get("attributes") is not None:
            raise _unsupported(f"{where}.attributes")
        file_id = raw.get("file_id")
        if not isinstance(file_id, str) or not file_id:
            raise bad_request(
                f"{where}.file_id is required", f"{where}.file_id", "missing_required_parameter"
            )
        size, overlap = chunking(raw.get("chunking_strategy"))
        entries.append(
            pb.VectorStoreFileBatchFile(file_id=file_id, max_chunk_chars=size, chunk_overlap_chars=overlap)
        )
    return entries


class FileBatchRoutes:
    """The file batch routes over the zone's RetrievalService."""

    def __init__(self, settings: EdgeSettings, calls: RetrievalCalls) -> None:
        self._settings = settings
        self._calls = calls

    def routes(self) -> list[Route]:
        base = "/v1/vector_stores/{vector_store_id}/file_batches"
        return [
            Route(base, self.create, methods=["POST"]),
            Route(base + "/{batch_id}", self.get, methods=["GET"]),
            Route(base + "/{batch_id}/cancel", self.cancel, methods=["POST"]),
            Route(base + "/{batch_id}/files", self.list_files, methods=["GET"]),
        ]

    async def create(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        body = object_of_fields(await read_json(request, self._settings.max_body_bytes), _CREATE)
        message = pb.CreateVectorStoreFileBatchRequest(
            vector_store_id=request.path_params["vector_store_id"], files=batch_files(body)
        )
        answer, region = await self._calls.call(principal, lambda s: s.CreateVectorStoreFileBatch, message)
        return JSONResponse(batch_object(answer.batch), headers={"x-llmmesh-region": region})

    async def get(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        message = pb.GetVectorStoreFileBatchRequest(
            vector_store_id=request.path_params["vector_store_id"], batch_id=request.path_params["batch_id"]
        )
        answer, _ = await self._calls.call(principal, lambda s: s.GetVectorStoreFileBatch, message)
        return JSONResponse(batch_object(answer.batch))

    async def cancel(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        message = pb.CancelVectorStoreFileBatchRequest(
            vector_store_id=request.path_params["vector_store_id"], batch_id=request.path_params["batch_id"]
        )
        answer, _ = await self._calls.call(principal, lambda s: s.CancelVectorStoreFileBatch, message)
        return JSONResponse(batch_object(answer.batch))

    async def list_files(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        limit, after, extra = list_query(request, frozenset({"filter"}))
        message = pb.ListVectorStoreFileBatchFilesRequest(
            vector_store_id=request.path_params["vector_store_id"],
            batch_id=request.path_params["batch_id"],
            page_size=limit,
            page_token=after,
            status=extra.get("filter", ""),
        )
        answer, _ = await self._calls.call(principal, lambda s: s.ListVectorStoreFileBatchFiles, message)
        items = [store_file_object(m) for m in answer.vector_store_files]
        return JSONResponse(list_page(items, answer.next_page_token))
