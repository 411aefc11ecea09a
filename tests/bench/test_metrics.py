"""The metric arithmetic of bench/metrics.py on synthetic timings, with exact expected numbers."""

import pytest

from bench.metrics import RequestOutcome, Stats, median_ttft_by_turn_s, summarize


def outcome(ttft_s, e2e_s, num_output, *, num_prompt=100, num_cached=None, itl_s=(), turn=0, error=None):
    return RequestOutcome(session_index=0, turn_index=turn, num_prompt_tokens=num_prompt, num_output_tokens=num_output,
                          num_cached_tokens=num_cached, ttft_s=ttft_s, e2e_s=e2e_s, itl_s=tuple(itl_s), start_s=0.0,
                          error=error)


def failed(error="HTTP 500: boom"):
    return outcome(0.0, 0.0, 0, num_prompt=0, error=error)


def test_tpot_excludes_the_first_token_and_needs_two_tokens():
    assert outcome(0.1, 0.5, 5).tpot_s == pytest.approx(0.1)  # (0.5 - 0.1) / (5 - 1)
    assert outcome(0.3, 0.5, 3).tpot_s == pytest.approx(0.1)
    assert outcome(0.2, 0.2, 1).tpot_s is None


def test_percentiles_interpolate_linearly_as_numpy():
    stats = Stats.of_seconds([i / 1000 for i in range(101)])  # 0 .. 100 ms
    assert stats.mean_ms == pytest.approx(50.0)
    assert stats.median_ms == pytest.approx(50.0)
    assert stats.p99_ms == pytest.approx(99.0)
    three = Stats.of_seconds([0.1, 0.3, 0.2])
    assert three.median_ms == pytest.approx(200.0)
    assert three.p99_ms == pytest.approx(298.0)  # 200 + 0.98 * (300 - 200)


def test_no_samples_give_zeros_as_vllm():
    assert Stats.of_seconds([]) == Stats(0.0, 0.0, 0.0)


def test_summary_of_synthetic_run():
    outcomes = [
        outcome(0.1, 0.5, 5, num_prompt=100, num_cached=40, itl_s=[0.1] * 4),
        outcome(0.3, 0.5, 3, num_prompt=300, num_cached=0, itl_s=[0.1] * 2),
        outcome(0.2, 0.2, 1, num_prompt=200, num_cached=None),  # a server that does not report cached tokens
        failed(), failed(), failed("timeout: ReadTimeout"),
    ]
    s = summarize(outcomes, duration_s=2.0)
    assert (s.num_completed, s.num_failed) == (3, 3)
    assert (s.num_prompt_tokens, s.num_output_tokens) == (600, 9)
    assert s.request_throughput == pytest.approx(1.5)
    assert s.output_throughput == pytest.approx(4.5)
    assert s.total_token_throughput == pytest.approx(304.5)
    assert s.cached_share == pytest.approx(0.1)  # 40 / (100 + 300): only requests that reported it
    assert s.num_computed_prompt_tokens == 360  # (100 - 40) + (300 - 0), the same requests
    assert (s.ttft.mean_ms, s.ttft.median_ms) == pytest.approx((200.0, 200.0))
    assert s.ttft.p99_ms == pytest.approx(298.0)
    assert (s.tpot.mean_ms, s.tpot.median_ms, s.tpot.p99_ms) == pytest.approx((100.0, 100.0, 100.0))
    assert (s.itl.mean_ms, s.itl.p99_ms) == pytest.approx((100.0, 100.0))
    assert (s.e2e.mean_ms, s.e2e.median_ms, s.e2e.p99_ms) == pytest.approx((400.0, 500.0, 500.0))
    assert s.first_errors == ("HTTP 500: boom", "timeout: ReadTimeout")  # distinct, in order


def test_cached_share_is_none_when_no_server_reports_it():
    summary = summarize([outcome(0.1, 0.2, 2)], duration_s=1.0)
    assert summary.cached_share is None and summary.num_computed_prompt_tokens is None


def test_all_failed_is_a_valid_summary():
    s = summarize([failed()], duration_s=1.0)
    assert (s.num_completed, s.num_failed, s.output_throughput) == (0, 1, 0.0)
    assert s.ttft == Stats(0.0, 0.0, 0.0)


def test_duration_must_be_positive():
    with pytest.raises(ValueError):
        summarize([], duration_s=0.0)


def test_median_ttft_by_turn_skips_failures():
    outcomes = [outcome(0.4, 1, 2, turn=0), outcome(0.2, 1, 2, turn=0), outcome(0.1, 1, 2, turn=1),
                outcome(0.0, 0, 0, turn=1, error="x")]
    assert median_ttft_by_turn_s(outcomes) == pytest.approx({0: 0.3, 1: 0.1})
