"""The frontend image (``Dockerfile.frontend``) without Docker: its instructions are linted, and its build
steps are replayed on the host (wheel -> fresh venv -> serve -> the image's own HEALTHCHECK command)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.servers import free_port, stop_process

from .recipe_checks import REPO_ROOT, parse_dockerfile

#: seconds the replayed container gets to answer its health check (the Dockerfile's --start-period is 30 s)
STARTUP_TIMEOUT = 60.0


def test_image_runs_as_a_non_root_user() -> None:
    user = parse_dockerfile().user
    assert user is not None, "no USER instruction: the image would run as root"
    name, _, group = user.partition(":")
    assert name not in ("root", "0") and group not in ("root", "0")


def test_image_declares_an_exec_form_health_check_against_the_health_endpoint() -> None:
    dockerfile = parse_dockerfile()
    assert dockerfile.healthcheck is not None
    assert dockerfile.healthcheck[0] == "python"  # no shell and no curl in a slim image
    assert f"http://127.0.0.1:{dockerfile.exposed[0]}/health" in dockerfile.healthcheck[-1]


def test_image_serves_on_all_interfaces_on_the_exposed_port_by_default() -> None:
    dockerfile = parse_dockerfile()
    assert dockerfile.entrypoint == ["deepseek-frontend"]
    argv = dockerfile.cmd
    assert argv[0] == "serve"
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert [int(argv[argv.index("--port") + 1])] == dockerfile.exposed


def test_image_installs_only_the_project_wheel_built_without_dependencies() -> None:
    runs = parse_dockerfile().run_lines
    assert any("pip wheel" in r and "--no-deps" in r for r in runs), runs
    assert any("pip install" in r and "/wheels/*.whl" in r for r in runs), runs


# --- replay of the build on the host -------------------------------------------------------------------


def _run(argv: list[str], timeout: float) -> None:
    """Run a build step quietly; on failure, fail with its output."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(argv)} failed:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding what the image holds: the project's wheel (built like the Dockerfile's build
    stage) and its runtime dependencies from PyPI, nothing from the development environment."""
    root = tmp_path_factory.mktemp("image")
    wheels = root / "wheels"
    # Build from exactly what the Dockerfile COPYs from the context: a file missing there fails here too.
    context = root / "context"
    context.mkdir()
    copies = parse_dockerfile().context_copies
    assert copies, "the Dockerfile copies nothing from the build context"
    for sources, destination in copies:
        for source in sources:
            target = (
                context / destination / Path(source).name
                if destination.endswith("/")
                else context / destination
            )
            if (REPO_ROOT / source).is_dir():
                ignore = shutil.ignore_patterns("*.egg-info", "__pycache__")
                shutil.copytree(REPO_ROOT / source, target, ignore=ignore)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO_ROOT / source, target)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--wheel-dir",
            str(wheels),
            str(context),
        ],
        timeout=300,
    )
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    python = venv / "bin" / "python"
    _run(
        [str(python), "-m", "pip", "install", "--quiet", *map(str, wheels.glob("*.whl"))],
        timeout=600,
    )
    return venv


@dataclass
class Served:
    port: int
    process: subprocess.Popen[bytes]
    log: Path


@pytest.fixture
def served(image_venv: Path, tmp_path: Path) -> Iterator[Served]:
    """The image's default command, run from the replayed venv on a free port."""
    dockerfile = parse_dockerfile()
    port = free_port()
    argv = [str(image_venv / "bin" / dockerfile.entrypoint[0]), *dockerfile.cmd]
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--host") + 1] = "127.0.0.1"
    log_path = tmp_path / "serve.log"
    log = log_path.open("wb")
    env = {k: v for k, v in os.environ.items() if k != "DEEPSEEK_FRONTEND_API_KEY"}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env)
    try:
        yield Served(port, proc, log_path)
    finally:
        stop_process(proc)
        log.close()


def _health_check(image_venv: Path, port: int) -> subprocess.CompletedProcess[bytes]:
    dockerfile = parse_dockerfile()
    command = [c.replace(f":{dockerfile.exposed[0]}/", f":{port}/") for c in dockerfile.healthcheck or []]
    command[0] = str(image_venv / "bin" / command[0])
    return subprocess.run(command, capture_output=True, timeout=30)


@pytest.mark.slow
def test_image_build_steps_yield_a_server_that_passes_its_own_health_check(
    image_venv: Path, served: Served
) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    result = _health_check(image_venv, served.port)
    while result.returncode != 0 and time.monotonic() < deadline:
        assert served.process.poll() is None, "server exited:\n" + served.log.read_text(errors="replace")
        time.sleep(0.2)
        result = _health_check(image_venv, served.port)
    assert result.returncode == 0, served.log.read_text(errors="replace") + result.stderr.decode(
        errors="replace"
    )


@pytest.mark.slow
def test_image_health_check_fails_when_nothing_answers(image_venv: Path) -> None:
    result = _health_check(image_venv, free_port())
    assert result.returncode != 0
