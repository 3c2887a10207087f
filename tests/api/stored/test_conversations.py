"""The Conversations API and ``conversation`` on /v1/responses, over the official openai SDK."""

from __future__ import annotations

import openai
import pytest

from .conftest import MODEL, assert_same_prompt_as_resent


def test_conversation_lifecycle(client: openai.OpenAI) -> None:
    conv = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}], metadata={"topic": "names"}
    )
    assert (
        conv.id.startswith("conv_") and conv.object == "conversation" and conv.metadata == {"topic": "names"}
    )
    assert client.conversations.retrieve(conv.id).model_dump() == conv.model_dump()
    added = client.conversations.items.create(
        conv.id,
        items=[
            {"type": "message", "role": "assistant", "content": "Hello Ada."},
            {"type": "message", "role": "user", "content": "Hi."},
        ],
    )
    assert len(added.data) == 2 and not added.has_more
    listed = client.conversations.items.list(conv.id, order="asc")
    texts = [item.content[0].text for item in listed.data]  # type: ignore[union-attr]
    assert texts == ["My name is Ada.", "Hello Ada.", "Hi."]
    newest = client.conversations.items.list(conv.id, limit=1)  # newest first by default
    assert newest.data[0].id == listed.data[-1].id and newest.has_more
    item = client.conversations.items.retrieve(listed.data[1].id, conversation_id=conv.id)
    assert item.id == listed.data[1].id
    after_delete = client.conversations.items.delete(listed.data[1].id, conversation_id=conv.id)
    assert after_delete.id == conv.id
    assert [i.id for i in client.conversations.items.list(conv.id, order="asc").data] == [
        listed.data[0].id,
        listed.data[2].id,
    ]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(listed.data[1].id, conversation_id=conv.id)
    updated = client.conversations.update(conv.id, metadata={"topic": "other"})
    assert updated.metadata == {"topic": "other"}
    deleted = client.conversations.delete(conv.id)
    assert deleted.deleted is True and deleted.id == conv.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list(conv.id)


def test_responses_in_a_conversation_read_and_extend_it(client: openai.OpenAI) -> None:
    conv = client.conversations.create()
    first = client.responses.create(
        model=MODEL, conversation=conv.id, input="My name is Ada. Reply with exactly: noted"
    )
    assert first.conversation is not None and first.conversation.id == conv.id
    items = client.conversations.items.list(conv.id, order="asc").data
    # the input, then the response's output items
    assert [i.id for i in items][1:] == [o.id for o in first.output]
    assert items[0].type == "message" and items[0].role == "user"  # type: ignore[union-attr]
    second = client.responses.create(model=MODEL, conversation={"id": conv.id}, input="What is my name?")
    assert_same_prompt_as_resent(client, second, first.output)
    assert len(client.conversations.items.list(conv.id, limit=100).data) == 2 + len(first.output) + len(
        second.output
    )


def test_conversation_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=MODEL, conversation="conv_missing", input="hi")
    assert err.value.body is not None and err.value.body["param"] == "conversation"  # type: ignore[index]
    first = client.responses.create(model=MODEL, input="hi")
    conv = client.conversations.create()
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, conversation=conv.id, previous_response_id=first.id, input="x")
    with pytest.raises(openai.BadRequestError) as err:
        client.conversations.create(metadata={f"k{i}": "v" for i in range(17)})
    assert err.value.body is not None and err.value.body["param"] == "metadata"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        client.conversations.items.create(conv.id, items=[{"role": "user", "content": "x"}] * 21)
    assert err.value.body is not None and err.value.body["param"] == "items"  # type: ignore[index]
