"""A background response's final status is final: a cancel and a completion racing leave one
consistent answer, and a task that resumes after its response was read as lost never flips it.

The app runs in-process (SQLite store, simulated engine); the races are forced in a known order by
hooks on the store's writes (barriers, no sleeps): the test decides which write reaches the store
first. Each hook lets the held write run as a task of its own, so that it happens as a write
already handed to the database does even when its caller is cancelled meanwhile. A stress test
then races a few hundred cancels against completions as they come.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from deepseek_frontend.api.responses.background import LEASE_S, LOST_MESSAGE
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig, ServerOptions
from deepseek_frontend.fleet.store_config import StateOptions
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer

MODEL = "deepseek-v4-flash"
#: seconds any barrier may be waited on before the test calls it stuck (a hang guard)
GUARD_S = 60.0


@pytest.fixture()
def app(prompt_tokenizer: PromptTokenizer, tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    path = tmp_path / "state.sqlite3"
    config = ServerConfig(
        ModelConfig(served_model_name=MODEL),
        server=ServerOptions(state=StateOptions(url=f"sqlite:///{path}")),
    )
    with TestClient(create_app(config, tokenizer=prompt_tokenizer)) as client:
        yield client, path


Write = Callable[..., Awaitable[bool]]


def hook_writes(client: TestClient, hook: Callable[[Write, tuple[Any, ...]], Awaitable[bool]]) -> None:
    """Route every ``update_response`` of the app's store through ``hook(original, args)``."""
    store = client.app.frontend.store  # type: ignore[attr-defined]
    original = store.update_response

    async def hooked(*args: Any, **kwargs: Any) -> bool:
        return await hook(lambda *a: original(*a, **kwargs), args)

    store.update_response = hooked


async def wait(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, GUARD_S), "a barrier was never reached"


async def as_its_own_task(write: Awaitable[bool]) -> bool:
    """``write`` run to its end whatever happens to the caller (a write handed to the database)."""
    return await asyncio.shield(asyncio.ensure_future(write))


def create(client: TestClient) -> str:
    response = client.post("/v1/responses", json={"model": MODEL, "input": "Say hello", "background": True})
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def outputs(client: TestClient, path: Path, response_id: str) -> int:
    """Output items stored for the response (read from the file: the API lists only input items)."""
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT COUNT(*) FROM response_items WHERE response_id = ? AND kind = 'output'", (response_id,)
        ).fetchall()
    return int(rows[0][0])


def wait_final(client: TestClient, response_id: str) -> dict[str, Any]:
    for _ in range(2000):
        body = client.get(f"/v1/responses/{response_id}").json()
        if body["status"] in ("completed", "incomplete", "failed", "cancelled"):
            return dict(body)
        threading.Event().wait(0.01)
    raise AssertionError("the response never finished")


def test_a_cancel_that_reads_before_a_completion_commits_loses_to_it(app: tuple[TestClient, Path]) -> None:
    """The cancel has read the response as in progress; the completion commits; then the cancel's
    write arrives: it is refused, and the cancel is answered as for a finished response."""
    client, path = app
    cancel_waiting, completed = threading.Event(), threading.Event()

    async def hook(write: Write, args: tuple[Any, ...]) -> bool:
        status = args[2]
        if status == "cancelled":
            cancel_waiting.set()
            await wait(completed)
            return await write(*args)
        if status == "completed":
            await wait(cancel_waiting)
            written = await as_its_own_task(write(*args))
            completed.set()
            return written
        return await write(*args)

    hook_writes(client, hook)
    response_id = create(client)
    cancel = client.post(f"/v1/responses/{response_id}/cancel")
    assert cancel.status_code == 400, cancel.text
    assert cancel.json()["error"]["message"] == "Cannot cancel a response with status 'completed'."
    final = wait_final(client, response_id)
    assert final["status"] == "completed" and final["output"]
    assert outputs(client, path, response_id) == len(final["output"])


def test_a_completion_in_flight_when_the_cancel_commits_writes_nothing(app: tuple[TestClient, Path]) -> None:
    """The completion's write is on its way to the store when the cancel commits: the cancel is
    answered 200 and the response stays cancelled, without output."""
    client, path = app
    completion_reached, cancelled = threading.Event(), threading.Event()

    async def hook(write: Write, args: tuple[Any, ...]) -> bool:
        status = args[2]
        if status == "completed":
            completion_reached.set()

            async def after_the_cancel() -> bool:
                await wait(cancelled)
                return await write(*args)

            return await as_its_own_task(after_the_cancel())
        written = await write(*args)
        if status == "cancelled" and written:
            cancelled.set()
        return written

    hook_writes(client, hook)
    response_id = create(client)
    assert completion_reached.wait(GUARD_S)
    cancel = client.post(f"/v1/responses/{response_id}/cancel")
    assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled"
    final = wait_final(client, response_id)
    assert final["status"] == "cancelled" and final["output"] == []
    assert outputs(client, path, response_id) == 0


def test_a_resumed_replica_cannot_overwrite_the_failed_it_lost(app: tuple[TestClient, Path]) -> None:
    """The task is paused past its lease (no renewal, its completion held); a read marks the
    response failed; the task resumes and writes its completion: refused, the response stays failed."""
    client, path = app
    paused, resume = threading.Event(), threading.Event()
    store = client.app.frontend.store  # type: ignore[attr-defined]

    async def no_renewal(*_args: Any) -> bool:
        return True  # the paused process renews nothing

    store.touch_response = no_renewal

    async def hook(write: Write, args: tuple[Any, ...]) -> bool:
        if args[2] == "completed":
            paused.set()

            async def resumed() -> bool:
                await wait(resume)
                return await write(*args)

            return await as_its_own_task(resumed())
        return await write(*args)

    hook_writes(client, hook)
    response_id = create(client)
    assert paused.wait(GUARD_S)
    with sqlite3.connect(path) as db:  # the lease's time passes
        db.execute(
            "UPDATE responses SET updated_at = updated_at - ? WHERE id = ?", (LEASE_S + 1, response_id)
        )
    lost = client.get(f"/v1/responses/{response_id}").json()
    assert lost["status"] == "failed" and lost["error"]["message"] == LOST_MESSAGE
    resume.set()
    for _ in range(3):  # the resumed task has written (or given up) by the time its response is read again
        final = wait_final(client, response_id)
        assert final["status"] == "failed" and final["output"] == []
    assert outputs(client, path, response_id) == 0


#: cancel-against-completion races through the API
STRESS = 200


def test_cancels_racing_completions_always_leave_one_consistent_answer(app: tuple[TestClient, Path]) -> None:
    client, path = app

    def race(_n: int) -> str:
        response_id = create(client)
        cancel = client.post(f"/v1/responses/{response_id}/cancel")
        final = wait_final(client, response_id)
        stored = outputs(client, path, response_id)
        if cancel.status_code == 200:
            assert final["status"] == "cancelled" and final["output"] == [] and stored == 0
            return "cancel"
        assert cancel.status_code == 400 and final["status"] == "completed"
        assert final["output"] and stored == len(final["output"])
        return "completion"

    with ThreadPoolExecutor(8) as pool:
        winners = list(pool.map(race, range(STRESS)))
    print(
        f"{STRESS} races: cancel won {winners.count('cancel')}, completion won {winners.count('completion')}"
    )
    assert len(winners) == STRESS
