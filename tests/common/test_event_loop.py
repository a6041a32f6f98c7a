"""Planes run their main coroutine on uvloop where it is installed."""

from __future__ import annotations

import asyncio

import uvloop

from llmmesh.core.lifecycle import run_event_loop


def test_a_plane_runs_on_uvloop_and_gets_its_result() -> None:
    async def main() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    assert run_event_loop(main()) == uvloop.Loop.__module__
