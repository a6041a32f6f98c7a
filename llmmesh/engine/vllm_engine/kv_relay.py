"""Relays vLLM's own KV-cache events onto the pod's :class:`KvEventLog`.

vLLM's engine core publishes ``KVEventBatch`` messages on a ZMQ PUB socket
(frames: topic, 8-byte big-endian sequence number, msgpack payload) and
serves replays on a ROUTER socket. The relay subscribes before the first
request, converts each ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared`` into the pod's event types and appends them to the log
that ``StreamKvEvents`` serves (with its own contiguous sequence numbers and
replay). When vLLM's sequence numbers jump (the subscriber fell behind its
high-water mark), the relay asks the replay socket for the missing batches;
if they are gone too, it records ``AllBlocksCleared`` so routers forget this
pod's blocks rather than trust a view with holes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import msgspec
import zmq
import zmq.asyncio
from vllm.distributed import kv_events as vllm_events

from llmmesh.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventLog, KvEventPayload

log = logging.getLogger(__name__)

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
REPLAY_TIMEOUT_S = 2.0


def block_hash_bytes(block_hash: bytes | int | None) -> bytes:
    """vLLM's external block hash as bytes (it is bytes for SHA-256 hashing,
    an int for the builtin hash)."""
    if block_hash is None:
        return b""
    if isinstance(block_hash, int):
        return block_hash.to_bytes(16, "big", signed=True)
    return bytes(block_hash)


def convert(events: Iterable[object]) -> list[KvEventPayload]:
    """vLLM's event structs as the pod's events; unknown kinds are skipped."""
    converted: list[KvEventPayload] = []
    for event in events:
        if isinstance(event, vllm_events.BlockStored):
            converted.append(
                BlockStored(
                    block_hashes=tuple(block_hash_bytes(h) for h in event.block_hashes),
                    parent_block_hash=block_hash_bytes(event.parent_block_hash),
                    token_ids=tuple(event.token_ids),
                    block_size=event.block_size,
                    medium=(event.medium or "GPU").lower(),
                )
            )
        elif isinstance(event, vllm_events.BlockRemoved):
            converted.append(
                BlockRemoved(
                    block_hashes=tuple(block_hash_bytes(h) for h in event.block_hashes),
                    medium=(event.medium or "GPU").lower(),
                )
            )
        elif isinstance(event, vllm_events.AllBlocksCleared):
            converted.append(AllBlocksCleared())
    return converted


class KvEventRelay:
    """Subscribes to vLLM's publisher (``endpoint``) and feeds ``event_log``."""

    def __init__(self, endpoint: str, replay_endpoint: str, topic: str, event_log: KvEventLog) -> None:
        self._endpoint = endpoint
        self._replay_endpoint = replay_endpoint
        self._topic = topic.encode()
        self._log = event_log
        self._context = zmq.asyncio.Context()
        self._decoder = msgspec.msgpack.Decoder(vllm_events.KVEventBatch)
        self._next_sequence: int | None = None
        self._subscriber = self._context.socket(zmq.SUB)
        self._subscriber.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._subscriber.connect(self._endpoint)
        self.relayed_batches = 0

    async def run(self) -> None:
        """Relay until cancelled."""
        while True:
            _topic, sequence_bytes, payload = await self._subscriber.recv_multipart()
            sequence = int.from_bytes(sequence_bytes, "big", signed=True)
            if self._next_sequence is not None and sequence > self._next_sequence:
                await self._replay(self._next_sequence, sequence)
            self._apply(sequence, payload)

    def close(self) -> None:
        self._subscriber.close(linger=0)
        self._context.term()

    def _apply(self, sequence: int, payload: bytes) -> None:
        if self._next_sequence is not None and sequence < self._next_sequence:
            return  # already relayed (a replay overlapped the live feed)
        batch = self._decoder.decode(payload)
        for event in convert(batch.events):
            self._log.append(event)
        self._next_sequence = sequence + 1
        self.relayed_batches += 1

    async def _replay(self, first_missing: int, received: int) -> None:
        log.warning("KV event batches %d..%d missed; asking vLLM to replay", first_missing, received - 1)
        dealer = self._context.socket(zmq.DEALER)
        dealer.connect(self._replay_endpoint)
        try:
            await dealer.send_multipart((b"", first_missing.to_bytes(8, "big")))
            while True:
                async with asyncio.timeout(REPLAY_TIMEOUT_S):
                    frames = await dealer.recv_multipart()
                _empty, _topic, sequence_bytes, payload = frames
                if sequence_bytes == END_OF_REPLAY:
                    break
                sequence = int.from_bytes(sequence_bytes, "big", signed=True)
                if sequence < received:
                    self._apply(sequence, payload)
        except TimeoutError:
            log.warning("vLLM did not answer the KV event replay")
        finally:
            dealer.close(linger=0)
        if self._next_sequence is not None and self._next_sequence < received:
            log.warning("KV event batches before %d are gone; announcing a cleared cache", received)
            self._log.append(AllBlocksCleared())
            self._next_sequence = received
