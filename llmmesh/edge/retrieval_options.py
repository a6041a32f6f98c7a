"""``llmmesh_retrieval``: the mesh's extension of chat completions that puts
chunks of the tenant's vector stores into a turn's context (``extra_body``
in the ``openai`` SDK), and the fields that report it in the reply.

The request names 1 to 10 vector stores and, optionally, how many chunks to
use (1 to 20; the region's default otherwise); the region searches them
with the turn's last user message. The reply (the ``chat.completion``, or a
stream's finish chunk) carries ``llmmesh_citations``: the chunks the
context held, each with the ``[n]`` marker the context numbered it with,
and ``llmmesh_retrieval_degraded``: true when retrieval could not run and
the turn went on without it. OpenAI's ``file_search`` tool belongs to the
Assistants and Responses APIs, which the mesh does not serve; a chat
``tools`` entry of that type is refused as any non-function tool is.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictInt

from llmmesh.edge.request_types import Strict, Text
from llmmesh.v1 import chat_service_pb2
from llmmesh.v1 import retrieval_service_pb2 as pb

StoreId = Annotated[Text, Field(min_length=1, max_length=96)]


class RetrievalOptions(Strict):
    """The ``llmmesh_retrieval`` object of a chat completion request."""

    vector_store_ids: list[StoreId] = Field(min_length=1, max_length=10)
    max_num_results: Annotated[StrictInt, Field(ge=1, le=20)] | None = None

    def to_proto(self) -> pb.ChatRetrieval:
        return pb.ChatRetrieval(
            vector_store_ids=self.vector_store_ids, max_num_results=self.max_num_results or 0
        )


def retrieval_fields(started: chat_service_pb2.ChatStarted) -> dict[str, object]:
    """The reply's retrieval fields; none when the turn asked for no retrieval."""
    if not started.HasField("retrieval"):
        return {}
    report = started.retrieval
    return {
        "llmmesh_citations": [
            {
                "marker": c.marker,
                "file_id": c.file_id,
                "filename": c.filename,
                "vector_store_id": c.vector_store_id,
                "chunk_index": c.chunk_index,
                "score": c.score,
            }
            for c in report.citations
        ],
        "llmmesh_retrieval_degraded": report.degraded,
    }
