"""Rotary position embedding (RoPE), HF's "rotate_half" (GPT-NeoX) layout.

A head vector of size D is split into halves (x1, x2); pair i is (x1[i], x2[i]) rotated by
angle position * inv_freq[i]. The cos/sin tables hold each frequency twice, concatenated
(not interleaved), which is the layout HF Llama checkpoints are trained with. With partial
rotary dimensions (Phi-3/4's partial_rotary_factor) only the first R < D dimensions of a head
rotate, as halves of R; the rest pass unchanged (the tables are then (.., R) wide).
"""

import math

import torch
from torch import Tensor


ROPE_TYPES = ("default", "linear", "llama3", "freq_factors", "longrope")


def rope_inv_freq(rotary_dim: int, theta: float, scaling: dict | None, long_context: bool = False) -> Tensor:
    """Inverse frequencies, float32 (rotary_dim // 2,), for HF's `config.rope_scaling`.

    Rope types: default, linear, llama3, longrope (Phi-3's "su" is its old name: per-frequency
    `short_factor`, or `long_factor` when `long_context`), and freq_factors: inv_freq divided by
    an explicit per-frequency list `factors`, as llama.cpp applies a GGUF's `rope_freqs.weight`
    (the GGUF importer writes Llama-3 files' tensor so). "type" is accepted as an alias of
    "rope_type", as in older HF configs. The arithmetic mirrors transformers'
    modeling_rope_utils step for step so that tables agree to the last bit in float32.
    """
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    rope_type = rope_type_of(scaling)
    if rope_type == "longrope":
        factors = scaling["long_factor" if long_context else "short_factor"]
        ext_factors = _per_frequency("longrope factors", factors, rotary_dim)
        return 1.0 / (ext_factors * theta**exponents)
    inv_freq = 1.0 / (theta ** exponents)  # (R/2,)
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if rope_type == "freq_factors":
        return inv_freq / _per_frequency("freq_factors factors", scaling["factors"], rotary_dim)
    raise ValueError(f"unsupported rope type {rope_type!r} (supported: {', '.join(ROPE_TYPES)})")


def rope_attention_factor(scaling: dict | None) -> float:
    """What cos and sin are multiplied by: longrope's attention factor (sqrt(1 + ln(factor) /
    ln(original context))), 1 for every other type. `factor` must be in the dict (the model
    config puts max_position_embeddings / original_max_position_embeddings there)."""
    if rope_type_of(scaling) != "longrope":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = scaling["factor"]
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(scaling["original_max_position_embeddings"]))


def rope_type_of(scaling: dict | None) -> str:
    if not scaling:
        return "default"
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    return "longrope" if rope_type == "su" else rope_type


def _per_frequency(what: str, factors, rotary_dim: int) -> Tensor:
    factors = torch.tensor(factors, dtype=torch.float32)
    if factors.shape != (rotary_dim // 2,):
        raise ValueError(f"{what} must hold {rotary_dim // 2} numbers (one per frequency), got {tuple(factors.shape)}")
    return factors


def _llama3_inv_freq(inv_freq: Tensor, scaling: dict) -> Tensor:
    """Llama 3.1 scaling: long wavelengths slowed by `factor`, short ones kept, a smooth
    interpolation between the two bands."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rerotation_cos_sin(inv_freq: Tensor, delta: int, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """(1, 1, R) cos and sin (R = 2 * len(inv_freq), the rotary dimensions) that move a K already rotated at position p to position p + delta
    (delta may be negative): RoPE composes, R(p + delta) = R(delta) R(p). Angles are taken in
    float64 (delta * inv_freq) so the table adds no rounding of its own beyond float32's."""
    angles = delta * inv_freq.to(torch.float64)  # (D/2,)
    emb = torch.cat((angles, angles))  # (D,)
    return emb.cos().to(dtype)[None, None, :], emb.sin().to(dtype)[None, None, :]


def rerotate_k(k: Tensor, delta: int, inv_freq: Tensor) -> Tensor:
    """The reference: k (T, KVH, D), rotated for positions p..p+T-1 -> the same K at p + delta."""
    cos, sin = rerotation_cos_sin(inv_freq.to(k.device), delta, k.dtype)
    return _rotate(k, cos, sin)


# Rows of a CPU model's cos/sin tables before the first position past them (RotaryEmbedding).
LAZY_TABLE_POSITIONS = 4096


class RotaryEmbedding:
    """Precomputed cos/sin tables for positions [0, max_positions); applies RoPE to q and k.

    Tables are computed in float32 and stored in `dtype`. Rotation happens in the dtype of q/k
    with the tables cast to it, which is what HF does (it casts cos/sin to the activation
    dtype before multiplying), so bf16 models match HF exactly. `rotary_dim` (default: all of
    head_dim) is how many leading dimensions of a head rotate; `long_context` picks longrope's
    long factors (chosen once per loaded model, so every cached K was rotated alike).
    """

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict | None,
        device,
        dtype=torch.float32,
        rotary_dim: int | None = None,
        long_context: bool = False,
    ):
        self.head_dim = head_dim
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if not 0 < self.rotary_dim <= head_dim or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and in (0, {head_dim}], got {self.rotary_dim}")
        self.max_positions = max_positions
        inv_freq = rope_inv_freq(self.rotary_dim, theta, scaling, long_context).to(device)  # (R/2,)
        self.inv_freq = inv_freq  # float32 (R/2,): what re-rotating stored K by a position delta needs
        self._attention_factor = rope_attention_factor(scaling)
        self._dtype = dtype
        # On the CPU the tables start at LAZY_TABLE_POSITIONS rows and double when a later position
        # needs it (131072 positions of a 64-dim head are 64 MiB of cos and sin a model mostly never
        # reads); elsewhere they are whole from the start (checking positions would sync the device).
        lazy = torch.device(device).type == "cpu"
        self._build(min(max_positions, LAZY_TABLE_POSITIONS) if lazy else max_positions)

    def _build(self, num_positions: int) -> None:
        """cos and sin of positions [0, num_positions): row p the same values at every table size."""
        positions = torch.arange(num_positions, device=self.inv_freq.device, dtype=torch.int64).float()
        freqs = positions[:, None] * self.inv_freq[None, :]  # (P, R/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (P, R)
        self.cos = (emb.cos() * self._attention_factor).to(self._dtype)  # (P, R)
        self.sin = (emb.sin() * self._attention_factor).to(self._dtype)  # (P, R)

    def __call__(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (N, H, D), k (N, KVH, D), positions (N,) int64 -> rotated (q, k), same dtypes."""
        cos, sin = self.cos_sin(positions, q.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(N, 1, D) cos and sin rows for `positions`: gathered once per forward
        pass and shared by every layer."""
        if self.cos.shape[0] < self.max_positions and positions.numel():
            needed = int(positions.max()) + 1
            if needed > self.cos.shape[0]:
                size = self.cos.shape[0]
                while size < needed:
                    size *= 2
                self._build(min(size, self.max_positions))
        return self.cos[positions].to(dtype)[:, None, :], self.sin[positions].to(dtype)[:, None, :]

    @staticmethod
    def apply(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x (N, h, D) rotated with rows from `cos_sin`; q and k heads may come in one x."""
        return _rotate(x, cos, sin)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (N, h, D): x * cos + rotate_half(x) * sin, rotate_half(x1, x2) = (-x2, x1); with
    tables R < D wide, the first R dimensions so and the rest as they are."""
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        return torch.cat((_rotate(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)  # (N, h, D/2) each
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
