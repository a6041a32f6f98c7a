"""Pydantic models of strict structured output, shared by the engines'
tests: an engine either returns a document its model validates or refuses
the schema naming the keyword (:data:`XGRAMMAR_REFUSES` for vLLM; the
simulator follows them all). Plain strings are bounded, so a model with
random weights under a grammar still closes them."""

from __future__ import annotations

from datetime import date, datetime
from enum import StrEnum
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, EmailStr, Field, StringConstraints, confloat, conint

Name = Annotated[str, StringConstraints(max_length=12)]
Zip = Annotated[str, StringConstraints(pattern=r"^\d{5}$")]
Code = Annotated[str, StringConstraints(pattern=r"^[A-Z]{2}-\d{3,5}$")]
ShortCode = Annotated[str, StringConstraints(pattern=r"^[A-Z]{2}-\d{3,5}$", max_length=7)]


class Color(StrEnum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Address(BaseModel):
    street: Name
    zip: Zip


class Tree(BaseModel):
    label: Name
    children: list[Tree] = Field(max_length=2)


class Event(BaseModel):
    at: datetime
    day: date
    id: UUID
    contact: EmailStr
    nick: Name | None
    color: Color
    address: Address


class Measure(BaseModel):
    ratio: confloat(ge=0, lt=1)  # type: ignore[valid-type]
    counts: list[int] = Field(min_length=1, max_length=3)
    level: conint(ge=1, le=5)  # type: ignore[valid-type]
    code: Code


class Stepped(BaseModel):
    step: conint(gt=0, multiple_of=5)  # type: ignore[valid-type]


class Everything(BaseModel):
    """Every strict-mode feature in one model."""

    when: datetime
    day: date
    id: UUID
    email: EmailStr
    code: ShortCode
    count: conint(gt=0, multiple_of=5)  # type: ignore[valid-type]
    ratio: confloat(ge=0, lt=1)  # type: ignore[valid-type]
    numbers: list[int] = Field(min_length=1, max_length=3)
    nick: str | None
    color: Color
    address: Address
    tree: Tree


MODELS: tuple[type[BaseModel], ...] = (Everything, Event, Measure, Tree, Stepped)
XGRAMMAR_REFUSES: dict[type[BaseModel], str] = {
    Everything: "maxLength beside pattern at #/properties/code",
    Stepped: "keyword 'multipleOf' at #/properties/step",
}
"""What vLLM's guided decoding refuses of :data:`MODELS`, as its message says."""
