"""``llmmesh chat``: an interactive terminal chat that streams replies token
by token.

Prompts are read from stdin one line at a time: at a terminal with a ``> ``
prompt, from a pipe without one (for scripts). Each reply streams to stdout
and ends with a newline; a short line on stderr follows it (finish reason,
prompt and reply tokens, the region that served). ``/reset`` forgets the
history (with ``--conversation``: starts a new conversation), ``/exit`` or
the end of input quits. Ctrl-C during a reply cancels the turn and returns
to the prompt: over gRPC the region stops it and still reports its usage,
over HTTP the connection is dropped, which the edge treats as a cancel; a
second Ctrl-C stops waiting for the region.

Transports: gRPC to a region's ``ChatService`` through
:mod:`llmmesh.client` (the default), or ``--transport http``: the edge's
OpenAI-compatible ``/v1/chat/completions`` with SSE. The chat keeps the
history itself and sends it with every turn, unless ``--conversation``
(gRPC only) keeps it server-side in a conversation of the zone store.
Addresses and the key come from the flags, the key else from
``$LLMMESH_API_KEY``, and the rest from ``$LLMMESH_HOME/mesh.json``
(written by ``llmmesh up``). Over gRPC the chat presents the mesh's
``client`` certificate (mutual TLS; ``--certs-dir``, else the mesh file's,
else ``$LLMMESH_HOME/certs``), or talks plaintext with ``--insecure`` or
when the mesh file says the mesh runs so.

A failed turn prints one line, ``llmmesh chat: <message> (<REASON>)``, on
stderr; its prompt stays out of the history and the chat goes on. The exit
status is 0 when the input ends (or ``/exit``) and no turn failed (cancelled
turns do not count), 1 when one did (so a script notices), 2 when the chat
cannot start (no address or key, options that do not go together).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from llmmesh.cli.tls_flags import add_tls_arguments, tls_from_args
from llmmesh.client import (
    CertificateSetupError,
    ChatClient,
    ChatTurn,
    MeshFileError,
    Message,
    TextDelta,
    read_mesh_file,
)
from llmmesh.core.errors import MeshError

Write = Callable[[str], None]
COMMANDS = ("/reset", "/exit")


class ChatFailure(Exception):
    """A turn (or the chat's setup) failed; printed as one line."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(f"{message} ({reason})")


@dataclass(frozen=True)
class ChatOptions:
    """What every turn asks for."""

    model: str
    system: str
    max_tokens: int | None
    temperature: float | None


@dataclass
class TurnSummary:
    """How a turn ended; token counts are None where the stream did not say."""

    reason: str
    region: str = ""
    input_tokens: int | None = None
    output_tokens: int | None = None

    def line(self) -> str:
        parts = [self.reason or "ended"]
        if self.input_tokens is not None and self.output_tokens is not None:
            parts.append(f"{self.input_tokens} prompt + {self.output_tokens} reply tokens")
        if self.region:
            parts.append(f"region {self.region}")
        return "-- " + " · ".join(parts)


@dataclass
class Transcript:
    """The history the chat sends with every turn when the server keeps none."""

    system: str
    turns: list[Message] = field(default_factory=list)

    def with_prompt(self, prompt: str) -> list[Message]:
        system = [Message("system", self.system)] if self.system else []
        return [*system, *self.turns, Message("user", prompt)]

    def record(self, prompt: str, reply: str) -> None:
        """Keep a turn; one that produced no text (cancelled at once) is left out."""
        if reply:
            self.turns += [Message("user", prompt), Message("assistant", reply)]


class Transport(Protocol):
    """One way of talking to the mesh."""

    async def send(self, prompt: str, write: Write) -> TurnSummary:
        """Run a turn, writing its text as it streams; raises ChatFailure."""
        ...

    def interrupt(self) -> None:
        """Ctrl-C during a turn (called in the event loop)."""
        ...

    async def reset(self) -> str:
        """Forget the history; returns what to tell the user."""
        ...

    async def close(self) -> None: ...


def _mesh_failure(err: MeshError) -> ChatFailure:
    return ChatFailure(err.message or err.code.name, err.reason)


class GrpcChat:
    """Turns on a region's ``ChatService``; with ``conversation`` set ("" for
    a new one) the history lives in a conversation of the zone store."""

    def __init__(self, client: ChatClient, options: ChatOptions, conversation: str | None) -> None:
        self._client = client
        self._options = options
        self._transcript = Transcript(options.system)
        self._server_history = conversation is not None
        self._join = conversation or ""
        self._conversation = ""
        # A conversation created here stores the system prompt; one joined by
        # id gets --system as an override on every turn.
        self._system_stored = False
        self._turn: ChatTurn | None = None
        self._interrupts = 0
        self._cancelling: asyncio.Task[None] | None = None

    async def begin(self) -> str:
        """Open the conversation, if any; returns what to tell the user."""
        if not self._server_history:
            return ""
        if not self._join:
            return await self.reset()
        try:
            self._conversation = (await self._client.get_conversation(self._join)).id
        except MeshError as err:
            raise _mesh_failure(err) from err
        return f"continuing conversation {self._conversation}"

    async def reset(self) -> str:
        if not self._server_history:
            self._transcript = Transcript(self._options.system)
            return "history cleared"
        model = "" if self._options.model == "auto" else self._options.model
        try:
            created = await self._client.create_conversation(model=model, system_prompt=self._options.system)
        except MeshError as err:
            raise _mesh_failure(err) from err
        self._conversation, self._system_stored = created.id, True
        return f"conversation {created.id} (continue it later with --conversation {created.id})"

    async def send(self, prompt: str, write: Write) -> TurnSummary:
        if self._conversation:
            override = self._options.system and not self._system_stored
            system = [Message("system", self._options.system)] if override else []
            messages = [*system, Message("user", prompt)]
        else:
            messages = self._transcript.with_prompt(prompt)
        turn = self._client.stream_chat(
            messages,
            self._options.model,
            max_tokens=self._options.max_tokens,
            temperature=self._options.temperature,
            conversation_id=self._conversation,
        )
        self._turn, self._interrupts = turn, 0
        try:
            async for event in turn:
                if isinstance(event, TextDelta):
                    write(event.text)
        except MeshError as err:
            if self._interrupts == 0:
                raise _mesh_failure(err) from err
        finally:
            self._turn = None
            turn.close()
            if self._cancelling is not None:
                with contextlib.suppress(MeshError):
                    await self._cancelling
                self._cancelling = None
        if not self._conversation:
            self._transcript.record(prompt, turn.text)
        region = turn.started.region if turn.started else ""
        summary = TurnSummary(turn.finished.reason if turn.finished else "cancelled", region)
        if turn.usage is not None:
            summary.input_tokens, summary.output_tokens = turn.usage.input_tokens, turn.usage.output_tokens
        return summary

    def interrupt(self) -> None:
        turn = self._turn
        if turn is None:
            return
        self._interrupts += 1
        if self._interrupts == 1:
            self._cancelling = asyncio.get_running_loop().create_task(
                turn.cancel("interrupted at the terminal")
            )
        else:
            turn.close()

    async def close(self) -> None:
        await self._client.close()


class HttpChat:
    """Turns on the edge's ``/v1/chat/completions``, streamed as SSE."""

    def __init__(self, edge_url: str, api_key: str, options: ChatOptions) -> None:
        self._url = edge_url.rstrip("/")
        self._options = options
        self._transcript = Transcript(options.system)
        self._http = httpx.AsyncClient(
            base_url=self._url,
            headers={"authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(connect=10.0, read=None, write=30.0, pool=10.0),
            trust_env=False,
        )
        self._reading: asyncio.Task[TurnSummary] | None = None

    async def send(self, prompt: str, write: Write) -> TurnSummary:
        body: dict[str, Any] = {
            "model": self._options.model,
            "messages": [
                {"role": m.role, "content": m.content} for m in self._transcript.with_prompt(prompt)
            ],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self._options.max_tokens is not None:
            body["max_tokens"] = self._options.max_tokens
        if self._options.temperature is not None:
            body["temperature"] = self._options.temperature
        reply: list[str] = []

        def collect(text: str) -> None:
            reply.append(text)
            write(text)

        self._reading = reading = asyncio.create_task(self._stream(body, collect))
        try:
            await asyncio.wait([reading])
        finally:
            self._reading = None
            reading.cancel()
        # Cancelled by Ctrl-C: leaving the stream closed the connection.
        summary = TurnSummary("cancelled") if reading.cancelled() else reading.result()
        self._transcript.record(prompt, "".join(reply))
        return summary

    async def _stream(self, body: dict[str, Any], write: Write) -> TurnSummary:
        try:
            async with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
                summary = TurnSummary("", response.headers.get("x-llmmesh-region", ""))
                if response.status_code != 200:
                    raise _http_failure(await response.aread(), response.status_code)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line.removeprefix("data:").strip()
                    if data == "[DONE]":
                        return summary
                    _apply_chunk(json.loads(data), summary, write)
        except httpx.HTTPError as err:
            raise ChatFailure(
                f"cannot stream from the edge at {self._url}: {err}", "EDGE_UNAVAILABLE"
            ) from err
        except (ValueError, AttributeError) as err:
            raise ChatFailure(f"the edge sent a malformed chunk: {err}", "MALFORMED_STREAM") from err
        raise ChatFailure("the edge stream ended before data: [DONE]", "STREAM_BROKEN")

    def interrupt(self) -> None:
        if self._reading is not None:
            self._reading.cancel()

    async def reset(self) -> str:
        self._transcript = Transcript(self._options.system)
        return "history cleared"

    async def close(self) -> None:
        await self._http.aclose()


def _error_failure(error: object, suffix: str = "") -> ChatFailure:
    """An OpenAI error object's ``{message, type, code}`` as a failure."""
    if not isinstance(error, dict):
        return ChatFailure(str(error)[:200], "UNKNOWN_ERROR" + suffix)
    return ChatFailure(str(error.get("message")), f"{error.get('code') or error.get('type')}{suffix}")


def _http_failure(body: bytes, status: int) -> ChatFailure:
    """The failure an error response's body describes."""
    try:
        return _error_failure(json.loads(body)["error"], f", HTTP {status}")
    except (ValueError, KeyError, TypeError):
        return ChatFailure(body.decode(errors="replace")[:200] or "no body", f"HTTP {status}")


def _apply_chunk(chunk: object, summary: TurnSummary, write: Write) -> None:
    """Write a ``chat.completion.chunk``'s text and note its finish reason and
    usage; an error event raises its failure."""
    if not isinstance(chunk, dict):
        raise ValueError(f"not an object: {chunk!r:.80}")
    if "error" in chunk:
        raise _error_failure(chunk["error"])
    for choice in chunk.get("choices") or ():
        content = (choice.get("delta") or {}).get("content")
        if content:
            write(content)
        if choice.get("finish_reason"):
            summary.reason = str(choice["finish_reason"])
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        summary.input_tokens = usage.get("prompt_tokens")
        summary.output_tokens = usage.get("completion_tokens")


# ------------------------------------------------------------------ the loop


async def _turn(transport: Transport, prompt: str, write: Write) -> TurnSummary:
    """One turn, with Ctrl-C cancelling it instead of ending the chat."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, transport.interrupt)
    except (RuntimeError, ValueError, NotImplementedError):  # not the main thread, or no signals
        return await transport.send(prompt, write)
    try:
        return await transport.send(prompt, write)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _read_prompt(interactive: bool) -> str | None:
    """The next line of input; None at its end."""
    if interactive:
        try:
            return input("> ")
        except EOFError:
            print()
            return None
    line = sys.stdin.readline()
    return line.rstrip("\n") if line else None


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Reply:
    """The reply being written to stdout."""

    def __init__(self) -> None:
        self.written = False

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        self.written = self.written or bool(text)

    def end(self, ok: bool) -> None:
        """End the reply's line: always after a turn that ended, else only if it has text."""
        if ok or self.written:
            self.write("\n")


async def _connect(args: argparse.Namespace, options: ChatOptions) -> tuple[Transport, str]:
    key = args.api_key or os.environ.get("LLMMESH_API_KEY", "")
    mesh = None
    if not key or not (args.edge_url if args.transport == "http" else args.region_address):
        mesh = read_mesh_file()
        key = key or mesh.api_key
    if not key:
        raise ChatFailure("no API key: pass --api-key or set LLMMESH_API_KEY", "NO_API_KEY")
    if args.transport == "http":
        url = args.edge_url or (mesh.edge_url if mesh else "")
        if not url:
            raise ChatFailure("no edge URL: pass --edge-url", "NO_MESH")
        return HttpChat(url, key, options), ""
    address = args.region_address or (mesh.region().address if mesh else "")
    tls = tls_from_args(args, None if args.region_address or mesh is None else mesh.tls)
    try:
        security = tls.security("client")
    except CertificateSetupError as err:
        raise ChatFailure(str(err), "NO_CERTIFICATE") from None
    chat = GrpcChat(ChatClient(address, key, security=security), options, args.conversation)
    try:
        return chat, await chat.begin()
    except ChatFailure:
        await chat.close()
        raise


def _converse(runner: asyncio.Runner, transport: Transport, interactive: bool) -> bool:
    """Run turns until the input ends or ``/exit``; True when none failed."""
    ok = True
    while True:
        try:
            line = _read_prompt(interactive)
        except KeyboardInterrupt:
            if not interactive:
                raise
            print()
            continue
        prompt = (line or "").strip()
        if line is None or prompt == "/exit":
            return ok
        if not prompt:
            continue
        if prompt.startswith("/") and prompt not in COMMANDS and " " not in prompt:
            _say(f"unknown command {prompt}; the commands are {', '.join(COMMANDS)}")
            continue
        reply = Reply()
        try:
            if prompt == "/reset":
                _say(runner.run(transport.reset()))
                continue
            summary = runner.run(_turn(transport, prompt, reply.write))
        except ChatFailure as err:
            reply.end(ok=False)
            _say(f"llmmesh chat: {err}")
            ok = False
            continue
        except KeyboardInterrupt:  # Ctrl-C before the turn could take it over
            summary = TurnSummary("cancelled")
        reply.end(ok=True)
        _say(summary.line())


def run_chat(args: argparse.Namespace) -> int:
    """Chat until the input ends; see the module docstring for the exit status."""
    if args.conversation is not None and args.transport != "grpc":
        _say("llmmesh chat: --conversation needs --transport grpc")
        return 2
    logging.getLogger("httpx").setLevel(logging.WARNING)
    options = ChatOptions(args.model, args.system, args.max_tokens, args.temperature)
    interactive = sys.stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
    with asyncio.Runner() as runner:
        try:
            transport, greeting = runner.run(_connect(args, options))
        except (ChatFailure, MeshFileError) as err:
            _say(f"llmmesh chat: {err}")
            return 2
        if interactive:
            _say(f"llmmesh chat over {args.transport}; {', '.join(COMMANDS)}; Ctrl-C stops a reply")
        if greeting:
            _say(greeting)
        try:
            ok = _converse(runner, transport, interactive)
        finally:
            runner.run(transport.close())
    return 0 if ok else 1


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transport",
        choices=["grpc", "http"],
        default="grpc",
        help="grpc: a region's ChatService (default); http: the edge's /v1/chat/completions with SSE",
    )
    parser.add_argument("--model", default="auto", help="model name, or auto for the tier's default")
    parser.add_argument("--system", default="", help="system prompt")
    parser.add_argument("--max-tokens", type=int, default=None, help="most reply tokens per turn")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature; 0 is greedy")
    parser.add_argument(
        "--conversation",
        nargs="?",
        const="",
        default=None,
        metavar="ID",
        help="keep the history server-side in a conversation: a new one, or the one with this id (grpc)",
    )
    parser.add_argument(
        "--region-address", default="", help="host:port of a region's ChatService (default: from mesh.json)"
    )
    parser.add_argument("--edge-url", default="", help="base URL of the edge (default: from mesh.json)")
    add_tls_arguments(parser)
    parser.add_argument(
        "--api-key", default="", help="API key (default: $LLMMESH_API_KEY, else the dev key in mesh.json)"
    )
