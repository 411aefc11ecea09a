"""The CPU backend's defaults for what its linear layers multiply in and what they keep, each with the measurement
behind it (model/backends/cpu_backend.py uses them; EngineConfig and serve's flags override some)."""

# What the few-rows block kernels multiply the blocks with (kernels/block_matmul.py): "int16" (the
# default), x quantized per group of 32 (integer dot products; top-1 agreement with float32 0.9998 on 200
# prompts of the default model, teacher-forced: docs/performance.md), or "float32", each weight decoded to
# its float32 value (exact up to summation order).
DECODE_ACTIVATIONS = ("int16", "float32")
# With int8 activations, the projections (last part of the name: "lm_head", "down_proj") that keep float
# activations all the same. None by default: keeping the LM head on float activations was not shown to
# raise top-1 agreement (docs/performance.md) and would slow its decode product; bench/int8_activation_quality.py
# --float-activation-layers measures a choice.
INT8_FLOAT_ACTIVATION_LAYERS: tuple[str, ...] = ()
# A model whose projections (every layer's and the LM head, not the embedding) take at most this many
# bytes in prefill's dtype (float32, or bfloat16: half) keeps a oneDNN-packed copy of them in it for
# prefill beside the blocks decode reads.
# The tiled GEMM over blocks dequantizes every weight again on each prefill chunk; with the copy the
# default model prefilled 1.3x (1k tokens) to 2.1x (32 tokens) as fast (docs/performance.md), and the
# copy costs a small model little (SmolLM2-135M: 513 MiB as float32, 257 MiB as bfloat16). Larger models
# keep blocks only. Under bf16 products (AMX) the default is no copy: over tiles the default model prefilled
# 0.96x (1k tokens) and 0.89x (4k) as fast in 512-token chunks, the server's, and held 0.5 GiB less
# (docs/performance.md, "Decode steps replayed"). Nor with the FMA GEMM over blocks (an AVX2
# machine): it prefilled the default model as fast as the copy from 64 tokens and faster below (docs/performance.md,
# "Prefill over blocks with FMA").
FLOAT_PREFILL_MAX_BYTES = 1 << 30
# With bfloat16 prefill, the projections (last part of the name) that prefill in float32 all the same. The LM
# head's output is the logits sampling reads: rounded to bf16 (steps of 1/16 at 16) near-ties flip; and in
# serving it runs on one row per prefilling sequence, so float32 costs it nothing there.
BF16_FLOAT_LAYERS: tuple[str, ...] = ("lm_head",)
# A gated activation (SwiGLU, GeGLU) of at least this many rows writes into a kept buffer during a forward: a fresh
# output of a prompt chunk is a fresh mapping from glibc (32 MiB at 1024 rows of a 1B model), its pages faulted in
# and zeroed every layer (docs/performance.md, "Prefill GEMMs on AMX tiles"). Decode steps, recorded with their
# pointers (decode_programs.py), have fewer rows and keep fresh outputs.
KEPT_OUTPUT_MIN_ROWS = 64
