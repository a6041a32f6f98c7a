"""Retrieval in a chat turn's context: a turn that names vector stores
(``ChatStart.retrieval``) gets the best chunks of them for its last user
message (a conversation turn: the question it asks, stored or new), as a
system message of numbered excerpts placed after its own system messages
(a conversation turn: after its system prompt, kept when history is cut),
and its start reports which chunks those were (``ChatStarted.retrieval``),
so the edge can cite them.

Degraded mode: when retrieval cannot run for a reason that is not the
caller's (the zone's store or its embedding pods unreachable, a store
error), the turn goes on without excerpts and the report says so. A
request the caller got wrong (a vector store that is not the tenant's, a
malformed option) fails the turn as any invalid request does; so do rate
limits, since the query's embedding counts against the key like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import grpc

from llmmesh.core.errors import InvalidArgument, MeshError, Reason
from llmmesh.region.knowledge.retrieval import RetrievalGateway
from llmmesh.region.knowledge.retrieval_settings import MAX_STORES_PER_SEARCH
from llmmesh.region.knowledge.vector_store_rows import ChunkHit
from llmmesh.region.policy_cache import Caller
from llmmesh.v1 import chat_service_pb2, common_pb2
from llmmesh.v1 import retrieval_service_pb2 as pb

log = logging.getLogger(__name__)

ExcerptScreen = Callable[[Sequence[str]], Awaitable[list[tuple[str, ...]]]]
"""Per excerpt, the content-filter categories it must stay out of a prompt for (empty: it may go in)."""

MAX_CONTEXT_RESULTS = 20
_CALLERS_FAULT = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)
_SYSTEM_ROLES = (common_pb2.CHAT_ROLE_SYSTEM, common_pb2.CHAT_ROLE_DEVELOPER)
_PREAMBLE = (
    "Excerpts from the user's files follow, each numbered. Use them to answer, "
    "and cite an excerpt by its number in brackets, like [1], where you use it."
)


def _invalid(message: str) -> InvalidArgument:
    return InvalidArgument(Reason.INVALID_REQUEST, message, metadata={"param": "llmmesh_retrieval"})


def excerpts_message(hits: list[ChunkHit]) -> common_pb2.ChatMessage:
    """The system message of numbered excerpts."""
    parts = [_PREAMBLE]
    parts += [f"[{n}] ({hit.filename}) {hit.text}" for n, hit in enumerate(hits, 1)]
    return common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_SYSTEM, content="\n\n".join(parts))


class ChatRetrievalContext:
    """Puts retrieved chunks into turns that ask for them."""

    def __init__(self, retrieval: RetrievalGateway, default_results: int) -> None:
        self._retrieval = retrieval
        self._default_results = default_results

    async def augment(
        self,
        start: chat_service_pb2.ChatStart,
        caller: Caller,
        secret: str | None,
        question: str | None = None,
        into: list[common_pb2.ChatMessage] | None = None,
        screen: ExcerptScreen | None = None,
    ) -> pb.ChatRetrievalReport | None:
        """Add the excerpts to ``start.messages`` (or to ``into``, a
        conversation turn's lead); the report, or None when the turn asked
        for no retrieval. ``question`` is searched with instead of the last
        user message of ``start``. ``screen`` (the input filter's) says which
        excerpts must stay out of the prompt: an instruction planted in a
        document never reaches the model, and is not cited."""
        if not start.HasField("retrieval"):
            return None
        asked = start.retrieval
        if not 1 <= len(asked.vector_store_ids) <= MAX_STORES_PER_SEARCH:
            raise _invalid(f"name 1 to {MAX_STORES_PER_SEARCH} vector stores")
        if not 0 <= asked.max_num_results <= MAX_CONTEXT_RESULTS:
            raise _invalid(f"max_num_results is 1 to {MAX_CONTEXT_RESULTS}")
        said = [m.content for m in start.messages if m.role == common_pb2.CHAT_ROLE_USER]
        query = question if question is not None else (said[-1] if said else "")
        if not query.strip():
            raise _invalid("retrieval searches with the last user message, and there is none with text")
        limit = asked.max_num_results or self._default_results
        try:
            hits = await self._retrieval.search_chunks(
                caller, secret, list(asked.vector_store_ids), query[-4096:], limit, start.user
            )
        except MeshError as err:
            if err.code in _CALLERS_FAULT:
                raise
            log.warning("turn %s: retrieval degraded (%s: %s)", start.request_id, err.reason, err.message)
            return pb.ChatRetrievalReport(degraded=True, degraded_reason=err.reason)
        except Exception as err:
            log.exception("turn %s: retrieval degraded", start.request_id)
            return pb.ChatRetrievalReport(degraded=True, degraded_reason=type(err).__name__)
        if hits and screen is not None:
            verdicts = await screen([h.text for h in hits])
            left_out = [(h, found) for h, found in zip(hits, verdicts, strict=True) if found]
            for hit, found in left_out:
                log.warning(
                    "turn %s: excerpt %d of file %s left out by the content filter (%s)",
                    start.request_id,
                    hit.chunk_index,
                    hit.file_id,
                    ",".join(found),
                )
            hits = [h for h, found in zip(hits, verdicts, strict=True) if not found]
        if hits and into is not None:
            into.append(excerpts_message(hits))
        elif hits:
            lead = 0
            while lead < len(start.messages) and start.messages[lead].role in _SYSTEM_ROLES:
                lead += 1
            start.messages.insert(lead, excerpts_message(hits))
        return pb.ChatRetrievalReport(
            citations=[
                pb.Citation(
                    file_id=h.file_id,
                    filename=h.filename,
                    vector_store_id=h.vector_store_id,
                    chunk_index=h.chunk_index,
                    score=h.score,
                    marker=f"[{n}]",
                )
                for n, h in enumerate(hits, 1)
            ]
        )
