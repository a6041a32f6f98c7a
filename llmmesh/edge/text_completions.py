"""``POST /v1/completions``: OpenAI's legacy text completions, served over
the same path as chat (edge -> region -> engine) by
:meth:`CompletionsHandler.serve_turn`: the same streams (resumable, failed
over), errors, usage and billing.

How the prompt reaches the engine: the region's ``ChatStart`` carries chat
messages only, no raw prompt, so a prompt is sent as one user message and
the engine renders it with the model's chat template. The reply is the
model's answer to the prompt, not a raw continuation of its text; a client
that needs an exact continuation gets a different text than a raw-prompt
server would give it (the honest limit of this mesh today).

Honoured: ``model``, ``prompt`` (a string, or a list of strings: each its
own turn and choice, not streamed together), ``max_tokens`` (16 when
absent, as OpenAI), ``temperature``, ``top_p``, ``n`` and ``best_of`` of 1,
``stop``, ``stream``, ``stream_options.include_usage``, ``echo`` (the
prompt before the text), ``logprobs`` (0 to 20 alternatives, the legacy
shape), ``seed``, ``user``, ``presence_penalty``, ``frequency_penalty``,
``logit_bias`` and vLLM's ``ignore_eos``, each as chat completions take
it, and vLLM's ``repetition_penalty`` of 1 (no penalty: what ``vllm bench
serve`` sends). Refused, naming the parameter: ``suffix`` (no insertion),
other repetition penalties,
token-id prompts (the mesh tokenizes text itself), several prompts in one
stream, and ``logprobs`` with ``echo`` (prompt tokens' log probabilities
are not computed).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Annotated

from pydantic import Field, StrictBool, StrictFloat, StrictInt
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmmesh.edge.caller import authenticate
from llmmesh.edge.chat_messages import refused
from llmmesh.edge.completions import CompletionsHandler
from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.json_body import read_json
from llmmesh.edge.mesh_client import MeshClient
from llmmesh.edge.request_types import AnyJson, Int32, ModelName, Strict, Text
from llmmesh.edge.route_headers import AUTO_MODELS
from llmmesh.edge.schemas import MAX_TOP_LOGPROBS, StreamOptions, TurnOptions, parse_body
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.text_chunks import TextFormat
from llmmesh.v1 import chat_service_pb2, common_pb2

DEFAULT_MAX_TOKENS = 16
"""OpenAI's output limit of a text completion that sets none."""
MAX_PROMPTS = 16
"""The most prompts one request may list (each is a turn)."""


class TextCompletionRequest(Strict):
    """``POST /v1/completions``."""

    model: ModelName
    prompt: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_PROMPTS)] | AnyJson = Field(
        description="A string, or a list of strings (one choice each); token ids are refused."
    )
    max_tokens: Int32 | None = Field(default=None, description="The most output tokens (16 when absent).")
    # Ranges are checked as chat checks them (turn_options).
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    n: StrictInt | None = Field(default=None, description="Only 1.")
    best_of: StrictInt | None = Field(default=None, description="Only 1.")
    stop: Text | Annotated[list[Text], Field(max_length=4)] | None = None
    stream: StrictBool | None = Field(default=False, description="Answer as SSE text_completion events.")
    stream_options: StreamOptions | None = None
    echo: StrictBool | None = Field(default=None, description="Put the prompt before the text.")
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        default=None, description="Each token's log probability and this many alternatives (legacy shape)."
    )
    seed: StrictInt | None = None
    user: Text | None = None
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None
    logit_bias: dict[str, StrictFloat] | None = None
    suffix: AnyJson = Field(default=None, description="Refused when set: no insertion.")
    ignore_eos: StrictBool = Field(
        default=False, description="vLLM's extension: generate exactly max_tokens."
    )
    repetition_penalty: StrictFloat | None = Field(
        default=None, description="vLLM's extension: only 1 (no penalty)."
    )

    def prompts(self) -> list[str]:
        """The prompts; a 400 naming ``prompt`` for token ids or anything else."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if isinstance(self.prompt, list) and self.prompt and all(isinstance(p, str) for p in self.prompt):
            return list(self.prompt)
        if (
            isinstance(self.prompt, list)
            and self.prompt
            and all(isinstance(p, int | list) for p in self.prompt)
        ):
            # Ids of which tokenizer the mesh cannot tell; its regions tokenize text themselves.
            raise refused("prompt", "token-id prompts are not supported; send the prompt as text")
        raise OpenAIError(
            400,
            f"'prompt' must be a string or a list of 1 to {MAX_PROMPTS} strings",
            param="prompt",
            code="invalid_value",
        )

    def check_supported(self) -> None:
        if self.suffix is not None:
            raise refused("suffix", "inserting text before a suffix is not supported")
        if self.repetition_penalty is not None and self.repetition_penalty != 1:
            raise refused(
                "repetition_penalty",
                "only 1 (no penalty) is supported; use presence_penalty or frequency_penalty",
            )
        if self.best_of is not None and self.best_of != 1:
            raise refused("best_of", "only one candidate per choice (best_of=1) is supported")
        if self.echo and self.logprobs is not None:
            raise refused("logprobs", "with echo it needs the prompt tokens' log probabilities, not computed")

    def turn_options(self) -> TurnOptions:
        """The chat options these parameters mean, validated as chat validates them."""
        stream_options = self.stream_options.model_dump(exclude_none=True) if self.stream_options else None
        fields = {
            "max_tokens": self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "n": self.n,
            "stop": self.stop,
            "stream": self.stream,
            "stream_options": stream_options,
            "seed": self.seed,
            "user": self.user,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "logit_bias": self.logit_bias,
            "logprobs": self.logprobs is not None or None,
            "top_logprobs": self.logprobs or None,
            "ignore_eos": self.ignore_eos,
        }
        return parse_body(TurnOptions, {k: v for k, v in fields.items() if v is not None})


class TextCompletionsHandler:
    """Serves text completions through the chat path of :class:`CompletionsHandler`."""

    def __init__(self, settings: EdgeSettings, mesh: MeshClient, completions: CompletionsHandler) -> None:
        self._settings = settings
        self._mesh = mesh
        self._completions = completions

    async def handle(self, request: Request) -> Response:
        mesh = self._mesh
        principal = await authenticate(request, mesh)
        req = parse_body(TextCompletionRequest, await read_json(request, self._settings.max_body_bytes))
        req.check_supported()
        prompts = req.prompts()
        options = req.turn_options()
        sampling = options.to_sampling()
        if options.streaming() and len(prompts) > 1:
            raise refused("prompt", "a stream serves one prompt; send one request per prompt")
        model = await mesh.models.resolve(req.model, principal.tenant.tier)
        auto = req.model in AUTO_MODELS
        completion_id = "cmpl-" + secrets.token_hex(12)

        def serve(index: int, prompt: str) -> asyncio.Task[Response]:
            start = chat_service_pb2.ChatStart(
                request_id=completion_id if index == 0 else f"{completion_id}-{index}",
                model="auto" if auto else model.name,
                messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=prompt)],
                sampling=sampling,
                user=options.end_user(),
            )
            reply_format = TextFormat(echo=prompt if req.echo else "", logprobs=req.logprobs is not None)
            served = self._completions.serve_turn(
                request,
                principal,
                start,
                "" if auto else model.name,
                stream=options.streaming(),
                include_usage=options.include_usage(),
                reply_format=reply_format,
            )
            return asyncio.ensure_future(served)

        if len(prompts) == 1:
            return await serve(0, prompts[0])
        turns = [serve(i, p) for i, p in enumerate(prompts)]
        try:
            answers = await asyncio.gather(*turns)
        except BaseException:
            # One failed: the others are cancelled (what they produced is still billed).
            for turn in turns:
                turn.cancel()
            await asyncio.gather(*turns, return_exceptions=True)
            raise
        return merged(completion_id, answers)


def merged(completion_id: str, answers: list[Response]) -> JSONResponse:
    """One ``text_completion`` of several prompts' whole answers: their
    choices in prompt order, their usage summed."""
    bodies = [json.loads(bytes(answer.body)) for answer in answers]
    whole = bodies[0]
    whole["id"] = completion_id
    whole["choices"] = [{**body["choices"][0], "index": i} for i, body in enumerate(bodies)]
    usage = whole["usage"]
    for body in bodies[1:]:
        for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
            usage[name] += body["usage"][name]
        usage["prompt_tokens_details"]["cached_tokens"] += body["usage"]["prompt_tokens_details"][
            "cached_tokens"
        ]
    headers = {k: v for k, v in answers[0].headers.items() if k.startswith("x-")}
    return JSONResponse(whole, headers=headers)
