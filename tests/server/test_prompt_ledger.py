"""Where two prompts diverge, and the bounded ledger of recent prompts."""

from server.prompt_ledger import Divergence, PromptLedger, divergence


def test_divergence_of_two_token_sequences():
    assert divergence([1, 2, 3], [1, 2, 3, 4]) is None  # the earlier prompt is a prefix: all reusable
    assert divergence([1, 2, 3, 4], [1, 2, 9, 4]) == Divergence(position=2, num_missed_tokens=2)
    assert divergence([1, 2, 3], [1, 2]) == Divergence(position=2, num_missed_tokens=1)
    assert divergence([5], []) == Divergence(0, 1)


def test_the_ledger_is_scoped_by_owner_and_bounded_by_tokens():
    ledger = PromptLedger(max_tokens=5)
    ledger.record("a", "key/", [1, 2, 3], {})
    assert ledger.lookup("a", "other/") is None and ledger.lookup("a", "key/").token_ids.tolist() == [1, 2, 3]
    ledger.record("b", "key/", [4, 5, 6], {})
    assert ledger.lookup("a", "key/") is None and ledger.num_tokens == 3
