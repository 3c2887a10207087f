"""``deepseek-frontend sim-engine``: the simulated engine as its own SGLang-protocol HTTP server.

Prints ``sim-engine listening on http://HOST:PORT`` (with the real port when ``--port 0``)
once the server accepts connections, so scripts and tests can wait for that line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import uvicorn

from deepseek_frontend.engines.sim.engine import SimulatedEngine, load_sim_tokenizer
from deepseek_frontend.engines.sim.server import FAIL_MODES, SimFaults, build_sim_app

HELP = "run the simulated engine as an HTTP server speaking SGLang's /generate token protocol"

DEFAULT_MODEL_PATH = "deepseek-ai/DeepSeek-V4-Flash"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=30000, help="port to bind; 0 picks a free one (default 30000)"
    )
    parser.add_argument(
        "--model-path",
        default=DEFAULT_MODEL_PATH,
        help="model path reported by /get_model_info; a local directory also supplies the tokenizer "
        "(default %(default)s, which uses the bundled DeepSeek-V4 tokenizer)",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer.json or model directory (default: --model-path if it exists locally, else bundled)",
    )
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first chunk")
    parser.add_argument("--itl-ms", type=float, default=0.0, help="delay between chunks")
    parser.add_argument("--tokens-per-chunk", type=int, default=1, help="output ids per streamed chunk")
    parser.add_argument(
        "--fail-after",
        type=int,
        default=None,
        metavar="N",
        help="fail every request after N output tokens (0: before the first token; health_generate then 503)",
    )
    parser.add_argument("--fail-mode", choices=FAIL_MODES, default="error-event", help="how a failure looks")
    parser.add_argument(
        "--cumulative",
        action="store_true",
        help="emit cumulative chunks (SGLang without --incremental-streaming-output)",
    )
    parser.add_argument("--seed", type=int, default=0, help="default seed when a request has none")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")


async def _serve(args: argparse.Namespace) -> int:
    engine = SimulatedEngine(
        load_sim_tokenizer(args.tokenizer or (args.model_path if Path(args.model_path).exists() else None)),
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        tokens_per_chunk=args.tokens_per_chunk,
        seed=args.seed,
        name=f"sim-engine:{args.port}",
    )
    faults = SimFaults(args.fail_after, args.fail_mode)
    app = build_sim_app(engine, model_path=args.model_path, cumulative=args.cumulative, faults=faults)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level=args.log_level, access_log=False, lifespan="off", timeout_keep_alive=30
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    if server.started:
        host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
        print(f"sim-engine listening on http://{host}:{port}", flush=True)
    await serving
    return 0 if server.started else 1


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the exit status."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(_serve(args))
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (what ``uvicorn.run`` would pick), else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m deepseek_frontend.engines.sim.command``)."""
    parser = argparse.ArgumentParser(prog="deepseek-frontend sim-engine", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
