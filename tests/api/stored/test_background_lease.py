"""A background response never stays ``in_progress`` for ever: when its process shuts down it is
marked ``failed`` at once, and when its process dies (SIGKILL) its lease runs out and it reads
``failed`` too. Real ``serve`` processes on one SQLite file, driven by the official openai SDK."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import openai
import pytest

from deepseek_frontend.api.responses.background import LEASE_S, LOST_MESSAGE, SHUTDOWN_MESSAGE

from .conftest import MODEL, sdk, start_stored

DEADLINE_S = 60.0


def _start_running(client: openai.OpenAI) -> str:
    """A long background response, returned once it is generating."""
    queued = client.responses.create(
        model=MODEL, input="Write 300 words about the sea", background=True, max_output_tokens=3000
    )
    deadline = time.monotonic() + DEADLINE_S
    while client.responses.retrieve(queued.id).status == "queued":
        assert time.monotonic() < deadline, "the background response never started"
        time.sleep(0.02)
    assert client.responses.retrieve(queued.id).status == "in_progress"
    return queued.id


def test_a_shutdown_marks_running_background_responses_failed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.sqlite3"
    with start_stored("--sim-itl-ms", "20", state_url=url) as server:
        response_id = _start_running(sdk(server))
    # the context manager terminated the server (SIGTERM): its shutdown ran
    with start_stored(state_url=url) as restarted:
        after = sdk(restarted).responses.retrieve(response_id)
    assert after.status == "failed"
    assert after.error is not None and after.error.code == "server_error"
    assert after.error.message == SHUTDOWN_MESSAGE


def test_a_killed_process_leaves_no_response_in_progress_once_its_lease_ran_out(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    url = f"sqlite:///{path}"
    server = start_stored("--sim-itl-ms", "20", state_url=url)
    try:
        response_id = _start_running(sdk(server))
        server.proc.kill()  # SIGKILL: no shutdown code runs
        server.proc.wait(timeout=30)
    finally:
        server.stop()
    with start_stored(state_url=url) as restarted:
        client = sdk(restarted)
        # within its lease the response still reads as running (the lease does not fire early)
        assert client.responses.retrieve(response_id).status == "in_progress"
        # the lease's time passes: the last renewal moves LEASE_S + 1 seconds into the past
        with sqlite3.connect(path) as db:
            db.execute(
                "UPDATE responses SET updated_at = updated_at - ? WHERE id = ?", (LEASE_S + 1, response_id)
            )
        lost = client.responses.retrieve(response_id)
        assert lost.status == "failed"
        assert (
            lost.error is not None
            and lost.error.code == "server_error"
            and lost.error.message == LOST_MESSAGE
        )
        with pytest.raises(openai.BadRequestError):
            client.responses.cancel(response_id)  # it ended: nothing to cancel
        assert client.responses.retrieve(response_id).status == "failed"  # written, not only shown
