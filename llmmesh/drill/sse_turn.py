"""One streamed chat turn through the edge, recorded event by event.

The request asks for ``max_tokens`` tokens with ``ignore_eos`` (so a whole
reply is exactly that many) and ``stream_options.include_usage``. The
record keeps what a client can see: the HTTP status, the
``x-request-id`` and ``x-llmmesh-region`` headers, the arrival time of
every SSE event, the ``id:`` and text of every content chunk, the finish
reason, the usage chunk and how the stream ended.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from enum import StrEnum

import httpx

DONE_DATA = "[DONE]"


class Outcome(StrEnum):
    """How a turn ended, as its client saw it."""

    DONE = "done"
    """``data: [DONE]`` arrived."""
    FAILED_CLEARLY = "failed_clearly"
    """An OpenAI error object: an HTTP error's body, or an error event in the stream."""
    LOST = "lost"
    """Neither: the stream broke off or hung past the turn timeout, or a
    refusal came without an OpenAI error object."""


@dataclass
class TurnRecord:
    """What one turn's client saw. Times are ``time.monotonic()``."""

    stream: int
    index: int
    zone: str
    """The zone of the key's tenant."""
    sent_at: float
    status: int = 0
    request_id: str = ""
    region: str = ""
    """Where the turn started (``x-llmmesh-region``); empty when it was refused."""
    headers_at: float | None = None
    event_times: list[float] = field(default_factory=list)
    """Arrival of every SSE event, ``[DONE]`` and error events included."""
    content_ids: list[int] = field(default_factory=list)
    content_texts: list[str] = field(default_factory=list)
    finish_reason: str = ""
    usage_output_tokens: int | None = None
    outcome: Outcome = Outcome.LOST
    error_code: str = ""
    """The OpenAI error's code (or type) of a clear failure; what went wrong for a lost turn."""
    ended_at: float = 0.0
    received_tokens: int | None = None
    """Tokens of the received text (:mod:`llmmesh.drill.tokens`), once counted."""

    @property
    def accepted(self) -> bool:
        """Whether the edge answered 200 and began the stream."""
        return self.status == 200

    @property
    def text(self) -> str:
        return "".join(self.content_texts)

    def ended_between(self, start: float, end: float) -> bool:
        return start <= self.ended_at <= end

    def in_flight_at(self, when: float) -> bool:
        return self.sent_at <= when < self.ended_at


def chat_body(prompt: str, max_tokens: int) -> dict[str, object]:
    """The request of every drill turn."""
    return {
        "model": "auto",
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": prompt}],
    }


async def stream_turn(
    http: httpx.AsyncClient,
    record: TurnRecord,
    secret: str,
    body: dict[str, object],
    timeout_s: float,
) -> TurnRecord:
    """Send the turn and read its stream to the end, or until ``timeout_s``; fills ``record``."""
    try:
        async with asyncio.timeout(timeout_s):
            await _run(http, record, secret, body)
    except TimeoutError:
        record.outcome, record.error_code = Outcome.LOST, "turn_timeout"
    except httpx.HTTPError as err:
        record.outcome, record.error_code = Outcome.LOST, type(err).__name__
    record.ended_at = time.monotonic()
    return record


async def _run(http: httpx.AsyncClient, record: TurnRecord, secret: str, body: dict[str, object]) -> None:
    # Event ids number the content events, which is how gaps and repeats are found.
    headers = {"authorization": f"Bearer {secret}", "x-llmmesh-event-ids": "true"}
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
        record.status = resp.status_code
        record.headers_at = time.monotonic()
        record.request_id = resp.headers.get("x-request-id", "")
        record.region = resp.headers.get("x-llmmesh-region", "")
        if resp.status_code != 200:
            await resp.aread()
            _refused(record, resp)
            return
        event_id: int | None = None
        data: list[str] = []
        async for line in resp.aiter_lines():
            if line.startswith("id:"):
                event_id = _int(line[3:].strip())
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line and data:
                if _event(record, event_id, "\n".join(data)):
                    return
                event_id, data = None, []
    record.outcome = Outcome.LOST
    record.error_code = record.error_code or "stream_ended_without_done"


def _event(record: TurnRecord, event_id: int | None, data: str) -> bool:
    """Take one event; True once the stream has ended."""
    record.event_times.append(time.monotonic())
    if data == DONE_DATA:
        record.outcome = Outcome.DONE
        return True
    try:
        payload = json.loads(data)
    except ValueError:
        record.error_code = "undecodable_event"
        return False
    if not isinstance(payload, dict):
        return False
    error = payload.get("error")
    if isinstance(error, dict) and error.get("message"):
        record.outcome = Outcome.FAILED_CLEARLY
        record.error_code = str(error.get("code") or error.get("type") or "error")
        return True
    choices = payload.get("choices") or []
    if choices and isinstance(choices[0], dict):
        choice = choices[0]
        content = (choice.get("delta") or {}).get("content")
        if content and event_id is not None:
            record.content_ids.append(event_id)
            record.content_texts.append(str(content))
        if choice.get("finish_reason"):
            record.finish_reason = str(choice["finish_reason"])
    usage = payload.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        record.usage_output_tokens = int(usage["completion_tokens"])
    return False


def _refused(record: TurnRecord, resp: httpx.Response) -> None:
    try:
        error = resp.json().get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        record.outcome = Outcome.FAILED_CLEARLY
        record.error_code = str(error.get("code") or error.get("type") or resp.status_code)
    else:
        record.outcome, record.error_code = Outcome.LOST, f"http_{resp.status_code}_without_error_object"


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None
