"""Process lifecycle shared by every plane: stop signals and ready files."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def stop_event() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, for a graceful drain."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, event.set)
    return event


def write_ready_file(path: str | None, payload: dict[str, object]) -> None:
    """Atomically write ``payload`` as JSON, telling a supervisor we serve."""
    if not path:
        return
    target = Path(path)
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(target)


def settle_heap() -> None:
    """Set aside what start-up allocated from the garbage collector's view.

    A plane's modules, settings and caches live as long as it does, yet
    every full collection walks them all again: with the protobuf, gRPC and
    web modules loaded that is tens of milliseconds during which the event
    loop relays no token. Called once a plane serves, this collects what
    start-up left behind and freezes the rest (``gc.freeze``), so later
    collections walk only what was allocated since.
    """
    gc.collect()
    gc.freeze()


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run a plane's main coroutine to its end on uvloop (libuv's event
    loop, which relays a token for less CPU than asyncio's own), or on
    asyncio's where uvloop is not installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a platform without uvloop
        return asyncio.run(main)
    return uvloop.run(main)
