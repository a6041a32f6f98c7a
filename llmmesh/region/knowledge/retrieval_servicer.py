"""``RetrievalService``: a thin gRPC face over :class:`region.knowledge.retrieval.RetrievalGateway`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from llmmesh.core.errors import MeshError
from llmmesh.region.grpc_caller import Context, caller_secret
from llmmesh.region.knowledge.file_batches import FileBatchGateway
from llmmesh.region.knowledge.retrieval import RetrievalGateway
from llmmesh.v1 import retrieval_service_pb2 as pb
from llmmesh.v1 import retrieval_service_pb2_grpc as pb_grpc

RETRIEVAL_SERVICE_NAME = "llmmesh.v1.RetrievalService"
RETRIEVAL_METHODS = tuple(
    method.name for method in pb.DESCRIPTOR.services_by_name["RetrievalService"].methods
)
"""Every RPC of the service, for the region's access policy."""

Req = TypeVar("Req")
Resp = TypeVar("Resp")


async def _answer(
    handler: Callable[[Req, str | None], Awaitable[Resp]], request: Req, context: Context
) -> Resp:
    try:
        # Shielded: a caller that goes away must not cut a write (and its billed embeddings) short.
        return await asyncio.shield(handler(request, caller_secret(context)))
    except MeshError as err:
        await err.abort(context)


class RetrievalServicer(pb_grpc.RetrievalServiceServicer):
    """Each RPC is its gateway method, with MeshErrors as rich statuses."""

    def __init__(self, gateway: RetrievalGateway) -> None:
        self._g = gateway
        self._batches = FileBatchGateway(gateway)

    async def CreateFile(self, request: pb.CreateFileRequest, context: Context) -> pb.CreateFileResponse:
        return await _answer(self._g.create_file, request, context)

    async def GetFile(self, request: pb.GetFileRequest, context: Context) -> pb.GetFileResponse:
        return await _answer(self._g.get_file, request, context)

    async def ListFiles(self, request: pb.ListFilesRequest, context: Context) -> pb.ListFilesResponse:
        return await _answer(self._g.list_files, request, context)

    async def DeleteFile(self, request: pb.DeleteFileRequest, context: Context) -> pb.DeleteFileResponse:
        return await _answer(self._g.delete_file, request, context)

    async def GetFileContent(
        self, request: pb.GetFileContentRequest, context: Context
    ) -> pb.GetFileContentResponse:
        return await _answer(self._g.file_content, request, context)

    async def CreateVectorStore(
        self, request: pb.CreateVectorStoreRequest, context: Context
    ) -> pb.CreateVectorStoreResponse:
        return await _answer(self._g.create_store, request, context)

    async def GetVectorStore(
        self, request: pb.GetVectorStoreRequest, context: Context
    ) -> pb.GetVectorStoreResponse:
        return await _answer(self._g.get_store, request, context)

    async def ListVectorStores(
        self, request: pb.ListVectorStoresRequest, context: Context
    ) -> pb.ListVectorStoresResponse:
        return await _answer(self._g.list_stores, request, context)

    async def DeleteVectorStore(
        self, request: pb.DeleteVectorStoreRequest, context: Context
    ) -> pb.DeleteVectorStoreResponse:
        return await _answer(self._g.delete_store, request, context)

    async def CreateVectorStoreFile(
        self, request: pb.CreateVectorStoreFileRequest, context: Context
    ) -> pb.CreateVectorStoreFileResponse:
        return await _answer(self._g.add_file, request, context)

    async def GetVectorStoreFile(
        self, request: pb.GetVectorStoreFileRequest, context: Context
    ) -> pb.GetVectorStoreFileResponse:
        return await _answer(self._g.get_store_file, request, context)

    async def ListVectorStoreFiles(
        self, request: pb.ListVectorStoreFilesRequest, context: Context
    ) -> pb.ListVectorStoreFilesResponse:
        return await _answer(self._g.list_store_files, request, context)

    async def DeleteVectorStoreFile(
        self, request: pb.DeleteVectorStoreFileRequest, context: Context
    ) -> pb.DeleteVectorStoreFileResponse:
        return await _answer(self._g.remove_file, request, context)

    async def CreateVectorStoreFileBatch(
        self, request: pb.CreateVectorStoreFileBatchRequest, context: Context
    ) -> pb.CreateVectorStoreFileBatchResponse:
        return await _answer(self._batches.create, request, context)

    async def GetVectorStoreFileBatch(
        self, request: pb.GetVectorStoreFileBatchRequest, context: Context
    ) -> pb.GetVectorStoreFileBatchResponse:
        return await _answer(self._batches.get, request, context)

    async def CancelVectorStoreFileBatch(
        self, request: pb.CancelVectorStoreFileBatchRequest, context: Context
    ) -> pb.CancelVectorStoreFileBatchResponse:
        return await _answer(self._batches.cancel, request, context)

    async def ListVectorStoreFileBatchFiles(
        self, request: pb.ListVectorStoreFileBatchFilesRequest, context: Context
    ) -> pb.ListVectorStoreFileBatchFilesResponse:
        return await _answer(self._batches.list_files, request, context)

    async def SearchVectorStores(
        self, request: pb.SearchVectorStoresRequest, context: Context
    ) -> pb.SearchVectorStoresResponse:
        return await _answer(self._g.search, request, context)
