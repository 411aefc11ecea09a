"""`radixserve serve` arguments -> settings, and its one-line errors (no server started)."""

from dataclasses import replace

import pytest

from engine.kv_disk_config import KVDiskConfig

from store.errors import RadixserveError
from store.model_store import DEFAULT_MODEL
from server import cli
from server.serve_command import settings_from_args


def _args(*argv: str):
    return cli._build_parser().parse_args(["serve", *argv])


def test_defaults_and_the_api_key_from_the_environment(monkeypatch, smollm2_dir):
    monkeypatch.setenv("RADIXSERVE_API_KEY", "from-env")
    settings = settings_from_args(_args(), smollm2_dir)
    assert settings.served_model_name == DEFAULT_MODEL == smollm2_dir.name
    assert (settings.host, settings.port, settings.api_key) == ("127.0.0.1", 8000, "from-env")
    assert settings.engine.enable_prefix_cache and settings.engine.schedule == "fcfs"
    assert settings_from_args(_args("--api-key", "flag"), smollm2_dir).api_key == "flag"
    monkeypatch.delenv("RADIXSERVE_API_KEY")
    assert settings_from_args(_args(), smollm2_dir).api_key is None


def test_the_step_budget_is_the_backends_unless_told(smollm2_dir):
    import torch

    from model.backends.torch_backend import step_policy_for

    assert settings_from_args(_args("--device", "cpu"), smollm2_dir).engine.max_num_batched_tokens is None
    assert step_policy_for(torch.device("cpu")).max_num_batched_tokens == 512  # what the engine then takes
    told = settings_from_args(_args("--device", "cpu", "--max-num-batched-tokens", "4096"), smollm2_dir)
    assert told.engine.max_num_batched_tokens == 4096


def test_cpu_kernel_choice_reaches_the_engine(smollm2_dir):
    from kernels.cpu_features import VARIANT_CHOICES

    assert cli.CPU_KERNEL_CHOICES == VARIANT_CHOICES
    engine = settings_from_args(_args("--cpu-kernels", "portable", "--int8-activations"), smollm2_dir).engine
    assert (engine.cpu_kernels, engine.int8_activations) == ("portable", True)
    default = settings_from_args(_args(), smollm2_dir).engine
    assert (default.cpu_kernels, default.int8_activations) == ("auto", False)


def test_prefill_dtype_reaches_the_engine_and_bf16_without_native_bf16_is_one_line(smollm2_dir, monkeypatch):
    from kernels.cpu_features import PREFILL_DTYPE_CHOICES, CpuFeatures
    from server import serve_command

    assert cli.PREFILL_DTYPE_CHOICES == PREFILL_DTYPE_CHOICES
    assert settings_from_args(_args("--prefill-dtype", "float32"), smollm2_dir).engine.prefill_dtype == "float32"
    assert settings_from_args(_args("--prefill-dtype", "auto"), smollm2_dir).engine.prefill_dtype == "auto"
    monkeypatch.setattr(serve_command, "this_cpu", lambda: CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c"})))
    with pytest.raises(RadixserveError, match="bfloat16 prefill needs native bf16"):
        settings_from_args(_args("--prefill-dtype", "bfloat16"), smollm2_dir)


def test_backend_choice_reaches_the_engine_and_a_bad_one_is_one_line(smollm2_dir):
    from model.backends import BACKEND_CHOICES

    assert set(cli.BACKEND_CHOICES) == set(BACKEND_CHOICES)
    assert settings_from_args(_args("--backend", "torch"), smollm2_dir).engine.backend == "torch"
    with pytest.raises(RadixserveError, match="backend cpu runs float32, not bfloat16"):
        settings_from_args(_args("--backend", "cpu", "--device", "cpu", "--dtype", "bfloat16"), smollm2_dir)


def test_float8_kv_is_not_offered_and_serve_would_check_it_before_loading(smollm2_dir, capsys):
    """float8 missed the quality bar (docs/performance.md): no flag takes it. serve still checks the KV formats
    against the backend before anything loads, as it would for float8 were it offered: the torch backend
    reads it, the cpu backend (also what auto runs on the CPU) refuses it in one line naming the format, the
    backend and what to use instead."""
    for flag in ("--kv-dtype", "--kv-dtype-k", "--kv-dtype-v"):
        with pytest.raises(SystemExit):
            _args(flag, "float8")
        assert "invalid choice: 'float8'" in capsys.readouterr().err

    def float8_args(*argv):
        args = _args("--device", "cpu", "--dtype", "float32", *argv)
        setattr(args, "KVDtypeConfig.kv_dtype", "float8")  # what the flag would give (server/config_flags.py)
        return args

    engine = settings_from_args(float8_args("--backend", "torch"), smollm2_dir).engine
    assert (engine.backend, engine.kv_dtype.kv_dtype) == ("torch", "float8")
    for argv in ((), ("--backend", "cpu")):
        with pytest.raises(RadixserveError, match=r"float8 cannot be stored on backend cpu.*use --backend torch "
                                                  r"for float8 KV, or --kv-dtype int8"):
            settings_from_args(float8_args(*argv), smollm2_dir)


def test_engine_options_reach_the_engine_config(smollm2_dir):
    settings = settings_from_args(_args("--kv-cache-memory", "256MiB", "--max-num-seqs", "8", "--dtype", "float32",
                                        "--device", "cpu", "--no-prefix-cache", "--schedule", "lpm",
                                        "--max-num-batched-tokens", "1024", "--served-model-name", "smol",
                                        "--max-waiting", "5", "--max-body-bytes", "4096", "--eviction-policy", "lfu"),
                                  smollm2_dir)
    engine = settings.engine
    assert engine.eviction_policy == "lfu"
    assert (engine.kv_cache_bytes, engine.max_num_seqs, engine.dtype, engine.device) == (256 << 20, 8, "float32", "cpu")
    assert (engine.enable_prefix_cache, engine.schedule, engine.max_num_batched_tokens) == (False, "lpm", 1024)
    assert (settings.served_model_name, settings.max_waiting, settings.max_body_bytes) == ("smol", 5, 4096)
    assert settings_from_args(_args("--kv-cache-memory", "0.3"), smollm2_dir).engine.kv_cache_fraction == 0.3


@pytest.mark.parametrize("argv, fragment", [
    (("--kv-cache-memory", "lots"), "--kv-cache-memory"),
    (("--max-body-bytes", "10"), "max body bytes"),
    (("--port", "70000"), "port"),
    (("--receive-timeout", "0"), "receive timeout"),
    (("--max-schema-bytes", "10"), "max schema bytes"),
])
def test_bad_values_are_one_line_errors(monkeypatch, capsys, smollm2_dir, argv, fragment):
    import store.model_store

    monkeypatch.setattr(store.model_store, "pull", lambda name, progress=True: smollm2_dir)
    assert cli.main(["serve", *argv]) == cli.EXIT_ERROR
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("radixserve: error: ") and fragment in lines[0]


def test_settings_errors_are_radixserve_errors(smollm2_dir):
    with pytest.raises(RadixserveError):
        settings_from_args(_args("--max-waiting", "1", "--api-key", "  "), smollm2_dir)


def test_the_kv_disk_tier_is_on_by_default_under_the_home(monkeypatch, tmp_path, smollm2_dir):
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path))
    engine = settings_from_args(_args(), smollm2_dir).engine
    assert engine.kv_disk == KVDiskConfig(directory=tmp_path / "kv", max_bytes=4 << 30, policy="write-through")
    told = settings_from_args(_args("--kv-disk-dir", str(tmp_path / "elsewhere"), "--kv-disk-bytes", "64MiB",
                                    "--kv-disk-policy", "write-back"), smollm2_dir).engine
    assert told.kv_disk == KVDiskConfig(directory=tmp_path / "elsewhere", max_bytes=64 << 20, policy="write-back")
    assert settings_from_args(_args("--no-kv-disk"), smollm2_dir).engine.kv_disk.directory is None
    assert settings_from_args(_args("--no-prefix-cache"), smollm2_dir).engine.kv_disk.directory is None
    for bad in ("0.5", "lots", "0"):
        with pytest.raises(RadixserveError, match="--kv-disk-bytes"):
            settings_from_args(_args("--kv-disk-bytes", bad), smollm2_dir)


def test_the_document_store_on_disk_has_a_bound_of_its_own(monkeypatch, tmp_path, smollm2_dir):
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path))
    assert settings_from_args(_args(), smollm2_dir).engine.documents.disk_bytes == 4 << 30
    told = settings_from_args(_args("--document-disk-bytes", "256MiB", "--kv-disk-bytes", "1GiB"), smollm2_dir).engine
    assert (told.documents.disk_bytes, told.kv_disk.max_bytes) == (256 << 20, 1 << 30)
    for bad in ("0.5", "lots", "0"):
        with pytest.raises(RadixserveError, match="--document-disk-bytes"):
            settings_from_args(_args("--document-disk-bytes", bad), smollm2_dir)


def test_several_api_keys_from_flags_and_a_file(monkeypatch, smollm2_dir, tmp_path):
    monkeypatch.delenv("RADIXSERVE_API_KEY", raising=False)
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# team keys\nk3\n\n  k4  \n")
    settings = settings_from_args(_args("--api-key", "k1", "--api-key", "k2", "--api-keys-file", str(keys_file),
                                        "--tenant-per-key"), smollm2_dir)
    assert settings.api_keys == ("k1", "k2", "k3", "k4") and settings.tenant_per_key
    monkeypatch.setenv("RADIXSERVE_API_KEY", "from-env")
    assert settings_from_args(_args("--api-keys-file", str(keys_file)), smollm2_dir).api_keys == ("from-env", "k3", "k4")
    with pytest.raises(RadixserveError, match="api-keys-file"):
        settings_from_args(_args("--api-keys-file", str(tmp_path / "missing.txt")), smollm2_dir)
    monkeypatch.delenv("RADIXSERVE_API_KEY")
    with pytest.raises(RadixserveError, match="tenant per key needs api keys"):
        settings_from_args(_args("--tenant-per-key"), smollm2_dir)


def test_hardening_limits_reach_the_settings(smollm2_dir):
    settings = settings_from_args(_args("--receive-timeout", "2.5", "--max-schema-bytes", "4096"), smollm2_dir)
    assert (settings.receive_timeout_seconds, settings.max_schema_bytes) == (2.5, 4096)


def test_document_reuse_flags_reach_the_engine_config(smollm2_dir):
    from engine.engine_config import EngineConfig

    default = settings_from_args(_args(), smollm2_dir).engine.documents
    reference = EngineConfig(model_dir=smollm2_dir).documents
    assert default.enabled is True  # serve's default
    assert reference.enabled is False  # an engine built directly: exact KV only
    assert default == replace(reference, enabled=True)
    told = settings_from_args(_args("--document-reuse", "on", "--document-store-memory", "256MiB",
                                    "--document-boundary-tokens", "8", "--document-recompute-fraction", "0"),
                              smollm2_dir).engine.documents
    assert (told.enabled, told.store_bytes, told.boundary_tokens, told.recompute_fraction) == (True, 256 << 20, 8, 0.0)
    assert settings_from_args(_args("--document-reuse", "off"), smollm2_dir).engine.documents.enabled is False
    selective = settings_from_args(_args("--document-recompute-fraction", "0.15"), smollm2_dir).engine.documents
    assert selective.recompute_fraction == 0.15
    assert settings_from_args(_args("--document-min-span-tokens", "32"), smollm2_dir).engine.documents.min_span_tokens == 32  # CacheBlend-style selective recompute


@pytest.mark.parametrize("argv, fragment", [
    (("--document-store-memory", "0.5"), "--document-store-memory"),
    (("--document-store-memory", "lots"), "--document-store-memory"),
    (("--document-boundary-tokens", "-1"), "document boundary tokens"),
    (("--document-recompute-fraction", "1.5"), "document recompute fraction"),
    (("--document-recompute-fraction", "-0.1"), "document recompute fraction"),
    (("--document-recompute-fraction", "nan"), "document recompute fraction"),
    (("--document-min-span-tokens", "0"), "document min span tokens"),
])
def test_bad_document_reuse_flags_are_one_line_errors(smollm2_dir, argv, fragment):
    with pytest.raises(RadixserveError, match=fragment):
        settings_from_args(_args(*argv), smollm2_dir)


def test_speculative_mode_reaches_the_engine(smollm2_dir):
    from engine.speculation_config import SPECULATIVE_MODES

    assert settings_from_args(_args(), smollm2_dir).engine.speculation.mode == "ngram"  # serve's default
    for mode in SPECULATIVE_MODES:
        assert settings_from_args(_args("--speculative", mode), smollm2_dir).engine.speculation.mode == mode


def test_speculation_flags_are_derived_from_its_config(smollm2_dir, capsys):
    """Every SpeculationConfig field is a flag (engine/setting.py), its help the field's, its value validated there."""
    speculation = settings_from_args(_args("--max-draft-tokens", "3", "--max-verify-rows-per-step", "5"),
                                     smollm2_dir).engine.speculation
    assert (speculation.max_draft_tokens, speculation.max_verify_rows_per_step) == (3, 5)
    assert speculation.suffix_index_tokens == 200_000  # not given: the dataclass's default
    with pytest.raises(RadixserveError, match="max_draft_tokens must be >= 1"):
        settings_from_args(_args("--max-draft-tokens", "0"), smollm2_dir)
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--max-draft-tokens MAX_DRAFT_TOKENS the most draft tokens a request verifies" in help_text
    assert "--speculative {off,ngram,suffix}" in help_text and "(default: ngram)" in help_text


def test_every_feature_setting_is_a_serve_flag_with_its_help(capsys):
    """Each feature's config dataclass derives its flags (engine/setting.py, server/config_flags.py)."""
    import dataclasses

    from engine.document_reuse_config import DocumentReuseConfig
    from engine.pin_config import PinConfig
    from engine.setting import setting_doc
    from engine.speculation_config import SpeculationConfig
    from replicas.replica_config import ReplicaConfig
    from server.config_flags import flag_name
    from server.generation_defaults import GenerationDefaults

    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for config_class in (SpeculationConfig, KVDiskConfig, DocumentReuseConfig, PinConfig, ReplicaConfig,
                         GenerationDefaults):
        for field in dataclasses.fields(config_class):
            if (doc := setting_doc(field)) is not None:
                assert flag_name(field) in help_text and " ".join(doc.help.split()[:4]) in help_text


def test_pins_and_replicas_come_from_their_configs(smollm2_dir):
    from engine.pin_config import PinConfig
    from replicas.replica_config import ReplicaConfig
    from server.config_flags import config_from_args

    assert settings_from_args(_args(), smollm2_dir).pins == PinConfig()
    told = settings_from_args(_args("--tool-pin-seconds", "0", "--max-pin-seconds", "60"), smollm2_dir).pins
    assert (told.tool_seconds, told.max_seconds) == (0.0, 60.0)
    with pytest.raises(RadixserveError, match="tool pin seconds must be in"):
        settings_from_args(_args("--tool-pin-seconds", "7200"), smollm2_dir)
    replicas = config_from_args(ReplicaConfig, _args("--replicas", "2", "--replica-router", "pow2"))
    assert (replicas.count, replicas.router, replicas.threads_per_replica) == (2, "pow2", 1)
    assert config_from_args(ReplicaConfig, _args()).count is None  # one engine in this process
    for argv, fragment in ((("--replicas", "0"), "--replicas: must be positive"),
                           (("--min-match-ratio", "2"), "min_match_ratio must be in")):
        with pytest.raises(ValueError, match=fragment):
            config_from_args(ReplicaConfig, _args(*argv))
