"""A vector store's file batches (``RetrievalService``'s ``…VectorStoreFileBatch…``
RPCs): files added together, each as one added alone is
(:meth:`region.knowledge.retrieval.RetrievalGateway.ingest`: the same
checks, caps, embedding and zone), then recorded as one batch in the
zone's store (:mod:`region.knowledge.file_batch_store`).

Files are chunked and embedded before the creation answers, so a batch is
``completed`` when it is returned and cancelling one is FAILED_PRECONDITION.
"""

from __future__ import annotations

import secrets

from llmmesh.core.errors import FailedPrecondition, Reason
from llmmesh.region.knowledge.file_batch_store import FileBatchStore
from llmmesh.region.knowledge.retrieval import MAX_STORE_FILES, RetrievalGateway, invalid, page_size
from llmmesh.region.knowledge.retrieval_protos import batch_proto, member_proto
from llmmesh.v1 import retrieval_service_pb2 as pb

FILE_STATES = ("in_progress", "completed", "failed", "cancelled")
"""The states a batch's files may be listed by."""


class FileBatchGateway:
    """File batches for authenticated callers, over the retrieval gateway's files and stores."""

    def __init__(self, retrieval: RetrievalGateway) -> None:
        self._r = retrieval
        self._store = FileBatchStore(retrieval.db)

    async def create(
        self, request: pb.CreateVectorStoreFileBatchRequest, secret: str | None
    ) -> pb.CreateVectorStoreFileBatchResponse:
        caller = await self._r.caller(secret)
        tenant, store_id = caller.tenant_id, request.vector_store_id
        # Each file is chunked and embedded (billed): a long or repeating list is refused, not run.
        if not 1 <= len(request.files) <= MAX_STORE_FILES:
            raise invalid(f"a batch names 1 to {MAX_STORE_FILES} files", "file_ids")
        file_ids = [f.file_id for f in request.files]
        if not all(file_ids):
            raise invalid("every file of a batch needs its file_id", "file_ids")
        if len(set(file_ids)) != len(file_ids):
            raise invalid("the batch names a file more than once", "file_ids")
        chunkings = [self._r.chunking(f.max_chunk_chars, f.chunk_overlap_chars) for f in request.files]
        await self._r.db.get_vector_store(tenant, store_id)
        for file_id in file_ids:
            await self._r.db.get_file(tenant, file_id)
        created_at = self._r.db.now()
        for file_id, chunking in zip(file_ids, chunkings, strict=True):
            await self._r.ingest(caller, secret, store_id, file_id, chunking, request.user)
        batch_id = f"vsfb_{self._r.zone}_{secrets.token_hex(12)}"
        row = await self._store.record(tenant, store_id, batch_id, file_ids, created_at)
        return pb.CreateVectorStoreFileBatchResponse(batch=batch_proto(row))

    async def get(
        self, request: pb.GetVectorStoreFileBatchRequest, secret: str | None
    ) -> pb.GetVectorStoreFileBatchResponse:
        tenant = (await self._r.caller(secret)).tenant_id
        row = await self._store.get(tenant, request.vector_store_id, request.batch_id)
        return pb.GetVectorStoreFileBatchResponse(batch=batch_proto(row))

    async def cancel(
        self, request: pb.CancelVectorStoreFileBatchRequest, secret: str | None
    ) -> pb.CancelVectorStoreFileBatchResponse:
        tenant = (await self._r.caller(secret)).tenant_id
        row = await self._store.get(tenant, request.vector_store_id, request.batch_id)
        raise FailedPrecondition(
            Reason.INVALID_REQUEST,
            f"file batch {row.id!r} is {row.status}: only a batch in progress can be cancelled",
            metadata={"param": "batch_id"},
        )

    async def list_files(
        self, request: pb.ListVectorStoreFileBatchFilesRequest, secret: str | None
    ) -> pb.ListVectorStoreFileBatchFilesResponse:
        tenant = (await self._r.caller(secret)).tenant_id
        if request.status and request.status not in FILE_STATES:
            raise invalid(f"filter is one of {', '.join(FILE_STATES)}", "filter")
        page = await self._store.files(
            tenant,
            request.vector_store_id,
            request.batch_id,
            request.status,
            page_size(request.page_size),
            request.page_token,
        )
        return pb.ListVectorStoreFileBatchFilesResponse(
            vector_store_files=[member_proto(r) for r in page.rows], next_page_token=page.next_after
        )
