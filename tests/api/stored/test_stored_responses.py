"""Stored responses over the official openai SDK against a real `serve` (SQLite store)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.servers import Server

from .conftest import API_KEY, MODEL, assert_same_prompt_as_resent


def test_responses_are_stored_by_default_and_retrieved_as_returned(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="Say hello")
    assert first.store is True and first.status == "completed"
    again = client.responses.retrieve(first.id)
    assert again.model_dump() == first.model_dump()


def test_store_false_keeps_nothing(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Say hello", store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.retrieve(response.id)
    assert err.value.body is not None and err.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def test_previous_response_id_continues_as_if_everything_was_resent(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="My name is Ada. Reply with exactly: noted")
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input="What is my name?")
    assert second.previous_response_id == first.id and second.status == "completed"
    # the same conversation resent by the client: the same prompt, so the same prompt length
    assert_same_prompt_as_resent(client, second, first.output)
    # a chain of three: the third turn sees both earlier ones
    third = client.responses.create(model=MODEL, previous_response_id=second.id, input="And again?")
    assert third.usage is not None and third.usage.input_tokens > second.usage.input_tokens


def test_input_items_are_listed_with_openai_pagination(client: openai.OpenAI) -> None:
    texts = [f"line {i}" for i in range(5)]
    response = client.responses.create(model=MODEL, input=[{"role": "user", "content": t} for t in texts])
    page = client.responses.input_items.list(response.id, limit=2)  # newest first by default
    assert [item.content[0].text for item in page.data] == ["line 4", "line 3"]  # type: ignore[union-attr]
    assert page.has_more is True and page.first_id == page.data[0].id and page.last_id == page.data[1].id
    everything = list(client.responses.input_items.list(response.id, limit=2, order="asc"))  # follows `after`
    assert [item.content[0].text for item in everything] == texts  # type: ignore[union-attr]
    assert len({item.id for item in everything}) == 5 and all(
        item.id.startswith("msg_") for item in everything
    )
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.input_items.list(response.id, after="msg_nope")
    assert err.value.body is not None and err.value.body["param"] == "after"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.input_items.list(response.id, limit=101)
    assert err.value.body is not None and err.value.body["param"] == "limit"  # type: ignore[index]


def test_delete_then_404(client: openai.OpenAI, stored_server: Server) -> None:
    response = client.responses.create(model=MODEL, input="Say hello")
    raw = httpx.delete(
        f"{stored_server.url}/v1/responses/{response.id}", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert raw.status_code == 200 and raw.json() == {"id": response.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=MODEL, previous_response_id=response.id, input="more")
    assert err.value.body is not None and err.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_item_reference_brings_back_a_stored_item(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="My name is Ada. Reply with exactly: noted")
    (user_item,) = client.responses.input_items.list(first.id).data
    referenced = client.responses.create(
        model=MODEL,
        store=False,
        input=[
            {"type": "item_reference", "id": user_item.id},
            {"role": "user", "content": "What is my name?"},
        ],
    )
    assert_same_prompt_as_resent(client, referenced, [])
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "msg_missing"}])
    assert err.value.body is not None and err.value.body["param"] == "input[0].id"  # type: ignore[index]


def test_a_stored_streamed_response_is_retrievable_once_completed(client: openai.OpenAI) -> None:
    completed = None
    with client.responses.stream(model=MODEL, input="Say hello") as stream:
        for event in stream:
            if event.type == "response.completed":
                completed = event.response
                # acknowledged: already stored when the client reads the completion event
                assert client.responses.retrieve(completed.id).status == "completed"
    assert completed is not None and completed.store is True
    stored = client.responses.retrieve(completed.id).model_dump(mode="json")["output"]
    assert (
        stored
        == completed.model_dump(
            mode="json", exclude={"output": {"__all__": {"content": {"__all__": {"parsed"}}}}}
        )["output"]
    )
