"""SIGKILL `serve` in the middle of a stored streaming response; after a restart on the same SQLite
file every acknowledged response is there, whole, and the one cut off is not there at all."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from .conftest import MODEL, sdk, start_stored


def test_sigkill_mid_stream_loses_nothing_acknowledged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.sqlite3"
    server = start_stored("--sim-itl-ms", "20", state_url=url)
    try:
        client = sdk(server)
        acknowledged = [client.responses.create(model=MODEL, input=f"Say hello {i}") for i in range(3)]
        chained = client.responses.create(model=MODEL, previous_response_id=acknowledged[0].id, input="Again")
        cut_id = None
        with client.responses.stream(
            model=MODEL, input="Write 300 words about the sea", max_output_tokens=3000
        ) as s:
            for event in s:
                if event.type == "response.created":
                    cut_id = event.response.id
                if event.type == "response.output_text.delta":
                    server.proc.kill()  # SIGKILL: no shutdown code runs
                    server.proc.wait(timeout=30)
                    break
        assert cut_id is not None
    finally:
        server.stop()
    with start_stored(state_url=url) as restarted:
        client = sdk(restarted)
        for response in [*acknowledged, chained]:
            again = client.responses.retrieve(response.id)
            assert again.status == "completed" and again.output_text == response.output_text
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(cut_id)
        follow = client.responses.create(model=MODEL, previous_response_id=chained.id, input="And again")
        assert follow.status == "completed"
