"""How many rows the CPU backend's few-rows kernels take, before a GEMM, and what more rows cost a step.

Decode rows (and a verify chunk's) run C kernels whose rows do not depend on how many share a call, up to
a limit per weight (kernels/cpu_matvec.py's BLOCKS_MAX_ROWS, or measured at load: crossover.py), and in
groups of that limit up to grouped_rows_max."""

MEASURE = "measure"  # few-rows limits timed per weight shape at load
FIXED = "fixed"  # the limits of kernels.cpu_matvec.BLOCKS_MAX_ROWS (and 1 row for float32)
MATVEC_F32_MAX_ROWS = 1  # the float32 matvec kernel takes one row
# A speculative verify chunk (a decode's last token + its drafts) of at most this many rows runs its
# attention in the fused decode kernel, one row per token (kernels/attention_plan.py).
MAX_VERIFY_ROWS_AS_DECODE = 16
# Up to these many rows (a decode batch, the LM head's rows) the few-rows block kernels run, in groups of their
# limit (8), before a GEMM: their rows do not depend on how many share a call. Over tiles (a model without a
# prefill copy) every GEMM dequantizes the whole weight again: grouped decode of the 1B-shaped files at batch 16
# / 32 / 64 ran 2.4x / 1.5x / 1.0x (Q4_K_M) and 1.9x / 1.2x / 0.82x (Q8_0) the tiles' (docs/performance.md,
# "bfloat16 products"). Not over the FMA GEMM, which decodes its panels in L2: the default model's 16- and
# 32-token prefills ran 1.2x and 1.3x faster on it than in groups (docs/performance.md, "Prefill over blocks with FMA"). Over a copy, only under bf16 products, so that a decode batch up to it gives each
# request the bits it gets alone: the default model decoded at batch 16 as fast this way, at 32 at 0.67x.
TILE_GROUPED_ROWS_MAX = 32
GROUPED_ROWS_MAX = 16
# A step of one sequence's 1..8 rows after a 600-token prefix, relative to 1 row (measured by
# bench/verify_row_costs.py; the run is in docs/performance.md, "Verify row costs"): the blocks kernels decode each
# weight block once for all rows, but their multiply-adds grow with the rows, and so does attention (each row
# scores the whole context; the rows of a chunk read it in one pass).
CPU_VERIFY_ROW_COSTS = (1.0, 1.22, 1.47, 1.71, 1.92, 2.14, 2.35, 2.58)
# Up to this many rows the block kernels (kernels/block_matmul.py) run a projection; past it, the
# tiled GEMM over dequantized rows. The kernels decode each block once for up to 8 rows.
BLOCK_KERNEL_MAX_ROWS = 8


def grouped_rows_max(limit: int, over_tiles: bool, bf16_products: bool) -> int:
    """Up to how many rows a few-rows kernel of `limit` rows runs, in groups of `limit` (0: none): over tiles
    (no prefill copy), or over a copy under bf16 products."""
    if not limit:
        return 0
    if over_tiles:
        return max(limit, TILE_GROUPED_ROWS_MAX)
    return max(limit, GROUPED_ROWS_MAX) if bf16_products else limit
