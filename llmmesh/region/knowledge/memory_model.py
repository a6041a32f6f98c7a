"""How a region learns end users' facts, chosen by ``memory_extractor``:

- ``rules`` (the default): :func:`region.knowledge.memory.extract_facts`, first-person
  patterns ("my name is …", "I live in …"), in the region, no model call;
- ``model``: after the turn, the zone's smallest chat model (or
  ``memory_model``) is asked, through the same engine path as conversation
  summaries (:mod:`region.lifecycle.housekeeping_model`: the region's pods, behind every
  tenant's turn, greedy, billed to the tenant within its limits, skipped
  when they leave no room), for the user's
  durable facts as guided JSON (``{"facts": [string]}``, a ``json_schema``
  response format that both the simulator and vLLM enforce). The reply is
  validated (JSON of that shape, each fact non-empty, at most 300
  characters, at most :data:`region.knowledge.memory.MAX_FACTS_PER_TURN`) before it
  is kept; a reply that is not is logged and nothing is kept.

On the simulator the model's facts are its modelled text, valid JSON of
the schema but no understanding of what the user said: tests there check
the pipeline (the guided call, its priority, what is kept and recalled),
not what the facts mean. On vLLM they are what the model read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from llmmesh.region.knowledge.memory import MAX_FACT_CHARS, MAX_FACTS_PER_TURN, rules_extractor
from llmmesh.region.settings import RegionSettings
from llmmesh.v1 import common_pb2

log = logging.getLogger(__name__)

Extract = Callable[[str, list[str]], Awaitable[list[str]]]
"""The facts in a turn's user messages (second argument), for a tenant (first)."""

EXTRACTORS = ("rules", "model")
INSTRUCTIONS = (
    "Read the user's messages below. List the durable facts they state about themselves "
    "(name, home, work, preferences, allergies, what they ask to be remembered), each as one "
    "short sentence about 'the user'. List nothing they did not state. Answer as JSON."
)
FACTS_SCHEMA = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "items": {"type": "string"},
            "maxItems": MAX_FACTS_PER_TURN,
        }
    },
    "required": ["facts"],
    "additionalProperties": False,
}
FACTS_FORMAT = common_pb2.ResponseFormat(
    type=common_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
    schema_name="user_facts",
    schema_json=json.dumps(FACTS_SCHEMA),
    strict=True,
)


class Housekeeping(Protocol):
    async def model(self) -> str: ...

    async def complete(
        self,
        tenant_id: str,
        model: str,
        turns: list[tuple[str, str]],
        max_tokens: int,
        response_format: common_pb2.ResponseFormat | None = None,
    ) -> str | None: ...


def parse_facts(reply: str) -> list[str]:
    """The facts of a model's reply; ValueError when it is not ``{"facts": [string]}``."""
    try:
        parsed = json.loads(reply)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the reply is not JSON ({exc.msg})") from exc
    if not isinstance(parsed, dict) or not isinstance(parsed.get("facts"), list):
        raise ValueError('the reply is not an object with a "facts" list')
    facts: dict[str, None] = {}
    for item in parsed["facts"]:
        if not isinstance(item, str):
            raise ValueError("a fact is not a string")
        fact = " ".join(item.split())
        if fact and len(fact) <= MAX_FACT_CHARS:
            facts.setdefault(fact)
    return list(facts)[:MAX_FACTS_PER_TURN]


class ModelFactExtractor:
    """Asks a model in the zone for the facts of a turn's user messages."""

    def __init__(self, model: Housekeeping, max_tokens: int = 256, max_input_chars: int = 4000) -> None:
        self._model = model
        self._max_tokens = max_tokens
        self._max_input_chars = max_input_chars

    async def __call__(self, tenant_id: str, texts: list[str]) -> list[str]:
        said = "\n\n".join(t for t in texts if t.strip())[-self._max_input_chars :]
        if not said:
            return []
        name = await self._model.model()
        turns = [("system", INSTRUCTIONS), ("user", said)]
        reply = await self._model.complete(tenant_id, name, turns, self._max_tokens, FACTS_FORMAT)
        if reply is None:
            return []  # the tenant's limits left no room
        try:
            return parse_facts(reply)
        except ValueError as err:
            log.warning("memory model %s: its reply was refused (%s); no facts kept", name, err)
            return []


def fact_extractor(settings: RegionSettings, model: Housekeeping) -> Extract:
    """The extractor ``settings.memory_extractor`` names (ValueError naming the setting otherwise)."""
    if settings.memory_extractor == "rules":
        return rules_extractor
    if settings.memory_extractor == "model":
        return ModelFactExtractor(model, max_tokens=settings.memory_max_tokens)
    raise ValueError(
        f"memory_extractor: expected one of {', '.join(EXTRACTORS)}, got {settings.memory_extractor!r}"
    )
