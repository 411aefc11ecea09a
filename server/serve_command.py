"""`radixserve serve`: pull the model if needed, build the app, run it under uvicorn."""

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

import uvicorn

from assembly.chat_template import ChatTemplate, TemplateError
from engine.engine_config import EngineConfig, parse_kv_cache_memory, resolve_device, resolve_dtype
from kernels.cpu_features import resolve_prefill_dtype, resolve_variant, this_cpu
from kernels.packed_linear import bf16_is_available
from kernels.kv_format import kv_dtype_name
from model.backends import check_kv_dtypes
from engine.document_reuse_config import DocumentReuseConfig
from engine.kv_disk_config import KVDiskConfig
from engine.kv_dtype_config import KVDtypeConfig
from engine.pin_config import PinConfig
from engine.speculation_config import SpeculationConfig
from server.config_flags import config_from_args
from server.connection_deadline import with_receive_timeout
from server.generation_defaults import generation_flags_from_args, resolve_generation_defaults
from server.settings import ServerSettings, api_key_from_environment, read_api_keys_file
from store.errors import RadixserveError

logger = logging.getLogger("radixserve.server")

GRACEFUL_SHUTDOWN_SECONDS = 5  # streams still open after this are cut on Ctrl-C / SIGTERM


class _Server(uvicorn.Server):
    """uvicorn's server, saying so once it listens (the model is loaded by then)."""

    def __init__(self, config: uvicorn.Config, settings: ServerSettings):
        super().__init__(config)
        self.settings = settings

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            s = self.settings
            logger.info("radixserve: serving %s on http://%s:%d", s.served_model_name, s.host, s.port)


def settings_from_args(args: argparse.Namespace, model_dir) -> ServerSettings:
    """Raises RadixserveError (one line for the user) for a bad combination of values."""
    try:
        engine_fields = {}
        if args.kv_cache_memory is not None:
            num_bytes, fraction = parse_kv_cache_memory(args.kv_cache_memory)
            engine_fields["kv_cache_bytes" if num_bytes is not None else "kv_cache_fraction"] = num_bytes or fraction
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(args, name) is not None:
                engine_fields[name] = getattr(args, name)
        device = resolve_device(args.device)
        dtype = resolve_dtype(args.dtype, device)
        kv_dtype = config_from_args(KVDtypeConfig, args)
        # the backend asked for, and the KV formats it must hold: one line each, not a load
        check_kv_dtypes(args.backend, device, dtype, *kv_dtype.resolve(kv_dtype_name(dtype)))
        resolve_variant(args.cpu_kernels, this_cpu())  # a variant this CPU lacks is refused here, in one line
        if args.decode_activations is not None:
            engine_fields["decode_activations"] = args.decode_activations
        if args.prefill_dtype is not None:
            if args.prefill_dtype != "auto":  # bfloat16 on a CPU without native bf16 is refused here, in one line
                resolve_prefill_dtype(args.prefill_dtype, this_cpu(), bf16_is_available())
            engine_fields["prefill_dtype"] = args.prefill_dtype  # auto: the backend measures, once, where it loads
        engine = EngineConfig(model_dir=model_dir, device=args.device, dtype=args.dtype, schedule=args.schedule,
                              eviction_policy=args.eviction_policy,
                              speculation=config_from_args(SpeculationConfig, args),
                              kv_disk=_kv_disk_config(args),
                              documents=config_from_args(DocumentReuseConfig, args),
                              kv_dtype=kv_dtype,
                              enable_prefix_cache=not args.no_prefix_cache, gguf_blocks=not args.no_gguf_blocks, backend=args.backend,
                              cpu_kernels=args.cpu_kernels, int8_activations=args.int8_activations,
                              **engine_fields)
        return ServerSettings(
            engine=engine,
            served_model_name=args.served_model_name or model_dir.name,
            host=args.host,
            port=args.port,
            **_api_key_fields(args),
            pins=config_from_args(PinConfig, args),
            responses_max_count=args.responses_max_count,
            responses_max_bytes=args.responses_max_bytes,
            responses_max_age_seconds=args.responses_max_age_seconds,
            **({"responses_db": Path(args.responses_db).expanduser()} if args.responses_db else {}),
            max_waiting=args.max_waiting,
            max_body_bytes=args.max_body_bytes,
            max_schema_bytes=args.max_schema_bytes,
            receive_timeout_seconds=args.receive_timeout,
            rag_order=args.rag_order,
            allowed_origins=tuple(args.allowed_origins),
            ui=args.ui,
            chat_template_path=Path(args.chat_template).expanduser() if args.chat_template else None,
            generation_defaults=generation_flags_from_args(args),
            **({"collections_dir": Path(args.collections_dir).expanduser()} if args.collections_dir else {}),
        )
    except ValueError as error:
        raise RadixserveError(str(error)) from None


def _kv_disk_config(args: argparse.Namespace) -> KVDiskConfig:
    """The disk tier is on unless --no-kv-disk (or --no-prefix-cache: the tier continues the tree's matches),
    under $RADIXSERVE_HOME/kv unless --kv-disk-dir says where."""
    config = config_from_args(KVDiskConfig, args)  # the flags given are checked even when the tier is off
    if args.no_kv_disk or args.no_prefix_cache:
        return replace(config, directory=None)
    if config.directory is None:
        from store.model_store import radixserve_home

        config = replace(config, directory=radixserve_home() / "kv")
    return config


def _api_key_fields(args: argparse.Namespace) -> dict:
    """`--api-key` (repeated; else $RADIXSERVE_API_KEY), then the keys of `--api-keys-file`."""
    keys = list(args.api_key or ())
    if not keys and (from_environment := api_key_from_environment()) is not None:
        keys = [from_environment]
    if args.api_keys_file:
        try:
            keys += read_api_keys_file(Path(args.api_keys_file).expanduser())
        except OSError as error:
            raise ValueError(f"--api-keys-file: {error}") from None
    return {"api_key": keys[0] if keys else None, "more_api_keys": tuple(keys[1:]),
            "tenant_per_key": args.tenant_per_key}


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("radixserve")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def serve(args: argparse.Namespace) -> int:
    from store.model_store import pull
    from server.app import create_app

    model_dir = pull(args.model, progress=True)
    settings = settings_from_args(args, model_dir)
    if settings.chat_template_path is not None:  # a bad file is the user's error, said before startup
        try:
            ChatTemplate.from_model_dir(model_dir, settings.chat_template_path)
        except TemplateError as error:
            raise RadixserveError(f"--chat-template: {error}") from None
    try:  # a bad generation_config.json is said before startup (the lifespan resolves them again, and logs them)
        resolve_generation_defaults(settings.generation_defaults, model_dir)
    except ValueError as error:
        raise RadixserveError(str(error)) from None
    configure_logging()
    if hasattr(args, "openmp_waits"):  # set by cli.main, which chose the policy before torch loaded
        logger.info("radixserve: %s", args.openmp_waits)
    return run_server(create_app(settings), settings)


def run_server(app, settings: ServerSettings) -> int:
    """Serve the ASGI `app` under uvicorn until Ctrl-C / SIGTERM; 1 if it never started."""
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                            access_log=False, lifespan="on", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
                            http=with_receive_timeout(settings.receive_timeout_seconds))
    server = _Server(config, settings)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown: a normal stop
        pass
    if not server.started:
        return 1
    logger.info("radixserve: stopped")
    return 0
