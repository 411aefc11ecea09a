"""Generated shared prefix (as SGLang's `generated-shared-prefix` bench): G groups x P prompts.

Every group has its own long system prompt (a run of corpus text); its P prompts add a
short question each. All G x P requests are shuffled, so groups interleave at run time.
"""

import random

from bench import corpus
from bench.workload import ChatRequest, SingleRequest, Workload
from bench.workload_sizes import WorkloadSizes


def _word_run(rng: random.Random, num_words: int) -> str:
    """`num_words` consecutive words of the corpus from a random place."""
    text = " ".join(corpus.paragraphs()).split()
    start = rng.randrange(len(text) - num_words)
    return " ".join(text[start:start + num_words])


def shared_prefix_workload(sizes: WorkloadSizes, seed: int) -> Workload:
    rng = random.Random(f"{seed}-shared-prefix")
    vocabulary = corpus.words()
    requests = []
    for group in range(sizes.shared_num_groups):
        system = f"Context {group}: you are an assistant for this material.\n" + _word_run(rng, sizes.shared_system_words)
        for _ in range(sizes.shared_prompts_per_group):
            question = " ".join(rng.choice(vocabulary) for _ in range(sizes.shared_question_words))
            messages = ({"role": "system", "content": system},
                        {"role": "user", "content": f"Explain these terms in the context above: {question}"})
            requests.append(ChatRequest(messages, sizes.max_tokens))
    rng.shuffle(requests)
    return Workload("shared_prefix", f"{sizes.shared_num_groups} groups x {sizes.shared_prompts_per_group} "
                    f"prompts, {sizes.shared_system_words}-word system prompt, "
                    f"{sizes.shared_question_words}-word questions", [SingleRequest(r) for r in requests])
