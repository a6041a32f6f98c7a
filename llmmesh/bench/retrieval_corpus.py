"""The generated corpus of ``llmmesh bench retrieval``: seeded fact cards
with one known answer each.

Each document describes one place (a made-up name, unique in the corpus)
and one role held there; places share their kinds and roles, so every
question has many near misses that differ only in the name. A question
asks for the role at one place: the document about that place is its known
answer. The same seed gives the same corpus and questions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "kr", "st", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "io", "ou")
_CODAS = ("", "n", "r", "l", "s", "th", "k", "m")
_KINDS = ("harbour", "observatory", "library", "foundry", "garden", "monastery", "lighthouse", "archive")
_ROLES = ("keeper", "founder", "chief engineer", "archivist", "navigator", "treasurer", "gardener")
_GOODS = ("maps", "lenses", "ledgers", "bells", "seeds", "charts", "engines", "scrolls")


@dataclass(frozen=True)
class Document:
    """One fact card: its file name and text."""

    name: str
    text: str


@dataclass(frozen=True)
class Question:
    """A question and the index of the document that answers it."""

    text: str
    answer: int


@dataclass(frozen=True)
class Corpus:
    documents: tuple[Document, ...]
    questions: tuple[Question, ...]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


def generate_corpus(documents: int, questions: int, seed: int = 7) -> Corpus:
    """``documents`` fact cards and ``questions`` questions about distinct
    ones. ValueError unless ``1 <= questions <= documents``."""
    if not 1 <= questions <= documents:
        raise ValueError("the corpus needs 1 <= questions <= documents")
    rng = random.Random(seed)
    places: list[str] = []
    seen: set[str] = set()
    while len(places) < documents:
        place = _word(rng, 3).capitalize()
        if place not in seen:
            seen.add(place)
            places.append(place)
    docs: list[Document] = []
    asks: list[str] = []
    for index, place in enumerate(places):
        kind, role, goods = rng.choice(_KINDS), rng.choice(_ROLES), rng.choice(_GOODS)
        person = f"{_word(rng, 2).capitalize()} {_word(rng, 2).capitalize()}"
        year, count = rng.randrange(1200, 1990), rng.randrange(10, 5000)
        text = (
            f"{place} {kind}. The {role} of the {place} {kind} is {person}. "
            f"The {kind} was built in {year} and keeps {count} {goods}."
        )
        docs.append(Document(f"card-{index:05d}-{place.lower()}.txt", text))
        asks.append(f"Who is the {role} of the {place} {kind}?")
    chosen = rng.sample(range(documents), questions)
    return Corpus(tuple(docs), tuple(Question(asks[i], i) for i in chosen))
