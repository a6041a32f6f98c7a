"""Reading a request's JSON body: bounded in size and in nesting, every
failure a 400 OpenAI error.

No OpenAI request nests more than a handful of levels, so anything deeper
than :data:`MAX_DEPTH` is refused. The check runs before any recursive code
(the JSON decoder, pydantic) sees the body, so hostile nesting can neither
exhaust the stack nor cost more than one linear scan.
"""

from __future__ import annotations

import itertools
import json
import operator
import re

from starlette.requests import Request

from llmmesh.edge.errors import OpenAIError

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects a body may have."""

# A JSON string, escapes included (the unrolled-loop form: one pass, no
# backtracking between alternatives).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# An opener adds one level and a closer takes one away: mapped to 2 and 0,
# the running sum less the position is the depth.
_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in ``raw`` (brackets inside
    strings do not count). Its cost is linear in the number of brackets, in
    C, so never more than decoding them would take. On a body that is not
    JSON the figure may be off; the decoder refuses such a body anyway."""
    steps = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS).translate(_STEPS)
    return max(map(operator.sub, itertools.accumulate(steps), itertools.count(1)), default=0)


def parse_json(raw: bytes) -> object:
    """``raw`` decoded, or a 400 naming what is wrong with it."""
    try:
        encoding = json.detect_encoding(raw)
        if encoding != "utf-8":
            # The depth scan reads UTF-8 bytes; the other encodings JSON
            # allows (UTF-16 or -32, a byte order mark) are re-encoded first.
            raw = raw.decode(encoding).encode("utf-8")
    except ValueError as exc:
        raise OpenAIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if nesting_depth(raw) > MAX_DEPTH:
        raise OpenAIError(400, f"the request body nests deeper than {MAX_DEPTH} levels", code="invalid_json")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise OpenAIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc


async def read_json(request: Request, limit: int) -> object:
    """The decoded JSON body, or a 400 naming what is wrong with it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise OpenAIError(400, f"request body larger than {limit} bytes", code="request_too_large")
    raw = await request.body()
    if len(raw) > limit:
        raise OpenAIError(400, f"request body larger than {limit} bytes", code="request_too_large")
    return parse_json(raw)
