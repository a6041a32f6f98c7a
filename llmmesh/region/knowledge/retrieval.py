"""The region's files and vector stores (``RetrievalService``): checks a
request, embeds with the mesh's embedding model and keeps everything in the
zone's store.

Chunks and queries are embedded through the region's own embeddings API
(:class:`region.embeddings.EmbeddingsGateway`) with the caller's key: under
the key's limits and the tenant's quota, billed as embedding tokens, on a
pod of this region, so a file's text never leaves the zone.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.core.ids import new_id
from llmmesh.region.embeddings import EmbeddingsGateway
from llmmesh.region.knowledge.retrieval_protos import file_proto, hit_proto, member_proto, store_proto
from llmmesh.region.knowledge.retrieval_settings import MAX_STORES_PER_SEARCH, RetrievalSettings
from llmmesh.region.knowledge.vector_store import VectorStoreDb
from llmmesh.region.knowledge.vector_store_rows import ChunkHit, VectorStoreFileRow
from llmmesh.region.knowledge.vector_store_text import chunk_text, query_terms
from llmmesh.region.policy_cache import Caller, PolicyCache
from llmmesh.v1 import embedding_service_pb2
from llmmesh.v1 import retrieval_service_pb2 as pb

log = logging.getLogger(__name__)

PURPOSES = ("assistants",)
DEFAULT_PAGE, MAX_PAGE = 20, 100
DEFAULT_RESULTS, MAX_RESULTS = 10, 50
MAX_QUERY_CHARS = 4096
MIN_CHUNK_CHARS, MAX_CHUNK_CHARS = 100, 20_000
_EMBED_BATCH = 64
_MAX_METADATA, _MAX_KEY, _MAX_VALUE = 16, 64, 512
MAX_STORE_FILES = 500
"""File ids one vector store's creation may name (OpenAI's limit too)."""


def invalid(message: str, param: str) -> InvalidArgument:
    return InvalidArgument(Reason.INVALID_REQUEST, message, metadata={"param": param})


def page_size(requested: int) -> int:
    """0 means the default; negative or over the most is INVALID_ARGUMENT (param ``limit``)."""
    if requested < 0 or requested > MAX_PAGE:
        raise invalid(f"limit must be between 1 and {MAX_PAGE}", "limit")
    return requested or DEFAULT_PAGE


def check_metadata(metadata: dict[str, str]) -> None:
    """OpenAI's metadata bounds: 16 pairs, keys of 64 and values of 512 characters."""
    if len(metadata) > _MAX_METADATA:
        raise invalid(f"metadata holds at most {_MAX_METADATA} pairs", "metadata")
    for key, value in metadata.items():
        if not key or len(key) > _MAX_KEY or len(value) > _MAX_VALUE:
            raise invalid(
                f"metadata keys are 1 to {_MAX_KEY} characters and values at most {_MAX_VALUE}", "metadata"
            )


class RetrievalGateway:
    """Files, vector stores and search for authenticated callers."""

    def __init__(
        self,
        settings: RetrievalSettings,
        zone: str,
        policy: PolicyCache,
        db: VectorStoreDb,
        embeddings: EmbeddingsGateway,
    ) -> None:
        self._settings = settings
        self.zone = zone
        self._policy = policy
        self.db = db
        self._embeddings = embeddings

    async def caller(self, secret: str | None) -> Caller:
        return await self._policy.authenticate_fresh(secret)

    # ------------------------------------------------------------------ files

    async def create_file(self, request: pb.CreateFileRequest, secret: str | None) -> pb.CreateFileResponse:
        caller = await self.caller(secret)
        if request.purpose not in PURPOSES:
            raise invalid(
                f"purpose {request.purpose!r} is not served; use one of {', '.join(PURPOSES)}", "purpose"
            )
        if not request.filename or len(request.filename) > 512:
            raise invalid("the file needs a name of at most 512 characters", "file")
        if not request.content:
            raise invalid("the file is empty", "file")
        if len(request.content) > self._settings.retrieval_max_file_bytes:
            raise invalid(f"the file is larger than {self._settings.retrieval_max_file_bytes} bytes", "file")
        try:
            request.content.decode("utf-8")
        except UnicodeDecodeError as err:
            raise invalid("only UTF-8 text files are served (no PDF, image or other binary)", "file") from err
        file_id = f"file-{self.zone}-{secrets.token_hex(12)}"
        most = caller.tenant.max_files or self._settings.retrieval_max_files
        row = await self.db.create_file(
            caller.tenant_id, file_id, request.filename, request.purpose, request.content, most
        )
        log.info("file %s stored for tenant %s (%d bytes)", file_id, caller.tenant_id, row.bytes)
        return pb.CreateFileResponse(file=file_proto(row))

    async def get_file(self, request: pb.GetFileRequest, secret: str | None) -> pb.GetFileResponse:
        row = await self.db.get_file((await self.caller(secret)).tenant_id, request.file_id)
        return pb.GetFileResponse(file=file_proto(row))

    async def list_files(self, request: pb.ListFilesRequest, secret: str | None) -> pb.ListFilesResponse:
        tenant = (await self.caller(secret)).tenant_id
        if request.purpose and request.purpose not in PURPOSES:
            raise invalid(f"purpose {request.purpose!r} is not served", "purpose")
        page = await self.db.list_files(
            tenant, request.purpose, page_size(request.page_size), request.page_token
        )
        return pb.ListFilesResponse(files=[file_proto(r) for r in page.rows], next_page_token=page.next_after)

    async def delete_file(self, request: pb.DeleteFileRequest, secret: str | None) -> pb.DeleteFileResponse:
        await self.db.delete_file((await self.caller(secret)).tenant_id, request.file_id)
        return pb.DeleteFileResponse(file_id=request.file_id)

    async def file_content(
        self, request: pb.GetFileContentRequest, secret: str | None
    ) -> pb.GetFileContentResponse:
        row, content = await self.db.file_content((await self.caller(secret)).tenant_id, request.file_id)
        return pb.GetFileContentResponse(file=file_proto(row), content=content)

    # ---------------------------------------------------------- vector stores

    def chunking(self, max_chars: int, overlap: int) -> tuple[int, int]:
        size = max_chars or self._settings.retrieval_chunk_chars
        if not MIN_CHUNK_CHARS <= size <= MAX_CHUNK_CHARS:
            raise invalid(
                f"chunks are {MIN_CHUNK_CHARS} to {MAX_CHUNK_CHARS} characters", "chunking_strategy"
            )
        shared = (
            overlap if max_chars or overlap else min(self._settings.retrieval_chunk_overlap_chars, size // 2)
        )
        if shared < 0 or shared > size // 2:
            raise invalid("the chunk overlap must be at most half the chunk size", "chunking_strategy")
        return size, shared

    async def create_store(
        self, request: pb.CreateVectorStoreRequest, secret: str | None
    ) -> pb.CreateVectorStoreResponse:
        caller = await self.caller(secret)
        if len(request.name) > 256:
            raise invalid("name is at most 256 characters", "name")
        check_metadata(dict(request.metadata))
        chunking = self.chunking(request.max_chunk_chars, request.chunk_overlap_chars)
        # Each id is chunked and embedded (billed): a long or repeating list is refused, not run.
        if len(request.file_ids) > MAX_STORE_FILES:
            raise invalid(f"name at most {MAX_STORE_FILES} files", "file_ids")
        if len(set(request.file_ids)) != len(request.file_ids):
            raise invalid("file_ids names a file more than once", "file_ids")
        for file_id in request.file_ids:
            await self.db.get_file(caller.tenant_id, file_id)
        store_id = f"vs_{self.zone}_{secrets.token_hex(12)}"
        most = caller.tenant.max_vector_stores or self._settings.retrieval_max_vector_stores
        await self.db.create_vector_store(
            caller.tenant_id, store_id, request.name, dict(request.metadata), most
        )
        for file_id in request.file_ids:
            await self.ingest(caller, secret, store_id, file_id, chunking, request.user)
        row = await self.db.get_vector_store(caller.tenant_id, store_id)
        return pb.CreateVectorStoreResponse(vector_store=store_proto(row))

    async def get_store(
        self, request: pb.GetVectorStoreRequest, secret: str | None
    ) -> pb.GetVectorStoreResponse:
        row = await self.db.get_vector_store((await self.caller(secret)).tenant_id, request.vector_store_id)
        return pb.GetVectorStoreResponse(vector_store=store_proto(row))

    async def list_stores(
        self, request: pb.ListVectorStoresRequest, secret: str | None
    ) -> pb.ListVectorStoresResponse:
        tenant = (await self.caller(secret)).tenant_id
        page = await self.db.list_vector_stores(tenant, page_size(request.page_size), request.page_token)
        return pb.ListVectorStoresResponse(
            vector_stores=[store_proto(r) for r in page.rows], next_page_token=page.next_after
        )

    async def delete_store(
        self, request: pb.DeleteVectorStoreRequest, secret: str | None
    ) -> pb.DeleteVectorStoreResponse:
        await self.db.delete_vector_store((await self.caller(secret)).tenant_id, request.vector_store_id)
        return pb.DeleteVectorStoreResponse(vector_store_id=request.vector_store_id)

    async def add_file(
        self, request: pb.CreateVectorStoreFileRequest, secret: str | None
    ) -> pb.CreateVectorStoreFileResponse:
        caller = await self.caller(secret)
        chunking = self.chunking(request.max_chunk_chars, request.chunk_overlap_chars)
        await self.db.get_vector_store(caller.tenant_id, request.vector_store_id)
        row = await self.ingest(
            caller, secret, request.vector_store_id, request.file_id, chunking, request.user
        )
        return pb.CreateVectorStoreFileResponse(vector_store_file=member_proto(row))

    async def get_store_file(
        self, request: pb.GetVectorStoreFileRequest, secret: str | None
    ) -> pb.GetVectorStoreFileResponse:
        tenant = (await self.caller(secret)).tenant_id
        row = await self.db.get_member(tenant, request.vector_store_id, request.file_id)
        return pb.GetVectorStoreFileResponse(vector_store_file=member_proto(row))

    async def list_store_files(
        self, request: pb.ListVectorStoreFilesRequest, secret: str | None
    ) -> pb.ListVectorStoreFilesResponse:
        tenant = (await self.caller(secret)).tenant_id
        page = await self.db.list_files_of(
            tenant, request.vector_store_id, page_size(request.page_size), request.page_token
        )
        return pb.ListVectorStoreFilesResponse(
            vector_store_files=[member_proto(r) for r in page.rows], next_page_token=page.next_after
        )

    async def remove_file(
        self, request: pb.DeleteVectorStoreFileRequest, secret: str | None
    ) -> pb.DeleteVectorStoreFileResponse:
        await self.db.remove_file(
            (await self.caller(secret)).tenant_id, request.vector_store_id, request.file_id
        )
        return pb.DeleteVectorStoreFileResponse(
            file_id=request.file_id, vector_store_id=request.vector_store_id
        )

    async def ingest(
        self,
        caller: Caller,
        secret: str | None,
        store_id: str,
        file_id: str,
        chunking: tuple[int, int],
        user: str,
    ) -> VectorStoreFileRow:
        """The file's text chunked, embedded and written to the store in one
        transaction. A file the embedding model refuses (a chunk longer than
        it embeds) is kept as a failed member saying why, as OpenAI keeps one."""
        _, content = await self.db.file_content(caller.tenant_id, file_id)
        pieces = chunk_text(content.decode("utf-8"), *chunking)
        try:
            vectors = await self.embed(secret, pieces, user)
        except InvalidArgument as err:
            log.info("file %s not added to %s: %s", file_id, store_id, err.message)
            return await self.db.add_file(
                caller.tenant_id, store_id, file_id, [], chunking, error=err.message
            )
        row = await self.db.add_file(
            caller.tenant_id, store_id, file_id, list(zip(pieces, vectors, strict=True)), chunking
        )
        log.info("file %s added to %s: %d chunks", file_id, store_id, len(pieces))
        return row

    async def embed(self, secret: str | None, texts: Sequence[str], user: str) -> list[list[float]]:
        """``texts`` embedded with the retrieval model, billed to the caller's tenant."""
        vectors: list[list[float]] = []
        for start in range(0, len(texts), _EMBED_BATCH):
            request = embedding_service_pb2.CreateEmbeddingsRequest(
                request_id=new_id("emb"),
                model=self._settings.retrieval_embedding_model,
                inputs=[
                    embedding_service_pb2.EmbeddingInput(text=t) for t in texts[start : start + _EMBED_BATCH]
                ],
                user=user,
            )
            answer = await self._embeddings.create(request, secret)
            vectors.extend(list(e.values) for e in answer.embeddings)
        return vectors

    # ----------------------------------------------------------------- search

    async def search(
        self, request: pb.SearchVectorStoresRequest, secret: str | None
    ) -> pb.SearchVectorStoresResponse:
        caller = await self.caller(secret)
        if request.score_threshold < 0 or request.score_threshold > 1:
            raise invalid("score_threshold must be between 0 and 1", "ranking_options")
        hits = await self.search_chunks(
            caller,
            secret,
            list(request.vector_store_ids),
            request.query,
            request.max_num_results,
            request.user,
        )
        return pb.SearchVectorStoresResponse(
            results=[hit_proto(h) for h in hits if h.score >= request.score_threshold],
            region=self.db.region,
            zone=self.zone,
            engine=self.db.index.name,
        )

    async def search_chunks(
        self, caller: Caller, secret: str | None, store_ids: Sequence[str], query: str, limit: int, user: str
    ) -> list[ChunkHit]:
        """The best chunks of the caller's ``store_ids`` for ``query``."""
        if not store_ids or len(store_ids) > MAX_STORES_PER_SEARCH:
            raise invalid(f"name 1 to {MAX_STORES_PER_SEARCH} vector stores", "vector_store_ids")
        if not query.strip() or len(query) > MAX_QUERY_CHARS:
            raise invalid(f"query must be 1 to {MAX_QUERY_CHARS} characters", "query")
        if limit < 0 or limit > MAX_RESULTS:
            raise invalid(f"max_num_results must be between 1 and {MAX_RESULTS}", "max_num_results")
        await self.db.require_stores(caller.tenant_id, store_ids)
        [vector] = await self.embed(secret, [query], user)
        return await self.db.search(
            caller.tenant_id, store_ids, vector, query_terms(query), limit or DEFAULT_RESULTS
        )
