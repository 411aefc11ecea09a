"""Turn one step's logits into next tokens, one row per request.

Order (as vLLM): logits processors -> logit_bias -> penalties (repetition,
frequency, presence) -> greedy rows take the argmax; sampled rows go on:
temperature -> top_k -> top_p -> min_p -> draw. Everything after the
processors is batched over rows with per-row parameter tensors.

Drawing is inverse-CDF: one uniform per row (from the row's own generator
when it has a seed), searched in the row's cumulative probabilities. It is
exact multinomial sampling like ``torch.multinomial`` or the exponential race,
but needs one random number per row instead of V: on a 2-core CPU, V
exponentials per row cost ~1 ms, the cumsum ~30 us. A seeded row's token
depends only on its own logits and its generator, never on the other rows.

Logprobs are those of the RAW model logits (log_softmax before processors,
bias, penalties, temperature and filtering), as vLLM returns by default: they
say what the model thought, not what the sampling rules allowed.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

import torch
from torch import Tensor

from engine.sampling_params import SamplingParams

# Top-p first looks for the nucleus in each row's largest K probabilities and
# widens K only for the rows whose nucleus is larger; a full sort of a
# 49152-wide row costs ~100x a top-64.
_TOP_P_SEARCH_WIDTHS = (64, 1024)


@dataclass
class SamplingState:
    """One request's sampling inputs, owned by the engine's request object."""
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]          # the engine appends each generated token
    generator: torch.Generator | None    # seeded from params.seed on the logits' device
    # (V,) bool: which tokens the prompt holds; built on first use by the repetition penalty
    prompt_token_mask: Tensor | None = field(default=None, init=False, repr=False)


def make_sampling_state(params: SamplingParams, prompt_token_ids: Sequence[int],
                        device: torch.device | str) -> SamplingState:
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(params.seed)
    return SamplingState(params, list(prompt_token_ids), [], generator)


class SampleOutput(NamedTuple):
    token_ids: list[int]                          # one per row
    # chosen token's logprob per row (NaN for rows that did not ask); None if no row asked
    logprobs: list[float] | None
    # per row, top-k (id, logprob) sorted by logprob descending; [] for rows that did not ask
    top_logprobs: list[list[tuple[int, float]]] | None


class Sampler:
    """Stateless; all per-request state lives in SamplingState."""

    def __call__(self, logits: Tensor, states: Sequence[SamplingState]) -> SampleOutput:
        """logits (B, V), any float dtype; row b belongs to states[b]."""
        num_rows, vocab_size = logits.shape
        if len(states) != num_rows:
            raise ValueError(f"{num_rows} logit rows but {len(states)} sampling states")
        params = [s.params for s in states]
        needs_processing = any(p.logits_processors or p.logit_bias or p.has_penalties
                               for p in params)
        if not needs_processing and all(p.is_greedy for p in params):
            token_ids = logits.argmax(dim=-1)                     # (B,)
        else:
            # copy only when rows are modified in place
            x = logits.to(torch.float32, copy=needs_processing)  # (B, V)
            apply_logits_processors(x, states)
            apply_logit_bias(x, params)
            apply_penalties(x, states)
            token_ids = _choose_tokens(x, states)
        logprobs, top_logprobs = compute_logprobs(logits, token_ids, params)
        return SampleOutput(token_ids.tolist(), logprobs, top_logprobs)


def apply_logits_processors(x: Tensor, states: Sequence[SamplingState]) -> None:
    """x (B, V) float32, modified in place; one Python call per processor per row."""
    for row, state in enumerate(states):
        for processor in state.params.logits_processors:
            x[row] = processor(state.output_token_ids, x[row])


def apply_logit_bias(x: Tensor, params: Sequence[SamplingParams]) -> None:
    """x (B, V) float32 += each row's logit_bias, in place."""
    rows, token_ids, biases = [], [], []
    for row, p in enumerate(params):
        if p.logit_bias:
            rows.extend([row] * len(p.logit_bias))
            token_ids.extend(p.logit_bias.keys())
            biases.extend(p.logit_bias.values())
    if rows:
        index = (torch.tensor(rows, device=x.device), torch.tensor(token_ids, device=x.device))
        x.index_put_(index, torch.tensor(biases, device=x.device), accumulate=True)


def apply_penalties(x: Tensor, states: Sequence[SamplingState]) -> None:
    """x (B, V) float32, penalised in place for the rows that ask.

    repetition (HF/vLLM): over prompt + generated tokens, positive logits are
    divided by the penalty, negative ones multiplied. frequency and presence
    (OpenAI): over generated tokens, logit -= frequency * count + presence * (count > 0).
    """
    rows = [row for row, s in enumerate(states) if s.params.has_penalties]
    if not rows:
        return
    device, vocab_size = x.device, x.shape[1]
    row_index = torch.tensor(rows, device=device)
    penalised = [states[row] for row in rows]
    logits = x[row_index]                                                  # (R, V)
    counts = _count_tokens([s.output_token_ids for s in penalised], vocab_size, device)  # (R, V)
    is_generated = counts > 0                                              # (R, V)
    repetition = [s.params.repetition_penalty for s in penalised]
    if any(r != 1.0 for r in repetition):
        repetition = torch.tensor(repetition, device=device).unsqueeze(1)  # (R, 1)
        prompt_masks = torch.stack([_prompt_token_mask(s, vocab_size, device) for s in penalised])
        is_seen = is_generated | prompt_masks                              # (R, V)
        scaled = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(is_seen, scaled, logits)
    frequency = torch.tensor([s.params.frequency_penalty for s in penalised], device=device)
    presence = torch.tensor([s.params.presence_penalty for s in penalised], device=device)
    logits -= frequency.unsqueeze(1) * counts + presence.unsqueeze(1) * is_generated
    x[row_index] = logits


def _count_tokens(token_lists: Sequence[list[int]], vocab_size: int,
                  device: torch.device) -> Tensor:
    """How often each token occurs in each list: (R, V) float32."""
    counts = torch.zeros(len(token_lists), vocab_size, device=device)
    lengths = [len(ids) for ids in token_lists]
    if sum(lengths) == 0:
        return counts
    token_ids = torch.tensor(list(chain.from_iterable(token_lists)))      # (N,)
    list_index = torch.repeat_interleave(torch.arange(len(token_lists)), torch.tensor(lengths))
    flat_index = (list_index * vocab_size + token_ids).to(device)          # (N,)
    counts.view(-1).index_add_(0, flat_index, torch.ones(flat_index.shape, device=device))
    return counts


def _prompt_token_mask(state: SamplingState, vocab_size: int, device: torch.device) -> Tensor:
    mask = state.prompt_token_mask
    if mask is None or mask.shape[0] != vocab_size or mask.device != device:
        mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)    # (V,)
        if state.prompt_token_ids:
            mask[torch.tensor(state.prompt_token_ids, device=device)] = True
        state.prompt_token_mask = mask
    return mask


def _choose_tokens(x: Tensor, states: Sequence[SamplingState]) -> Tensor:
    """x (B, V) processed float32 logits -> (B,) token ids: argmax or a draw per row."""
    sampled = [row for row, s in enumerate(states) if not s.params.is_greedy]
    if not sampled:
        return x.argmax(dim=-1)
    if len(sampled) == len(states):
        return _sample(x, states)
    token_ids = x.argmax(dim=-1)                                           # (B,)
    sampled_index = torch.tensor(sampled, device=x.device)
    token_ids[sampled_index] = _sample(x[sampled_index], [states[row] for row in sampled])
    return token_ids


def _sample(x: Tensor, states: Sequence[SamplingState]) -> Tensor:
    """x (R, V) processed logits of rows with temperature > 0 -> (R,) drawn token ids."""
    device, vocab_size = x.device, x.shape[1]
    params = [s.params for s in states]
    temperature = torch.tensor([p.temperature for p in params], device=device)
    x = x / temperature.unsqueeze(1)                                       # (R, V)
    if any(p.has_top_k for p in params):
        top_k = [p.top_k if p.has_top_k else vocab_size for p in params]
        _mask_outside_top_k(x, torch.tensor(top_k, device=device))
    probs = x.softmax(dim=-1)                                              # (R, V)
    if any(p.has_top_p for p in params):
        rows = [row for row, p in enumerate(params) if p.has_top_p]
        _zero_outside_top_p(probs, rows, [params[row].top_p for row in rows])
    if any(p.has_min_p for p in params):
        min_p = torch.tensor([p.min_p for p in params], device=device).unsqueeze(1)  # (R, 1)
        probs.masked_fill_(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    return _draw(probs, [s.generator for s in states])


def _mask_outside_top_k(x: Tensor, top_k: Tensor) -> None:
    """x (R, V) logits; set to -inf all but each row's top_k (R,) largest (ties kept)."""
    vocab_size = x.shape[1]
    is_limited = top_k < vocab_size                                        # (R,)
    k_max = int(top_k[is_limited].max()) if bool(is_limited.any()) else 0
    if k_max == 0:
        return
    top_values = x.topk(k_max, dim=-1).values                              # (R, k_max)
    kth_value = top_values.gather(1, (top_k.clamp(max=k_max) - 1).unsqueeze(1))  # (R, 1)
    kth_value = torch.where(is_limited.unsqueeze(1), kth_value, -math.inf)
    x.masked_fill_(x < kth_value, -math.inf)


def _zero_outside_top_p(probs: Tensor, rows: list[int], top_p: list[float]) -> None:
    """probs (R, V), zeroed in place outside each listed row's nucleus.

    A row keeps its most likely tokens up to and including the one that
    brings their mass to top_p (ties with that token are kept too). The search
    looks at the top-K probabilities with growing K; a row is settled once its
    nucleus ends inside the top K, so a full sort is needed only for flat rows.
    """
    device, vocab_size = probs.device, probs.shape[1]
    smallest_kept = torch.zeros(probs.shape[0], 1, device=device)          # (R, 1); 0 keeps all
    pending = torch.tensor(rows, device=device)                            # (r,)
    pending_top_p = torch.tensor(top_p, device=device)                     # (r,)
    for width in (*_TOP_P_SEARCH_WIDTHS, vocab_size):
        width = min(width, vocab_size)
        top_values = probs[pending].topk(width, dim=-1).values             # (r, width) descending
        mass_before = top_values.cumsum(dim=-1).roll(1, dims=-1)           # (r, width)
        mass_before[:, 0] = 0.0
        num_kept = (mass_before < pending_top_p.unsqueeze(1)).sum(dim=-1)  # (r,) >= 1
        smallest = top_values.gather(1, (num_kept - 1).unsqueeze(1))       # (r, 1)
        is_settled = (num_kept < width) | (top_values[:, -1] == 0) | (width == vocab_size)
        smallest_kept[pending[is_settled]] = smallest[is_settled]
        pending, pending_top_p = pending[~is_settled], pending_top_p[~is_settled]
        if pending.numel() == 0:
            break
    probs.masked_fill_(probs < smallest_kept, 0.0)


def _draw(probs: Tensor, generators: Sequence[torch.Generator | None]) -> Tensor:
    """probs (R, V), unnormalised, >= 0 -> (R,) one inverse-CDF draw per row."""
    device, vocab_size = probs.device, probs.shape[1]
    uniform = torch.rand(probs.shape[0], 1, device=device)                 # (R, 1), global RNG
    seeded = [row for row, g in enumerate(generators) if g is not None]
    if seeded:
        own = [torch.rand(1, generator=generators[row], device=device) for row in seeded]
        uniform[torch.tensor(seeded, device=device)] = torch.stack(own)
    cumulative = probs.cumsum(dim=-1)                                      # (R, V)
    total = cumulative[:, -1:]                                             # (R, 1)
    # strictly below the total, so the draw lands on a token of nonzero probability
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    token_ids = torch.searchsorted(cumulative, target, right=True)         # (R, 1)
    return token_ids.squeeze(1).clamp_(max=vocab_size - 1)  # clamp: rows with every token banned


def compute_logprobs(logits: Tensor, token_ids: Tensor, params: Sequence[SamplingParams]
                     ) -> tuple[list[float] | None, list[list[tuple[int, float]]] | None]:
    """Chosen-token logprob and top-k alternatives from the RAW logits (B, V)."""
    rows = [row for row, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return None, None
    row_index = torch.tensor(rows, device=logits.device)
    logprobs = logits[row_index].float().log_softmax(dim=-1)               # (R, V)
    chosen = logprobs.gather(1, token_ids[row_index].unsqueeze(1)).squeeze(1).tolist()
    k_max = max(params[row].logprobs for row in rows)
    top_values, top_ids = logprobs.topk(k_max, dim=-1)                     # (R, k_max) descending
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    chosen_by_row = [math.nan] * len(params)
    top_by_row: list[list[tuple[int, float]]] = [[] for _ in params]
    for i, row in enumerate(rows):
        k = params[row].logprobs
        chosen_by_row[row] = chosen[i]
        top_by_row[row] = list(zip(top_ids[i][:k], top_values[i][:k]))
    return chosen_by_row, top_by_row
