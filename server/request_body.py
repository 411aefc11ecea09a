"""The base of every request body, and the JSON values bodies may carry as they are.

Three rules every body follows, as OpenAI's API does:
- strict types (a string is not a number, 1 is not `true`); fields we do not use are ignored;
- `null` in an optional field means "not given": the field takes its default. The official
  clients send `null` whenever a caller passes None, so `"stop": null` or `"n": null` must
  work like leaving the field out. A required field stays required (`null` is a 400);
- numbers are finite: NaN and Infinity (JSON literals, or a literal like 1e999 that
  overflows to infinity) are refused in every numeric field, and in free-form JSON values
  (`FiniteJSON`), with a message that says so.

Constraints (min_length, ge, ...) go on the inner type of an optional field
(`Annotated[list[str], Field(max_length=4)] | None`), never on the union: pydantic applies
a constraint on `X | None` to None too and raises TypeError, which is not a validation
error and would turn a valid `null` into a 500.
"""

import asyncio
import math
from functools import cache
from typing import Annotated, Any, TypeVar

from litestar import Request
from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator

Body = TypeVar("Body", bound=BaseModel)

# Integers a stored value may hold: what JSON libraries (ours and clients') keep exactly as int64 / uint64.
MIN_STORED_INT, MAX_STORED_INT = -(2**63), 2**64 - 1


class RequestBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        optional = _optional_keys(cls)
        return {key: value for key, value in data.items() if value is not None or key not in optional}


def refuse_fields(data: Any, names: tuple[str, ...]) -> None:
    """A body's fields this server accepts in the API's schema but cannot honour: a 400 naming the first
    one sent with a value (None means "not given", as everywhere)."""
    if isinstance(data, dict):
        for name in names:
            if data.get(name) is not None:
                raise ValueError(f"{name} is not supported by this server")


@cache
def _optional_keys(model: type[BaseModel]) -> frozenset[str]:
    """The JSON keys of the model's fields that have a default."""
    return frozenset(info.alias or name for name, info in model.model_fields.items() if not info.is_required())


def _walk_numbers(value: Any, path: str, check) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, (int, float)):
        check(value, path)
    elif isinstance(value, dict):
        for key, item in value.items():
            _walk_numbers(item, f"{path}.{key}" if path else str(key), check)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk_numbers(item, f"{path}[{i}]", check)


def _check_finite(number: int | float, path: str) -> None:
    if isinstance(number, float) and not math.isfinite(number):
        where = f" (at {path})" if path else ""
        raise ValueError(f"numbers must be finite: NaN and Infinity are not valid JSON numbers{where}")


def _check_storable(number: int | float, path: str) -> None:
    _check_finite(number, path)
    if isinstance(number, int) and not MIN_STORED_INT <= number <= MAX_STORED_INT:
        raise ValueError(f"integers must lie in [-2**63, 2**64 - 1] to be stored exactly (at {path})")


def _finite(value: Any) -> Any:
    _walk_numbers(value, "", _check_finite)
    return value


def _storable(value: Any) -> Any:
    _walk_numbers(value, "", _check_storable)
    return value


# Free-form JSON (tool parameter schemas, template variables): any value, numbers finite.
FiniteJSON = Annotated[Any, AfterValidator(_finite)]
# JSON the server stores and returns (document metadata): it must come back exactly as sent,
# so numbers are finite and integers fit 64 bits (floats round-trip by their shortest repr).
StorableJSON = Annotated[Any, AfterValidator(_storable)]


async def validated_body(request: Request, model: type[Body]) -> Body:
    """The request's JSON body as `model`. Validated in a worker thread: a body of megabytes takes
    seconds, which must not stall the event loop (and every other request with it)."""
    return await asyncio.to_thread(model.model_validate_json, await request.body())
