"""The streaming client and the runner against scripted servers (httpx.MockTransport): parsing,
errors counted not raised, multi-turn replies fed back, clear unreachable-endpoint errors."""

import asyncio
import json
import sys

import httpx
import pytest

from bench.local_server import ServerStartError, local_server
from bench.openai_stream import stream_chat
from bench.report import markdown_report
from bench.results import ServerRun
from bench.runner import EndpointUnreachable, RunOptions, discover_model, run_workload, run_workloads
from bench.workload import ChatRequest
from bench.workload_sizes import QUICK
from bench.workloads import build_workload

REQUEST = ChatRequest(({"role": "user", "content": "hi"},), max_tokens=3)
OPTIONS = RunOptions(concurrency=2, show_progress=False, num_warmup=1)


def sse(*chunks) -> httpx.Response:
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})


def delta(text):
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def usage(prompt, completion, cached=None, **extra):
    body = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}, **extra}
    if cached is not None:
        body["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    return body


def echo_server(request: httpx.Request) -> httpx.Response:
    """Replies with the number of messages it got, 'max_tokens' chunks, cached = half the prompt."""
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"data": [{"id": "echo-model"}]})
    body = json.loads(request.content)
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["ignore_eos"]
    num_messages = len(body["messages"])
    chunks = [delta(f"m{num_messages} ")] + [delta("x") for _ in range(body["max_tokens"] - 1)]
    return sse(*chunks, usage(10 * num_messages, body["max_tokens"], cached=5 * num_messages))


def run(coroutine_fn, handler):
    async def main():
        async with httpx.AsyncClient(base_url="http://test", transport=httpx.MockTransport(handler)) as client:
            return await coroutine_fn(client)
    return asyncio.run(main())


def stream(handler):
    return run(lambda c: stream_chat(c, REQUEST, model="m", ignore_eos=True, session_index=3, turn_index=1,
                                     run_started_s=0.0), handler)


def test_stream_reads_text_usage_and_cached_tokens():
    reply = stream(lambda r: sse({"choices": [{"delta": {"role": "assistant"}}]}, delta("a"), delta("b"),
                                 delta("c"), usage(12, 3, cached=8)))
    o = reply.outcome
    assert reply.text == "abc" and o.is_success
    assert (o.num_prompt_tokens, o.num_output_tokens, o.num_cached_tokens) == (12, 3, 8)
    assert (o.session_index, o.turn_index, len(o.itl_s)) == (3, 1, 2)
    assert 0 < o.ttft_s <= o.e2e_s


def test_stream_falls_back_to_llama_cpp_timings_and_chunk_count():
    o = stream(lambda r: sse(delta("a"), {**delta("b"), "timings": {"cache_n": 7}})).outcome
    assert o.num_cached_tokens == 7
    assert o.num_output_tokens == 2  # no usage chunk: one token per content chunk
    assert stream(lambda r: sse(delta("a"), usage(5, 1))).outcome.num_cached_tokens is None


@pytest.mark.parametrize("handler, error_start", [
    (lambda r: httpx.Response(503, json={"error": {"message": "overloaded"}}), "HTTP 503"),
    (lambda r: sse({"error": {"message": "engine died"}}), "error event: engine died"),
    (lambda r: sse(usage(5, 0)), "the stream carried no output"),
    (lambda r: httpx.Response(200, content=b"data: {not json\n\n"), "malformed stream chunk"),
])
def test_stream_failures_become_outcomes(handler, error_start):
    o = stream(handler).outcome
    assert not o.is_success and o.error.startswith(error_start)


def test_stream_connection_errors_become_outcomes():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    def time_out(request):
        raise httpx.ReadTimeout("slow", request=request)

    assert stream(refuse).outcome.error.startswith("ConnectError")
    assert stream(time_out).outcome.error.startswith("timeout")


def test_agent_run_feeds_each_reply_into_the_next_turn():
    workload = build_workload("agent", QUICK, 0)
    result = run(lambda c: run_workload(c, workload, model="echo-model", options=OPTIONS), echo_server)
    assert result.summary.num_completed == workload.num_requests == 4
    by_turn = sorted((o.turn_index, o.num_prompt_tokens) for o in result.outcomes)
    assert by_turn == [(0, 20), (0, 20), (1, 40), (1, 40)]  # turn 1 added a reply and a tool result
    assert result.summary.cached_share == pytest.approx(0.5)


def test_a_failed_turn_ends_its_session_and_is_counted():
    def fail_second_turn(request):
        if len(json.loads(request.content)["messages"]) > 2:
            return httpx.Response(500, json={"error": {"message": "boom"}})
        return echo_server(request)

    result = run(lambda c: run_workload(c, build_workload("agent", QUICK, 0), model="m", options=OPTIONS),
                 fail_second_turn)
    assert (result.summary.num_completed, result.summary.num_failed) == (2, 2)
    assert "boom" in result.summary.first_errors[0]


def test_discover_model_and_unreachable_endpoints():
    assert run(discover_model, echo_server) == "echo-model"
    with pytest.raises(EndpointUnreachable, match="HTTP 401"):
        run(discover_model, lambda r: httpx.Response(401, json={"error": "no key"}))
    with pytest.raises(EndpointUnreachable, match="cannot reach http://127.0.0.1:1/v1/models"):
        asyncio.run(run_workloads("http://127.0.0.1:1", [], OPTIONS))


def test_report_marks_servers_that_do_not_report_cached_tokens():
    def no_cache_info(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return sse(delta("a"), delta("b"), usage(10, 2))

    workload = build_workload("random", QUICK, 0)
    result = run(lambda c: run_workload(c, workload, model="m", options=OPTIONS), no_cache_info)
    ours = run(lambda c: run_workload(c, build_workload("random", QUICK, 0), model="m", options=OPTIONS), echo_server)
    report = markdown_report("t", [ServerRun("ours", "m", (ours,)), ServerRun("peer", "m", (result,))], "ours", [])
    assert "| random | peer | 3 / 0 |" in report and "not reported" in report
    assert "| random | peer |" in report.split("Ratios")[1]


def test_local_server_that_exits_is_a_clear_error(tmp_path):
    with pytest.raises(ServerStartError, match="(?s)exited with status 3.*no such model"):
        with local_server(lambda port: [sys.executable, "-c", "print('no such model'); raise SystemExit(3)"],
                          name="fake", log_path=tmp_path / "fake.log"):
            pass
