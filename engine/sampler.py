"""Turn one step's logits into next tokens, one row per request.

Order (as vLLM): logits processors -> logit_bias -> penalties (repetition,
frequency, presence, then DRY: engine/dry_penalty.py) -> greedy rows take the argmax; sampled rows go on:
temperature -> top_k -> top_p -> min_p -> draw. All but the processors is
batched over rows with per-row parameter tensors.

Drawing is inverse-CDF: one uniform per row (from the row's own generator when
it has a seed), searched in the row's cumulative kept weights. That is exact
multinomial sampling, like torch.multinomial or the exponential race, with one
random number per row instead of V (V exponentials cost ~1 ms a row on a
2-core CPU). Rows with top_k / top_p draw from a short sorted candidate list
instead of masking all V logits. A seeded row's token depends only on its own
logits and its generator, never on the other rows of the batch.

Logprobs are those of the RAW model logits (log_softmax before processors,
bias, penalties, temperature and filtering), as vLLM returns by default: they
say what the model thought, not what the sampling rules allowed.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from engine.dry_penalty import apply_dry_penalty
from engine.sampling_params import SamplingParams

# Top-k / top-p rows look for their kept tokens among their W largest weights,
# W growing until it holds them; a full sort of a 49152-wide row costs ~30x a
# top-64 on CPU, so only flat rows pay for it.
_CANDIDATE_WIDTHS = (64, 1024)


@dataclass
class SamplingState:
    """One request's sampling inputs, owned by the engine's request object."""
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]          # the request's own list (engine/request.py), read here, never written
    generator: torch.Generator | None    # seeded from params.seed on the logits' device
    # penalty caches, built on first use: the prompt's distinct ids, and output_token_ids
    # as a tensor extended by the new ids each step (rebuilt if the list ever shrinks)
    prompt_ids_distinct: Tensor | None = field(default=None, init=False, repr=False)
    output_ids_tensor: Tensor | None = field(default=None, init=False, repr=False)


def make_sampling_state(params: SamplingParams, prompt_token_ids: Sequence[int],
                        device: torch.device | str, output_token_ids: list[int] | None = None) -> SamplingState:
    """`output_token_ids`: the list the request appends its tokens to (a new one when None)."""
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(params.seed)
    return SamplingState(params, list(prompt_token_ids), [] if output_token_ids is None else output_token_ids,
                         generator)


class SampleOutput(NamedTuple):
    token_ids: list[int]                          # one per row
    # chosen token's logprob per row (NaN for rows that did not ask); None if no row asked
    logprobs: list[float] | None
    # per row, top-k (id, logprob) sorted by logprob descending; [] for rows that did not ask
    top_logprobs: list[list[tuple[int, float]]] | None


class Sampler:
    """Stateless: all per-request state lives in SamplingState."""

    def __call__(self, logits: Tensor, states: Sequence[SamplingState]) -> SampleOutput:
        """logits (B, V), any float dtype; row b belongs to states[b]. logits are not modified."""
        num_rows, vocab_size = logits.shape
        if len(states) != num_rows:
            raise ValueError(f"{num_rows} logit rows but {len(states)} sampling states")
        params = [s.params for s in states]
        if all(is_plain_greedy(p) for p in params):
            token_ids = logits.max(dim=-1).indices   # (B,); first max, like argmax but faster
        else:
            x = logits.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
            apply_logits_processors(x, states)       # x (B, V) float32, ours to overwrite
            apply_logit_bias(x, params)
            apply_penalties(x, states)
            token_ids = _choose_tokens(x, states)
        logprobs, top_logprobs = compute_logprobs(logits, token_ids, params)
        return SampleOutput(token_ids.tolist(), logprobs, top_logprobs)


def is_plain_greedy(params: SamplingParams) -> bool:
    """Whether a row of these params is its logits' argmax alone (no processors, bias or penalties)."""
    return params.is_greedy and not (params.logits_processors or params.logit_bias or params.has_penalties)


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
    """x (B, V) contiguous float32, penalised in place for the rows that ask.

    repetition (HF/vLLM), over prompt + generated tokens: positive logits are
    divided by the penalty, negative ones multiplied. Then presence and
    frequency (OpenAI), over generated tokens: logit -= presence * (count > 0)
    + frequency * count. Then DRY over generated tokens (engine/dry_penalty.py).
    Only those logits are touched: O(tokens), not O(B * V).
    """
    flat_logits = x.view(-1)                                                # (B * V,)
    for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0),
                          ("frequency_penalty", 0.0)):
        rows = [row for row, s in enumerate(states) if getattr(s.params, name) != neutral]
        if not rows:
            continue
        index, penalty = _penalty_index(states, rows, name, x.shape[1], x.device)  # (N,), (N,)
        if name == "repetition_penalty":
            seen = flat_logits[index]          # duplicates read and write the same value
            flat_logits[index] = torch.where(seen > 0, seen / penalty, seen * penalty)
        elif name == "presence_penalty":
            flat_logits[index] = flat_logits[index] - penalty   # once per distinct token
        else:
            flat_logits.index_add_(0, index, -penalty)          # once per occurrence
    dry_rows = [row for row, s in enumerate(states) if s.params.dry_multiplier != 0.0]
    if dry_rows:
        dry = [states[row].params for row in dry_rows]
        apply_dry_penalty(x, dry_rows, [states[row].output_token_ids for row in dry_rows],
                          [p.dry_multiplier for p in dry], [p.dry_base for p in dry],
                          [p.dry_allowed_length for p in dry])


def _penalty_index(states: Sequence[SamplingState], rows: list[int], name: str,
                   vocab_size: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The rows' penalised tokens -> (N,) indices into the flattened (B * V) logits and
    (N,) the row's penalty for each; repetition covers the prompt too."""
    ids = [_output_ids(states[row], device) for row in rows]
    if name == "repetition_penalty":
        ids = [torch.cat((_prompt_ids_distinct(states[row], device), out))
               for row, out in zip(rows, ids)]
    lengths = torch.tensor([t.numel() for t in ids], device=device)        # (R,)
    penalties = torch.tensor([getattr(states[row].params, name) for row in rows], device=device)
    row_offsets = torch.tensor(rows, device=device) * vocab_size            # (R,)
    index = torch.cat(ids) + row_offsets.repeat_interleave(lengths)
    return index, penalties.repeat_interleave(lengths)


def _prompt_ids_distinct(state: SamplingState, device: torch.device) -> Tensor:
    ids = state.prompt_ids_distinct
    if ids is None or ids.device != device:
        ids = torch.tensor(sorted(set(state.prompt_token_ids)), dtype=torch.long, device=device)
        state.prompt_ids_distinct = ids
    return ids


def _output_ids(state: SamplingState, device: torch.device) -> Tensor:
    """state.output_token_ids as a (n,) long tensor, extended incrementally."""
    ids, token_ids = state.output_ids_tensor, state.output_token_ids
    if ids is None or ids.device != device or ids.numel() > len(token_ids):
        ids = torch.tensor(token_ids, dtype=torch.long, device=device)
    elif ids.numel() < len(token_ids):
        new_ids = torch.tensor(token_ids[ids.numel():], dtype=torch.long, device=device)
        ids = torch.cat((ids, new_ids))
    state.output_ids_tensor = ids
    return ids


def _choose_tokens(x: Tensor, states: Sequence[SamplingState]) -> Tensor:
    """x (B, V) processed float32 logits, overwritten -> (B,) argmax or drawn ids."""
    sampled = [row for row, s in enumerate(states) if not s.params.is_greedy]
    if len(sampled) == len(states):
        return sample_rows(x, states)
    token_ids = x.max(dim=-1).indices                                         # (B,)
    if sampled:
        index = torch.tensor(sampled, device=x.device)
        token_ids[index] = sample_rows(x[index], [states[row] for row in sampled])
    return token_ids


def sample_rows(x: Tensor, states: Sequence[SamplingState]) -> Tensor:
    """x (R, V) processed logits of rows with temperature > 0, overwritten -> (R,) drawn ids."""
    device = x.device
    params = [s.params for s in states]
    if any(p.temperature != 1.0 for p in params):
        x.div_(torch.tensor([p.temperature for p in params], device=device).unsqueeze(1))
    # (R, V) unnormalised probabilities; each row's max is exactly 1
    weights = x.sub_(x.amax(dim=-1, keepdim=True)).exp_()
    uniform = _uniforms([s.generator for s in states], device)               # (R,)
    is_filtered = [p.has_top_p or 0 < p.top_k < x.shape[1] for p in params]
    if not any(is_filtered):
        return _draw_unfiltered(weights, uniform, params)
    if all(is_filtered):
        return _draw_from_top(weights, uniform, params)
    token_ids = torch.empty(len(params), dtype=torch.long, device=device)
    for want, draw in ((True, _draw_from_top), (False, _draw_unfiltered)):
        rows = [row for row, f in enumerate(is_filtered) if f == want]
        index = torch.tensor(rows, device=device)
        token_ids[index] = draw(weights[index], uniform[index], [params[r] for r in rows])
    return token_ids


def _uniforms(generators: Sequence[torch.Generator | None], device: torch.device) -> Tensor:
    """(R,) one U[0, 1) per row: from the row's own generator if seeded, else the global RNG."""
    uniform = torch.rand(len(generators), device=device)
    seeded = [row for row, g in enumerate(generators) if g is not None]
    if seeded:
        own = [torch.rand(1, generator=generators[row], device=device) for row in seeded]
        uniform[torch.tensor(seeded, device=device)] = torch.cat(own)
    return uniform


def _draw_unfiltered(weights: Tensor, uniform: Tensor, params: Sequence[SamplingParams]
                     ) -> Tensor:
    """weights (R, V) >= 0 with row max 1 (min_p applies, top_k / top_p do not) -> (R,) ids."""
    if any(p.has_min_p for p in params):
        min_p = torch.tensor([p.min_p for p in params], device=weights.device).unsqueeze(1)
        weights.mul_(weights >= min_p)     # keep >= min_p * max (max is 1); 2x masked_fill_
    cumulative = _cumsum(weights)                                             # (R, V)
    position = _search(cumulative, cumulative[:, -1], uniform)
    return position.clamp_(max=weights.shape[1] - 1)      # clamp: rows with every token banned


def _draw_from_top(weights: Tensor, uniform: Tensor, params: Sequence[SamplingParams]
                   ) -> Tensor:
    """weights (R, V) >= 0 with row max 1, rows with top_k and/or top_p -> (R,) ids.

    A row keeps a prefix of its tokens ordered by (weight desc, id asc): at
    most top_k; up to the one that brings the mass before it to top_p of the
    top-k mass; none below min_p. The prefix is looked for among the W largest
    weights; a row is settled once its prefix ends strictly above the W-th
    weight, so ties at the list's edge never decide, and the result depends
    neither on W nor on the other rows.
    """
    device, (num_rows, vocab_size) = weights.device, weights.shape
    top_k = torch.tensor([p.top_k if p.has_top_k else vocab_size for p in params],
                         device=device).clamp_(max=vocab_size)                 # (R,)
    top_p = torch.tensor([p.top_p for p in params], device=device)            # (R,)
    min_p = torch.tensor([p.min_p for p in params], device=device)            # (R,)
    # (R,) each row's mass, for top_p without top_k. Not weights.sum(): a reduction's order
    # (and so its rounding) changes with the number of rows; a row's cumsum does not.
    total = (_cumsum(weights)[:, -1] if any(p.has_top_p for p in params)
             else torch.ones(num_rows, device=device))
    # the first width holds every top_k (+1: a row settles only above the list's edge)
    first_width = min(vocab_size, max([_CANDIDATE_WIDTHS[0]] + [
        p.top_k + 1 for p in params if 0 < p.top_k < vocab_size]))
    widths = [first_width] + [w for w in (*_CANDIDATE_WIDTHS[1:], vocab_size)
                              if first_width < w <= vocab_size]
    token_ids = torch.empty(num_rows, dtype=torch.long, device=device)
    pending = torch.arange(num_rows, device=device)                           # (r,)
    for width in widths:
        values, ids = _largest(weights if len(pending) == num_rows else weights[pending], width)
        k, p, u = top_k[pending], top_p[pending], uniform[pending]
        cumulative = _cumsum(values)                                          # (r, W)
        mass_before = torch.nn.functional.pad(cumulative[:, :-1], (1, 0))    # (r, W)
        kept_k = k.clamp(max=width)
        top_k_mass = torch.where((k <= width) & (k < vocab_size),   # no top_k: the total
                                 cumulative.gather(1, (kept_k - 1).unsqueeze(1)).squeeze(1),
                                 total[pending])
        kept_p = (mass_before < (p * top_k_mass).unsqueeze(1)).sum(dim=-1)
        kept_min_p = (values >= min_p[pending].unsqueeze(1)).sum(dim=-1)
        num_kept = torch.minimum(kept_k, kept_min_p)
        num_kept = torch.where(p < 1.0, torch.minimum(num_kept, kept_p), num_kept).clamp_(min=1)
        last_kept = values.gather(1, (num_kept - 1).unsqueeze(1)).squeeze(1)  # (r,)
        edge = values[:, -1]                                                   # (r,)
        is_k_known = (k <= width) | (k == vocab_size)
        is_settled = (width == vocab_size) | (edge == 0) | ((last_kept > edge) & is_k_known)
        kept_mass = cumulative.gather(1, (num_kept - 1).unsqueeze(1)).squeeze(1)
        position = torch.minimum(_search(cumulative, kept_mass, u), num_kept - 1)
        drawn = ids.gather(1, position.unsqueeze(1)).squeeze(1)                # (r,)
        token_ids[pending[is_settled]] = drawn[is_settled]
        pending = pending[~is_settled]
        if pending.numel() == 0:
            break
    return token_ids


def _largest(weights: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """weights (r, V) -> the `width` largest (values, ids), (r, width), ordered by
    (value desc, id asc): ties come out in the same order whatever the batch."""
    if width == weights.shape[1]:
        return weights.sort(dim=-1, descending=True, stable=True)
    values, ids = weights.topk(width, dim=-1, sorted=False)
    by_id = ids.argsort(dim=-1)
    values, ids = values.gather(1, by_id), ids.gather(1, by_id)
    by_value = values.argsort(dim=-1, descending=True, stable=True)
    return values.gather(1, by_value), ids.gather(1, by_value)


def _cumsum(values: Tensor) -> Tensor:
    """Row-wise cumulative sum, rounded the same whatever the number of rows. CPU scans
    each row in sequence (in double); CUDA scans a lone row with another kernel than a
    batch, so there it runs in float64, where the two differ by ~1e-16 only."""
    return values.cumsum(dim=-1, dtype=torch.float64 if values.is_cuda else None)


def _search(cumulative: Tensor, mass: Tensor, uniform: Tensor) -> Tensor:
    """cumulative (R, W) nondecreasing, mass (R,), uniform (R,) -> (R,) first position whose
    cumulative exceeds uniform * mass: a position of nonzero weight, drawn by weight."""
    # strictly below the mass, so the draw lands on a token of nonzero weight
    target = torch.minimum(uniform * mass, torch.nextafter(mass, torch.zeros_like(mass)))
    return torch.searchsorted(cumulative, target.unsqueeze(1), right=True).squeeze(1)


def compute_logprobs(logits: Tensor, token_ids: Tensor, params: Sequence[SamplingParams]
                     ) -> tuple[list[float] | None, list[list[tuple[int, float]]] | None]:
    """Chosen-token logprob and top-k alternatives from the RAW logits (B, V)."""
    rows = [row for row, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return None, None
    row_index = torch.tensor(rows, device=logits.device)
    raw = logits if len(rows) == len(params) else logits[row_index]
    logprobs = raw.float().log_softmax(dim=-1)                             # (R, V)
    chosen = logprobs.gather(1, token_ids[row_index].unsqueeze(1)).squeeze(1).tolist()
    k_max = max(params[row].logprobs for row in rows)
    top_values, top_ids = logprobs.topk(k_max, dim=-1)                     # (R, k_max) descending
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    chosen_by_row, top_by_row = [math.nan] * len(params), [[] for _ in params]
    for i, row in enumerate(rows):
        k = params[row].logprobs
        chosen_by_row[row] = chosen[i]
        top_by_row[row] = list(zip(top_ids[i][:k], top_values[i][:k]))
    return chosen_by_row, top_by_row
