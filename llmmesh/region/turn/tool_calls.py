"""A reply's tool calls as the region hands them on: ids of its own, and the
calls whole, for the zone store and the output filter.

A pod may name its calls any way it likes, and two pods (or two regions)
running one turn would name them differently. The region gives every call
the id :func:`tool_call_id` derives from the tenant, the turn's original
request id and the call's index, so a turn continued in another region
after a failover names each call as the first region did, and a client that
already holds a call's id sees the same id for its later parts.

Parts stream as the contract says (``ToolCallDelta``): the first part of a
call carries its index, id and name, later parts of that index more of its
arguments. :class:`ToolCallLog` merges them back into whole calls
(:class:`llmmesh.core.tool_calls.ToolCallMerger`, as the edge does).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from llmmesh.core.tool_calls import ToolCallMerger
from llmmesh.v1 import common_pb2

CALL_ID_PREFIX = "call_"


def tool_call_id(tenant_id: str, original_request_id: str, index: int) -> str:
    """The id of call ``index`` of a turn: ``call_`` and the 24 hex digits of
    a 12-byte BLAKE2b digest of ``"{tenant}:{original request id}:{index}"``.
    Deterministic, so every region serving one turn agrees; the tenant is in
    it because request ids are each tenant's own."""
    digest = hashlib.blake2b(f"{tenant_id}:{original_request_id}:{index}".encode(), digest_size=12)
    return CALL_ID_PREFIX + digest.hexdigest()


def rewrite_ids(
    parts: Iterable[common_pb2.ToolCallDelta], tenant_id: str, original_request_id: str
) -> list[common_pb2.ToolCallDelta]:
    """``parts`` with every id the pod gave replaced by :func:`tool_call_id`
    (parts without an id, a call's later ones, stay as they are)."""
    out: list[common_pb2.ToolCallDelta] = []
    for part in parts:
        copy = common_pb2.ToolCallDelta()
        copy.CopyFrom(part)
        if copy.id:
            copy.id = tool_call_id(tenant_id, original_request_id, copy.index)
        out.append(copy)
    return out


def merge_parts(parts: Sequence[common_pb2.ToolCallDelta]) -> list[common_pb2.ToolCallDelta]:
    """Adjacent parts of one call folded into one (the arguments joined), as
    one delta holds them when the output filter releases several at once."""
    merged: list[common_pb2.ToolCallDelta] = []
    for part in parts:
        last = merged[-1] if merged else None
        if last is not None and last.index == part.index and not part.id and not part.name:
            last.arguments += part.arguments
            continue
        copy = common_pb2.ToolCallDelta()
        copy.CopyFrom(part)
        merged.append(copy)
    return merged


def part_text(parts: Iterable[common_pb2.ToolCallDelta]) -> str:
    """The text of tool-call parts as the output filter reads it: a call's
    name where it begins, then its arguments, so a flagged phrase inside
    the arguments is caught as one in the reply's content is."""
    return "".join((f"\n{part.name} " if part.name else "") + part.arguments for part in parts)


class ToolCallLog(ToolCallMerger):
    """A reply's tool calls, whole, from the parts that streamed (and, for a
    continuation, the calls its client had before the break)."""

    def carry(self, calls: Iterable[common_pb2.ToolCall], tenant_id: str, original_request_id: str) -> None:
        """Take the calls a continued turn's client had, by index from 0,
        under the ids the region gave them (whatever ids the caller sent)."""
        for index, call in enumerate(calls):
            own_id = tool_call_id(tenant_id, original_request_id, index)
            self.put(index, common_pb2.ToolCall(id=own_id, name=call.name, arguments=call.arguments))

    def text(self) -> str:
        """The calls' text as :func:`part_text` gives the filter their parts."""
        return "".join(f"\n{call.name} {call.arguments}" for call in self.calls())
