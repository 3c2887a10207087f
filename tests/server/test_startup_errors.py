"""Every way ``serve`` can fail to start ends the same way: one line on stderr that names what to fix,
and exit status 2 -- never a traceback (uvicorn's comes as one log line full of literal ``\\n``) or
uvicorn's status 3.

Each case runs the real ``deepseek-frontend serve`` in a subprocess: the checks before it listens
(the port, a keys file, the state store), the models it builds (a tokenizer) and the app's start-up
under uvicorn (a prefill/decode worker's role), alone and under ``--workers 2``. The lifespan's
steps themselves (``server/startup.py``) are tested in process below.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette

from deepseek_frontend.errors import StartupError
from deepseek_frontend.server.startup import LifespanReport, failure_line, startup_step
from tests.support.servers import free_port, start_sim_engine

#: seconds one refused start may take (loading the tokenizer takes a second or two)
START_TIMEOUT_S = 120.0


def refused(*args: str, preamble: str = "") -> str:
    """Run ``deepseek-frontend serve --port 0 ARGS`` to its end; assert it refused to start as
    promised and return its one error line. ``preamble``: Python run first (to hide a package)."""
    env = {k: v for k, v in os.environ.items() if k != "DEEPSEEK_FRONTEND_API_KEY"}
    launcher = f"{preamble}\nimport sys\nfrom deepseek_frontend.cli import main\nsys.exit(main())\n"
    proc = subprocess.run(
        [sys.executable, "-c", launcher, "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env=env,
        check=False,
    )
    err = proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{err}"
    lines = [line for line in err.splitlines() if line.startswith("deepseek-frontend serve:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "\\n" not in err, err
    assert not [line for line in err.splitlines() if " ERROR " in line], err
    return lines[0]


@pytest.fixture(scope="module")
def closed_port() -> int:
    return free_port()


def test_postgresql_unreachable_names_the_flag_and_hides_the_password(closed_port: int) -> None:
    line = refused("--state-store", f"postgresql://app:s3cret@127.0.0.1:{closed_port}/state")
    assert f"--state-store postgresql://app:***@127.0.0.1:{closed_port}/state" in line
    assert "ConnectionRefusedError" in line
    assert "s3cret" not in line


def test_postgresql_without_asyncpg_says_what_to_install() -> None:
    line = refused(
        "--state-store",
        "postgresql://app@127.0.0.1:5432/state",
        preamble="import sys; sys.modules['asyncpg'] = None",
    )
    assert "asyncpg" in line and "pip install 'deepseek-frontend[postgres]'" in line


def test_a_store_file_that_cannot_be_created_names_the_flag(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("", encoding="utf-8")
    line = refused("--state-store", f"sqlite:///{blocker}/state.sqlite3")
    assert f"--state-store sqlite:///{blocker}/state.sqlite3" in line


@pytest.fixture(scope="module")
def aggregated_worker() -> Iterator[str]:
    with start_sim_engine() as worker:
        yield worker.url


def test_a_worker_whose_role_does_not_fit_its_flag_names_both(aggregated_worker: str) -> None:
    line = refused("--prefill-worker", aggregated_worker, "--decode-worker", aggregated_worker)
    assert f"{aggregated_worker} was given as --prefill-worker" in line
    assert "--disaggregation-mode prefill" in line


def test_a_tokenizer_that_does_not_load_names_its_flag(tmp_path: Path) -> None:
    broken = broken_tokenizer(tmp_path)
    line = refused("--tokenizer", str(broken))
    assert f"cannot load its tokenizer (--tokenizer {broken})" in line


def test_a_port_in_use_or_out_of_range_names_the_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused("--port", str(port))
    assert f"cannot listen on --host 127.0.0.1 --port {port}" in line and "in use" in line
    assert "port must be 0-65535" in refused("--port", "70000")


def test_a_bad_keys_file_names_the_file_and_line(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: [\n", encoding="utf-8")
    line = refused("--keys-file", str(keys))
    assert str(keys) in line and "line" in line


def broken_tokenizer(folder: Path) -> Path:
    broken = folder / "tokenizer.json"
    broken.write_text("{", encoding="utf-8")
    return broken


def test_several_processes_report_a_failed_start_once(tmp_path: Path) -> None:
    """Under ``--workers 2`` each process fails the same way; the supervisor prints the line once,
    stops the group and exits 2 rather than restarting processes that cannot start."""
    line = refused("--workers", "2", "--tokenizer", str(broken_tokenizer(tmp_path)))
    assert "cannot load its tokenizer" in line


# ------------------------------------------------------------------ the steps, in process


def test_a_step_names_itself_and_its_cause_on_one_line() -> None:
    with pytest.raises(StartupError) as caught, startup_step("model m: its engine and workers"):
        raise ConnectionRefusedError(111, "Connect call failed\n('10.0.0.5', 30000)")
    assert str(caught.value) == (
        "model m: its engine and workers: "
        "ConnectionRefusedError: [Errno 111] Connect call failed ('10.0.0.5', 30000)"
    )
    assert failure_line(caught.value).startswith("deepseek-frontend serve: model m:")
    with pytest.raises(StartupError, match=r"^--state-store x: down$"), startup_step("ignored"):
        raise StartupError("--state-store x: down")  # already names its step


def test_a_failed_start_is_kept_and_uvicorn_gets_no_traceback() -> None:
    async def lifespan(app: Starlette) -> Iterator[None]:  # type: ignore[misc]
        with startup_step("tracing (the OTEL_* environment variables)"):
            raise RuntimeError("OTEL_EXPORTER_OTLP_TIMEOUT='soon': not a number")
        yield

    import contextlib

    report = LifespanReport(Starlette(lifespan=contextlib.asynccontextmanager(lifespan)))
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "lifespan.startup"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(report({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send))
    assert sent == [{"type": "lifespan.startup.failed", "message": ""}]
    assert failure_line(report.failure) == (
        "deepseek-frontend serve: tracing (the OTEL_* environment variables): "
        "OTEL_EXPORTER_OTLP_TIMEOUT='soon': not a number"
    )


@pytest.mark.parametrize(("flag", "value"), [("--workers", "0"), ("--key-limit-slots", "0")])
def test_a_count_below_one_names_its_flag(flag: str, value: str) -> None:
    line = refused("--workers", "2", flag, value) if flag != "--workers" else refused(flag, value)
    assert f"{flag} must be >= 1" in line
