"""How big each workload is. The defaults size a full `make bench` on a 2-core CPU machine
(SmolLM2-135M: ~350 prefill tok/s, ~20 decode tok/s a sequence) at a few minutes a server;
`QUICK` runs in seconds (the end-to-end test)."""

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class WorkloadSizes:
    max_tokens: int = 32  # output tokens of every request (ignore_eos keeps it exact where honoured)
    # agent: sessions x turns; each turn adds the reply and a tool result of this many words
    agent_num_sessions: int = 6
    agent_num_turns: int = 5
    agent_tool_result_words: int = 40
    # RAG: top-k of a corpus of documents with Zipf popularity
    rag_num_requests: int = 24
    rag_num_corpus_documents: int = 40
    rag_document_words: int = 150
    rag_top_k: int = 3
    rag_zipf_exponent: float = 1.1
    # generated shared prefix: groups x prompts, a long system prompt per group
    shared_num_groups: int = 4
    shared_prompts_per_group: int = 6
    shared_system_words: int = 500
    shared_question_words: int = 20
    # random: no sharing; lengths uniform in [min, max] words
    random_num_requests: int = 20
    random_min_words: int = 150
    random_max_words: int = 700

    def __post_init__(self) -> None:
        for field in fields(self):
            if getattr(self, field.name) <= 0:
                raise ValueError(f"{field.name} must be positive, got {getattr(self, field.name)}")
        if self.random_min_words > self.random_max_words:
            raise ValueError("random_min_words must not exceed random_max_words")
        if self.rag_top_k > self.rag_num_corpus_documents:
            raise ValueError("rag_top_k must not exceed rag_num_corpus_documents")


QUICK = replace(
    WorkloadSizes(), max_tokens=4, agent_num_sessions=2, agent_num_turns=2, agent_tool_result_words=10,
    rag_num_requests=3, rag_num_corpus_documents=6, rag_document_words=40, rag_top_k=2,
    shared_num_groups=2, shared_prompts_per_group=2, shared_system_words=60, shared_question_words=8,
    random_num_requests=3, random_min_words=20, random_max_words=60,
)
