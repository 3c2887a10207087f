"""The ``deepseek-frontend serve`` flags: their one definition.

:func:`add_arguments` registers every flag with its default and help; the Kubernetes manifests'
frontend args are validated against it, and a ``serve --config`` file's values are checked as the
flags' would be (:func:`flag_actions`). The limits flags' defaults are ``ServingLimits``'s
(api/config.py). Running the server from the parsed flags is ``api/serve_command.py``.
"""

from __future__ import annotations

import argparse

from deepseek_frontend.fleet.batch_config import add_batch_arguments
from deepseek_frontend.fleet.config import ServingLimits
from deepseek_frontend.fleet.store_config import add_state_arguments
from deepseek_frontend.keys.limit_state import DEFAULT_SLOTS
from deepseek_frontend.tokenization import CACHE_IDLE_SECONDS, PREFIX_CACHE_BYTES, RUN_CACHE_BYTES

#: the limits flags' defaults: ServingLimits is their one definition
LIMIT_DEFAULTS = ServingLimits()

#: Default TCP port, the one SGLang and vLLM frontends use too.
DEFAULT_PORT = 8000


def _on_off(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("on", "true", "1", "yes", "enabled"):
        return True
    if lowered in ("off", "false", "0", "no", "disabled"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register every ``serve`` flag on ``parser``."""
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model-path",
        default=None,
        help="checkpoint directory (tokenizer.json, config.json); default: the bundled DeepSeek-V4 tokenizer",
    )
    model.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="the tokenizer.json (or a directory holding it) the model uses (default: --model-path's, "
        "else the bundled one)",
    )
    model.add_argument(
        "--family",
        choices=("deepseek_v4", "deepseek_v41", "deepseek_v32"),
        default=None,
        help="the model family's prompt format (default: detected from --model-path's config.json or "
        "the served name)",
    )
    model.add_argument(
        "--served-model-name",
        default=None,
        help="model name clients send and /v1/models lists (default: the detected family's name)",
    )
    model.add_argument(
        "--model-alias",
        action="append",
        default=[],
        metavar="NAME[=SERVED]",
        help="also accept this model name (glob patterns such as 'claude-*' allowed); repeatable",
    )
    model.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="context window in tokens (default: config.json max_position_embeddings, else 1048576)",
    )
    model.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        help="output limit when a request sets none (default: up to the context length)",
    )
    model.add_argument(
        "--default-thinking",
        type=_on_off,
        default=True,
        metavar="on|off",
        help="thinking mode when the request does not choose (default: on)",
    )
    model.add_argument(
        "--hosted-tools",
        choices=("drop", "reject"),
        default="drop",
        help="OpenAI hosted tools this server cannot run (web_search, file_search, code_interpreter, "
        "computer use, MCP) in a /v1/responses request: drop them with a warning in the response and a "
        "log line, or reject the request with a 400 (default: drop, so Codex runs)",
    )
    model.add_argument(
        "--reasoning-effort-profile",
        choices=("preview", "official", "release", "prerelease"),
        default=None,
        help="how reasoning_effort words map onto the checkpoint's effort levels: preview|official for "
        "DeepSeek-V4, release|prerelease for V4.1 (default: detected from the checkpoint)",
    )

    engine = parser.add_argument_group("engine")
    engine.add_argument(
        "--engine",
        choices=("sglang", "vllm", "sim"),
        default=None,
        help="worker protocol (default: sglang when --worker is given, else the built-in simulated engine)",
    )
    engine.add_argument(
        "--worker",
        action="extend",
        nargs="+",
        default=[],
        metavar="URL",
        help="engine worker base URL, e.g. http://10.0.0.5:30000; repeatable",
    )
    engine.add_argument(
        "--worker-model",
        default=None,
        metavar="NAME",
        help="model name the vLLM workers serve, sent in their requests (default: the checkpoint path "
        "when given, else the served model name)",
    )
    engine.add_argument(
        "--vllm-grammar",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send the DSML tool-call grammar (tool_choice required / named) to vLLM workers as "
        "structured_outputs.grammar (default: on, vLLM always has a structured-outputs backend); "
        "--no-vllm-grammar answers such requests with a 400 instead, for a backend known to fail them",
    )
    engine.add_argument(
        "--health-check-interval",
        type=float,
        default=5.0,
        help="seconds between worker health checks (default: 5)",
    )
    engine.add_argument(
        "--health-check-timeout",
        type=float,
        default=30.0,
        help="seconds one worker health probe (SGLang: GET /server_info, which does not generate) or "
        "capability discovery may take before it counts as a failure; keep it above SGLang's own 20 s "
        "health wait so busy workers are not ejected (default: 30)",
    )
    engine.add_argument(
        "--max-retries",
        type=int,
        default=2,
        help="other workers to try when one fails before the first token (default: 2)",
    )

    from deepseek_frontend.fleet.routing_flags import add_pd_arguments, add_routing_arguments

    add_routing_arguments(parser)
    add_pd_arguments(parser)

    sim = parser.add_argument_group("built-in simulated engine (no --worker)")
    sim.add_argument("--sim-ttft-ms", type=float, default=0.0, help="simulated time to first token")
    sim.add_argument("--sim-itl-ms", type=float, default=0.0, help="simulated time between chunks")
    sim.add_argument("--sim-tokens-per-chunk", type=int, default=1, help="tokens per simulated chunk")
    sim.add_argument(
        "--sim-behave",
        default="ideal",
        metavar="PRESET",
        help="refuse what a real engine launched this way would: ideal (nothing), sglang-recipe "
        "(no grammar backend, EAGLE reserving 4 output slots, seeds ignored), sglang-recipe-grammar "
        "(the same with xgrammar) (default: ideal; see `sim-engine --help`)",
    )

    caches = parser.add_argument_group("prompt-id caches (per frontend process)")
    caches.add_argument(
        "--prefix-cache-bytes",
        type=int,
        default=PREFIX_CACHE_BYTES,
        help="memory budget of the conversation prefix cache: segment text plus 4 bytes an id "
        f"(default: {PREFIX_CACHE_BYTES >> 20} MiB)",
    )
    caches.add_argument(
        "--run-cache-bytes",
        type=int,
        default=RUN_CACHE_BYTES,
        help=f"memory budget of the text-run cache (default: {RUN_CACHE_BYTES >> 20} MiB)",
    )
    caches.add_argument(
        "--cache-idle-seconds",
        type=float,
        default=CACHE_IDLE_SECONDS,
        help=f"drop cache entries unused this long (default: {CACHE_IDLE_SECONDS:g})",
    )

    limits = parser.add_argument_group(
        "limits and timeouts (docs/serving.md, 'Limits and timeouts'; a timeout of 0 turns it off)"
    )
    limits.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=LIMIT_DEFAULTS.max_concurrent_requests,
        help="requests served at once; more wait in a short queue (default: %(default)g)",
    )
    limits.add_argument(
        "--max-queued-requests",
        type=int,
        default=LIMIT_DEFAULTS.max_queued_requests,
        help="requests that may wait for a slot; beyond it a 429 with Retry-After at once "
        "(default: %(default)g)",
    )
    limits.add_argument(
        "--queue-timeout",
        type=float,
        default=LIMIT_DEFAULTS.queue_timeout,
        help="seconds a request may wait for a slot (a request or worker slot) before its 429 "
        "(default: %(default)g)",
    )
    limits.add_argument(
        "--max-requests-per-worker",
        type=int,
        default=LIMIT_DEFAULTS.max_requests_per_worker,
        help="engine requests one worker runs at once; the engine client's connection pool is sized to "
        "match (default: %(default)g)",
    )
    limits.add_argument(
        "--worker-response-timeout",
        type=float,
        default=LIMIT_DEFAULTS.worker_response_timeout,
        help="seconds a worker may take to send the response headers of a generate request (SGLang and "
        "vLLM send them before the prefill); then it is ejected as silent and its requests still "
        "waiting for a first token move to another worker (default: %(default)g)",
    )
    limits.add_argument(
        "--first-token-timeout",
        type=float,
        default=LIMIT_DEFAULTS.first_token_timeout,
        help="seconds a worker may take to the first token (a 1M-token prefill takes minutes); then the "
        "request is aborted and the client gets a 504 (default: %(default)g)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=float,
        default=LIMIT_DEFAULTS.idle_timeout,
        help="seconds a started stream may go without output from its worker; then it is aborted and "
        "ends with an error event (default: %(default)g)",
    )
    limits.add_argument(
        "--request-timeout",
        type=float,
        default=LIMIT_DEFAULTS.request_timeout,
        help="seconds one engine request may take in all (default: %(default)g)",
    )
    limits.add_argument(
        "--header-timeout",
        type=float,
        default=LIMIT_DEFAULTS.header_timeout,
        help="seconds a client may take to send its request line and headers; then 408 and the "
        "connection is closed (default: %(default)g)",
    )
    limits.add_argument(
        "--body-timeout",
        type=float,
        default=LIMIT_DEFAULTS.body_timeout,
        help="seconds a client may take to send its request body; then 408 and the connection is "
        "closed (default: %(default)g)",
    )
    limits.add_argument(
        "--arrival-hold-timeout",
        type=float,
        default=LIMIT_DEFAULTS.arrival_hold_timeout,
        help="seconds a request that starts like no recent one (a new conversation) may be held, its "
        "start paced, while follow-ups of recent conversations are answered first; 0: start every "
        "request at once (default: %(default)g)",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        default=LIMIT_DEFAULTS.max_connections,
        help="open client connections at most; a new one beyond it gets a 503 with Retry-After, except "
        "GET /live and /health, answered from a few reserved slots (default: %(default)g, capped by the "
        "open-files limit)",
    )
    limits.add_argument(
        "--max-body-readers",
        type=int,
        default=LIMIT_DEFAULTS.max_body_readers,
        help="requests whose body is still arriving, at once; such a request holds no request slot "
        "(--max-concurrent-requests) until its body is in; more wait briefly, then 429 "
        "(default: %(default)g)",
    )
    limits.add_argument(
        "--max-body-readers-per-client",
        type=int,
        default=LIMIT_DEFAULTS.max_body_readers_per_client,
        help="the same, per client address: slow bodies from one address cost that address "
        "(default: %(default)g)",
    )
    limits.add_argument(
        "--probe-port",
        type=int,
        default=None,
        metavar="PORT",
        help="also serve /live, /health and /metrics (only those) on this port, on --host, with its own "
        "connection limit, so a connection flood on the main port never reaches the probes; 0 picks a "
        "free one (default: off)",
    )
    limits.add_argument(
        "--offload-threads",
        type=int,
        default=LIMIT_DEFAULTS.offload_threads,
        help="threads that render and tokenize long prompts off the event loop, at a lower CPU "
        "priority than the event loop (default: %(default)g)",
    )
    limits.add_argument(
        "--offload-min-chars",
        type=int,
        default=LIMIT_DEFAULTS.offload_min_chars,
        help="a prompt with at least this many characters of text the prompt caches do not hold is "
        "tokenized on those threads (default: %(default)g)",
    )
    limits.add_argument(
        "--offload-prepare-chars",
        type=int,
        default=LIMIT_DEFAULTS.offload_prepare_chars,
        help="a request with at least this many characters of text is rendered on those threads "
        "too (default: %(default)g)",
    )
    limits.add_argument(
        "--stream-yield-ms",
        type=float,
        default=LIMIT_DEFAULTS.stream_yield_ms,
        help="while prompts wait to be prepared, a running stream's next chunk waits for them, at "
        "most this long; the tokens written meanwhile come in that chunk (0: never; default: %(default)g)",
    )

    images = parser.add_argument_group("images (DeepSeek-V4.1; docs/serving.md, 'Images')")
    images.add_argument(
        "--max-images-per-request",
        type=int,
        default=32,
        help="image parts one request may carry; more is a 400 naming the first extra part (default: 32)",
    )
    images.add_argument(
        "--max-image-bytes",
        type=int,
        default=20 * 1024 * 1024,
        help="encoded bytes of one image (default: 20 MiB)",
    )
    images.add_argument(
        "--max-total-image-bytes",
        type=int,
        default=64 * 1024 * 1024,
        help="encoded bytes of all images of one request (default: 64 MiB)",
    )
    images.add_argument(
        "--image-url-allow",
        action="append",
        default=[],
        metavar="DOMAIN",
        help="fetch http(s) image URLs of DOMAIN and its subdomains (repeatable). Off by default: only "
        "data: URLs are read. Loopback, private and link-local addresses are never fetched",
    )
    images.add_argument(
        "--image-fetch-timeout",
        type=float,
        default=10.0,
        help="seconds one remote image may take, connection to last byte (default: 10)",
    )

    add_state_arguments(parser)
    add_batch_arguments(parser)

    http = parser.add_argument_group("http")
    http.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML file listing the models (and API keys) this server serves; per-model flags on the "
        "command line are every model's defaults; re-read on SIGHUP (docs/serving.md, 'Several models')",
    )
    http.add_argument(
        "--keys-file",
        default=None,
        metavar="FILE",
        help="YAML or JSON file of API keys with names, models and limits (docs/serving.md, 'API keys "
        "and limits'); re-read on SIGHUP",
    )
    http.add_argument(
        "--key-limit-slots",
        type=int,
        default=DEFAULT_SLOTS,
        metavar="N",
        help="with --workers N: API keys whose limits the processes' shared table holds at once; an idle "
        "key's slot is reused, and a key finding every slot busy is limited per process until one frees "
        f"(docs/serving.md, 'API keys and limits') (default: {DEFAULT_SLOTS})",
    )
    http.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    http.add_argument(
        "--workers",
        dest="frontend_processes",
        type=int,
        default=1,
        metavar="N",
        help="frontend processes sharing the port, under a supervisor that forwards signals (POSIX); "
        "caches, limits and the in-process simulated engine are per process, /metrics covers all "
        "(docs/serving.md, 'Several processes') (default: 1)",
    )
    http.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT}; 0 picks a free one)"
    )
    http.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require this key (Authorization: Bearer KEY or x-api-key: KEY); repeatable: any of the keys "
        "is accepted, and each key's stored responses and conversations are its own; "
        "default: $DEEPSEEK_FRONTEND_API_KEY if set, else no auth",
    )
    http.add_argument(
        "--api-key-file",
        default=None,
        metavar="PATH",
        help="require a key read from this file, one key per line (a mounted secret; blank lines and "
        "'#' lines skipped): like --api-key, without the key on the command line; re-read on SIGHUP; "
        "with --api-key, both files' and flags' keys are accepted",
    )
    http.add_argument(
        "--max-body-bytes",
        type=int,
        default=32 * 1024 * 1024,
        help="reject request bodies larger than this with 413 (default: 32 MiB)",
    )
    http.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="log level (default: info)",
    )
    http.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text: key=value lines; json: one JSON object per line (default: text)",
    )


def flag_actions() -> dict[str, argparse.Action]:
    """Each ``serve`` flag's argparse action by its dest (a configuration file's values are checked
    as the flag's would be: fleet/config_file.py)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return {action.dest: action for action in parser._actions}
