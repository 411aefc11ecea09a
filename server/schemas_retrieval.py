"""Request bodies of the collections and embeddings routes, validated by pydantic (failures are 400s).

Sizes that make a request too big (documents or inputs per request) are checked by the
service and answered with 413, not here.
"""

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, field_validator

from retrieval.collections import MAX_TOP_K
from server.request_body import RequestBody, StorableJSON

DEFAULT_TOP_K = 4

_Body = RequestBody  # strict, null means "not given", numbers finite


def _not_blank(value: str, info: ValidationInfo) -> str:
    if not value.strip():
        raise ValueError(f"{info.field_name} must not be empty")
    return value


TextNotBlank = Annotated[str, AfterValidator(_not_blank)]


class CreateCollectionRequest(_Body):
    name: str
    index: Literal["auto", "flat", "hnsw"] = "auto"  # auto: exact search, HNSW past a size


class DocumentIn(_Body):
    id: str | None = None  # None: the server picks one
    text: TextNotBlank
    metadata: dict[str, StorableJSON] = Field(default_factory=dict)  # returned exactly as sent

    @field_validator("id")
    @classmethod
    def _id_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("id must not be empty (leave it out to get one)")
        return value


class AddDocumentsRequest(_Body):
    documents: list[DocumentIn] = Field(min_length=1)
    # Compute each chunk's document KV now (server/document_precompute.py), when document reuse is on.
    precompute: bool = True
    cache_salt: Annotated[str, Field(min_length=1)] | None = None  # the salt whose requests will reuse that KV


class SearchRequest(_Body):
    query: TextNotBlank
    top_k: int = Field(DEFAULT_TOP_K, ge=1, le=MAX_TOP_K)


def _is_token_ids(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value))


def _embedding_inputs(value: Any) -> Any:
    """str | [str, ...] | [int, ...] | [[int, ...], ...] -> a list of texts or a list of token-id lists."""
    if isinstance(value, str) or _is_token_ids(value):
        return [value]
    if isinstance(value, list) and value and (all(isinstance(v, str) for v in value)
                                              or all(_is_token_ids(v) for v in value)):
        return value
    if value == []:
        raise ValueError("input must not be an empty list")
    raise ValueError("input must be a string, a list of strings, a list of token ids (integers >= 0) "
                     "or a list of such lists")


_TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
# What a client may send (the OpenAPI document shows it; the validator normalises it to a list).
_Text = Annotated[str, Field(min_length=1)]
_EmbeddingInput = (_Text | Annotated[list[_Text], Field(min_length=1)]
                   | _TokenIds | Annotated[list[_TokenIds], Field(min_length=1)])


class EmbeddingRequest(_Body):
    input: Annotated[list[str] | list[list[int]],
                     BeforeValidator(_embedding_inputs, json_schema_input_type=_EmbeddingInput)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _no_empty_text(cls, value: list[str] | list[list[int]]) -> list[str] | list[list[int]]:
        if any(isinstance(v, str) and not v for v in value):
            raise ValueError("input must not contain empty strings")
        return value
