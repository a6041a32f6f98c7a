"""The OpenAPI description of ``/v1/files``, ``/v1/vector_stores`` (with
their file batches) and ``/v1/memories`` (:mod:`edge.files`,
:mod:`edge.vector_stores`, :mod:`edge.file_batches`, :mod:`edge.memories`),
merged into the edge's
document by :mod:`edge.openapi.document`."""

from __future__ import annotations

from collections.abc import Mapping

from llmmesh.edge.openapi.components import INT, STRING, Schema, ref

_NUMBER: Schema = {"type": "number"}
_STRINGS: Schema = {"type": "object", "additionalProperties": STRING}
_CHUNKING: Schema = {
    "description": "auto, or static token sizes (4 characters a token).",
    "oneOf": [
        {"type": "object", "properties": {"type": {"const": "auto"}}, "required": ["type"]},
        {
            "type": "object",
            "properties": {
                "type": {"const": "static"},
                "static": {
                    "type": "object",
                    "properties": {
                        "max_chunk_size_tokens": {"type": "integer", "minimum": 100, "maximum": 4096},
                        "chunk_overlap_tokens": {"type": "integer", "minimum": 0},
                    },
                    "required": ["max_chunk_size_tokens", "chunk_overlap_tokens"],
                },
            },
            "required": ["type", "static"],
        },
    ],
}
_BATCH_COUNTS = ("in_progress", "completed", "failed", "cancelled", "total")
_REFUSED: Schema = {"description": "Refused (400 unsupported_parameter) unless null."}


def _list(item: str) -> Schema:
    return {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": ref(item)},
            "first_id": {"type": ["string", "null"]},
            "last_id": {"type": ["string", "null"]},
            "has_more": {"type": "boolean"},
        },
        "required": ["object", "data", "has_more"],
    }


def _deleted(kind: str) -> Schema:
    return {
        "type": "object",
        "properties": {"id": STRING, "object": {"const": kind}, "deleted": {"const": True}},
        "required": ["id", "object", "deleted"],
    }


SCHEMAS: dict[str, Schema] = {
    "File": {
        "type": "object",
        "properties": {
            "id": STRING,
            "object": {"const": "file"},
            "bytes": INT,
            "created_at": INT,
            "filename": STRING,
            "purpose": {"const": "assistants"},
            "status": {"const": "processed"},
        },
        "required": ["id", "object", "bytes", "created_at", "filename", "purpose", "status"],
    },
    "FileList": _list("File"),
    "FileUpload": {
        "type": "object",
        "properties": {
            "file": {"type": "string", "format": "binary", "description": "UTF-8 text."},
            "purpose": {"const": "assistants"},
        },
        "required": ["file", "purpose"],
        "additionalProperties": False,
    },
    "VectorStore": {
        "type": "object",
        "properties": {
            "id": STRING,
            "object": {"const": "vector_store"},
            "created_at": INT,
            "name": STRING,
            "usage_bytes": INT,
            "file_counts": {"type": "object", "additionalProperties": INT},
            "status": {"enum": ["completed", "in_progress"]},
            "last_active_at": INT,
            "metadata": _STRINGS,
        },
        "required": ["id", "object", "created_at", "name", "usage_bytes", "file_counts", "status"],
    },
    "VectorStoreList": _list("VectorStore"),
    "VectorStoreFile": {
        "type": "object",
        "properties": {
            "id": STRING,
            "object": {"const": "vector_store.file"},
            "created_at": INT,
            "vector_store_id": STRING,
            "status": {"enum": ["completed", "failed"]},
            "usage_bytes": INT,
            "last_error": {"type": ["object", "null"]},
            "chunking_strategy": {"type": "object"},
        },
        "required": ["id", "object", "created_at", "vector_store_id", "status", "usage_bytes"],
    },
    "VectorStoreFileList": _list("VectorStoreFile"),
    "CreateVectorStoreRequest": {
        "type": "object",
        "properties": {
            "name": STRING,
            "file_ids": {"type": "array", "items": STRING, "maxItems": 500},
            "metadata": _STRINGS,
            "chunking_strategy": _CHUNKING,
            "expires_after": _REFUSED,
            "description": _REFUSED,
        },
        "additionalProperties": False,
    },
    "CreateVectorStoreFileRequest": {
        "type": "object",
        "properties": {"file_id": STRING, "chunking_strategy": _CHUNKING, "attributes": _REFUSED},
        "required": ["file_id"],
        "additionalProperties": False,
    },
    "VectorStoreFileBatch": {
        "type": "object",
        "properties": {
            "id": STRING,
            "object": {"const": "vector_store.files_batch"},
            "created_at": INT,
            "vector_store_id": STRING,
            "status": {
                "enum": ["in_progress", "completed", "cancelled", "failed"],
                "description": "completed when returned: files are embedded before the answer.",
            },
            "file_counts": {
                "type": "object",
                "properties": dict.fromkeys(_BATCH_COUNTS, INT),
                "required": list(_BATCH_COUNTS),
            },
        },
        "required": ["id", "object", "created_at", "vector_store_id", "status", "file_counts"],
    },
    "CreateVectorStoreFileBatchRequest": {
        "type": "object",
        "description": "file_ids (with one chunking_strategy) or files, not both.",
        "properties": {
            "file_ids": {"type": "array", "items": STRING, "minItems": 1, "maxItems": 500},
            "files": {
                "type": "array",
                "minItems": 1,
                "maxItems": 500,
                "items": {
                    "type": "object",
                    "properties": {
                        "file_id": STRING,
                        "chunking_strategy": _CHUNKING,
                        "attributes": _REFUSED,
                    },
                    "required": ["file_id"],
                    "additionalProperties": False,
                },
            },
            "chunking_strategy": {**_CHUNKING, "description": "With file_ids only; refused with files."},
            "attributes": _REFUSED,
        },
        "additionalProperties": False,
    },
    "VectorStoreSearchRequest": {
        "type": "object",
        "properties": {
            "query": {"oneOf": [STRING, {"type": "array", "items": STRING, "minItems": 1, "maxItems": 1}]},
            "max_num_results": {"type": "integer", "minimum": 1, "maximum": 50},
            "ranking_options": {
                "type": "object",
                "properties": {
                    "ranker": {"enum": ["auto", "none", "default-2024-11-15"]},
                    "score_threshold": {"type": "number", "minimum": 0, "maximum": 1},
                },
            },
            "filters": _REFUSED,
            "rewrite_query": {"type": "boolean", "description": "true is refused."},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    "VectorStoreSearchPage": {
        "type": "object",
        "properties": {
            "object": {"const": "vector_store.search_results.page"},
            "search_query": {"type": "array", "items": STRING},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "file_id": STRING,
                        "filename": STRING,
                        "score": {
                            **_NUMBER,
                            "description": "Reciprocal-rank fusion of vector and full-text.",
                        },
                        "attributes": {"type": "object"},
                        "content": {"type": "array", "items": {"type": "object"}},
                    },
                },
            },
            "has_more": {"const": False},
            "next_page": {"type": "null"},
        },
        "required": ["object", "search_query", "data", "has_more"],
    },
    "Memory": {
        "type": "object",
        "properties": {
            "id": STRING,
            "object": {"const": "llmmesh.memory"},
            "user": STRING,
            "content": STRING,
            "created_at": INT,
            "source_request_id": STRING,
        },
        "required": ["id", "object", "user", "content", "created_at"],
    },
    "MemoryList": _list("Memory"),
    "MemoriesDeleted": {
        "type": "object",
        "properties": {"object": {"const": "llmmesh.memory.deleted"}, "deleted": INT},
        "required": ["object", "deleted"],
    },
    "FileDeleted": _deleted("file"),
    "VectorStoreDeleted": _deleted("vector_store.deleted"),
    "VectorStoreFileDeleted": _deleted("vector_store.file.deleted"),
}


def _path_param(name: str, description: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "description": description, "schema": STRING}


def _query(name: str, description: str) -> Schema:
    return {"name": name, "in": "query", "description": description, "schema": STRING}


_FILE_ID = _path_param("file_id", 'A file id, "file-<zone>-<random>".')
_STORE_ID = _path_param("vector_store_id", 'A vector store id, "vs_<zone>_<random>".')
_PAGING = [
    _query("limit", "1 to 100; 20 when absent."),
    _query("after", "An id from the previous page."),
    _query("order", "desc only (newest first)."),
]


def paths(errors: Mapping[str, Schema]) -> dict[str, Schema]:
    """The operations, answering ``errors`` besides their 200."""

    def op(summary: str, answer: str, *, body: str = "", parameters: list[Schema] | None = None) -> Schema:
        ok = {"description": summary, "content": {"application/json": {"schema": ref(answer)}}}
        operation: Schema = {"summary": summary, "responses": {"200": ok, **errors}}
        if body:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": ref(body)}},
            }
        if parameters:
            operation["parameters"] = parameters
        return operation

    upload = op("Upload a UTF-8 text file (purpose assistants), kept in the tenant's zone.", "File")
    upload["requestBody"] = {
        "required": True,
        "content": {"multipart/form-data": {"schema": ref("FileUpload")}},
    }
    content: Schema = {
        "summary": "The file's bytes.",
        "parameters": [_FILE_ID],
        "responses": {
            "200": {"description": "The bytes.", "content": {"application/octet-stream": {}}},
            **errors,
        },
    }
    store_file = _path_param("file_id", "A file of the vector store.")
    batch = _path_param("batch_id", 'A file batch id, "vsfb_<zone>_<random>".')
    return {
        "/v1/files": {
            "post": upload,
            "get": op(
                "The tenant's files, newest first.",
                "FileList",
                parameters=[*_PAGING, _query("purpose", "assistants")],
            ),
        },
        "/v1/files/{file_id}": {
            "get": op("One file.", "File", parameters=[_FILE_ID]),
            "delete": op(
                "Delete a file and its chunks in every vector store.", "FileDeleted", parameters=[_FILE_ID]
            ),
        },
        "/v1/files/{file_id}/content": {"get": content},
        "/v1/vector_stores": {
            "post": op(
                "Create a vector store; its files are chunked and embedded before the answer.",
                "VectorStore",
                body="CreateVectorStoreRequest",
            ),
            "get": op("The tenant's vector stores, newest first.", "VectorStoreList", parameters=_PAGING),
        },
        "/v1/vector_stores/{vector_store_id}": {
            "get": op("One vector store.", "VectorStore", parameters=[_STORE_ID]),
            "delete": op(
                "Delete a vector store (its files stay).", "VectorStoreDeleted", parameters=[_STORE_ID]
            ),
        },
        "/v1/vector_stores/{vector_store_id}/files": {
            "post": op(
                "Add a file: chunked and embedded with the mesh's embedding model (billed).",
                "VectorStoreFile",
                body="CreateVectorStoreFileRequest",
                parameters=[_STORE_ID],
            ),
            "get": op("The vector store's files.", "VectorStoreFileList", parameters=[_STORE_ID, *_PAGING]),
        },
        "/v1/vector_stores/{vector_store_id}/files/{file_id}": {
            "get": op("One file of the vector store.", "VectorStoreFile", parameters=[_STORE_ID, store_file]),
            "delete": op(
                "Remove a file from the vector store.",
                "VectorStoreFileDeleted",
                parameters=[_STORE_ID, store_file],
            ),
        },
        "/v1/vector_stores/{vector_store_id}/file_batches": {
            "post": op(
                "Add files as one batch, each chunked and embedded before the answer (completed).",
                "VectorStoreFileBatch",
                body="CreateVectorStoreFileBatchRequest",
                parameters=[_STORE_ID],
            )
        },
        "/v1/vector_stores/{vector_store_id}/file_batches/{batch_id}": {
            "get": op(
                "One file batch of the vector store.", "VectorStoreFileBatch", parameters=[_STORE_ID, batch]
            )
        },
        "/v1/vector_stores/{vector_store_id}/file_batches/{batch_id}/cancel": {
            "post": op(
                "Cancel a batch in progress; a finished one (every batch, once created) is a 400.",
                "VectorStoreFileBatch",
                parameters=[_STORE_ID, batch],
            )
        },
        "/v1/vector_stores/{vector_store_id}/file_batches/{batch_id}/files": {
            "get": op(
                "The batch's files still in the vector store, newest first.",
                "VectorStoreFileList",
                parameters=[
                    _STORE_ID,
                    batch,
                    *_PAGING,
                    _query("filter", "in_progress, completed, failed or cancelled."),
                ],
            )
        },
        "/v1/memories": {
            "get": op(
                "llmmesh: the facts kept about one end user (memory), newest first.",
                "MemoryList",
                parameters=[{**_query("user", "The end user."), "required": True}, *_PAGING],
            ),
            "delete": op(
                "llmmesh: delete every fact kept about one end user.",
                "MemoriesDeleted",
                parameters=[{**_query("user", "The end user."), "required": True}],
            ),
        },
        "/v1/memories/{memory_id}": {
            "delete": op(
                "llmmesh: delete one fact (with user, only if it is about that end user).",
                "MemoriesDeleted",
                parameters=[
                    _path_param("memory_id", 'A memory id, "mem_<random>".'),
                    _query("user", "The end user the fact must be about."),
                ],
            )
        },
        "/v1/vector_stores/{vector_store_id}/search": {
            "post": op(
                "Hybrid search: vector k-NN and full-text BM25, fused by reciprocal rank.",
                "VectorStoreSearchPage",
                body="VectorStoreSearchRequest",
                parameters=[_STORE_ID],
            )
        },
    }
