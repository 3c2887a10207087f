"""Start ``deepseek-frontend`` subprocesses on free ports for end-to-end tests.

Each process runs one command module (``serve`` or ``sim-engine``) exactly as the
``deepseek-frontend`` CLI dispatches it: ``add_arguments`` on a fresh parser, then
``run(args)``. Going through the module rather than the console script keeps these tests
about the server, not about the dispatcher (which has its own tests).

Each process binds port 0 and logs the real address; :func:`start` waits for that
line and then for the given health path to answer -- no fixed sleeps. ``stop``
terminates the process (then kills it) and returns its log for failure messages; a
:class:`Server` is also a context manager that stops on exit.

Tests that run some other process (an installed console script, a replayed image) reuse
:func:`stop_process` and :func:`free_port`; a process started in its own process group whose children
must not outlive it (a real engine's scheduler and workers) is stopped by :func:`stop_process_group`.
A real engine binds the ports it is told tens of seconds into its start-up: it gets them from
:func:`free_engine_port`.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

_ADDRESS = re.compile(r"listening on (http://[0-9.]+:\d+)")
#: seconds a process may take to start (loading the tokenizer takes about a second)
START_TIMEOUT_S = 60.0
#: CLI command -> the module the CLI dispatches it to
_COMMANDS = {
    "serve": "deepseek_frontend.server.serve_command",
    "sim-engine": "deepseek_frontend.engines.sim.command",
}


def free_port() -> int:
    """A localhost port nothing listens on right now (for a process that must be told its port, or for
    an address that must refuse connections)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: the kernel's range for port-0 binds; these defaults where ``/proc`` does not say
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_EPHEMERAL_DEFAULT = (32768, 60999)
#: ports :func:`free_engine_port` handed out in this process (two engines started together never share one)
_ENGINE_PORTS: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT
    return low, high


def free_engine_port() -> int:
    """A free localhost port outside the kernel's ephemeral range, for a server that binds it long after
    it is chosen (a real engine binds its HTTP port, and vLLM its NIXL side channel, 40-90 s into start-up).

    A port from :func:`free_port` is free only when chosen: every port-0 bind in between (the engine's
    own ZMQ and gloo sockets, another engine starting beside it) draws from the ephemeral range and can
    be handed the same number, and the engine then fails to bind it. Ports below (else above) the range
    are never handed out that way."""
    low, high = _ephemeral_range()
    candidates = range(10000, low) if low - 10000 >= 1000 else range(high + 1, 65536)
    for _ in range(200):
        port = random.choice(candidates)
        if port in _ENGINE_PORTS:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ENGINE_PORTS.add(port)
        return port
    raise RuntimeError(f"no free port in {candidates.start}-{candidates.stop - 1}")


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """Terminate ``proc`` and wait for it; kill it if it has not exited after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def stop_process_group(proc: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM ``proc``, wait up to ``timeout`` seconds, then SIGKILL its whole process group.

    ``proc`` must lead its own process group (started with ``process_group=0`` or
    ``start_new_session=True``): the engine processes it started (vLLM's ``EngineCore`` and workers,
    SGLang's scheduler and detokenizer) share its group, and would otherwise keep running -- and keep
    a core busy -- after their API server is gone.
    """
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10.0)


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    args: list[str] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> str:
        stop_process(self.proc)
        return self.log()

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start(
    args: list[str], health_path: str, *, expect_healthy: bool = True, env: dict[str, str] | None = None
) -> Server:
    """Run ``deepseek-frontend ARGS`` and wait until ``health_path`` answers (200 unless not expected).

    The process gets this process's environment without ``DEEPSEEK_FRONTEND_API_KEY``, plus ``env``."""
    fd, name = tempfile.mkstemp(prefix="dsfe-test-", suffix=".log")
    log_path = Path(name)
    extra_env = env
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("DEEPSEEK_FRONTEND_API_KEY", None)
    env.update(extra_env or {})
    module = _COMMANDS[args[0]]
    launcher = (
        "import argparse, importlib, sys\n"
        f"m = importlib.import_module({module!r})\n"
        "p = argparse.ArgumentParser()\n"
        "m.add_arguments(p)\n"
        "sys.exit(m.run(p.parse_args(sys.argv[1:])) or 0)\n"
    )
    cmd = [sys.executable, "-c", launcher, *args[1:]]
    proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env)
    os.close(fd)
    deadline = time.monotonic() + START_TIMEOUT_S
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args[0]} exited with {proc.returncode}:\n{log_path.read_text()}")
        match = _ADDRESS.search(log_path.read_text(encoding="utf-8", errors="replace"))
        if match:
            url = match.group(1)
            break
        time.sleep(0.05)
    if url is None:
        proc.kill()
        raise RuntimeError(f"{args[0]} did not report its address:\n{log_path.read_text()}")
    server = Server(proc, url, log_path, args)
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url + health_path, timeout=2.0)
            if r.status_code == 200 or not expect_healthy:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"{args[0]} never became healthy:\n{server.log()}")


def start_sim_engine(*extra: str) -> Server:
    return start(["sim-engine", "--port", "0", *extra], "/health")


def start_frontend(*extra: str, expect_healthy: bool = True, env: dict[str, str] | None = None) -> Server:
    return start(
        ["serve", "--port", "0", *extra],
        "/live" if not expect_healthy else "/health",
        expect_healthy=expect_healthy,
        env=env,
    )
