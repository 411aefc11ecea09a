"""DRY: the tokens that would lengthen a verbatim repeat of the output lose logit, growing with its length;
against a brute-force reference, batched rows alike alone, and rows without it untouched (greedy unchanged)."""

import pytest
import torch

from engine.dry_penalty import repeat_lengths
from engine.errors import RequestError
from engine.sampler import Sampler, apply_penalties, make_sampling_state
from engine.sampling_params import SamplingParams

sample = Sampler()


def reference_repeat_lengths(output: list[int], allowed_length: int) -> dict[int, int]:
    """For each earlier position i, how many tokens ending at i equal the output's last ones; output[i + 1]
    would lengthen that repeat."""
    longest = {}
    for i in range(len(output) - 1):
        length = 0
        while length <= i and output[i - length] == output[len(output) - 1 - length]:
            length += 1
        if length >= allowed_length:
            longest[output[i + 1]] = max(longest.get(output[i + 1], 0), length)
    return longest


@pytest.mark.parametrize("allowed_length", [1, 2, 3])
def test_repeat_lengths_match_a_brute_force_reference(allowed_length):
    generator = torch.Generator().manual_seed(3)
    for num_tokens in (0, 1, 2, 5, 40, 200):
        for vocab_size in (2, 3, 8):  # small vocabularies: many repeats
            output = torch.randint(vocab_size, (num_tokens,), generator=generator).tolist()
            assert repeat_lengths(output, allowed_length) == reference_repeat_lengths(output, allowed_length)
    loop = [7, 8, 9, 10] * 5 + [7, 8]
    assert repeat_lengths(loop, 2) == {9: 18}


def test_the_penalty_grows_with_the_repeat_and_batched_rows_match_alone():
    vocab_size = 30
    logits = torch.randn(4, vocab_size, generator=torch.Generator().manual_seed(5))
    outputs = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 5, 6, 5], [], [1, 2, 3, 4, 1, 2, 3]]
    params = [SamplingParams(temperature=0, dry_multiplier=0.8), SamplingParams(temperature=0, dry_multiplier=2.0,
                                                                               dry_base=2.0, dry_allowed_length=1),
              SamplingParams(temperature=0, dry_multiplier=0.8), SamplingParams(temperature=0)]
    states = [make_sampling_state(p, [4, 4, 4], "cpu", list(out)) for p, out in zip(params, outputs)]
    batched = logits.clone()
    apply_penalties(batched, states)
    expected = logits.clone()
    expected[0, 4] -= 0.8 * 1.75 ** (3 - 2)  # "1 2 3" repeated: 4 would make it "1 2 3 4" again
    expected[1, 6] -= 2.0 * 2.0 ** (3 - 1)   # "5 6 5" again: 6 would make it "5 6 5 6" again
    assert torch.allclose(batched, expected), (batched - logits)
    for row, state in enumerate(states):  # each row alike alone
        alone = logits[row:row + 1].clone()
        apply_penalties(alone, [state])
        assert torch.equal(alone[0], batched[row])


def test_rows_without_dry_are_unchanged_and_a_loop_is_broken():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 2)
    loop = [1, 2, 3] * 3 + [1, 2]  # greedy would say 3 next (then 1, 2, 3, ...)
    plain = make_sampling_state(SamplingParams(temperature=0), [], "cpu", list(loop))
    dry = make_sampling_state(SamplingParams(temperature=0, dry_multiplier=0.8), [], "cpu", list(loop))
    assert sample(logits, [plain, dry]).token_ids == [3, 2]  # argmax for the plain row, not the loop for DRY
    assert sample(logits[:1], [plain]).token_ids == [3]      # greedy alone: the argmax fast path


@pytest.mark.parametrize("fields", [dict(dry_multiplier=-0.1), dict(dry_multiplier=11.0), dict(dry_base=1.0),
                                    dict(dry_base=float("nan")), dict(dry_allowed_length=0),
                                    dict(dry_allowed_length=2.0)])
def test_bad_dry_values_are_refused(fields):
    with pytest.raises(RequestError, match=next(iter(fields))):
        SamplingParams(**fields)
