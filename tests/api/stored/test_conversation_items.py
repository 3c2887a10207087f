"""Conversation items are checked when they are written, as ``/v1/responses`` checks its input: a
bad item is a 400 naming the item and field, and nothing is stored -- so no conversation is ever
left that every later response on it refuses."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support.servers import Server

from .conftest import API_KEY, MODEL

HEADERS = {"Authorization": f"Bearer {API_KEY}"}

#: (items, the param the 400 names)
BAD_ITEMS: list[tuple[list[Any], str]] = [
    ([{"role": "robot", "content": "hi"}], "items[0].role"),
    ([{"type": "message", "role": "user"}], "items[0].content"),
    ([{"type": "message", "role": "user", "content": 42}], "items[0].content"),
    ([{"role": "user", "content": [{"type": "input_text", "text": 7}]}], "items[0].content[0].text"),
    ([{"role": "user", "content": [{"type": "bogus_part"}]}], "items[0].content[0].type"),
    (
        [{"role": "user", "content": "ok"}, {"type": "function_call", "name": "f", "arguments": "{}"}],
        "items[1].call_id",
    ),
    ([{"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}], "items[0].call_id"),
    ([{"type": "web_search_call", "id": "ws_1"}], "items[0]"),
    ([{"type": "reasoning", "content": [{"type": "reasoning_text"}]}], "items[0].content[0].text"),
]


def _post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=HEADERS, timeout=60)


@pytest.mark.parametrize(("items", "param"), BAD_ITEMS)
def test_a_bad_item_is_refused_on_create_naming_it(
    stored_server: Server, items: list[Any], param: str
) -> None:
    refused = _post(stored_server, "/v1/conversations", {"items": items})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param
    assert param in refused.json()["error"]["message"]


@pytest.mark.parametrize(("items", "param"), BAD_ITEMS)
def test_a_bad_item_is_refused_on_add_and_nothing_is_stored(
    stored_server: Server, client: openai.OpenAI, items: list[Any], param: str
) -> None:
    conv = client.conversations.create(items=[{"role": "user", "content": "Hello"}])
    refused = _post(stored_server, f"/v1/conversations/{conv.id}/items", {"items": [*items]})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param
    assert len(client.conversations.items.list(conv.id).data) == 1  # nothing of the call was kept
    # the conversation is still one a response can continue
    assert client.responses.create(model=MODEL, conversation=conv.id, input="Again").status == "completed"


def test_an_output_may_answer_a_call_stored_earlier(client: openai.OpenAI) -> None:
    conv = client.conversations.create(
        items=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "weather",
                "arguments": '{"city":"Paris"}',
            },
        ]
    )
    client.conversations.items.create(
        conv.id, items=[{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
    )
    answer = client.responses.create(model=MODEL, conversation=conv.id, input="Thanks")
    assert answer.status == "completed"
