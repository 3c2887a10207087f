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
import zmq

from deepseek_frontend._descriptors import reserve_descriptor_table
from deepseek_frontend.engines.sim.behavior import PRESETS, SimBehavior
from deepseek_frontend.engines.sim.disagg import (
    DEFAULT_BOOTSTRAP_PORT,
    DISAGG_MODES,
    SGLANG_BOOTSTRAP_TIMEOUT_S,
    SGLANG_HANDSHAKE_TIMEOUT_S,
    SGLANG_WAITING_TIMEOUT_S,
    DisaggSettings,
)
from deepseek_frontend.engines.sim.engine import (
    DEFAULT_CHUNKED_PREFILL_SIZE,
    SimulatedEngine,
    load_sim_tokenizer,
)
from deepseek_frontend.engines.sim.kv import add_kv_arguments, kv_caches_from_args
from deepseek_frontend.engines.sim.pd_roles import SimDisagg
from deepseek_frontend.engines.sim.scheduler import DEFAULT_PREEMPTION_THRESHOLD, SchedulerSettings
from deepseek_frontend.engines.sim.server import FAIL_MODES, SimFaults, build_sim_app

HELP = "run the simulated engine as an HTTP server speaking SGLang's /generate token protocol"

DEFAULT_MODEL_PATH = "deepseek-ai/DeepSeek-V4-Flash"
#: open files the sim-engine's descriptor table holds from the start (a load test's connections)
SIM_DESCRIPTORS = 8192


def _chunk_range(text: str) -> tuple[int, int]:
    """``N`` or ``MIN-MAX`` (1 <= MIN <= MAX) -> (MIN, MAX)."""
    low, _, high = text.partition("-")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN-MAX, got {text!r}") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"need 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


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
    parser.add_argument(
        "--tokens-per-chunk",
        type=_chunk_range,
        default=(1, 1),
        metavar="N|MIN-MAX",
        help="output ids per streamed chunk: N, or a range such as 1-4 drawn per chunk (as MTP / EAGLE "
        "speculative decoding accepts a varying number of tokens per step) (default 1)",
    )
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
    add_kv_arguments(parser)
    _add_disagg_arguments(parser)
    _add_scheduling_arguments(parser)
    real = parser.add_argument_group(
        "real-engine behaviour",
        "refuse and report what SGLang 0.5.23 launched this way would (flags named as SGLang's; "
        "each overrides the --behave preset)",
    )
    real.add_argument(
        "--behave",
        choices=sorted(PRESETS),
        default="ideal",
        help="preset: ideal (kind: everything honoured), sglang-recipe (the recipe's worker with "
        "--skip-tokenizer-init: no grammar backend, EAGLE reserving 4 slots, seeds ignored, slow "
        "health), sglang-recipe-grammar (the same with its tokenizer loaded: xgrammar) "
        "(default %(default)s)",
    )
    real.add_argument("--grammar-backend", default=None, help="xgrammar, llguidance, outlines or none")
    real.add_argument(
        "--skip-tokenizer-init",
        action="store_const",
        const=True,
        default=None,
        help="no tokenizer, hence no grammar backend (constrained requests get an abort chunk)",
    )
    real.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="refuse (in-stream 400) input + reserved slots + max_new_tokens above this",
    )
    real.add_argument("--speculative-algorithm", default=None, help="EAGLE, EAGLE3 or NEXTN reserve slots")
    real.add_argument("--speculative-num-steps", type=int, default=None)
    real.add_argument("--speculative-eagle-topk", type=int, default=None)
    real.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    real.add_argument(
        "--enable-deterministic-inference",
        action="store_const",
        const=True,
        default=None,
        help="honour sampling_seed (without it a preset other than ideal ignores seeds)",
    )
    real.add_argument(
        "--health-delay-ms", type=float, default=None, help="time /health and /health_generate take"
    )


def _add_disagg_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "prefill scheduling and PD disaggregation",
        "flags named as SGLang's (engines/sim/clock.py, disagg.py, pd_roles.py)",
    )
    group.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=DEFAULT_CHUNKED_PREFILL_SIZE,
        help="uncached tokens per prefill chunk; each chunk holds the decode steps of the other running "
        "streams for its prefill time (needs --prefill-us-per-token); -1: one chunk (default %(default)s, "
        "SGLang's on an 80-141 GB GPU)",
    )
    group.add_argument(
        "--enable-mixed-chunk",
        action="store_true",
        help="one decode step rides on each prefill chunk (default: chunks run back to back, decode waits)",
    )
    group.add_argument("--disaggregation-mode", choices=DISAGG_MODES, default="null", help="PD role")
    group.add_argument(
        "--disaggregation-bootstrap-port",
        type=int,
        default=DEFAULT_BOOTSTRAP_PORT,
        help="a prefill worker's bootstrap port (0: a free one, reported in /server_info) "
        "(default %(default)s)",
    )
    group.add_argument(
        "--kv-bytes-per-token",
        type=int,
        default=64,
        help="bytes of KV a prefill worker sends per prompt token (default %(default)s)",
    )
    group.add_argument(
        "--transfer-bandwidth-mbps",
        type=float,
        default=0.0,
        help="pace KV transfers to this many megabits/s (default 0: as fast as the socket)",
    )
    group.add_argument(
        "--disaggregation-bootstrap-timeout",
        type=float,
        default=SGLANG_BOOTSTRAP_TIMEOUT_S,
        metavar="S",
        help="prefill: seconds from a request's arrival for its decode worker to pre-allocate the KV "
        "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default %(default)g)",
    )
    group.add_argument(
        "--disaggregation-waiting-timeout",
        type=float,
        default=SGLANG_WAITING_TIMEOUT_S,
        metavar="S",
        help="decode: seconds from pre-allocating a room's KV to receiving it "
        "(SGLANG_DISAGGREGATION_WAITING_TIMEOUT, default %(default)g)",
    )
    group.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help="decode: the KV pool in tokens; a request pre-allocates its prompt plus max_new_tokens, "
        "first come first served, and its prefill waits for that (default: unbounded)",
    )
    group.add_argument(
        "--tokenizer-worker-num",
        type=int,
        default=1,
        help="as SGLang's: with more than one, /abort_request matches by prefix even a rid this worker "
        "does not hold (default %(default)s)",
    )
    group.add_argument(
        "--disaggregation-handshake-timeout",
        type=float,
        default=SGLANG_HANDSHAKE_TIMEOUT_S,
        metavar="S",
        help="decode: seconds to keep retrying an unreachable bootstrap port (SGLang: 15 tries 1 s apart, "
        "default %(default)g)",
    )


def _add_scheduling_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "running batch and priority scheduling",
        "flags named and defaulted as SGLang's (engines/sim/scheduler.py); without any of them every "
        "request runs at once",
    )
    group.add_argument(
        "--max-running-requests",
        type=int,
        default=None,
        help="requests in the running batch at once; more wait in the queue (default: unbounded)",
    )
    group.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="requests that may wait; past it an arrival (or with priorities the least preferred waiting "
        "request) is aborted with 503 (default: unbounded)",
    )
    group.add_argument(
        "--enable-priority-scheduling",
        action="store_true",
        help="order the queue by each request's priority field, then arrival; preempt running requests",
    )
    group.add_argument(
        "--schedule-low-priority-values-first",
        action="store_true",
        help="lower priority values first (default: higher first)",
    )
    group.add_argument(
        "--priority-scheduling-preemption-threshold",
        type=int,
        default=DEFAULT_PREEMPTION_THRESHOLD,
        help="a waiting request preempts a running one whose priority it beats by more than this "
        "(default %(default)s)",
    )
    group.add_argument("--disable-priority-preemption", action="store_true", help="never preempt")
    group.add_argument(
        "--default-priority-value",
        type=int,
        default=None,
        help="the priority of a request without one (default: the least preferred)",
    )
    group.add_argument(
        "--abort-on-priority-when-disabled",
        action="store_true",
        help="without priority scheduling, abort (503) a request that carries a priority",
    )


def scheduling_from_args(args: argparse.Namespace) -> SchedulerSettings | None:
    """The scheduler the flags ask for (None: none of its flags given, every request runs at once);
    raises ValueError naming a bad flag."""
    running = getattr(args, "max_running_requests", None)
    queued = getattr(args, "max_queued_requests", None)
    if running is not None and running < 1:
        raise ValueError(f"--max-running-requests must be at least 1, got {running}")
    if queued is not None and queued < 1:
        raise ValueError(f"--max-queued-requests must be at least 1, got {queued}")
    settings = SchedulerSettings(
        max_running_requests=running,
        enable_priority_scheduling=getattr(args, "enable_priority_scheduling", False),
        schedule_low_priority_values_first=getattr(args, "schedule_low_priority_values_first", False),
        priority_scheduling_preemption_threshold=getattr(
            args, "priority_scheduling_preemption_threshold", DEFAULT_PREEMPTION_THRESHOLD
        ),
        disable_priority_preemption=getattr(args, "disable_priority_preemption", False),
        default_priority_value=getattr(args, "default_priority_value", None),
        abort_on_priority_when_disabled=getattr(args, "abort_on_priority_when_disabled", False),
        max_queued_requests=queued,
    )
    return None if settings == SchedulerSettings() else settings


def disagg_from_args(args: argparse.Namespace) -> SimDisagg | None:
    """The PD role the flags ask for (None: aggregated); raises ValueError naming a bad flag."""
    mode = getattr(args, "disaggregation_mode", "null")
    if mode == "null":
        return None
    return SimDisagg(
        DisaggSettings(
            mode=mode,
            bootstrap_port=args.disaggregation_bootstrap_port,
            kv_bytes_per_token=args.kv_bytes_per_token,
            transfer_bandwidth_mbps=args.transfer_bandwidth_mbps,
            bootstrap_timeout_s=args.disaggregation_bootstrap_timeout,
            waiting_timeout_s=args.disaggregation_waiting_timeout,
            handshake_timeout_s=args.disaggregation_handshake_timeout,
            max_total_tokens=getattr(args, "max_total_tokens", None),
        )
    )


def behavior_from_args(args: argparse.Namespace) -> SimBehavior:
    """The ``--behave`` preset with every explicitly given real-engine flag applied over it."""
    delay = getattr(args, "health_delay_ms", None)
    context = getattr(args, "context_length", None)
    return PRESETS[getattr(args, "behave", "ideal")].with_overrides(
        grammar_backend=getattr(args, "grammar_backend", None),
        skip_tokenizer_init=getattr(args, "skip_tokenizer_init", None),
        context_length=context,
        report_context_length=True if context is not None else None,
        speculative_algorithm=getattr(args, "speculative_algorithm", None),
        speculative_num_steps=getattr(args, "speculative_num_steps", None),
        speculative_eagle_topk=getattr(args, "speculative_eagle_topk", None),
        speculative_num_draft_tokens=getattr(args, "speculative_num_draft_tokens", None),
        deterministic_inference=getattr(args, "enable_deterministic_inference", None),
        health_delay_s=delay / 1000.0 if delay is not None else None,
    )


async def _serve(args: argparse.Namespace) -> int:
    try:
        kvs, publishers = kv_caches_from_args(args)
        disagg = disagg_from_args(args)
        scheduling = scheduling_from_args(args)
    except ValueError as exc:
        print(f"deepseek-frontend sim-engine: {exc}", file=sys.stderr)
        return 2
    except zmq.ZMQError as exc:  # a KV event port is taken
        print(f"deepseek-frontend sim-engine: KV event publisher: {exc}", file=sys.stderr)
        return 1
    engine = SimulatedEngine(
        load_sim_tokenizer(args.tokenizer or (args.model_path if Path(args.model_path).exists() else None)),
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        tokens_per_chunk=args.tokens_per_chunk[0],
        max_tokens_per_chunk=args.tokens_per_chunk[1],
        seed=args.seed,
        name=f"sim-engine:{args.port}",
        behavior=behavior_from_args(args),
        kvs=kvs,
        chunked_prefill_size=getattr(args, "chunked_prefill_size", DEFAULT_CHUNKED_PREFILL_SIZE),
        enable_mixed_chunk=getattr(args, "enable_mixed_chunk", False),
        scheduling=scheduling,
    )
    faults = SimFaults(args.fail_after, args.fail_mode)
    app = build_sim_app(
        engine,
        model_path=args.model_path,
        cumulative=args.cumulative,
        faults=faults,
        disagg=disagg,
        attn_dp_size=getattr(args, "attn_dp_size", 1),
        kv_publishers=publishers,
        tokenizer_worker_num=getattr(args, "tokenizer_worker_num", 1),
    )
    if disagg is not None:
        try:
            await disagg.start(args.host)
        except OSError as exc:
            where = f"--disaggregation-bootstrap-port {args.disaggregation_bootstrap_port}"
            print(f"deepseek-frontend sim-engine: cannot listen on {where}: {exc}", file=sys.stderr)
            return 2
    # a load test opens thousands of connections at once: grow the descriptor table before it does
    reserve_descriptor_table(SIM_DESCRIPTORS)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except (OSError, OverflowError) as exc:  # in use, no such address, a port outside 0-65535
        where = f"--host {args.host} --port {args.port}"
        print(f"deepseek-frontend sim-engine: cannot listen on {where}: {exc}", file=sys.stderr)
        if disagg is not None:
            await disagg.aclose()
        return 2
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
        if publishers is not None:
            for pub in publishers.publishers:
                print(f"sim-engine KV events of rank {pub.dp_rank} on {pub.endpoint}", flush=True)
        if disagg is not None and disagg.bootstrap is not None:
            print(f"sim-engine bootstrap port {disagg.bootstrap.port}", flush=True)
    await serving
    if disagg is not None:
        await disagg.aclose()
    if publishers is not None:
        await publishers.aclose()
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
