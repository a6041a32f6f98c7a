"""Writes a schema-valid JSON document as simulator output tokens.

The simulator's guided decoding: what the grammar forces (braces, keys,
quotes, separators, ``null``) is emitted with probability 1; each free
choice is a deterministic draw from the reply plan's digest, so the
document is a function of (prompt, seed) and a continuation rebuilds it
exactly. Words inside plain strings are sampled like free text
(:mod:`engine.sim.distribution`: logit bias, penalties, temperature, log
probabilities), from word pieces only, which a JSON string always allows,
as many as ``minLength``/``maxLength`` leave room for (a string too short
after that is padded with ``x``). A value among ``n`` fixed alternatives
(an enum member, a boolean, one of at most 101 evenly spaced numbers in
the schema's range, a string of a format or pattern, see
:mod:`engine.sim.json_numbers` and :mod:`engine.sim.json_strings`) is
drawn uniformly, its first token carrying log(1/n). Shape choices (an
``anyOf`` branch, an array's length, which optional properties appear)
are uniform draws too, and the tokens they lead to are reported like
forced ones: the log probabilities follow the grammar's token choices, not
every draw. Where one token is possible, the top list holds that token
only. The layout is ``json.dumps``'s: ``", "`` and ``": "`` separators.
Nesting deeper than :data:`MAX_DEPTH` takes small instances (no optional
properties, the fewest items, the branch of least height, see
:func:`engine.sim.json_schema.heights`), so a recursive schema ends; one
whose smallest instance is still deeper than :data:`DEPTH_LIMIT` is
refused.
"""

from __future__ import annotations

import json
import math
from collections import Counter

from llmmesh.engine.sim.distribution import Adjustments, Pool, SampledToken, sample
from llmmesh.engine.sim.json_numbers import NumberNode, number_text
from llmmesh.engine.sim.json_schema import (
    AnyOfNode,
    ArrayNode,
    CompiledSchema,
    EnumNode,
    FreeObjectNode,
    Node,
    ObjectNode,
    RefNode,
    ScalarNode,
    SchemaNotSupported,
)
from llmmesh.engine.sim.json_strings import StringNode, shaped_text
from llmmesh.engine.sim.sampler import ReplyPlan, draw_bytes, uniform
from llmmesh.engine.sim.tokenizer import SimTokenizer
from llmmesh.engine.sim.vocabulary import WORDS

MAX_DEPTH = 6
DEPTH_LIMIT = 24
MAX_WORDS = 4
DEFAULT_MAX_ITEMS = 3
PAD = "x"


class JsonWriter:
    """Collects the tokens of one guided output. ``salt`` separates the
    draws of its documents from the plan's free-text draws."""

    def __init__(
        self,
        tokenizer: SimTokenizer,
        plan: ReplyPlan,
        *,
        bare_words: Pool,
        spaced_words: Pool,
        salt: bytes = b"json",
    ) -> None:
        self._tokenizer = tokenizer
        self._plan = plan
        self._bare = bare_words.sized(plan.pool_size)
        self._spaced = spaced_words.sized(plan.pool_size)
        self._digest = plan.digest + salt
        self._draws = 0
        # Bias on other tokens could put a quote or a control byte inside a
        # string: in strings only word pieces compete, a biased one from
        # beyond the plan's pool included.
        self._adjustments = Adjustments(
            {
                token_id: bias
                for token_id, bias in plan.adjustments.bias.items()
                if token_id in bare_words or token_id in spaced_words
            },
            plan.adjustments.presence_penalty,
            plan.adjustments.frequency_penalty,
        )
        self.tokens: list[SampledToken] = []
        self._counts: Counter[int] = Counter()

    @property
    def text(self) -> str:
        return self._tokenizer.decode([token.token_id for token in self.tokens])

    def forced(self, text: str, choices: int = 1) -> None:
        """Emit ``text``; with ``choices`` > 1 it was one of that many equally
        likely alternatives, which its first token's log probability says."""
        for i, token_id in enumerate(self._tokenizer.encode(text)):
            logprob = -math.log(choices) if i == 0 and choices > 1 else 0.0
            self._emit(
                SampledToken(token_id, logprob, ((token_id, logprob),) if self._plan.top_logprobs else ())
            )

    def choose(self, count: int) -> int:
        """A uniform choice among ``count`` alternatives."""
        return min(int(self._uniform() * count), count - 1)

    def value(self, schema: CompiledSchema, node: Node, depth: int = 0) -> None:
        """Emit one instance of ``node``."""
        if depth > DEPTH_LIMIT:
            raise SchemaNotSupported(f"the schema has no instance nested fewer than {DEPTH_LIMIT} levels")
        if isinstance(node, RefNode):
            self.value(schema, schema.definitions[node.target], depth + 1)
        elif isinstance(node, ObjectNode):
            self._object(schema, node, depth)
        elif isinstance(node, ArrayNode):
            self._array(schema, node, depth)
        elif isinstance(node, AnyOfNode):
            options = node.options
            if depth >= MAX_DEPTH:
                lowest = min(schema.height(option) for option in options)
                options = tuple(option for option in options if schema.height(option) == lowest)
            self.value(schema, options[self.choose(len(options))], depth + 1)
        elif isinstance(node, EnumNode):
            index = self.choose(len(node.values))
            self.forced(json.dumps(node.values[index], ensure_ascii=False), len(node.values))
        elif isinstance(node, FreeObjectNode):
            self._free_object()
        elif isinstance(node, StringNode):
            self.string(node)
        elif isinstance(node, NumberNode):
            self.forced(*number_text(node, self.choose))
        else:
            self._scalar(node)

    def _object(self, schema: CompiledSchema, node: ObjectNode, depth: int) -> None:
        chosen = [
            (name, sub)
            for name, sub in node.properties
            if name in node.required or (depth < MAX_DEPTH and self.choose(2) == 1)
        ]
        self.forced("{")
        for i, (name, sub) in enumerate(chosen):
            self.forced(("" if i == 0 else ", ") + json.dumps(name, ensure_ascii=False) + ": ")
            self.value(schema, sub, depth + 1)
        self.forced("}")

    def _array(self, schema: CompiledSchema, node: ArrayNode, depth: int) -> None:
        most = node.max_items if node.max_items is not None else max(node.min_items, DEFAULT_MAX_ITEMS)
        count = (
            node.min_items if depth >= MAX_DEPTH else node.min_items + self.choose(most - node.min_items + 1)
        )
        self.forced("[")
        for i in range(count):
            if i:
                self.forced(", ")
            self.value(schema, node.items, depth + 1)
        self.forced("]")

    def _scalar(self, node: ScalarNode) -> None:
        if node.kind == "null":
            self.forced("null")
        elif node.kind == "boolean":
            self.forced("true" if self.choose(2) else "false", 2)
        elif node.kind == "string":
            self.string()
        else:
            self.forced(*number_text(NumberNode(node.kind), self.choose))

    def string(self, node: StringNode | None = None) -> None:
        """A quoted string: a format's or pattern's, else one to
        :data:`MAX_WORDS` sampled words within the node's length bounds."""
        node = node or StringNode()
        if node.format is not None or node.regex is not None:
            text, choices = shaped_text(node, self.choose)
            self.forced(json.dumps(text, ensure_ascii=False), choices)
            return
        self.forced('"')
        words, length = 1 + self.choose(MAX_WORDS), 0
        while (words > 0 or length < node.min_length) and length != node.max_length:
            token = sample(
                self._spaced if length else self._bare,
                self._uniform(),
                adjustments=self._adjustments,
                counts=self._counts,
                temperature=self._plan.temperature,
                top=self._plan.top_logprobs,
            )
            size = len(self._tokenizer.decode([token.token_id]))
            if node.max_length is not None and length + size > node.max_length:
                break
            self._emit(token)
            words, length = words - 1, length + size
        if length < node.min_length:
            self.forced(PAD * (node.min_length - length))
        self.forced('"')

    def _free_object(self) -> None:
        """Any object (json_object): one to three distinct word keys with
        string, integer or boolean values."""
        self.forced("{")
        keys: list[str] = []
        for i in range(1 + self.choose(3)):
            index = self.choose(self._plan.pool_size)
            while WORDS[index] in keys:
                index = (index + 1) % len(WORDS)
            keys.append(WORDS[index])
            self.forced(("" if i == 0 else ", ") + json.dumps(WORDS[index]) + ": ", self._plan.pool_size)
            self._scalar(ScalarNode(("string", "integer", "boolean")[self.choose(3)]))
        self.forced("}")

    def _emit(self, token: SampledToken) -> None:
        self.tokens.append(token)
        self._counts[token.token_id] += 1

    def _uniform(self) -> float:
        self._draws += 1
        return uniform(draw_bytes(self._digest, self._draws))
