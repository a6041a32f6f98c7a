"""``llmmesh bench fleet``: ``auto`` against always-large and always-small
on one simulated fleet, the same seeded mixed workload for each.

The mesh is ``llmmesh up`` with one region serving llmmesh-small and
llmmesh-large (``pods_per_model`` simulator pods each, with the family's
per-size step costs; :mod:`llmmesh.core.model_family`). Each system ("auto",
"always_large", "always_small": the request's ``model``) sends every turn
of the workload (:mod:`llmmesh.bench.fleet_workload`) streamed, at the
same seeded Poisson arrival times (``rate`` turns a second: an open loop,
so a system that answers faster is not sent more), in rounds whose order
alternates (ABC, CBA, …) so that no system always runs first. A turn's cost is its usage at the prices of
the model that served it (the registry's, from ``GET /v1/models``); TTFT is
from sending to the first content. Every turn starts with a reference of
its own, so that no system is served from another's prefix caches, and
each system first sends ``warmup`` unmeasured turns. Targets: auto costs at least 40% less
per turn than always-large at a TTFT p90 no worse.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path

import httpx

from llmmesh.bench.fleet_report import FleetReport, SystemResult, TurnResult
from llmmesh.bench.fleet_workload import FleetTurn, FleetWorkload
from llmmesh.bench.processes import StartupError
from llmmesh.core.model_family import LARGE, SMALL
from llmmesh.core.pricing import turn_cost

Progress = Callable[[str], None]
SYSTEMS = {"auto": "auto", "always_large": LARGE.name, "always_small": SMALL.name}


@dataclass(frozen=True)
class FleetBenchPlan:
    """What to run."""

    workload: FleetWorkload = field(default_factory=FleetWorkload)
    rate: float = 2.0
    """Turns sent per second (Poisson arrivals, the same schedule for every system)."""
    rounds: int = 2
    pods_per_model: int = 1
    warmup: int = 2
    startup_timeout_s: float = 180.0

    def __post_init__(self) -> None:
        if min(self.rounds, self.pods_per_model) < 1 or not self.rate > 0 or self.warmup < 0:
            raise ValueError("rate, rounds and pods per model must be positive, warmup not negative")


def fleet_toml(pods_per_model: int) -> str:
    """One zone, one region serving the small and the large model."""
    return (
        '[mesh]\nedge_port = 0\nbackend = "sim"\n[zones.us.regions.us-east.models]\n'
        f"{SMALL.name} = {pods_per_model}\n{LARGE.name} = {pods_per_model}\n"
    )


@contextlib.asynccontextmanager
async def running_fleet(
    plan: FleetBenchPlan, run_dir: Path, progress: Progress
) -> AsyncIterator[dict[str, object]]:
    """``llmmesh up`` on the fleet topology; yields its mesh.json."""
    home = run_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    config = run_dir / "fleet.toml"
    config.write_text(fleet_toml(plan.pods_per_model))
    mesh_file = home / "mesh.json"
    mesh_file.unlink(missing_ok=True)
    env = {**os.environ, "LLMMESH_HOME": str(home)}
    command = [sys.executable, "-m", "llmmesh", "up", "--config", str(config), "--insecure"]
    progress(f"starting the fleet: {' '.join(command[2:])}")
    log_path = run_dir / "up.log"
    with log_path.open("w") as log:
        process = await asyncio.to_thread(
            subprocess.Popen, command, stdout=log, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + plan.startup_timeout_s
        while not mesh_file.exists():
            if process.poll() is not None:
                raise StartupError("the fleet", f"llmmesh up exited with {process.returncode}", log_path)
            if time.monotonic() > deadline:
                raise StartupError("the fleet", f"no mesh.json in {plan.startup_timeout_s:.0f} s", log_path)
            await asyncio.sleep(0.2)
        yield json.loads(mesh_file.read_text())
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 60)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait, 10)


class FleetBench:
    """Runs the scenario against a fresh fleet."""

    def __init__(self, plan: FleetBenchPlan, run_dir: Path, progress: Progress) -> None:
        self._plan = plan
        self._run_dir = run_dir
        self._progress = progress

    async def run(self) -> FleetReport:
        turns = self._plan.workload.generate()
        async with running_fleet(self._plan, self._run_dir, self._progress) as mesh:
            headers = {"authorization": f"Bearer {mesh['api_key']}"}
            async with httpx.AsyncClient(
                base_url=f"{mesh['edge_url']}/v1", headers=headers, timeout=300
            ) as http:
                prices = await _prices(http)
                results = {name: SystemResult() for name in SYSTEMS}
                order = list(SYSTEMS)
                for name in order:
                    for turn in _tagged(turns[: self._plan.warmup], f"warm {name}"):
                        await _one(http, SYSTEMS[name], turn, prices)
                for round_index in range(self._plan.rounds):
                    for name in order if round_index % 2 == 0 else reversed(order):
                        self._progress(f"round {round_index + 1}: {name}, {len(turns)} turns")
                        tagged = _tagged(turns, f"{name} round {round_index + 1}")
                        results[name].turns += await self._system(http, SYSTEMS[name], tagged, prices)
        workload = {
            **asdict(self._plan.workload),
            "rate": self._plan.rate,
            "rounds": self._plan.rounds,
        }
        return FleetReport(workload, results)

    async def _system(
        self,
        http: httpx.AsyncClient,
        model: str,
        turns: Sequence[FleetTurn],
        prices: dict[str, tuple[Decimal, Decimal]],
    ) -> list[TurnResult]:
        # Open loop: every system gets the same arrival times, however fast it answers.
        arrivals = random.Random(self._plan.workload.seed)
        loop = asyncio.get_running_loop()
        began, at = loop.time(), 0.0
        sent = []
        for turn in turns:
            delay = began + at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            sent.append(asyncio.create_task(_one(http, model, turn, prices)))
            at += arrivals.expovariate(self._plan.rate)
        return list(await asyncio.gather(*sent))


def _tagged(turns: Sequence[FleetTurn], tag: str) -> list[FleetTurn]:
    """``turns`` with a reference of their own first, so that no system
    finds another's prompts in the pods' prefix caches (words only: the
    scorer reads digits with an operator as maths)."""
    return [
        dataclasses.replace(turn, prompt=f"(ref {tag} turn {_word(i)}) {turn.prompt}")
        for i, turn in enumerate(turns)
    ]


def _word(n: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        text = letters[n % 26] + text
        n //= 26
        if n == 0:
            return text


async def _prices(http: httpx.AsyncClient) -> dict[str, tuple[Decimal, Decimal]]:
    response = await http.get("/models")
    response.raise_for_status()
    return {
        m["id"]: (Decimal(m["pricing"]["input_per_1k_usd"]), Decimal(m["pricing"]["output_per_1k_usd"]))
        for m in response.json()["data"]
    }


async def _one(
    http: httpx.AsyncClient, model: str, turn: FleetTurn, prices: dict[str, tuple[Decimal, Decimal]]
) -> TurnResult:
    result = TurnResult(turn.kind)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": turn.prompt}],
        "max_tokens": turn.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    try:
        async with http.stream("POST", "/chat/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}"
                return result
            result.model = response.headers.get("x-llmmesh-route-model", model)
            result.reason = response.headers.get("x-llmmesh-route-reason", "")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                choices = chunk.get("choices") or []
                if result.ttft_s is None and choices and choices[0].get("delta", {}).get("content"):
                    result.ttft_s = time.perf_counter() - sent
                usage = chunk.get("usage")
                if usage:
                    price_in, price_out = prices.get(result.model, (Decimal(0), Decimal(0)))
                    result.cost_usd = turn_cost(
                        price_in, price_out, usage["prompt_tokens"], usage["completion_tokens"]
                    )
    except httpx.HTTPError as err:
        result.error = type(err).__name__
    return result
