"""POST /v1/embeddings, in OpenAI's shape:

    {"input": str | [str] | [int] | [[int]], "model"?, "encoding_format"?: "float" | "base64", "dimensions"?}
    -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
        "usage": {"prompt_tokens", "total_tokens"}}

Vectors are L2-normalised; "base64" is the float32 little-endian bytes (what OpenAI's
Python client asks for by default). Token ids are the embedding model's word-pieces
([CLS] and [SEP] are added). An input longer than the model's 256 word-pieces (those two
included) is a 400: it is not truncated, so usage counts every token embedded.
"""

import base64

import numpy as np
from litestar import Request, post
from litestar.datastructures import State

from server.errors import invalid_request
from server.openapi import json_body
from server.retrieval_service import EMBEDDING_MODEL
from server.schemas_retrieval import EmbeddingRequest


@post("/embeddings", status_code=200, operation_class=json_body(EmbeddingRequest))
async def embeddings(request: Request, state: State) -> dict:
    body = EmbeddingRequest.model_validate_json(await request.body())
    batch = await state.retrieval.embed(body.input, body.model)
    dim = batch.vectors.shape[1]
    if body.dimensions is not None and body.dimensions != dim:
        raise invalid_request(f"dimensions must be {dim} for {EMBEDDING_MODEL} (it cannot be shortened)",
                              param="dimensions")
    if body.encoding_format == "base64":
        encoded = [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() for v in batch.vectors]
    else:
        encoded = batch.vectors.tolist()
    num_tokens = sum(batch.num_tokens)
    return {"object": "list", "model": EMBEDDING_MODEL,
            "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encoded)],
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}
