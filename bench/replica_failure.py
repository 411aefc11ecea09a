"""Failure run: kill one replica's process under load; nothing hangs, the endpoint keeps
answering, Ray Serve brings the replica back.

Starts `radixserve serve --replicas 2`, keeps `--concurrency` streamed chat requests in
flight, SIGKILLs one replica's worker process after `--kill-after-s`, and goes on until the
replica is back (two replica processes again, and both reporting in /metrics) plus a while.

    python -m bench.replica_failure [--concurrency 4] [--kill-after-s 8] [--max-tokens 24]
"""

import argparse
import asyncio
import os
import re
import signal
import subprocess
import time

import httpx

from bench.local_server import radixserve_server

REPLICA_PROCESS = "ray::ServeReplica:radixserve:radixserve-engine"
REQUEST_TIMEOUT_S = 120.0


def replica_pids() -> list[int]:
    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split(None, 1)[0]) for line in listing.splitlines() if REPLICA_PROCESS in line]


async def reporting_replicas(client: httpx.AsyncClient) -> set[str]:
    text = (await client.get("/metrics")).text
    return set(re.findall(r'replica_num_requests_running\{replica="([^"]+)"\}', text))


async def drive(url: str, concurrency: int, kill_after_s: float, max_tokens: int, settle_s: float) -> dict:
    outcomes = []  # (start, end, ok, detail)
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
        before = await reporting_replicas(client)

        async def worker(index: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                body = {"messages": [{"role": "user", "content": f"Worker {index} request {n}: tell me a story."}],
                        "max_tokens": max_tokens, "temperature": 0, "stream": True}
                start = time.monotonic()
                try:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                        text = "".join([line async for line in response.aiter_lines()])
                    ok = response.status_code == 200 and "[DONE]" in text and '"error"' not in text
                    detail = f"HTTP {response.status_code}" + ("" if ok else f": {text[-200:]}")
                except httpx.HTTPError as error:
                    ok, detail = False, f"{type(error).__name__}: {error}"
                outcomes.append((start, time.monotonic(), ok, detail))

        workers = [asyncio.create_task(worker(i)) for i in range(concurrency)]
        started = time.monotonic()
        await asyncio.sleep(kill_after_s)
        victim = replica_pids()[0]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        back_at = None
        while time.monotonic() - killed_at < 240:
            await asyncio.sleep(1)
            pids = replica_pids()
            reporting = await reporting_replicas(client)
            if back_at is None and len(pids) == 2 and victim not in pids and len(reporting) == 2 and reporting != before:
                back_at = time.monotonic()
            if back_at is not None and time.monotonic() - back_at > settle_s:
                break
        stop.set()
        await asyncio.gather(*workers)
    after_kill = [o for o in outcomes if o[0] > killed_at]
    after_back = [o for o in outcomes if back_at is not None and o[0] > back_at]
    in_flight_at_kill = [o for o in outcomes if o[0] < killed_at < o[1]]
    return {
        "num_requests": len(outcomes), "num_failed": sum(not o[2] for o in outcomes),
        "failures": sorted({o[3][:160] for o in outcomes if not o[2]}),
        "in_flight_at_kill": len(in_flight_at_kill), "in_flight_at_kill_failed": sum(not o[2] for o in in_flight_at_kill),
        "started_after_kill": len(after_kill), "started_after_kill_ok": sum(o[2] for o in after_kill),
        "started_after_recovery": len(after_back), "started_after_recovery_ok": sum(o[2] for o in after_back),
        "longest_request_s": round(max(o[1] - o[0] for o in outcomes), 1),
        "replica_back_after_s": None if back_at is None else round(back_at - killed_at, 1),
        "run_s": round(time.monotonic() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kill-after-s", type=float, default=8.0)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--settle-s", type=float, default=10.0, help="keep the load on this long after recovery")
    args = parser.parse_args()
    # Low balance thresholds: these short prompts share the template's first pages, and the load is to be on
    # both replicas when one dies.
    server_args = ["--replicas", "2", "--threads-per-replica", "1", "--kv-cache-memory", "256MiB",
                   "--balance-abs-threshold", "1"]
    with radixserve_server(server_args) as url:
        result = asyncio.run(drive(url, args.concurrency, args.kill_after_s, args.max_tokens, args.settle_s))
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
