"""Sampling the region decides for a turn: a fresh draw where the caller
asked for one without saying how.

- A regeneration without a temperature is sampled at temperature 1,
  OpenAI's default: at the mesh's own default for an unset temperature
  (greedy decoding, on the simulator and on vLLM alike, kept for every
  other turn so plain turns stay reproducible) a regenerated reply would
  be the very reply it replaces.
- A sampled turn (temperature above 0) without a seed gets one from the
  region, derived from the request id it began under. Two turns (two
  regenerations of one reply) get two draws; a continuation, which carries
  its original request id (``Continuation.original_request_id``), gets the
  same seed in any region of the zone, so a failover resume goes on exactly
  as the broken stream would have. The seed stays the region's: the caller
  did not set one, and none is reported.
"""

from __future__ import annotations

import hashlib

from llmmesh.v1 import chat_service_pb2

REGENERATE_TEMPERATURE = 1.0
"""OpenAI's default temperature, which a regeneration without one is sampled at."""


def turn_seed(request_id: str) -> int:
    """The seed of a sampled turn that began under ``request_id`` and named none (0 to 2**31 - 1)."""
    digest = hashlib.sha256(b"llmmesh-turn-seed\0" + request_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


def fresh_draw(start: chat_service_pb2.ChatStart, request_id: str) -> None:
    """Set ``start``'s temperature and seed where the region decides them;
    ``request_id`` is the id the turn runs under (a continuation's own is
    ignored: its original's decides)."""
    sampling = start.sampling
    if start.WhichOneof("branch_point") == "regenerate_message_id" and not sampling.HasField("temperature"):
        sampling.temperature = REGENERATE_TEMPERATURE
    if sampling.temperature > 0 and not sampling.HasField("seed"):
        began = start.continuation.original_request_id if start.HasField("continuation") else request_id
        sampling.seed = turn_seed(began)
