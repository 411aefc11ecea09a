"""Request bodies of the collections and embeddings routes, validated by pydantic (failures are 400s).

Sizes that make a request too big (documents or inputs per request) are checked by the
service and answered with 413, not here.
"""

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from retrieval.collections import MAX_TOP_K

DEFAULT_TOP_K = 4


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


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
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _id_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("id must not be empty (leave it out to get one)")
        return value


class AddDocumentsRequest(_Body):
    documents: list[DocumentIn] = Field(min_length=1)


class SearchRequest(_Body):
    query: TextNotBlank
    top_k: int = Field(DEFAULT_TOP_K, ge=1, le=MAX_TOP_K)


class EmbeddingRequest(_Body):
    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _texts(cls, value: Any) -> Any:
        if isinstance(value, list) and value and not all(isinstance(v, str) for v in value):
            raise ValueError("input must be a string or a list of strings (token ids are not supported)")
        return value

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        texts = [value] if isinstance(value, str) else value
        if not texts:
            raise ValueError("input must not be an empty list")
        for text in texts:
            if not text:
                raise ValueError("input must not contain empty strings")
        return value

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input
