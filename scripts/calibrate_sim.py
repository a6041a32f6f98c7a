"""Measure a running engine pod and fit the simulator's timing model to it.

Usage: .venv/bin/python scripts/calibrate_sim.py ADDRESS
(start the pod first, e.g. ``llmmesh engine --backend vllm --port 50061``).

It measures, over the pod's own gRPC stream:

- time to first token of single requests with uncached prompts of several
  lengths (one token out): a least-squares line gives
  ``sim_prefill_overhead_s`` (the intercept, less one decode step) and
  ``sim_prefill_per_token_s`` (the slope);
- inter-token latency of a batch of 1 and of ``max_num_seqs`` greedy
  generations: ``sim_inter_token_s`` is the first, and
  ``sim_batch_load_factor`` is how much slower a full batch's step is.

It prints one JSON object with the fitted settings and the raw figures.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time

import grpc.aio

from llmmesh.v1 import common_pb2
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc

# Up to 1024: beyond, attention's quadratic cost bends the line on CPUs.
PROMPT_LENGTHS = (64, 256, 512, 1024)
REPEATS = 3
DECODE_TOKENS = 64


async def timed_generation(
    stub: pb_grpc.EngineServiceStub, request_id: str, prompt: list[int], max_tokens: int
) -> tuple[float, list[float]]:
    """(TTFT, arrival times of every token) of one greedy generation."""
    call = stub.Generate()
    sent = time.perf_counter()
    await call.write(
        pb.GenerateRequest(
            start=pb.GenerateStart(
                request_id=request_id,
                prompt_token_ids=prompt,
                sampling=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
            )
        )
    )
    arrivals: list[float] = []
    async for response in call:
        if response.WhichOneof("event") == "delta":
            arrivals.extend([time.perf_counter()] * len(response.delta.token_ids))
    return arrivals[0] - sent, arrivals


def itl(arrivals: list[float]) -> float:
    return (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)


async def main(address: str) -> dict[str, object]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.EngineServiceStub(channel)
        info = await stub.GetEngineInfo(pb.GetEngineInfoRequest())
        vocab = 10  # ids from 10 up to 1000 are ordinary tokens of llmmesh-tiny and of the simulator
        # Distinct leading tokens per request and per run: nothing is served
        # from the prefix cache.
        ttfts: dict[int, float] = {}
        counter = random.randrange(10**6)
        for length in PROMPT_LENGTHS:
            samples = []
            for _ in range(REPEATS):
                counter += 1
                prompt = [vocab + (counter * 7 + i) % 900 for i in range(length)]
                ttft, _ = await timed_generation(stub, f"cal-ttft-{counter}", prompt, 1)
                samples.append(ttft)
            ttfts[length] = statistics.median(samples)
        slope, intercept = statistics.linear_regression(list(ttfts), list(ttfts.values()))

        _, single = await timed_generation(stub, "cal-itl-1", [vocab + 1, vocab + 2], DECODE_TOKENS)
        full = info.max_num_seqs
        batch = await asyncio.gather(
            *(
                timed_generation(stub, f"cal-itl-b{n}", [vocab + n, vocab + n + 1], DECODE_TOKENS)
                for n in range(full)
            )
        )
        itl_1 = itl(single)
        itl_full = statistics.median(itl(arrivals) for _, arrivals in batch)
    return {
        "pod": {"backend": info.backend, "model": info.model, "max_num_seqs": full},
        "ttft_s_by_prompt_tokens": {str(k): round(v, 5) for k, v in ttfts.items()},
        "itl_s": {"batch_1": round(itl_1, 5), f"batch_{full}": round(itl_full, 5)},
        "fitted": {
            "sim_prefill_per_token_s": round(max(slope, 0.0), 7),
            "sim_prefill_overhead_s": round(max(intercept - itl_1, 0.0), 5),
            "sim_inter_token_s": round(itl_1, 5),
            "sim_batch_load_factor": round(max(itl_full / itl_1 - 1, 0.0), 3),
        },
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
