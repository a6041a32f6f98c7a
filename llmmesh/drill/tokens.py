"""Counting the tokens a client received, with the mesh's own tokenizer.

An SSE chunk carries text, not tokens, and one chunk may hold several
tokens (the region's output filter releases text in pieces). So the drill
tokenizes each turn's received text with ``EngineService.Tokenize`` on one
of the mesh's pods, less the tokens of the empty text (the BOS a plain
prompt gets). For the simulator this gives back exactly the tokens
generated (its output is canonically tokenized words and marks); for a
BPE model re-tokenizing decoded text can in rare cases merge or split a
piece differently. Texts repeat (every whole reply of a stream is the
same), so counts are cached by text.

The drill reaches the pods with its admin certificate (an operator may
look at any pod). A deployed mesh's pods are not reachable from the drill: the count is
then the mesh's own, the ``completion_tokens`` of the stream's usage
chunk, and the report says which source it used.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import grpc.aio

from llmmesh.drill.target import Dial
from llmmesh.v1 import engine_service_pb2 as epb
from llmmesh.v1 import engine_service_pb2_grpc

TOKENIZE_TIMEOUT_S = 10.0


class TokenCounter:
    """Counts tokens of texts on the first pod that answers; ``pods`` open channels to them."""

    def __init__(self, pods: Sequence[Dial]) -> None:
        self._pods = list(pods)
        self._cache: dict[str, int] = {}
        self._baseline: int | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: engine_service_pb2_grpc.EngineServiceStub | None = None

    async def __aenter__(self) -> TokenCounter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def count(self, text: str) -> int | None:
        """Tokens of ``text``; None when no pod can tokenize."""
        if not text:
            return 0
        if text in self._cache:
            return self._cache[text]
        if self._baseline is None:
            self._baseline = await self._tokenize("")
            if self._baseline is None:
                return None
        tokens = await self._tokenize(text)
        if tokens is None:
            return None
        self._cache[text] = max(0, tokens - self._baseline)
        return self._cache[text]

    async def _tokenize(self, text: str) -> int | None:
        while self._pods:
            if self._stub is None:
                self._channel = self._pods[0]()
                self._stub = engine_service_pb2_grpc.EngineServiceStub(self._channel)
            try:
                resp = await self._stub.Tokenize(epb.TokenizeRequest(text=text), timeout=TOKENIZE_TIMEOUT_S)
                return len(resp.token_ids)
            except grpc.aio.AioRpcError:
                # This pod is gone: the next one (every pod of a mesh serves the same tokenizer).
                self._pods.pop(0)
                if self._channel is not None:
                    await self._channel.close()
                self._channel, self._stub = None, None
        return None
