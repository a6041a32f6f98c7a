"""Field types shared by the edge's request bodies, and the strict base model
they are built on: a field a body does not define is refused
(``unknown_parameter``), never dropped."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr


def _encodable(text: str) -> str:
    # JSON can carry a lone surrogate ("\udc80"); protobuf strings cannot.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid UTF-8 text") from exc
    return text


Text = Annotated[StrictStr, AfterValidator(_encodable)]
"""A string the contract can carry."""
Int32 = Annotated[StrictInt, Field(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
ModelName = Annotated[StrictStr, Field(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]
"""A model name as the registry allows one ("auto" included): a name that
could never exist is refused here, before it travels through the mesh."""
FunctionName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
"""A function (tool) name as OpenAI allows one."""

AnyJson = Any
"""A value of a parameter the mesh refuses whatever it holds (the refusal
names the parameter); typed loosely so that the refusal, not a type error,
is what the client reads."""


class Strict(BaseModel):
    """A request object: unknown fields are a 400 naming them."""

    model_config = ConfigDict(extra="forbid")
