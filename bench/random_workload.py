"""Random prompts with no sharing: the overhead baseline of a prefix cache.

Each prompt is random corpus words in the system message (so not even a default system
prompt of the chat template is shared), of a length uniform in [min, max] words.
"""

import random

from bench import corpus
from bench.workload import ChatRequest, SingleRequest, Workload
from bench.workload_sizes import WorkloadSizes


def random_workload(sizes: WorkloadSizes, seed: int) -> Workload:
    rng = random.Random(f"{seed}-random")
    vocabulary = corpus.words()
    sessions = []
    for _ in range(sizes.random_num_requests):
        num_words = rng.randint(sizes.random_min_words, sizes.random_max_words)
        text = " ".join(rng.choice(vocabulary) for _ in range(num_words))
        messages = ({"role": "system", "content": text},
                    {"role": "user", "content": "Continue the list above with more words."})
        sessions.append(SingleRequest(ChatRequest(messages, sizes.max_tokens)))
    return Workload("random", f"{sizes.random_num_requests} requests, {sizes.random_min_words}-"
                    f"{sizes.random_max_words} random words, no sharing", sessions)
