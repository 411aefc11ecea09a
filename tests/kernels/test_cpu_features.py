"""Reading the CPU's instruction sets and choosing the kernel variant from them."""

import pytest

from kernels import native_build
from kernels.cpu_features import PORTABLE, CpuFeatures, read_features, resolve_prefill_dtype, resolve_variant

AVX2_ONLY = CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c"}))
AVX512 = CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                                          "avx512_bf16"}))


def test_reads_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni "
                       "avx512_bf16 amx_tile\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    features = read_features(cpuinfo)
    assert features.flags == {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                              "avx512_bf16", "amx_tile"}
    assert features.describe() == ("x86_64 with AVX2, FMA, F16C, AVX-512F, AVX-512BW, AVX-512VL, AVX512_VNNI, "
                                   "AVX512_BF16, AMX-TILE")
    assert read_features(tmp_path / "missing").flags == frozenset()


def test_best_variant_per_machine():
    assert AVX512.best_variant() == "avx512_vnni"
    assert AVX2_ONLY.best_variant() == "avx2"
    assert CpuFeatures("x86_64", frozenset({"avx2"})).best_variant() == PORTABLE  # no FMA
    assert CpuFeatures("aarch64", AVX512.flags).best_variant() == PORTABLE


def test_resolve_names_every_fallback():
    assert resolve_variant("auto", AVX512) == ("avx512_vnni", ())
    variant, fallbacks = resolve_variant("auto", AVX2_ONLY)
    assert variant == "avx2"
    assert fallbacks == ("avx512_vnni kernels not built (this CPU lacks AVX-512F/AVX-512BW/AVX-512VL/AVX512_VNNI)",)
    assert resolve_variant("avx2", AVX512) == ("avx2", ("avx512_vnni kernels not used (avx2 asked for)",))
    assert resolve_variant(PORTABLE, AVX2_ONLY)[0] == PORTABLE
    with pytest.raises(ValueError, match="needs AVX-512F"):
        resolve_variant("avx512_vnni", AVX2_ONLY)
    with pytest.raises(ValueError, match="must be one of"):
        resolve_variant("sse2", AVX512)


def test_libraries_take_their_best_variant_at_or_below_the_one_asked():
    assert native_build.library_variant("gemm_q8", "avx512_vnni") == "avx512_vnni"
    assert native_build.library_variant("gemm_q8", "avx2") == "avx2"
    assert native_build.library_variant("matvec", "avx512_vnni") == "avx2"  # AVX2 code only
    assert native_build.library_variant("matvec", PORTABLE) is None


def test_prefill_dtype_is_bf16_only_where_native_products_run_and_measured_faster():
    faster, slower = (lambda: 6.8), (lambda: 0.6)
    assert resolve_prefill_dtype("auto", AVX512, True, faster, bf16_products=True) == ("bfloat16", ())
    amx_only = CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c", "amx_tile", "amx_bf16"}))
    assert resolve_prefill_dtype("auto", amx_only, True, faster, bf16_products=True) == ("bfloat16", ())
    # native but measured slower: float32, said with the number
    assert resolve_prefill_dtype("auto", AVX512, True, slower, bf16_products=True) == (
        "float32", ("bfloat16 prefill off (a bf16 GEMM ran 0.60x float32's here, under 1.25x): float32 GEMMs",))
    # an AVX2 machine keeps today's float32 path, says why, and measures nothing
    def never():
        raise AssertionError("measured where bf16 products do not run")
    assert resolve_prefill_dtype("auto", AVX2_ONLY, onednn_bf16=True, bf16_speedup=never) == (
        "float32", ("bfloat16 prefill off (this CPU lacks AVX512_BF16/AMX-BF16): float32 GEMMs",))
    assert resolve_prefill_dtype("auto", AVX512, onednn_bf16=False, bf16_speedup=never)[1] == (
        "bfloat16 prefill off (this torch's oneDNN has no bf16 GEMM): float32 GEMMs",)
    # native bf16 without bf16 products (no AMX): bf16 tensors' rows depend on the batch, so not by default
    dtype, why = resolve_prefill_dtype("auto", AVX512, True, never, bf16_products=False)
    assert dtype == "float32" and "no bf16 products" in why[0]
    assert resolve_prefill_dtype("auto", CpuFeatures("aarch64", AVX512.flags), True, never)[0] == "float32"
    assert resolve_prefill_dtype("float32", AVX512, onednn_bf16=True) == ("float32", ())
    assert resolve_prefill_dtype("bfloat16", AVX512, onednn_bf16=True, bf16_speedup=never) == ("bfloat16", ())
    with pytest.raises(ValueError, match="needs native bf16 \\(this CPU lacks AVX512_BF16/AMX-BF16\\)"):
        resolve_prefill_dtype("bfloat16", AVX2_ONLY, onednn_bf16=True)
    with pytest.raises(ValueError, match="must be one of auto, float32, bfloat16"):
        resolve_prefill_dtype("float16", AVX512, onednn_bf16=True)


def test_bf16_gemm_speedup_is_a_measured_ratio():
    from kernels.packed_linear import bf16_is_available
    from model.backends.crossover import bf16_gemm_speedup

    if not bf16_is_available():
        pytest.skip("this torch's oneDNN has no bf16 GEMM")
    speedup = bf16_gemm_speedup(rows=64, size=256, rounds=1)
    assert 0.01 < speedup < 100
