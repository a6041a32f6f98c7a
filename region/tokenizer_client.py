"""Prompt tokens exactly as the engine pods see them, for the router.

The region never tokenizes by itself: it asks a pod serving the model
(``Tokenize`` with the chat messages and the assistant opener, as
``Generate`` renders them) and caches the answer by model and content hash,
so a conversation's repeated prefix costs one RPC per distinct prompt.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Sequence

import grpc
import grpc.aio

from llmmesh.errors import Reason, Unavailable, from_rpc_error
from llmmesh.v1 import common_pb2, engine_service_pb2
from region.engine_pool import EnginePool

# Another pod may answer when one is restarting or draining.
_TRY_NEXT_POD = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def prompt_key(model: str, messages: Sequence[common_pb2.ChatMessage], add_generation_prompt: bool) -> bytes:
    """The cache key of a prompt: a hash of the model and of every message's
    deterministic encoding, each length-prefixed so boundaries count."""
    digest = hashlib.sha256()
    for part in (model.encode(), b"\x01" if add_generation_prompt else b"\x00"):
        digest.update(len(part).to_bytes(8, "little") + part)
    for message in messages:
        encoded = message.SerializeToString(deterministic=True)
        digest.update(len(encoded).to_bytes(8, "little") + encoded)
    return digest.digest()


class TokenizerClient:
    """Tokenizes chat prompts through the pods of ``pods``; an LRU of
    ``capacity`` prompts. Pods serving one model share its tokenizer, so any
    healthy one may answer (the least busy is asked first, then the others)."""

    def __init__(self, pods: EnginePool, capacity: int = 4096, timeout_s: float = 2.0) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._pods = pods
        self._capacity = capacity
        self._timeout_s = timeout_s
        self._cache: OrderedDict[tuple[str, bytes], tuple[int, ...]] = OrderedDict()
        self._turn = itertools.count()
        self.hits = 0
        self.misses = 0

    async def tokenize(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        add_generation_prompt: bool = True,
    ) -> tuple[int, ...]:
        """The prompt's token ids. Raises the pod's MeshError for a bad
        prompt, Unavailable when no pod serving ``model`` answers."""
        key = (model, prompt_key(model, messages, add_generation_prompt))
        cached = self._cache.get(key)
        if cached is not None:
            self.hits += 1
            self._cache.move_to_end(key)
            return cached
        self.misses += 1
        token_ids = await self._ask_a_pod(model, messages, add_generation_prompt)
        self._cache[key] = token_ids
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return token_ids

    async def _ask_a_pod(
        self, model: str, messages: Sequence[common_pb2.ChatMessage], add_generation_prompt: bool
    ) -> tuple[int, ...]:
        serving = [p for p in self._pods.healthy_pods if not model or not p.model or p.model == model]
        # The least busy pod first: a pod tokenizes on the loop that streams
        # its tokens, so a busy one answers late and slows its own streams.
        # Ties rotate, so idle pods share the work.
        start = next(self._turn)
        rotated = [serving[(start + n) % len(serving)] for n in range(len(serving))] if serving else []
        pods = sorted(rotated, key=lambda pod: pod.in_flight)
        request = engine_service_pb2.TokenizeRequest(
            model=model, messages=messages, add_generation_prompt=add_generation_prompt
        )
        for pod in pods:
            try:
                response = await pod.stub.Tokenize(request, timeout=self._timeout_s)
            except grpc.aio.AioRpcError as err:
                if err.code() in _TRY_NEXT_POD:
                    continue
                raise from_rpc_error(err) from err
            return tuple(response.token_ids)
        raise Unavailable(
            Reason.ENGINE_UNAVAILABLE,
            f"no engine pod serving model {model!r} could tokenize the prompt",
            retry_after_s=1.0,
        )
