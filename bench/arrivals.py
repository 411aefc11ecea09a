"""When sessions start under a request rate: gaps drawn from a gamma distribution, as vLLM.

Shape `burstiness` and mean 1 / rate: burstiness 1 is a Poisson process, below 1 burstier,
above 1 more regular. An infinite rate starts everything at once (concurrency is then the
only limit).
"""

import math
import random


def arrival_offsets_s(num_arrivals: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Start times in seconds after the run begins, the first at 0."""
    if request_rate <= 0 or burstiness <= 0:
        raise ValueError("request_rate and burstiness must be positive")
    if math.isinf(request_rate):
        return [0.0] * num_arrivals
    rng = random.Random(f"{seed}-arrivals")
    scale_s = 1.0 / (request_rate * burstiness)  # gamma's mean is shape * scale = 1 / rate
    offsets, now_s = [], 0.0
    for _ in range(num_arrivals):
        offsets.append(now_s)
        now_s += rng.gammavariate(burstiness, scale_s)
    return offsets
