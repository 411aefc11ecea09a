"""The web console (serve --ui, on by default): its page, and the two API routes it reads besides the public ones.

    GET /                     the single-page console (server/console/index.html), no key needed: the page
                              holds nothing but code; it asks for the key and sends it as a bearer header
    GET /console/{file}       its scripts and styles, from inside the package: the files server/console/ held when
                              the server started, by name only (no paths), with an ETag (304 when unchanged)
    GET /v1/requests/{id}     a recent chat request of the same key: its prompt tokens by origin, TTFT,
                              TPOT, speculation (server/request_records.py)
    GET /v1/cache?limit=N     the KV pool, disk tier and document store now, and the caller's tenant's N
                              largest cached prefixes (engine/cached_prefixes.py)

The /v1 routes sit behind the API-key guard like every /v1 route. A tenant is the cache salt its
requests run with when they name none (`--tenant-per-key`: the key's own; else the shared, unsalted
one): /v1/cache shows that tenant's prefixes only.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path

from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.params import FromPath, Parameter

from server.auth import caller_of
from server.errors import APIError
from server.request_records import request_body

CONSOLE_DIR = Path(__file__).parent / "console"
DEFAULT_NUM_PREFIXES = 20
MAX_NUM_PREFIXES = 100


MEDIA_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


@dataclass(frozen=True)
class ConsoleFile:
    content: bytes
    media_type: str
    etag: str


def _read_console_files() -> dict[str, ConsoleFile]:
    files = {}
    for path in sorted(CONSOLE_DIR.iterdir()):
        if path.suffix in MEDIA_TYPES:
            content = path.read_bytes()
            files[path.name] = ConsoleFile(content, MEDIA_TYPES[path.suffix],
                                           f'"{hashlib.sha256(content).hexdigest()[:16]}"')
    return files


CONSOLE_FILES = _read_console_files()  # name -> file: a few tens of KB, read once


def _file_response(request: Request, name: str) -> Response:
    file = CONSOLE_FILES.get(name)
    if file is None:
        raise APIError(404, f"the console has no file {name!r}", code="not_found")
    headers = {"ETag": file.etag, "Cache-Control": "no-cache"}  # revalidated on every load: 304 when unchanged
    if request.headers.get("if-none-match") == file.etag:
        return Response(b"", status_code=304, headers=headers)
    return Response(file.content, media_type=file.media_type, headers=headers)


@get("/", media_type="text/html")
async def console_page(request: Request) -> Response:
    return _file_response(request, "index.html")


@get("/console/{name:str}")
async def console_files(request: Request, name: FromPath[str]) -> Response:
    return _file_response(request, name)


@get("/requests/{request_id:str}")
async def get_request(request: Request, state: State, request_id: FromPath[str]) -> dict:
    record = state.request_records.lookup(request_id, caller_of(request).key_id)
    if record is None:
        raise APIError(404, f"no recent request {request_id!r} of this API key (the server keeps the latest "
                            f"{state.request_records.max_count} chat completions in memory)",
                       param="request_id", code="request_not_found")
    return request_body(record)


@get("/cache")
async def get_cache(request: Request, state: State,
                    limit: int = Parameter(default=DEFAULT_NUM_PREFIXES, ge=1, le=MAX_NUM_PREFIXES)) -> dict:
    engine, settings = state.engine, state.settings.engine
    stats = engine.stats()
    body = {
        "object": "cache",
        "page_size": engine.facts.page_size,
        "pool": {"num_pages": stats.num_pages, "num_free_pages": stats.num_free_pages,
                 "num_cached_pages": stats.num_cached_pages, "num_pages_in_use": stats.num_pages_in_use},
        "disk_tier": ({"num_bytes": stats.kv_disk.num_bytes, "max_bytes": settings.kv_disk.max_bytes,
                       "num_pages": stats.kv_disk.num_pages} if settings.kv_disk.directory is not None else None),
        "document_store": ({"num_bytes": stats.documents.num_store_bytes, "max_bytes": settings.documents.store_bytes,
                            "num_entries": stats.documents.num_store_entries} if settings.documents.enabled else None),
    }
    if engine.cached_prefixes_unavailable is not None:  # the replica router's handle (replicas/)
        return {**body, "prefixes": None, "prefixes_unavailable": engine.cached_prefixes_unavailable}
    salt = caller_of(request).cache_salt(None)
    read_at, prefixes = await engine.cached_prefixes(salt, limit)
    decode = state.service.prompts.tokenizer.decode
    return {**body, "read_at": round(read_at, 3), "prefixes": [
        {"num_tokens": p.num_tokens, "num_pages": p.num_pages, "num_derived_tokens": p.num_derived_tokens,
         "hit_count": p.hit_count, "num_ops_since_use": p.num_ops_since_use,
         "num_locking_requests": p.num_locking_requests, "num_pinned_tokens": p.num_pinned_tokens,
         "pin_seconds_left": p.pin_seconds_left,
         "head_text": decode(list(p.head_token_ids), skip_special_tokens=False),
         "tail_text": decode(list(p.tail_token_ids), skip_special_tokens=False) if p.tail_token_ids else None}
        for p in prefixes]}


CONSOLE_API_ROUTES = [get_request, get_cache]
CONSOLE_PAGE_ROUTES = [console_page, console_files]
