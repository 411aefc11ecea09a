import math

import pytest
import torch

from engine.sampler import Sampler, _draw_from_top, apply_penalties, make_sampling_state
from engine.sampling_params import SamplingParams

sample = Sampler()


def states_for(num_rows, prompt=(), **params):
    shared = SamplingParams(**params)
    return [make_sampling_state(shared, list(prompt), "cpu") for _ in range(num_rows)]


def seeded_states(num_rows, **params):
    return [make_sampling_state(SamplingParams(seed=seed, **params), [], "cpu")
            for seed in range(num_rows)]


def repeat_row(logits_row, num_rows):
    return logits_row.unsqueeze(0).expand(num_rows, -1).contiguous()


def chi_square(token_ids, probs):
    """Pearson statistic of the draws against the expected probs (zeros skipped)."""
    observed = torch.bincount(torch.tensor(token_ids), minlength=probs.numel()).double()
    expected = probs.double() * len(token_ids)
    keep = expected > 0
    assert observed[~keep].sum() == 0, "drew a token of zero probability"
    return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())


# chi-square 99.99% quantiles, for a test that fails by chance ~1 in 10^4 seeds
CHI2_LIMIT = {3: 21.1, 4: 23.5, 7: 29.9}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_is_argmax(dtype):
    logits = torch.randn(7, 300, generator=torch.Generator().manual_seed(0)).to(dtype)
    out = sample(logits, states_for(7, temperature=0))
    assert out.token_ids == logits.float().argmax(-1).tolist()
    assert out.logprobs is None and out.top_logprobs is None


def test_greedy_rows_in_a_mixed_batch_are_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    states = [make_sampling_state(SamplingParams(temperature=0 if row % 2 else 1.0), [], "cpu")
              for row in range(6)]
    out = sample(logits, states)
    assert out.token_ids[1::2] == logits[1::2].argmax(-1).tolist()


def test_greedy_ties_take_the_first_max():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    assert sample(logits, states_for(2, temperature=0)).token_ids == [1, 0]
    states = states_for(2, temperature=0, logit_bias={3: -1.0})   # the processed path
    assert sample(logits, states).token_ids == [1, 0]


def test_top_k_at_least_the_vocabulary_is_no_filter():
    torch.manual_seed(5)
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5])
    out = sample(repeat_row(logits, 40_000), states_for(40_000, top_k=5, top_p=0.999999))
    assert chi_square(out.token_ids, logits.softmax(-1)) < CHI2_LIMIT[4]


def test_empty_batch():
    assert sample(torch.zeros(0, 10), []).token_ids == []


@pytest.mark.parametrize("temperature", [1e-6, 1e-3, 0.005])
def test_temperature_towards_zero_becomes_greedy(temperature):
    logits = torch.tensor([0.0, 2.0, 1.9, -1.0])
    out = sample(repeat_row(logits, 500), seeded_states(500, temperature=temperature))
    assert set(out.token_ids) == {1}


@pytest.mark.parametrize("params", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)])
def test_filters_that_keep_one_token_equal_greedy(params):
    logits = torch.randn(300, 1000, generator=torch.Generator().manual_seed(2))
    out = sample(logits, seeded_states(300, temperature=1.5, **params))
    assert out.token_ids == logits.argmax(-1).tolist()


def test_temperature_one_matches_softmax():
    torch.manual_seed(0)
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5, -3.0, 1.5, 0.2])
    out = sample(repeat_row(logits, 40_000), states_for(40_000))
    assert chi_square(out.token_ids, logits.softmax(-1)) < CHI2_LIMIT[7]


def test_temperature_scales_logits():
    torch.manual_seed(1)
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5])
    out = sample(repeat_row(logits, 40_000), states_for(40_000, temperature=0.5))
    assert chi_square(out.token_ids, (logits / 0.5).softmax(-1)) < CHI2_LIMIT[4]


def test_top_k_renormalises_over_the_k_largest():
    torch.manual_seed(2)
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5, -3.0, 1.5, 0.2])
    out = sample(repeat_row(logits, 40_000), states_for(40_000, top_k=4))
    expected = torch.where(logits >= 0.5, logits, -math.inf).softmax(-1)   # 2.0, 1.5, 1.0, 0.5
    assert chi_square(out.token_ids, expected) < CHI2_LIMIT[3]


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    torch.manual_seed(3)
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    # sorted: 0.4, 0.3, 0.15 (mass before 0.7 < 0.8, kept), 0.1 (mass before 0.85, dropped)
    out = sample(repeat_row(probs.log(), 40_000), states_for(40_000, top_p=0.8))
    expected = torch.tensor([0.0, 0.4, 0.0, 0.3, 0.15]) / 0.85
    assert chi_square(out.token_ids, expected) < CHI2_LIMIT[3]


def test_min_p_drops_tokens_below_the_fraction_of_the_top():
    torch.manual_seed(4)
    probs = torch.tensor([0.5, 0.2, 0.14, 0.1, 0.06])
    out = sample(repeat_row(probs.log(), 40_000), states_for(40_000, min_p=0.25))
    # threshold 0.25 * 0.5 = 0.125: keeps 0.5, 0.2, 0.14
    expected = torch.tensor([0.5, 0.2, 0.14, 0.0, 0.0]) / 0.84
    assert chi_square(out.token_ids, expected) < CHI2_LIMIT[3]


def reference_draw(weights, uniform, params):
    """The kept prefix and inverse-CDF draw of _draw_from_top, over a full stable sort."""
    values, ids = weights.sort(descending=True, stable=True)
    cumulative = values.cumsum(0)
    k = params.top_k if 0 < params.top_k < weights.numel() else weights.numel()
    top_k_mass = cumulative[k - 1] if k < weights.numel() else weights.cumsum(0)[-1]
    mass_before = cumulative - values
    num_kept = min(k, int((values >= params.min_p).sum()))
    if params.top_p < 1:
        num_kept = min(num_kept, int((mass_before < params.top_p * top_k_mass).sum()))
    mass = cumulative[num_kept - 1]
    target = min(uniform * mass, torch.nextafter(mass, torch.tensor(0.0)))
    return int(ids[min(int(torch.searchsorted(cumulative, target, right=True)), num_kept - 1)])


@pytest.mark.parametrize("scale", [0.0, 0.3, 1.0, 4.0])
@pytest.mark.parametrize("filters", [dict(top_p=0.3), dict(top_p=0.9), dict(top_p=0.999),
                                     dict(top_k=5), dict(top_k=64), dict(top_k=300),
                                     dict(top_k=40, top_p=0.8, min_p=0.01)])
def test_top_k_top_p_draw_matches_a_full_sort(scale, filters):
    g = torch.Generator().manual_seed(int(scale * 10) + len(str(filters)))
    logits = torch.randn(6, 3000, generator=g) * scale
    logits = (logits * 4).round() / 4               # coarse, like bf16: many ties
    weights = (logits - logits.amax(-1, keepdim=True)).exp()
    params = SamplingParams(**filters)
    for uniform in torch.linspace(0, 0.999, 40).tolist():
        drawn = _draw_from_top(weights.clone(), torch.full((6,), uniform), [params] * 6)
        expected = [reference_draw(weights[row], uniform, params) for row in range(6)]
        assert drawn.tolist() == expected


def test_same_seed_gives_same_tokens():
    logits = torch.randn(20, 1000, generator=torch.Generator().manual_seed(5))
    runs = []
    for _ in range(2):
        state = make_sampling_state(SamplingParams(seed=1234, top_p=0.9), [], "cpu")
        runs.append([sample(row.unsqueeze(0), [state]).token_ids[0] for row in logits])
    assert runs[0] == runs[1]
    other = make_sampling_state(SamplingParams(seed=4321, top_p=0.9), [], "cpu")
    assert [sample(row.unsqueeze(0), [other]).token_ids[0] for row in logits] != runs[0]


@pytest.mark.parametrize("params", [dict(top_k=200, top_p=0.95, min_p=0.01), dict(top_p=0.9),
                                    dict(temperature=0.7), dict(min_p=0.05, temperature=1.3)])
def test_seeded_row_is_the_same_alone_or_batched(params):
    g = torch.Generator().manual_seed(6)
    steps, vocab_size, params = 12, 5000, dict(seed=77, **params)
    row_logits = (torch.randn(steps, vocab_size, generator=g) * 8).round() / 4   # with ties
    alone = make_sampling_state(SamplingParams(**params), [], "cpu")
    batched = make_sampling_state(SamplingParams(**params), [], "cpu")
    neighbours = [SamplingParams(), SamplingParams(temperature=0), SamplingParams(seed=5),
                  SamplingParams(top_p=0.5, top_k=10, frequency_penalty=1.0),
                  SamplingParams(logprobs=3, temperature=0.3)]
    neighbour_states = [make_sampling_state(p, [1, 2], "cpu") for p in neighbours]
    for step in range(steps):
        token_alone = sample(row_logits[step:step + 1], [alone]).token_ids[0]
        batch = torch.randn(len(neighbours) + 1, vocab_size, generator=g) * 3
        position = step % (len(neighbours) + 1)
        batch[position] = row_logits[step]
        states = neighbour_states[:position] + [batched] + neighbour_states[position:]
        token_batched = sample(batch, states).token_ids[position]
        assert token_alone == token_batched
        alone.output_token_ids.append(token_alone)
        batched.output_token_ids.append(token_batched)


def reference_penalties(logits, prompt, output, params):
    logits = logits.clone()
    for token in set(prompt) | set(output):
        if logits[token] > 0:
            logits[token] /= params.repetition_penalty
        else:
            logits[token] *= params.repetition_penalty
    for token in set(output):
        logits[token] -= params.frequency_penalty * output.count(token)
        logits[token] -= params.presence_penalty
    return logits


def test_penalties_match_a_per_row_reference():
    g = torch.Generator().manual_seed(7)
    vocab_size, states = 60, []
    for row in range(12):
        params = SamplingParams(
            repetition_penalty=[1.0, 1.3, 0.7][row % 3],
            frequency_penalty=[0.0, 0.5, -1.2, 2.0][row % 4],
            presence_penalty=[0.0, 1.5, -0.4][row % 3 - 1])
        prompt = torch.randint(vocab_size, (row * 3,), generator=g).tolist()
        state = make_sampling_state(params, prompt, "cpu")
        state.output_token_ids += torch.randint(vocab_size, (row * 5 % 17,), generator=g).tolist()
        states.append(state)
    logits = torch.randn(12, vocab_size, generator=g) * 4
    penalised = logits.clone()
    apply_penalties(penalised, states)
    for row, state in enumerate(states):
        expected = reference_penalties(logits[row], state.prompt_token_ids,
                                       state.output_token_ids, state.params)
        assert torch.allclose(penalised[row], expected, atol=1e-5), (row, state.params)


def test_penalties_follow_tokens_appended_between_steps():
    params = SamplingParams(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.3)
    state = make_sampling_state(params, [1, 1, 2], "cpu")
    logits = torch.randn(1, 10, generator=torch.Generator().manual_seed(11)) * 3
    for new_tokens in ([], [3], [3, 4], [], [2, 7, 7]):
        state.output_token_ids.extend(new_tokens)
        penalised = logits.clone()
        apply_penalties(penalised, [state])
        expected = reference_penalties(logits[0], state.prompt_token_ids,
                                       state.output_token_ids, params)
        assert torch.allclose(penalised[0], expected, atol=1e-5)


def test_caller_logits_are_not_modified():
    logits = torch.randn(3, 20)
    before = logits.clone()
    states = [make_sampling_state(p, [1], "cpu") for p in (
        SamplingParams(top_k=3, temperature=0.5), SamplingParams(repetition_penalty=2.0),
        SamplingParams(logit_bias={4: 10}, logits_processors=(lambda ids, x: x.mul_(2),)))]
    sample(logits, states)
    assert torch.equal(logits, before)


def test_penalties_steer_greedy_choice():
    logits = torch.tensor([[3.0, 2.9, 0.0], [3.0, 2.9, 0.0], [3.0, 2.9, 0.0]])
    states = [make_sampling_state(SamplingParams(temperature=0, **p), [0], "cpu") for p in
              (dict(), dict(repetition_penalty=1.2), dict(presence_penalty=0.5))]
    for state in states:
        state.output_token_ids.append(0)
    assert sample(logits, states).token_ids == [0, 1, 1]


def test_logit_bias_bans_and_forces():
    logits = torch.randn(400, 30, generator=torch.Generator().manual_seed(8))
    top = logits.argmax(-1)
    banned = sample(logits, [make_sampling_state(
        SamplingParams(temperature=0, logit_bias={int(t): -100}), [], "cpu") for t in top])
    assert all(token != int(t) for token, t in zip(banned.token_ids, top))
    forced = sample(logits, seeded_states(400, logit_bias={17: 100}))
    assert set(forced.token_ids) == {17}


def test_logits_processor_mask_forces_allowed_tokens():
    allowed = [3, 9, 21]
    seen_histories = []

    def grammar(token_ids, logits):
        seen_histories.append(list(token_ids))
        mask = torch.full_like(logits, -math.inf)
        mask[allowed] = 0.0
        return logits + mask

    states = seeded_states(300, logits_processors=(grammar,))
    for state in states:
        state.output_token_ids.append(5)
    out = sample(torch.randn(300, 40) * 5, states)
    assert set(out.token_ids) <= set(allowed) and len(set(out.token_ids)) == 3
    assert seen_histories == [[5]] * 300


def test_row_with_every_token_banned_still_returns_a_valid_id():
    states = states_for(2, logits_processors=(lambda ids, x: torch.full_like(x, -math.inf),))
    assert all(0 <= t < 10 for t in sample(torch.randn(2, 10), states).token_ids)


def test_logprobs_are_of_raw_logits_with_sorted_top_k():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(9))
    params = [SamplingParams(logprobs=5, temperature=0.5, presence_penalty=2.0,
                             logit_bias={0: 50}),
              SamplingParams(),
              SamplingParams(logprobs=0, temperature=0),
              SamplingParams(logprobs=20, top_k=3)]
    states = [make_sampling_state(p, [], "cpu") for p in params]
    out = sample(logits, states)
    expected = logits.log_softmax(-1)
    for row in (0, 2, 3):
        assert out.logprobs[row] == pytest.approx(float(expected[row, out.token_ids[row]]),
                                                  abs=1e-6)
    assert math.isnan(out.logprobs[1])
    assert [len(top) for top in out.top_logprobs] == [5, 0, 0, 20]
    for row in (0, 3):
        top = out.top_logprobs[row]
        values = [v for _, v in top]
        assert values == sorted(values, reverse=True)
        ids = [i for i, _ in top]
        assert ids == expected[row].topk(len(top)).indices.tolist()
        assert values == pytest.approx(expected[row, ids].tolist(), abs=1e-6)


def test_logprobs_on_the_greedy_fast_path_with_half_logits():
    logits = torch.randn(3, 64).to(torch.bfloat16)
    out = sample(logits, states_for(3, temperature=0, logprobs=2))
    expected = logits.float().log_softmax(-1)
    assert out.logprobs == pytest.approx(expected.max(-1).values.tolist(), abs=1e-6)


def test_make_sampling_state():
    state = make_sampling_state(SamplingParams(), (4, 5), "cpu")
    assert state.generator is None and state.prompt_token_ids == [4, 5]
    assert state.output_token_ids == []
    assert make_sampling_state(SamplingParams(seed=1), [], "cpu").generator is not None


def test_rejects_mismatched_batch():
    with pytest.raises(ValueError):
        sample(torch.zeros(2, 5), states_for(3))
