"""``/v1/files``: upload (multipart, ``purpose=assistants``), list, get,
delete and content, in OpenAI's shapes, stored in the tenant's zone.

Only UTF-8 text files are served (the region refuses others with a 400
naming ``file``); ``expires_after`` and any other form field are refused,
never ignored.
"""

from __future__ import annotations

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmmesh.edge.retrieval_calls import RetrievalCalls, list_page, list_query
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.unary_requests import bad_request
from llmmesh.v1 import retrieval_service_pb2 as pb

_FORM_FIELDS = frozenset({"file", "purpose"})


def file_object(file: pb.StoredFile) -> dict[str, object]:
    """A stored file as OpenAI's ``file`` object."""
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": file.created_at,
        "filename": file.filename,
        "purpose": file.purpose,
        # Stored whole before the answer: nothing is left to process.
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


class FileRoutes:
    """The files routes over the zone's RetrievalService."""

    def __init__(self, settings: EdgeSettings, calls: RetrievalCalls) -> None:
        self._settings = settings
        self._calls = calls

    def routes(self) -> list[Route]:
        return [
            Route("/v1/files", self.upload, methods=["POST"]),
            Route("/v1/files", self.list, methods=["GET"]),
            Route("/v1/files/{file_id}", self.get, methods=["GET"]),
            Route("/v1/files/{file_id}", self.delete, methods=["DELETE"]),
            Route("/v1/files/{file_id}/content", self.content, methods=["GET"]),
        ]

    async def upload(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise bad_request("upload a file as multipart/form-data with fields file and purpose", "file")
        size = int(request.headers.get("content-length") or 0)
        if size > self._settings.max_body_bytes:
            raise bad_request(f"the upload is larger than {self._settings.max_body_bytes} bytes", "file")
        async with request.form(max_files=1, max_fields=4) as form:
            for key in form:
                if key not in _FORM_FIELDS:
                    raise bad_request(f"form field {key!r} is not supported", key, "unsupported_parameter")
            upload = form.get("file")
            purpose = form.get("purpose")
            if not isinstance(upload, UploadFile):
                raise bad_request(
                    "file is required: the file's bytes as a form file", "file", "missing_required_parameter"
                )
            if not isinstance(purpose, str) or not purpose:
                raise bad_request("purpose is required", "purpose", "missing_required_parameter")
            content = await upload.read()
            message = pb.CreateFileRequest(filename=upload.filename or "", purpose=purpose, content=content)
        answer, region = await self._calls.call(principal, lambda s: s.CreateFile, message)
        return JSONResponse(file_object(answer.file), headers={"x-llmmesh-region": region})

    async def list(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        limit, after, extra = list_query(request, {"purpose"})
        message = pb.ListFilesRequest(page_size=limit, page_token=after, purpose=extra.get("purpose", ""))
        answer, _ = await self._calls.call(principal, lambda s: s.ListFiles, message)
        return JSONResponse(list_page([file_object(f) for f in answer.files], answer.next_page_token))

    async def get(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        message = pb.GetFileRequest(file_id=request.path_params["file_id"])
        answer, _ = await self._calls.call(principal, lambda s: s.GetFile, message)
        return JSONResponse(file_object(answer.file))

    async def delete(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        message = pb.DeleteFileRequest(file_id=request.path_params["file_id"])
        answer, _ = await self._calls.call(principal, lambda s: s.DeleteFile, message)
        return JSONResponse({"id": answer.file_id, "object": "file", "deleted": True})

    async def content(self, request: Request) -> Response:
        principal = await self._calls.principal(request)
        message = pb.GetFileContentRequest(file_id=request.path_params["file_id"])
        answer, _ = await self._calls.call(principal, lambda s: s.GetFileContent, message)
        # The bytes are the tenant's upload, whatever they hold: a browser
        # saves them, never sniffs and renders them on the mesh's origin.
        headers = {"x-content-type-options": "nosniff", "content-disposition": "attachment"}
        return Response(answer.content, media_type="application/octet-stream", headers=headers)
