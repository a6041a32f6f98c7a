"""``/v1/vector_stores``: a tenant's vector stores, their files and search,
in OpenAI's shapes, kept in the tenant's zone.

Every field OpenAI defines is honoured or refused with a 400 naming it.
Honoured: ``name``, ``file_ids``, ``metadata``, ``chunking_strategy``
(``auto``, or ``static`` whose token sizes become characters at 4 per
token, the chunker's unit), and in a search ``query``, ``max_num_results``
and ``ranking_options`` (``ranker`` ``auto``/``none``: the hybrid ranking
either way; ``score_threshold`` on the fused score). Refused:
``expires_after``, ``description``, a file's ``attributes``, a search's
``filters`` and ``rewrite_query: true``. Files are chunked and embedded
before the answer, so a store is ``completed`` when it is returned.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmmesh.edge.json_body import read_json
from llmmesh.edge.retrieval_calls import RetrievalCalls, list_page, list_query
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.unary_requests import bad_request, object_of_fields
from llmmesh.v1 import retrieval_service_pb2 as pb

CHARS_PER_TOKEN = 4
_CREATE = frozenset({"name", "file_ids", "metadata", "chunking_strategy", "expires_after", "description"})
_ADD = frozenset({"file_id", "chunking_strategy", "attributes"})
_SEARCH = frozenset({"query", "max_num_results", "ranking_options", "filters", "rewrite_query"})
_REFUSED = frozenset({"expires_after", "description", "attributes", "filters"})


def store_object(store: pb.VectorStore) -> dict[str, object]:
    counts = store.file_counts
    return {
        "id": store.id,
        "object": "vector_store",
        "created_at": store.created_at,
        "name": store.name,
        "usage_bytes": store.usage_bytes,
        "file_counts": {
            "in_progress": counts.in_progress,
            "completed": counts.completed,
            "failed": counts.failed,
            "cancelled": counts.cancelled,
            "total": counts.total,
        },
        "status": store.status,
        "expires_after": None,
        "expires_at": None,
        "last_active_at": store.last_active_at,
        "metadata": dict(store.metadata),
    }


def store_file_object(member: pb.VectorStoreFile) -> dict[str, object]:
    error = {"code": "server_error", "message": member.last_error} if member.last_error else None
    return {
        "id": member.file_id,
        "object": "vector_store.file",
        "created_at": member.created_at,
        "vector_store_id": member.vector_store_id,
        "status": member.status,
        "usage_bytes": member.usage_bytes,
        "last_error": error,
        "attributes": {},
        "chunking_strategy": {
            "type": "static",
            "static": {
                "max_chunk_size_tokens": member.max_chunk_chars // CHARS_PER_TOKEN,
                "chunk_overlap_tokens": member.chunk_overlap_chars // CHARS_PER_TOKEN,
            },
        },
    }


def _refuse(body: dict[str, object]) -> None:
    for key in sorted(_REFUSED & body.keys()):
        if body[key] is not None:
            raise bad_request(f"{key} is not supported by this mesh", key, "unsupported_parameter")


def chunking(raw: object) -> tuple[int, int]:
    """(characters per chunk, overlap) from OpenAI's ``chunking_strategy``;
    (0, 0) for the region's default."""
    if raw is None:
        return 0, 0
    param = "chunking_strategy"
    if not isinstance(raw, dict) or raw.get("type") not in ("auto", "static"):
        raise bad_request(
            "chunking_strategy must be {'type': 'auto'} or {'type': 'static', 'static': {...}}", param
        )
    if raw["type"] == "auto":
        if set(raw) != {"type"}:
            raise bad_request("an auto chunking_strategy takes no other field", param)
        return 0, 0
    static = raw.get("static")
    if set(raw) != {"type", "static"} or not isinstance(static, dict):
        raise bad_request("a static chunking_strategy needs its 'static' object", param)
    size, overlap = static.get("max_chunk_size_tokens"), static.get("chunk_overlap_tokens")
    if set(static) != {"max_chunk_size_tokens", "chunk_overlap_tokens"} or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in (size, overlap)
    ):
        raise bad_request("static needs integer max_chunk_size_tokens and chunk_overlap_tokens", param)
    assert isinstance(size, int) and isinstance(overlap, int)
    if not 100 <= size <= 4096 or not 0 <= overlap <= size // 2:
        raise bad_request(
            "max_chunk_size_tokens is 100 to 4096 and chunk_overlap_tokens at most half of it", param
        )
    return size * CHARS_PER_TOKEN, overlap * CHARS_PER_TOKEN


def _strings(raw: object, param: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise bad_request(f"{param} must be an object of strings", param, "invalid_type")
    return dict(raw)


class VectorStoreRoutes:
    """The vector store routes over the zone's RetrievalService."""

    def __init__(self, settings: EdgeSettings, calls: RetrievalCalls) -> None:
        self._settings = settings
        self._calls = calls

    def routes(self) -> list[Route]:
        base = "/v1/vector_stores"
        return [
            Route(base, self.create, methods=["POST"]),
            Route(base, self.list, methods=["GET"]),
            Route(base + "/{vector_store_id}", self.get, methods=["GET"]),
            Route(base + "/{vector_store_id}", self.delete, methods=["DELETE"]),
            Route(base + "/{vector_store_id}/files", self.add_file, methods=["POST"]),
            Route(base + "/{vector_store_id}/files", self.list_files, methods=["GET"]),
            Route(base + "/{vector_store_id}/files/{file_id}", self.get_file, methods=["GET"]),
            Route(base + "/{vector_store_id}/files/{file_id}", self.remove_file, methods=["DELETE"]),
            Route(base + "/{vector_store_id}/search", self.search, methods=["POST"]),
        ]

    async def _body(self, request: Request, fields: frozenset[str]) -> dict[str, object]:
        body = object_of_fields(await read_json(request, self._settings.max_body_bytes), fields)
        _refuse(body)
        return body

    async def create(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        body = await self._body(request, _CREATE)
        name = body.get("name") or ""
        if not isinstance(name, str):
            raise bad_request("name must be a string", "name", "invalid_type")
        file_ids = body.get("file_ids") or []
        if not isinstance(file_ids, list) or not all(isinstance(f, str) and f for f in file_ids):
            raise bad_request("file_ids must be an array of file ids", "file_ids", "invalid_type")
        if len(file_ids) > 500:
            raise bad_request("file_ids holds at most 500 files", "file_ids")
        size, overlap = chunking(body.get("chunking_strategy"))
        message = pb.CreateVectorStoreRequest(
            name=name,
            file_ids=file_ids,
            metadata=_strings(body.get("metadata"), "metadata"),
            max_chunk_chars=size,
            chunk_overlap_chars=overlap,
        )
        answer, region = await self._calls.call(principal, lambda s: s.CreateVectorStore, message)
        return JSONResponse(store_object(answer.vector_store), headers={"x-llmmesh-region": region})

    async def list(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        limit, after, _ = list_query(request)
        message = pb.ListVectorStoresRequest(page_size=limit, page_token=after)
        answer, _ = await self._calls.call(principal, lambda s: s.ListVectorStores, message)
        return JSONResponse(
            list_page([store_object(v) for v in answer.vector_stores], answer.next_page_token)
        )

    async def get(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        message = pb.GetVectorStoreRequest(vector_store_id=request.path_params["vector_store_id"])
        answer, _ = await self._calls.call(principal, lambda s: s.GetVectorStore, message)
        return JSONResponse(store_object(answer.vector_store))

    async def delete(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        message = pb.DeleteVectorStoreRequest(vector_store_id=request.path_params["vector_store_id"])
        answer, _ = await self._calls.call(principal, lambda s: s.DeleteVectorStore, message)
        return JSONResponse({"id": answer.vector_store_id, "object": "vector_store.deleted", "deleted": True})

    async def add_file(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        body = await self._body(request, _ADD)
        file_id = body.get("file_id")
        if not isinstance(file_id, str) or not file_id:
            raise bad_request("file_id is required", "file_id", "missing_required_parameter")
        size, overlap = chunking(body.get("chunking_strategy"))
        message = pb.CreateVectorStoreFileRequest(
            vector_store_id=request.path_params["vector_store_id"],
            file_id=file_id,
            max_chunk_chars=size,
            chunk_overlap_chars=overlap,
        )
        answer, _ = await self._calls.call(principal, lambda s: s.CreateVectorStoreFile, message)
        return JSONResponse(store_file_object(answer.vector_store_file))

    async def list_files(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        limit, after, _ = list_query(request)
        message = pb.ListVectorStoreFilesRequest(
            vector_store_id=request.path_params["vector_store_id"], page_size=limit, page_token=after
        )
        answer, _ = await self._calls.call(principal, lambda s: s.ListVectorStoreFiles, message)
        items = [store_file_object(m) for m in answer.vector_store_files]
        return JSONResponse(list_page(items, answer.next_page_token))

    async def get_file(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        message = pb.GetVectorStoreFileRequest(
            vector_store_id=request.path_params["vector_store_id"], file_id=request.path_params["file_id"]
        )
        answer, _ = await self._calls.call(principal, lambda s: s.GetVectorStoreFile, message)
        return JSONResponse(store_file_object(answer.vector_store_file))

    async def remove_file(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        message = pb.DeleteVectorStoreFileRequest(
            vector_store_id=request.path_params["vector_store_id"], file_id=request.path_params["file_id"]
        )
        answer, _ = await self._calls.call(principal, lambda s: s.DeleteVectorStoreFile, message)
        return JSONResponse({"id": answer.file_id, "object": "vector_store.file.deleted", "deleted": True})

    async def search(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        body = await self._body(request, _SEARCH)
        query = body.get("query")
        if isinstance(query, list) and len(query) == 1:
            query = query[0]
        if not isinstance(query, str) or not query.strip():
            raise bad_request("query must be a non-empty string (or an array of one)", "query")
        if body.get("rewrite_query"):
            raise bad_request(
                "rewrite_query is not supported by this mesh", "rewrite_query", "unsupported_parameter"
            )
        results = body.get("max_num_results", 10)
        if isinstance(results, bool) or not isinstance(results, int) or not 1 <= results <= 50:
            raise bad_request("max_num_results must be an integer from 1 to 50", "max_num_results")
        threshold = _ranking(body.get("ranking_options"))
        message = pb.SearchVectorStoresRequest(
            vector_store_ids=[request.path_params["vector_store_id"]],
            query=query,
            max_num_results=results,
            score_threshold=threshold,
        )
        answer, region = await self._calls.call(principal, lambda s: s.SearchVectorStores, message)
        data = [
            {
                "file_id": r.file_id,
                "filename": r.filename,
                "score": r.score,
                "attributes": {},
                "content": [{"type": "text", "text": r.text}],
            }
            for r in answer.results
        ]
        page = {
            "object": "vector_store.search_results.page",
            "search_query": [query],
            "data": data,
            "has_more": False,
            "next_page": None,
        }
        return JSONResponse(
            page, headers={"x-llmmesh-region": region, "x-llmmesh-search-engine": answer.engine}
        )


def _ranking(raw: object) -> float:
    """The score threshold of ``ranking_options``; 0 for none."""
    if raw is None:
        return 0.0
    param = "ranking_options"
    if not isinstance(raw, dict) or not set(raw) <= {"ranker", "score_threshold"}:
        raise bad_request("ranking_options takes ranker and score_threshold", param)
    if raw.get("ranker", "auto") not in ("auto", "none", "default-2024-11-15"):
        raise bad_request("ranker must be auto, none or default-2024-11-15", param)
    threshold = raw.get("score_threshold", 0.0)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
        raise bad_request("score_threshold must be a number from 0 to 1", param)
    return float(threshold)
