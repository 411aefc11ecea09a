"""Decode over copies of a model's Q4_1 / Q4_K (and, AVX2 build, Q6_K) projections repacked into interleaved rows.

With int16 decode activations, the few-rows products of those projections read a copy of their blocks in
the int8 GEMM's layout (16 rows interleaved by 4 bytes with AVX-512, 8 with AVX2) through
kernels/cpu_gemm_q8.py's `matmul_q16`: the block kernels' quantization of x, integer products summed per
block instead of per lane, 2-3x their speed at one row (docs/performance.md, "Decode over interleaved
rows"); Q6_K's copy (the AVX2 build's) 1.3-1.4x. Prefill's AMX GEMM decodes its panels from a Q4_1 / Q4_K copy, the
FMA GEMM from any (kernels/amx_gemm.py, kernels/fma_gemm.py); the embedding, the other prefill paths and the
other formats still read the blocks, so the copy costs their bytes again, except where every path of a part reads
the copy (float32 prefill on the FMA GEMM, not the tied embedding's table): there the backend releases the part's
blocks (`release`: the part becomes a CopiedPart). A model keeps copies only where those held beside their blocks
fit in the budget; where all formats' do not, its Q4_1 / Q4_K parts' alone where they do (a fused projection's other
formats stay on the blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from kernels.block_formats import FORMATS, BlockFormat, BlockWeight
from kernels.cpu_gemm_q8 import Q16_FORMATS, CpuGemmQ8, PackedBlocks

# The budget for copies held beside their blocks (a copy whose part's blocks are released costs nothing more):
# SmolLM2-135M's copy takes 76 MiB, the Llama-3.2-1B-shaped Q4_K_M file's ~0.46 GiB of Q4_K and 0.31 of Q6_K; larger
# models keep the blocks only, except where prefill reads the copy too and the blocks go (float32 prefill on the FMA
# GEMM, an AVX2 machine).
DECODE_COPY_MAX_BYTES = 1 << 30


@dataclass(frozen=True, eq=False)
class CopiedPart:
    """A projection's part held only as its copy in interleaved rows (DecodeCopies.release): its format and shape
    as the BlockWeight it replaces had them; its blocks are gone, and a path that still reads them fails saying so
    instead of reading freed memory."""

    format: str
    rows: int
    cols: int

    @property
    def spec(self) -> BlockFormat:
        return FORMATS[self.format]

    @property
    def blocks(self) -> Tensor:
        raise RuntimeError(f"a {self.format} {self.rows} x {self.cols} weight held only as its copy in interleaved "
                           "rows: its blocks were released (model/backends/decode_copies.py)")


class DecodeCopies:
    """The copies of one backend's model. `kernels`: the loaded library (None: none, every product over the
    blocks)."""

    def __init__(self, kernels: CpuGemmQ8 | None, max_bytes: int | None = None):
        self.kernels = kernels
        self.max_bytes = DECODE_COPY_MAX_BYTES if max_bytes is None else max_bytes
        self._formats: tuple[str, ...] = ()  # the formats copied, decided per model in plan()
        self._releases: Callable[[str, BlockWeight], bool] = lambda name, part: False  # plan()'s `released`
        self._copies: dict[int, PackedBlocks] = {}  # id(a projection's BlockWeight) -> its copy
        self._bytes = 0
        self._beside = 0  # bytes of the copies whose parts' blocks are held too
        self._released = 0  # bytes of blocks released (their parts held only as the copies)

    def plan(self, blocks: dict[str, list[BlockWeight]], int16_decode: bool,
             released: Callable[[str, BlockWeight], bool] = lambda name, part: False) -> str | None:
        """Decides for a model (its blocks by module name) which formats of its projections get copies: every
        format the kernels read repacked, else Q4_1 / Q4_K alone, where the copies held beside their blocks fit in
        the budget (`released(name, part)`: whether the backend will release that part's blocks behind its copy);
        returns the reason for a format left on the blocks by the budget, for describe()'s fallbacks."""
        self._formats, self._releases = (), released
        if self.kernels is None or not int16_decode:
            return None

        def need(formats):
            return sum(part.blocks.numel() for name, parts in blocks.items() if name != "embed_tokens"
                       for part in parts if part.format in formats and not released(name, part))

        choices = [self.kernels.q16_formats] + ([Q16_FORMATS] if self.kernels.q16_formats != Q16_FORMATS else [])
        present = {part.format for name, parts in blocks.items() if name != "embed_tokens" for part in parts}
        for formats in choices:
            if present & set(formats) and need(formats) <= self.max_bytes:
                self._formats = formats
                break
        left = [f for f in self.kernels.q16_formats if f not in self._formats and f in present]
        if left and need(self.kernels.q16_formats) > self.max_bytes:
            return (f"int16 decode over the {'/'.join(left)} blocks: a copy in interleaved rows of "
                    f"{'/'.join(self.kernels.q16_formats)} would hold {need(self.kernels.q16_formats) / 2**20:.0f} "
                    f"MiB beside their blocks, over {self.max_bytes / 2**20:.0f} MiB")
        return None

    def copy(self, parts: list[BlockWeight]) -> str | None:
        """Copies a projection's parts of the formats plan() chose; returns what its few rows then run (None:
        nothing copied)."""
        copied = [part for part in parts if part.format in self._formats]
        if not copied:
            return None
        self.add(self.kernels, copied)
        rest = (f", for its {'+'.join(p.format for p in copied)} parts; the rest C block matmul"
                if len(copied) < len(parts) else "")
        return f"C int16 activations (a copy in rows interleaved by {self.kernels.interleave}, {self.kernels.variant}{rest})"

    def add(self, kernels: CpuGemmQ8, parts: list[BlockWeight]) -> None:
        """Copies of `parts` (of kernels.q16_formats), whatever the budget: also for a measurement that switches a
        float32-decode engine's activations after load (bench/int8_activation_quality.py)."""
        self.kernels = kernels
        for part in parts:
            copy = self._copies[id(part)] = kernels.repack(part)
            self._bytes += copy.packed.numel()
            self._beside += copy.packed.numel()

    def release_planned(self, name: str, parts: list[BlockWeight], resident: dict[str, int]) -> list:
        """`parts` of projection `name`, those with a copy that plan()'s `released` names released (`release`), their
        bytes taken off `resident` (format -> bytes held as blocks)."""
        held = []
        for part in parts:
            if self.copy_of(part) is not None and self._releases(name, part):
                resident[part.format] -= part.blocks.numel()
                part = self.release(part)
            held.append(part)
        return held

    def release(self, part: BlockWeight) -> CopiedPart:
        """The part, held only as its copy from now on: the returned CopiedPart takes its place (the copy keyed by
        it), and once the caller drops the BlockWeight its blocks are freed. Only for a part every path of which
        reads the copy."""
        copy = self._copies.pop(id(part))
        held = CopiedPart(part.format, part.rows, part.cols)
        self._copies[id(held)] = copy
        self._released += part.blocks.numel()
        self._beside -= copy.packed.numel()
        return held

    def copy_of(self, part: BlockWeight) -> PackedBlocks | None:
        """The part's copy, or None (prefill's AMX GEMM decodes its panels from it: kernels/amx_gemm.py)."""
        return self._copies.get(id(part))

    def product(self, x: Tensor, part: BlockWeight, out: Tensor | None) -> Tensor | None:
        """x @ part^T over the part's copy, into `out` when given; None when the part has none."""
        copy = self._copies.get(id(part))
        return None if copy is None else self.kernels.matmul_q16(x, copy, out)

    def note(self) -> str | None:
        if not self._bytes:
            return None
        return (f"decode over a copy of the {' / '.join(self._formats or self.kernels.q16_formats)} projections in "
                f"interleaved rows, {self._bytes / 2**20:.0f} MiB "
                f"({self._beside / 2**20:.0f} MiB of it beside blocks, within {self.max_bytes / 2**20:.0f} MiB)"
                + (f"; their blocks released ({self._released / 2**20:.0f} MiB): prefill reads the copy too"
                   if self._released else ""))
