"""Collections: create, list, get, delete; add, get and delete documents; search.

    POST   /v1/collections                          {"name", "index"?}            -> 201 collection
    GET    /v1/collections                          -> {"object": "list", "data": [collection]}
    GET    /v1/collections/{name}                   -> collection
    DELETE /v1/collections/{name}                   -> {"name", "object", "deleted": true}
    POST   /v1/collections/{name}/documents         {"documents": [{"id"?, "text", "metadata"?}], "precompute"?,
                                                     "cache_salt"?} -> {"ids", "num_precomputed_tokens",
                                                     "precompute_skipped"? (why none was computed)}
    GET    /v1/collections/{name}/documents/{id}    -> {"id", "text", "metadata", "num_chunks"}
    DELETE /v1/collections/{name}/documents/{id}    -> {"id", "object", "deleted": true}
    POST   /v1/collections/{name}/search            {"query", "top_k"?} -> {"object": "list", "data": [hit]}

collection = {"name", "object": "collection", "num_documents", "num_chunks"};
hit = {"id" (document id), "chunk_id" ("<id>#<n>"), "text" (the chunk), "score" (cosine), "metadata"}.
Adding documents computes their chunks' document KV too, with document reuse on (unless "precompute":
false), before it answers: `num_precomputed_tokens` were computed (0 for spans already stored), under
the caller's cache salt (or "cache_salt"), so that tenant's `retrieval` prompts find it; with replicas,
into every replica (the sum is reported). When precompute was asked for but cannot happen (document
reuse off, a replica router that cannot reach each replica), "precompute_skipped" says why.
A document id in a path may contain '/' (sent as is or as %2F); an id that starts with '/' cannot
be addressed there, as the router folds '//' into '/'.
"""

from litestar import Request, delete, get, post
from litestar.datastructures import State
from litestar.params import FromPath

from retrieval.collections import CollectionInfo, NewDocument
from server.auth import caller_of
from server.document_precompute import precompute_chunks, precompute_skipped_reason
from server.rag_context import prompt_document
from server.openapi import json_body
from server.schemas_retrieval import AddDocumentsRequest, CreateCollectionRequest, SearchRequest


def _collection(info: CollectionInfo) -> dict:
    return {"name": info.name, "object": "collection", "num_documents": info.num_documents,
            "num_chunks": info.num_chunks}


@post("/collections", status_code=201, operation_class=json_body(CreateCollectionRequest))
async def create_collection(request: Request, state: State) -> dict:
    body = CreateCollectionRequest.model_validate_json(await request.body())
    return _collection(await state.retrieval.create_collection(body.name, body.index))


@get("/collections")
async def list_collections(state: State) -> dict:
    return {"object": "list", "data": [_collection(i) for i in await state.retrieval.list_collections()]}


@get("/collections/{name:str}")
async def get_collection(state: State, name: FromPath[str]) -> dict:
    return _collection(await state.retrieval.collection(name))


@delete("/collections/{name:str}", status_code=200)
async def delete_collection(state: State, name: FromPath[str]) -> dict:
    await state.retrieval.delete_collection(name)
    return {"name": name, "object": "collection.deleted", "deleted": True}


@post("/collections/{name:str}/documents", status_code=200, operation_class=json_body(AddDocumentsRequest))
async def add_documents(request: Request, state: State, name: FromPath[str]) -> dict:
    body = AddDocumentsRequest.model_validate_json(await request.body())
    documents = [NewDocument(d.text, d.id, d.metadata) for d in body.documents]
    ids = await state.retrieval.add_documents(name, documents)
    num_precomputed = 0
    skipped = precompute_skipped_reason(state.engine, state.settings.engine.documents.enabled) if body.precompute else None
    if body.precompute and skipped is None:
        chunks = await state.retrieval.document_chunks(name, ids)
        documents = [prompt_document(chunk.name, chunk.text, chunk.metadata)
                     for chunk in chunks]  # as a retrieval prompt holds them (server/rag_context.py)
        num_precomputed = await precompute_chunks(state.engine, state.service.prompts.builder, documents,
                                                  caller_of(request).cache_salt(body.cache_salt))
    return {"ids": ids, "num_precomputed_tokens": num_precomputed,
            **({"precompute_skipped": skipped} if skipped is not None else {})}


@get("/collections/{name:str}/documents/{document_id:path}")
async def get_document(state: State, name: FromPath[str], document_id: FromPath[str]) -> dict:
    row = await state.retrieval.document(name, document_id.removeprefix("/"))
    return {"id": row.id, "object": "document", "text": row.text, "metadata": row.metadata,
            "num_chunks": row.num_chunks}


@delete("/collections/{name:str}/documents/{document_id:path}", status_code=200)
async def delete_document(state: State, name: FromPath[str], document_id: FromPath[str]) -> dict:
    document_id = document_id.removeprefix("/")
    await state.retrieval.delete_document(name, document_id)
    return {"id": document_id, "object": "document.deleted", "deleted": True}


@post("/collections/{name:str}/search", status_code=200, operation_class=json_body(SearchRequest))
async def search_collection(request: Request, state: State, name: FromPath[str]) -> dict:
    body = SearchRequest.model_validate_json(await request.body())
    hits = await state.retrieval.search(name, body.query, body.top_k)
    return {"object": "list", "data": [{"id": h.id, "chunk_id": h.chunk_id, "text": h.text, "score": h.score,
                                        "metadata": h.metadata} for h in hits]}


COLLECTION_ROUTES = [create_collection, list_collections, get_collection, delete_collection, add_documents,
                     get_document, delete_document, search_collection]
