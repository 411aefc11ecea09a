"""The web console (serve --ui, on by default): its page, and the two API routes it reads besides the public ones.

    GET /                     the single-page console (server/console/index.html), no key needed: the page
                              holds nothing but code; it asks for the key and sends it as a bearer header
    GET /console/{file}       its scripts and styles (Litestar's static files, from inside the package)
    GET /v1/requests/{id}     a recent chat request of the same key: its prompt tokens by origin, TTFT,
                              TPOT, speculation (server/request_records.py)
    GET /v1/cache?limit=N     the KV pool, disk tier and document store now, and the caller's tenant's N
                              largest cached prefixes (engine/cached_prefixes.py)

The /v1 routes sit behind the API-key guard like every /v1 route. A tenant is the cache salt its
requests run with when they name none (`--tenant-per-key`: the key's own; else the shared, unsalted
one): /v1/cache shows that tenant's prefixes only.
"""

from pathlib import Path

from litestar import Request, get
from litestar.datastructures import State
from litestar.params import FromPath, Parameter
from litestar.response import File
from litestar.static_files import create_static_files_router

from server.auth import caller_of
from server.errors import APIError
from server.request_records import request_body

CONSOLE_DIR = Path(__file__).parent / "console"
DEFAULT_NUM_PREFIXES = 20
MAX_NUM_PREFIXES = 100


@get("/", media_type="text/html")
async def console_page() -> File:
    return File(CONSOLE_DIR / "index.html", content_disposition_type="inline", media_type="text/html")


console_files = create_static_files_router(path="/console", directories=[CONSOLE_DIR], send_as_attachment=False,
                                           include_in_schema=True)  # every route is in /openapi.json


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
        "disk_tier": ({"num_bytes": stats.num_kv_disk_bytes, "max_bytes": settings.kv_disk_bytes,
                       "num_pages": stats.num_kv_disk_pages} if settings.kv_disk_dir is not None else None),
        "document_store": ({"num_bytes": stats.num_document_store_bytes, "max_bytes": settings.document_store_bytes,
                            "num_entries": stats.num_document_store_entries} if settings.document_reuse else None),
    }
    read_prefixes = getattr(engine, "cached_prefixes", None)
    if read_prefixes is None:  # the replica router's handle (replicas/): each replica has its own tree
        return {**body, "prefixes": None,
                "prefixes_unavailable": "this server's engine handle does not show its radix tree (with --replicas "
                                        "each replica has its own)"}
    salt = caller_of(request).cache_salt(None)
    read_at, prefixes = await read_prefixes(salt, limit)
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
