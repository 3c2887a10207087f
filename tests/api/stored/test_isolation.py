"""Two API keys on one server: each key's stored responses and conversations are its own, and
another key's ids are answered exactly as ids that do not exist (404)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.servers import Server

from .conftest import API_KEY, MODEL, sdk, start_stored

OTHER_KEY = "state-test-other-key"


@pytest.fixture(scope="module")
def two_key_server() -> Iterator[Server]:
    with start_stored("--api-key", OTHER_KEY) as server:
        yield server


def _not_found(call: object) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        call()  # type: ignore[operator]
    assert err.value.body is not None and err.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def test_another_key_gets_404_for_everything_stored(two_key_server: Server) -> None:
    alice, bob = sdk(two_key_server, API_KEY), sdk(two_key_server, OTHER_KEY)
    response = alice.responses.create(model=MODEL, input="My secret is 42. Reply with exactly: noted")
    background = alice.responses.create(model=MODEL, input="Say hello", background=True)
    (item,) = alice.responses.input_items.list(response.id).data
    conv = alice.conversations.create(items=[{"type": "message", "role": "user", "content": "private"}])
    (conv_item,) = alice.conversations.items.list(conv.id).data

    _not_found(lambda: bob.responses.retrieve(response.id))
    _not_found(lambda: bob.responses.input_items.list(response.id))
    _not_found(lambda: bob.responses.delete(response.id))
    _not_found(lambda: bob.responses.cancel(background.id))
    _not_found(lambda: bob.responses.create(model=MODEL, previous_response_id=response.id, input="secret?"))
    _not_found(lambda: bob.responses.create(model=MODEL, input=[{"type": "item_reference", "id": item.id}]))
    _not_found(lambda: bob.responses.create(model=MODEL, conversation=conv.id, input="secret?"))
    _not_found(lambda: bob.conversations.retrieve(conv.id))
    _not_found(lambda: bob.conversations.update(conv.id, metadata={"x": "y"}))
    _not_found(lambda: bob.conversations.items.list(conv.id))
    _not_found(lambda: bob.conversations.items.retrieve(conv_item.id, conversation_id=conv.id))
    _not_found(lambda: bob.conversations.items.create(conv.id, items=[{"role": "user", "content": "x"}]))
    _not_found(lambda: bob.conversations.items.delete(conv_item.id, conversation_id=conv.id))
    _not_found(lambda: bob.conversations.delete(conv.id))

    # nothing of the owner's changed, and the owner reaches all of it
    assert alice.responses.retrieve(response.id).id == response.id
    assert alice.conversations.retrieve(conv.id).metadata == {}
    assert [i.id for i in alice.conversations.items.list(conv.id).data] == [conv_item.id]
    chained = alice.responses.create(model=MODEL, previous_response_id=response.id, input="secret?")
    assert chained.status == "completed"
    # the other key stores for itself
    own = bob.responses.create(model=MODEL, input="hello")
    assert bob.responses.retrieve(own.id).id == own.id
    _not_found(lambda: alice.responses.retrieve(own.id))


def test_both_keys_are_accepted_and_others_refused(two_key_server: Server) -> None:
    for key in (API_KEY, OTHER_KEY):
        r = httpx.get(two_key_server.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
    r = httpx.get(two_key_server.url + "/v1/models", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
