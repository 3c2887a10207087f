"""The real agent CLIs against ``deepseek-frontend serve`` (simulated engine), behind a recording proxy.

Run by ``.ci/stage-agent-clis.sh`` (``pytest -m agent_cli tests/agent_clis``), which installs
the pinned CLIs with npm first; the main suite deselects the ``agent_cli`` marker. A CLI that
is not on PATH fails the test (this stage exists to run them), it is never skipped.

Each CLI runs in a scratch folder with HOME (and its config folder) in a temp dir, telemetry
and update checks off, and every proxy variable pointing at a closed loopback port with
NO_PROXY for loopback, so the only traffic it can make is to the frontend.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.logging_proxy import LoggingProxy
from tests.support.servers import Server, free_port, start_frontend

API_KEY = "agent-cli-key"
SERVED_MODEL = "deepseek-v4-flash"


@pytest.fixture(scope="module")
def frontend() -> Iterator[Server]:
    server = start_frontend(
        "--api-key",
        API_KEY,
        "--served-model-name",
        SERVED_MODEL,
        "--model-alias",
        "claude-*",
        "--model-alias",
        "gpt-*",
        "--context-length",
        "262144",
    )
    yield server
    server.stop()


@pytest.fixture()
def proxy(frontend: Server) -> Iterator[LoggingProxy]:
    recorder = LoggingProxy(frontend.url).start()
    yield recorder
    recorder.stop()


@pytest.fixture()
def sandbox(tmp_path: Path) -> dict[str, Path]:
    """A scratch work folder with one file to look at, and a HOME of its own."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("hello from the scratch folder\n", encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    return {"work": work, "home": home}


def cli_path(name: str) -> str:
    """The CLI on PATH; a missing one fails (the stage installs it), never skips."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name!r} is not on PATH: run .ci/stage-agent-clis.sh, which installs the pinned CLIs")
    return found


def claude_installs() -> list[str]:
    """The Claude Code executables to test: ``$CLAUDE_CODE_BINS`` (paths joined by ``os.pathsep``;
    the stage sets it to one install per pinned version), else ``claude`` on PATH."""
    listed = os.environ.get("CLAUDE_CODE_BINS", "")
    return [path for path in listed.split(os.pathsep) if path] or ["claude"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test taking ``claude_bin`` runs once per Claude Code install (:func:`claude_installs`),
    with the install's folder as the test id (``claude-code-2.1.332``)."""
    if "claude_bin" in metafunc.fixturenames:
        installs = claude_installs()
        ids = [Path(path).parent.parent.name if os.sep in path else path for path in installs]
        metafunc.parametrize("claude_bin", installs, ids=ids)


def claude_path(claude_bin: str) -> str:
    """``claude_bin`` as an executable path; a missing one fails (the stage installs it)."""
    if os.sep not in claude_bin:
        return cli_path(claude_bin)
    if not os.access(claude_bin, os.X_OK):
        pytest.fail(f"{claude_bin!r} is not an executable: run .ci/stage-agent-clis.sh, which installs it")
    return claude_bin


def offline_env(home: Path) -> dict[str, str]:
    """A minimal environment: PATH, a private HOME, loopback-only networking, no telemetry."""
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: any non-loopback request fails at once
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "HTTP_PROXY": closed,
        "HTTPS_PROXY": closed,
        "ALL_PROXY": closed,
        "http_proxy": closed,
        "https_proxy": closed,
        "all_proxy": closed,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    node = shutil.which("node")
    if node is not None:
        # the CLIs' launchers find node through PATH; keep its folder even if PATH was trimmed
        env["PATH"] = f"{Path(node).parent}:{env['PATH']}"
    return env


def run_cli(
    name: str, argv: list[str], cwd: Path, env: dict[str, str], proxy: LoggingProxy, timeout_s: float
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the CLI ``name`` (``argv``) to the end (no stdin, output captured) and return it with
    the failure context every assertion shows: exit code, the tails of stdout and stderr, and the
    proxy's requests."""
    proc = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    context = (
        f"{name} exited {proc.returncode}\nstdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-3000:]}\n"
        f"requests:\n{proxy.report()}"
    )
    return proc, context
