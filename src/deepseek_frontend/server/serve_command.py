"""``deepseek-frontend serve``: the OpenAI-compatible HTTP server.

``run`` builds the served models' :class:`~deepseek_frontend.fleet.config.ServerConfig` from the
flags (defined in ``api/serve_flags.py``, registered by ``add_arguments``), binds the port, forks
the ``--workers`` processes, builds the app and serves with uvicorn. With no ``--worker`` the
built-in simulated engine runs in-process and the first log line says so.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from deepseek_frontend._descriptors import open_files_limit, reserve_descriptor_table

from .serve_flags import add_arguments, flag_actions

#: what the command line dispatches to: ``HELP``, ``add_arguments(parser)``, ``run(args)``
__all__ = ["HELP", "add_arguments", "run"]

HELP = "run the OpenAI-compatible HTTP server over SGLang / vLLM workers (or the built-in simulated engine)"

SIM_NOTICE = (
    "no --worker given: using the built-in simulated engine (deepseek_frontend.engines.sim) "
    "-- a development/load-testing tool, not a model"
)


def _descriptors_for(connections: int) -> int:
    """Open files a process serving ``connections`` client connections needs: the engine
    connections too (one per in-flight stream, plus control connections), and a margin for the
    tokenizer files and logs."""
    return connections + connections // 4 + 1024


def _connection_limit(wanted: int, log: logging.Logger) -> int:
    """``wanted`` open connections, or fewer if the open-files limit cannot hold them.

    The soft limit is raised to the hard one first; a margin of descriptors stays for worker
    connections, the tokenizer files and logs.
    """
    soft = open_files_limit()
    if soft is None:
        return wanted
    room = max(64, soft - (_descriptors_for(wanted) - wanted))
    if wanted > room:
        log.warning("--max-connections %d does not fit the open-files limit %d; using %d", wanted, soft, room)
        return room
    return wanted


def _error_body_for(app: Any) -> Callable[[str, Any], bytes]:
    """Errors the HTTP layer answers before the app runs, in the shape of the API the path belongs to."""
    import orjson

    from deepseek_frontend.edge.errors import shape_for

    shapes = app.frontend.api_shapes

    def body(path: str, err: Any) -> bytes:
        return orjson.dumps(shape_for(path, shapes).error_body(err))

    return body


def _startup_failed(line: str, slot: Any) -> int:
    """Report a start-up failure (one line) and give the exit status: printed by this process, or,
    in a ``--workers N`` child (``slot``), left for the supervisor to print once for the group."""
    from .startup import STARTUP_FAILED

    if slot is None:
        print(line, file=sys.stderr)
    else:
        slot.report_startup_failure(line)
    return STARTUP_FAILED


#: the variable the Rust tokenizer's thread pool (rayon) reads once, when it starts
TOKENIZER_THREADS_VARIABLE = "RAYON_NUM_THREADS"


def _leave_a_core_to_the_loop() -> None:
    """Size the Rust tokenizer's thread pool to one thread fewer than this process may run on.

    The cold prompt text of a burst is tokenized in batches on that pool (pipeline/offload.py), at
    the event loop's own priority; with as many threads as cores it would share every core with
    the loop that streams every response. One core fewer keeps one for the loop: on 2 cores, the
    loop streams on one while prompts are tokenized on the other. Set before the tokenizer is
    first used (the pool starts then); an operator's own setting of the variable wins.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    os.environ.setdefault(TOKENIZER_THREADS_VARIABLE, str(max(1, cores - 1)))


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted. Returns the process exit code."""
    import uvicorn

    from deepseek_frontend._tracing import check_env as check_tracing_env
    from deepseek_frontend.errors import FrontendError, StartupError
    from deepseek_frontend.fleet.config_file import fleet_from_args
    from deepseek_frontend.fleet.store_config import check_state_store
    from deepseek_frontend.keys.limit_state import DEFAULT_SLOTS, SharedLimitState

    from . import hangups
    from .acceptor import FrontendServer
    from .app import create_app
    from .http_protocol import PROBE_MAX_CONNECTIONS, counting_connections, guarded_protocol
    from .logs import configure_logging
    from .startup import STARTUP_FAILED, LifespanReport, failure_line

    configure_logging(args.log_level, args.log_format)
    log = logging.getLogger("deepseek_frontend.serve")
    actions = flag_actions()
    hangups.catch()  # a SIGHUP while starting is a reload to make once serving, not the end
    hangups_seen = hangups.count()  # one arriving from here on may be newer than the file read
    try:
        fleet = fleet_from_args(args, actions)
        check_tracing_env()  # before binding: every process would refuse to start later
    except (FrontendError, StartupError, OSError, ValueError, RuntimeError) as exc:
        print(failure_line(StartupError(str(exc))), file=sys.stderr)
        return STARTUP_FAILED
    config = fleet.models[0]  # the server-wide settings (every model shares them)
    store_error = check_state_store(config.server.state)  # before binding, forking or loading anything
    if store_error is not None:
        print(failure_line(StartupError(store_error)), file=sys.stderr)
        return STARTUP_FAILED
    for model in fleet.models:
        if model.engine.uses_builtin_sim:
            log.warning("%s: %s", model.model.served_model_name, SIM_NOTICE)

    # Bind ourselves so --port 0 works and the real port is logged before serving.
    family = socket.AF_INET6 if ":" in config.server.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    processes = getattr(args, "frontend_processes", 1)
    if processes > 1 and hasattr(socket, "SO_REUSEPORT"):
        # --workers N: each process will listen on this port with its own accept queue (processes.py)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((config.server.host, config.server.port))
    except (OSError, OverflowError) as exc:  # OverflowError: a --port outside 0-65535
        where = f"--host {config.server.host} --port {config.server.port}"
        print(failure_line(StartupError.because(f"cannot listen on {where}", exc)), file=sys.stderr)
        return STARTUP_FAILED
    max_connections = _connection_limit(config.limits.max_connections, log)
    # a burst of connections waits in the kernel's accept queue rather than being refused by it
    # (the kernel caps this at net.core.somaxconn)
    backlog = max(2048, min(max_connections, 65535))
    sock.listen(backlog)
    sock.set_inheritable(True)
    port = sock.getsockname()[1]
    probe_sock = None
    if getattr(args, "probe_port", None) is not None:
        # one socket for every process (--workers N): probes are few, one accept queue is enough
        probe_sock = socket.socket(family, socket.SOCK_STREAM)
        probe_sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe_sock.bind((config.server.host, args.probe_port))
        except (OSError, OverflowError) as exc:
            where = f"cannot listen on --probe-port {args.probe_port}"
            print(failure_line(StartupError.because(where, exc)), file=sys.stderr)
            return STARTUP_FAILED
        probe_sock.listen(256)

    slot = None
    if processes < 1:
        print(failure_line(StartupError("--workers must be >= 1")), file=sys.stderr)
        return STARTUP_FAILED
    slots = getattr(args, "key_limit_slots", None)
    if slots is None:
        slots = DEFAULT_SLOTS
    if slots < 1:
        print(failure_line(StartupError("--key-limit-slots must be >= 1")), file=sys.stderr)
        return STARTUP_FAILED
    try:
        # the API keys' limits hold across processes: their state is shared memory made before forking
        shared_limits = SharedLimitState.create(slots=slots, processes=processes) if processes > 1 else None
    except OSError as exc:
        what = f"--workers {processes}: cannot make the shared memory for the API keys' limits"
        print(failure_line(StartupError.because(what, exc)), file=sys.stderr)
        return STARTUP_FAILED
    if processes > 1:
        from .processes import fork_processes

        # fork before the app exists: no threads yet, and each process loads its own tokenizer
        try:
            forked = fork_processes(processes, sock, backlog)
        except OSError as exc:
            print(failure_line(StartupError.because(f"--workers {processes}", exc)), file=sys.stderr)
            return STARTUP_FAILED
        if isinstance(forked, int):
            if probe_sock is not None:
                probe_sock.close()
            return forked  # the supervisor, after every process exited
        slot = forked

    # In each serving process (a forked one starts with a small table again), before the app
    # starts threads, so no accept() waits for the table to grow (_descriptors.py)
    reserve_descriptor_table(_descriptors_for(max_connections))
    if slot is not None:
        assert shared_limits is not None
        shared_limits.reset_process(slot.index)  # what a dead predecessor held in flight is free again
        # a process forked again later reads the configuration as it is now (a reload may have changed it)
        try:
            hangups_seen = hangups.count()
            fleet = fleet_from_args(args, actions)
            config = fleet.models[0]
        except (FrontendError, OSError, ValueError) as exc:
            log.error(
                "the configuration no longer loads (%s); this process serves the one read at start", exc
            )
    _leave_a_core_to_the_loop()
    try:
        app = create_app(
            config,
            fleet=fleet,
            shared_limits=shared_limits,
            process_index=slot.index if slot is not None else 0,
            load_fleet=lambda: fleet_from_args(args, actions),
            hangups_seen=hangups_seen,
        )
    except Exception as exc:  # a tokenizer that does not load names its flag (compose.load_tokenizer)
        return _startup_failed(failure_line(exc), slot)
    if slot is not None:
        app.state.frontend.process_group = slot
    # Thousands of requests in flight make every full collection long (~0.1 s on 2 cores, the
    # event loop stopped meanwhile); collect the young generation 14x less often (10,000
    # allocations instead of 700) and so run far fewer full collections under a burst.
    gc.set_threshold(10_000, 20, 10)
    protocol = guarded_protocol(
        header_timeout_s=config.limits.header_timeout,
        max_connections=max_connections,
        error_body=_error_body_for(app),
        arrivals=app.state.frontend.arrivals,
        heads=app.state.frontend.recent_heads,
    )
    app.state.frontend.connection_stats = protocol.stats
    app.state.frontend.connection_counts = protocol.counts
    probes = []
    if probe_sock is not None:
        probe_protocol = guarded_protocol(
            header_timeout_s=config.limits.header_timeout,
            max_connections=PROBE_MAX_CONNECTIONS,
            error_body=_error_body_for(app),
            probe_only=True,
        )
        probes = [(probe_sock, probe_protocol)]
    # the app's own start-up (tracing, engines and workers, the state store) reports a failure
    # through this: one line and STARTUP_FAILED, not uvicorn's traceback (server/startup.py)
    lifespan_report = LifespanReport(app)
    uv_config = uvicorn.Config(
        lifespan_report,
        loop="auto",
        http=protocol,
        # uvicorn's own servers (the private socket; the public one on a loop without add_reader)
        backlog=backlog,
        access_log=False,
        log_level=args.log_level,
        lifespan="on",
        timeout_graceful_shutdown=5,
        log_config=None,
    )
    listening = slot.listening if slot is not None and slot.listening is not None else sock
    # the public socket is accepted by the frontend itself, up to 64 connections per wake-up
    # the connections of the public port are the ones balanced over the processes (not the
    # private socket's: the siblings' metrics scrapes)
    public_protocol = counting_connections(protocol, slot.count_connection) if slot is not None else None
    server = FrontendServer(
        uv_config, public=[listening], slot=slot, probes=probes, public_protocol=public_protocol
    )
    log.info("listening on http://%s:%d", config.server.host, port)
    for model in fleet.models:
        log.info(
            "model=%s family=%s engine=%s workers=%s aliases=%s",
            model.model.served_model_name,
            model.model.family,
            model.engine.kind,
            ",".join(model.engine.workers)
            or (
                f"prefill={','.join(model.pd.prefill_workers)} decode={','.join(model.pd.decode_workers)}"
                if model.pd.prefill_workers
                else "-"
            ),
            ",".join(a.pattern for a in model.model.model_aliases) or "-",
        )
    if probe_sock is not None:
        log.info(
            "probes on http://%s:%d (/live, /health, /metrics)",
            config.server.host,
            probe_sock.getsockname()[1],
        )
    try:
        # applies loop="auto" (uvloop when installed); a forked process also serves its private socket
        private = [slot.private_socket] if slot is not None and slot.private_socket is not None else []
        server.run(sockets=private)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    if lifespan_report.failure is not None:
        return _startup_failed(failure_line(lifespan_report.failure), slot)
    return 0
