"""``deepseek-frontend serve``: the OpenAI-compatible HTTP server.

``add_arguments`` is the single definition of the server's flags (the Kubernetes
manifests' frontend args are validated against it); ``run`` builds a
:class:`~deepseek_frontend.api.config.ServerConfig` from them and serves with
uvicorn. With no ``--worker`` the built-in simulated engine runs in-process and
the first log line says so.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys

HELP = "run the OpenAI-compatible HTTP server over SGLang / vLLM workers (or the built-in simulated engine)"

#: Default TCP port, the one SGLang and vLLM frontends use too.
DEFAULT_PORT = 8000

SIM_NOTICE = (
    "no --worker given: using the built-in simulated engine (deepseek_frontend.engines.sim) "
    "-- a development/load-testing tool, not a model"
)


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
        "--reasoning-effort-profile",
        choices=("preview", "official"),
        default=None,
        help="how reasoning_effort words map onto the checkpoint's effort levels "
        "(default: detected from the checkpoint, else preview)",
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
        action="store_true",
        help="send the DSML tool-call grammar (tool_choice required / named) to vLLM workers as "
        "structured_outputs.grammar; only for a vLLM grammar backend checked to emit the DSML and "
        "</think> tokens (default: such requests get a 400 on vLLM)",
    )
    engine.add_argument(
        "--health-check-interval",
        type=float,
        default=5.0,
        help="seconds between worker health checks (default: 5)",
    )
    engine.add_argument(
        "--max-retries",
        type=int,
        default=2,
        help="other workers to try when one fails before the first token (default: 2)",
    )

    sim = parser.add_argument_group("built-in simulated engine (no --worker)")
    sim.add_argument("--sim-ttft-ms", type=float, default=0.0, help="simulated time to first token")
    sim.add_argument("--sim-itl-ms", type=float, default=0.0, help="simulated time between chunks")
    sim.add_argument("--sim-tokens-per-chunk", type=int, default=1, help="tokens per simulated chunk")

    http = parser.add_argument_group("http")
    http.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    http.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT}; 0 picks a free one)"
    )
    http.add_argument(
        "--api-key",
        default=None,
        help="require this key (Authorization: Bearer KEY or x-api-key: KEY); "
        "default: $DEEPSEEK_FRONTEND_API_KEY if set, else no auth",
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


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted. Returns the process exit code."""
    import uvicorn

    from deepseek_frontend.api.app import create_app
    from deepseek_frontend.api.config import ServerConfig
    from deepseek_frontend.api.logs import configure_logging
    from deepseek_frontend.errors import FrontendError

    configure_logging(args.log_level)
    log = logging.getLogger("deepseek_frontend.serve")
    try:
        config = ServerConfig.from_args(args)
    except (FrontendError, OSError, ValueError) as exc:
        print(f"deepseek-frontend serve: {exc}", file=sys.stderr)
        return 2
    if config.uses_builtin_sim:
        log.warning(SIM_NOTICE)

    # Bind ourselves so --port 0 works and the real port is logged before serving.
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        print(f"deepseek-frontend serve: cannot bind {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 2
    sock.listen(2048)
    sock.set_inheritable(True)
    port = sock.getsockname()[1]

    app = create_app(config)
    uv_config = uvicorn.Config(
        app,
        loop="auto",
        http="auto",
        access_log=False,
        log_level=args.log_level,
        lifespan="on",
        timeout_graceful_shutdown=5,
        log_config=None,
    )
    server = uvicorn.Server(uv_config)
    log.info(
        "listening on http://%s:%d model=%s family=%s engine=%s workers=%s",
        config.host,
        port,
        config.served_model_name,
        config.family,
        config.engine,
        ",".join(config.workers) or "-",
    )
    try:
        server.run(sockets=[sock])  # applies loop="auto" (uvloop when installed)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0
