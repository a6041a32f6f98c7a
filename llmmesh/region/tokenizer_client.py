"""Prompt tokens exactly as the engine pods see them, for the router and the context builder.

A pod publishes its tokenizer as data (``GetTokenizer``: the simulator's
word pieces, or vLLM's Hugging Face tokenizer and chat template), and the
region runs it itself: a busy pod tokenizes on the event loop that streams
its tokens, so asking it puts that loop on every turn's critical path. The
description is fetched once per model. Where a pod describes no tokenizer,
or the region cannot run the one it describes, or a prompt is one the local
tokenizer refuses (an unknown role), the region asks a pod serving the
model (``Tokenize`` with the chat messages and the assistant opener, as
``Generate`` renders them), so errors stay the pod's own. Either way the
answer is cached by model and content hash.

A prompt with tools (definitions, an assistant's calls, a tool's answer)
is rendered as :mod:`region.turn.prompt_render` says: a chat template that
renders tools gets them as vLLM hands them to it; the simulator's tokenizer,
and a chat template that renders no tools (vLLM would leave them out of the
prompt; the region renders the prompt the pod runs, so they reach the model
and are billed), get them as JSON text in plain turns, which a pod asked to
tokenize renders alike. A chat
template with tools that the region cannot run itself is refused
(FAILED_PRECONDITION): ``Tokenize`` carries no tools, and a prompt without
them would bill and run a different prompt than the one asked for.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import grpc
import grpc.aio

from llmmesh.core.chat_tokenizer import (
    HfTokenizerSpec,
    PieceTokenizer,
    PieceTokenizerSpec,
    TokenizerSpec,
    tokenizer_spec,
)
from llmmesh.core.errors import FailedPrecondition, Reason, Unavailable, from_rpc_error
from llmmesh.region.engine_pool import EnginePodHandle, EnginePool
from llmmesh.region.hf_chat_tokenizer import HfChatTokenizer, hf_chat_tokenizer
from llmmesh.region.turn.prompt_render import has_tool_parts, plain_turns, template_messages, template_tools
from llmmesh.v1 import common_pb2, engine_service_pb2

log = logging.getLogger(__name__)

# Another pod may answer when one is restarting or draining.
_TRY_NEXT_POD = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def prompt_key(
    model: str,
    messages: Sequence[common_pb2.ChatMessage],
    add_generation_prompt: bool,
    tools: Sequence[common_pb2.ToolDefinition] = (),
) -> bytes:
    """The cache key of a prompt: a hash of the model, of every message's
    deterministic encoding and of every tool's, each length-prefixed so
    boundaries count (and a tool never reads as a message)."""
    digest = hashlib.sha256()
    for part in (model.encode(), b"\x01" if add_generation_prompt else b"\x00"):
        digest.update(len(part).to_bytes(8, "little") + part)
    for message in messages:
        encoded = message.SerializeToString(deterministic=True)
        digest.update(len(encoded).to_bytes(8, "little") + encoded)
    for tool in tools:
        encoded = b"tool" + tool.SerializeToString(deterministic=True)
        digest.update(len(encoded).to_bytes(8, "little") + encoded)
    return digest.digest()


class ChatTokenizer(Protocol):
    """A tokenizer a pod published, running in the region."""

    def render_chat(self, turns: Iterable[tuple[str, str]], add_generation_prompt: bool) -> list[int]:
        """The ids of chat turns ``(role, content)``; raises for a chat it cannot render."""
        ...


def local_tokenizer(spec: TokenizerSpec | None) -> ChatTokenizer | None:
    """A runnable tokenizer for a published ``spec``, or None when there is none or it cannot run here."""
    if isinstance(spec, PieceTokenizerSpec):
        try:
            return PieceTokenizer(spec)
        except Exception as err:  # a pattern this Python's re rejects
            log.warning("cannot tokenize the published tokenizer locally (%s); asking the pods", err)
            return None
    if isinstance(spec, HfTokenizerSpec):
        return hf_chat_tokenizer(spec)
    return None


class TokenizerClient:
    """Tokenizes chat prompts for models served by the pods of ``pods``; an
    LRU of ``capacity`` prompts. Pods serving one model share its tokenizer,
    so any healthy one may describe it or answer (the least busy is asked
    first, then the others).

    ``local`` False always asks the pods. A model whose pods could not be
    asked for a description is asked again after ``describe_retry_s``.
    """

    def __init__(
        self,
        pods: EnginePool,
        capacity: int = 4096,
        timeout_s: float = 2.0,
        *,
        local: bool = True,
        describe_retry_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._pods = pods
        self._capacity = capacity
        self._timeout_s = timeout_s
        self._local = local
        self._describe_retry_s = describe_retry_s
        self._clock = clock
        self._cache: OrderedDict[tuple[str, bytes], tuple[int, ...]] = OrderedDict()
        # model -> its local tokenizer (None: the pods tokenize), and when to ask again when unsettled.
        self._tokenizers: dict[str, tuple[ChatTokenizer | None, float]] = {}
        self._describing: dict[str, asyncio.Task[ChatTokenizer | None]] = {}
        # model -> the tokenizer its pods published (None: none), once one answered.
        self._specs: dict[str, TokenizerSpec | None] = {}
        self._turn = itertools.count()
        self.hits = 0
        self.misses = 0
        self.local_misses = 0
        """Misses the region tokenized itself (the rest asked a pod)."""

    async def tokenize(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        add_generation_prompt: bool = True,
        tools: Sequence[common_pb2.ToolDefinition] = (),
    ) -> tuple[int, ...]:
        """The prompt's token ids, ``tools`` rendered into it. Raises the
        pod's MeshError for a bad prompt, Unavailable when no pod serving
        ``model`` answers, FailedPrecondition for tools only a chat template
        the region cannot run could render."""
        key = (model, prompt_key(model, messages, add_generation_prompt, tools))
        cached = self._cache.get(key)
        if cached is not None:
            self.hits += 1
            self._cache.move_to_end(key)
            return cached
        self.misses += 1
        token_ids = await self._tokenize_locally(model, messages, add_generation_prompt, tools)
        if token_ids is None:
            token_ids = await self._ask_a_pod(model, messages, add_generation_prompt, tools)
        else:
            self.local_misses += 1
        self._cache[key] = token_ids
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return token_ids

    async def _tokenize_locally(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        add_generation_prompt: bool,
        tools: Sequence[common_pb2.ToolDefinition],
    ) -> tuple[int, ...] | None:
        """The ids by the model's published tokenizer, or None where the pods must answer."""
        # A prompt without messages is plain text to a pod, and "" names no one tokenizer.
        if not self._local or not model or not messages:
            return None
        tokenizer = await self._tokenizer_of(model)
        if tokenizer is None:
            return None
        try:
            if (
                isinstance(tokenizer, HfChatTokenizer)
                and tokenizer.renders_tools
                and has_tool_parts(messages, tools)
            ):
                rendered, offered = template_messages(messages), template_tools(tools)
                return tuple(tokenizer.render_messages(rendered, offered, add_generation_prompt))
            return tuple(tokenizer.render_chat(plain_turns(messages, tools), add_generation_prompt))
        except Exception:
            # The pod gives this prompt its own answer, an error most likely.
            return None

    async def _tokenizer_of(self, model: str) -> ChatTokenizer | None:
        known = self._tokenizers.get(model)
        if known is not None and (known[0] is not None or self._clock() < known[1]):
            return known[0]
        # One description request per model, however many turns wait for it.
        task = self._describing.get(model)
        if task is None:
            task = self._describing[model] = asyncio.create_task(self._describe(model))
            task.add_done_callback(lambda _: self._describing.pop(model, None))
        return await asyncio.shield(task)

    async def _describe(self, model: str) -> ChatTokenizer | None:
        """Ask the pods serving ``model`` for its tokenizer and remember the answer."""
        request = engine_service_pb2.GetTokenizerRequest(model=model)
        pods = self._pods_for(model)
        if not pods:
            return None  # nothing to remember: ask again once a pod is up
        for pod in pods:
            try:
                response = await pod.stub.GetTokenizer(request, timeout=self._timeout_s)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    break  # a pod of an older release: it can only tokenize
                continue
            spec = self._specs[model] = tokenizer_spec(response)
            tokenizer = local_tokenizer(spec)
            # A pod's answer settles it for good: pods of one model share its tokenizer.
            self._tokenizers[model] = (tokenizer, float("inf"))
            if tokenizer is not None:
                log.info("tokenizing prompts of model %s in the region", model)
            return tokenizer
        self._tokenizers[model] = (None, self._clock() + self._describe_retry_s)
        return None

    def _pods_for(self, model: str) -> list[EnginePodHandle]:
        """The healthy pods serving ``model``, the least busy first.

        A pod answers on the loop that streams its tokens, so a busy one
        answers late and slows its own streams. Ties rotate, so idle pods
        share the work."""
        serving = [p for p in self._pods.healthy_pods if not model or not p.model or p.model == model]
        start = next(self._turn)
        rotated = [serving[(start + n) % len(serving)] for n in range(len(serving))] if serving else []
        return sorted(rotated, key=lambda pod: pod.in_flight)

    async def _ask_a_pod(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        add_generation_prompt: bool,
        tools: Sequence[common_pb2.ToolDefinition],
    ) -> tuple[int, ...]:
        if has_tool_parts(messages, tools):
            messages = await self._plain_messages(model, messages, tools)
        request = engine_service_pb2.TokenizeRequest(
            model=model, messages=messages, add_generation_prompt=add_generation_prompt
        )
        for pod in self._pods_for(model):
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

    async def _plain_messages(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        tools: Sequence[common_pb2.ToolDefinition],
    ) -> list[common_pb2.ChatMessage]:
        """A prompt with tool parts as the plain messages a pod renders as
        :func:`plain_turns` does; FailedPrecondition for a chat template that
        renders tools itself (see the module docstring)."""
        if model not in self._specs:
            await self._describe(model)
        if model not in self._specs:
            raise Unavailable(
                Reason.ENGINE_UNAVAILABLE,
                f"no engine pod serving model {model!r} described its tokenizer",
                retry_after_s=1.0,
            )
        spec = self._specs.get(model)
        if isinstance(spec, HfTokenizerSpec) and "tools" in spec.chat_template:
            raise FailedPrecondition(
                Reason.INVALID_REQUEST,
                f"this region cannot render tools into model {model}'s chat template "
                "(it renders them itself, and cannot run that template here)",
                metadata={"param": "tools"},
            )
        return [
            common_pb2.ChatMessage(
                role=common_pb2.ChatRole.Value(f"CHAT_ROLE_{role.upper()}"), content=content
            )
            for role, content in plain_turns(messages, tools)
        ]
