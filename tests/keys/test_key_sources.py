"""Where ``serve`` reads its key from, so it need not be on the command line: the
``DEEPSEEK_FRONTEND_API_KEY`` environment variable and ``--api-key-file PATH`` (one key per line),
each with one process, with ``--workers 2`` and with ``--config``; the key never reaches a log line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deepseek_frontend.keys.tenants import read_api_key_file
from tests.support.servers import Server, start_frontend

pytestmark = pytest.mark.timeout(180)

KEY = "sk-from-a-secret-0123456789"
ROTATED = "sk-rotated-secret-9876543210"


def _config(tmp_path: Path) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text("models:\n  - name: deepseek-v4-flash\n", encoding="utf-8")
    return str(path)


@pytest.fixture(params=["one process", "--workers 2", "--config"])
def layout(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    if request.param == "--workers 2":
        return ["--workers", "2"]
    if request.param == "--config":
        return ["--config", _config(tmp_path)]
    return []


@pytest.fixture(params=["environment", "--api-key-file"])
def server(request: pytest.FixtureRequest, layout: list[str], tmp_path: Path) -> Iterator[Server]:
    if request.param == "environment":
        started = start_frontend(*layout, env={"DEEPSEEK_FRONTEND_API_KEY": KEY})
    else:
        key_file = tmp_path / "api-key"
        key_file.write_text(f"# mounted from a Secret\n{KEY}\n\n", encoding="utf-8")
        started = start_frontend(*layout, "--api-key-file", str(key_file))
    with started:
        yield started


def test_the_key_is_required_and_accepted_and_never_logged(server: Server) -> None:
    chat = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for _ in range(4):  # with --workers 2, more than one process answers
            assert http.post("/v1/chat/completions", json=chat).status_code == 401
            assert (
                http.post("/v1/chat/completions", json=chat, headers={"x-api-key": "sk-wrong"}).status_code
                == 401
            )
            ok = http.post("/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {KEY}"})
            assert ok.status_code == 200, ok.text
    assert KEY not in server.log()


def test_an_api_key_file_is_read_again_on_sighup(tmp_path: Path) -> None:
    """A rotated secret takes effect on a reload, like --keys-file."""
    import signal

    from tests.support.waiting import wait_until

    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n", encoding="utf-8")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with start_frontend("--api-key-file", str(key_file)) as server, httpx.Client(base_url=server.url) as http:
        assert http.post("/v1/chat/completions", json=chat, headers={"x-api-key": KEY}).status_code == 200
        key_file.write_text(ROTATED + "\n", encoding="utf-8")
        server.proc.send_signal(signal.SIGHUP)
        wait_until(
            lambda: (
                http.post("/v1/chat/completions", json=chat, headers={"x-api-key": ROTATED}).status_code
                == 200
            ),
            "the rotated key is accepted after SIGHUP",
            timeout=30,
        )
        assert http.post("/v1/chat/completions", json=chat, headers={"x-api-key": KEY}).status_code == 401
        log = server.log()
    assert KEY not in log and ROTATED not in log


def test_an_api_key_file_without_a_key_names_the_file_not_its_text(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no key"):
        read_api_key_file(empty)
    spaced = tmp_path / "spaced"
    spaced.write_text("sk-a sk-b\n", encoding="utf-8")
    with pytest.raises(ValueError, match="key 1 holds whitespace") as raised:
        read_api_key_file(spaced)
    assert "sk-a" not in str(raised.value)
    assert read_api_key_file(_write(tmp_path / "two", " sk-1 \n#x\nsk-2\n")) == ["sk-1", "sk-2"]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
