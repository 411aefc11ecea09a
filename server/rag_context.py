"""Server-side RAG for chat completions: the `retrieval` extension -> documents for the prompt.

`"retrieval": {"collection", "top_k", "query"?}` embeds the query (default: the
last user message), takes the top chunks of the collection, and hands them to the
prompt builder as documents, after any the request brought itself. Their order is
a policy (`--rag-order`): `relevance` (best first, as the search returns them) or
`canonical` (by document id and chunk position), which makes the same set of
chunks render as the same text whatever the question, so it shares cached pages
across questions. The response reports `retrieved_documents: [{"id", "score"}]`.
"""

from dataclasses import dataclass

from server.errors import invalid_request
from server.retrieval_service import RetrievalService
from server.schemas import ChatCompletionRequest

RAG_ORDERS = ("relevance", "canonical")


@dataclass(frozen=True)
class RetrievedContext:
    documents: list[dict]  # for the prompt: {"id": chunk id, "title"?, "text"}, in the policy's order
    reported: list[dict]  # for the response: {"id": document id, "chunk_id", "score"}, best first


def _query(request: ChatCompletionRequest) -> str:
    if request.retrieval.query is not None:
        return request.retrieval.query
    for message in reversed(request.messages):
        if message.role == "user" and message.content and message.content.strip():
            return message.content
    raise invalid_request("retrieval needs a query: give retrieval.query or a user message", param="retrieval.query")


async def retrieve_context(service: RetrievalService, request: ChatCompletionRequest, order: str) -> RetrievedContext:
    """Raises APIError (404 unknown collection, 400 bad input) through the retrieval service."""
    spec = request.retrieval
    hits = await service.search(spec.collection, _query(request), spec.top_k)
    reported = [{"id": hit.id, "chunk_id": hit.chunk_id, "score": round(float(hit.score), 6)} for hit in hits]
    if order == "canonical":
        hits = sorted(hits, key=lambda hit: (hit.id, hit.position))
    documents = [prompt_document(hit.chunk_id, hit.text, hit.metadata) for hit in hits]
    return RetrievedContext(documents, reported)


def prompt_document(chunk_id: str, text: str, metadata: dict | None) -> dict:
    """A chunk as the prompt builder renders it ({"id", "title"?, "text"}): the same dict for a
    retrieval prompt and for ingest's precompute (server/document_precompute.py)."""
    document = {"id": chunk_id, "text": text}
    title = (metadata or {}).get("title")
    if isinstance(title, str) and title:
        document["title"] = title
    return document
