"""Fixtures for the engine plane: a started simulator backend and
in-process pods on port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from llmmesh.engine.server import EnginePod, start_engine
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.backend import SimBackend
from tests.engine.support import FAST, SLOW


@pytest.fixture
def fast_settings() -> EngineSettings:
    return FAST


@pytest_asyncio.fixture
async def backend(fast_settings: EngineSettings) -> AsyncIterator[SimBackend]:
    sim = SimBackend(fast_settings)
    await sim.start()
    yield sim
    await sim.close()


@pytest_asyncio.fixture
async def pod() -> AsyncIterator[EnginePod]:
    engine_pod = await start_engine(FAST)
    yield engine_pod
    await engine_pod.stop(grace_s=0.5)


@pytest_asyncio.fixture
async def slow_pod() -> AsyncIterator[EnginePod]:
    engine_pod = await start_engine(SLOW)
    yield engine_pod
    await engine_pod.stop(grace_s=0.5)
