"""Schema-driven fuzzing (schemathesis) of the real app, from its own OpenAPI document: no
request, however odd, gets a 5xx, and every response is one the document describes (schemathesis's
response-conformance checks: status code, content type, headers and body schema). The app runs in-process with the scripted fake engine
(everything above the engine is real: validation, templates, grammars, retrieval with the
real embedding model) and without an API key, so requests reach the handlers.

Examples per operation: $RADIXSERVE_FUZZ_EXAMPLES (default 15, a short run for the suite;
`make fuzz` runs a longer one). The totals are printed at the end (pytest -s shows them).
"""

import collections
import itertools
import os
import time

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_headers_conformance,
                                 response_schema_conformance, status_code_conformance)
from schemathesis.generation.modes import GenerationMode

pytestmark = [pytest.mark.model]  # the embedding model, for the embeddings and collections routes

NUM_EXAMPLES = int(os.environ.get("RADIXSERVE_FUZZ_EXAMPLES", "15"))

CONFORMANCE_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
                      response_headers_conformance, response_schema_conformance]

_statuses: collections.Counter = collections.Counter()
_off_document: list[str] = []  # responses the document does not describe, one line each


@pytest.fixture(scope="module")
def fuzzed_app(make_fake_app):
    app, _ = make_fake_app("Hello there, friend.")
    yield app
    num_requests = sum(_statuses.values())
    num_5xx = sum(count for status, count in _statuses.items() if status >= 500)
    print(f"\nfuzz: {num_requests} requests, {num_5xx} with a 5xx, {len(_off_document)} off the document; "
          f"statuses {dict(sorted(_statuses.items()))}")


def _operations(app) -> list:
    return [result.ok() for result in schemathesis.openapi.from_asgi("/openapi.json", app).get_all_operations()]


def test_no_request_gets_a_server_error(fuzzed_app):
    operations = _operations(fuzzed_app)
    assert len(operations) >= 15  # every route of the document (tests/server/test_operations.py checks them)
    for operation, mode in itertools.product(operations, GenerationMode):  # bodies that fit the schema, and not
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=NUM_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def call(case):
            response = case.call(timeout=120)  # embedding 2048 long inputs on a small CPU takes a while
            _statuses[response.status_code] += 1
            try:
                case.validate_response(response, checks=CONFORMANCE_CHECKS)
            except (Exception, BaseExceptionGroup) as failure:  # counted, not raised: the run goes on and reports them all
                failures = failure.exceptions if isinstance(failure, BaseExceptionGroup) else (failure,)
                reasons = "; ".join((str(f).splitlines() or [type(f).__name__])[0] for f in failures)
                _off_document.append(f"{case.method} {case.formatted_path} -> {response.status_code}: {reasons}")
            assert response.status_code < 500, (f"{case.method} {case.formatted_path} body={case.body!r}: "
                                                f"{response.status_code} {response.text}")
            content_type = (response.headers.get("content-type") or [""])[0]
            if response.status_code >= 400 and content_type.startswith("application/json"):
                if case.path.startswith("/v1/messages"):  # Anthropic's error shape
                    error = response.json()["error"]
                    assert response.json()["type"] == "error" and {"type", "message"} <= set(error) <= {
                        "type", "message", "details"}
                else:
                    assert set(response.json()["error"]) == {"message", "type", "param", "code"}

        started = time.perf_counter()
        try:
            call()
        except Unsatisfiable:  # nothing to break in a route without parameters or body
            assert mode is GenerationMode.NEGATIVE
        print(f"{operation.method.upper()} {operation.path} ({mode}): {time.perf_counter() - started:.1f} s")
    assert not _off_document, "\n".join(sorted(set(_off_document)))
