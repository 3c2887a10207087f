"""The wire protocols: each API's requests mapped into the pipeline's ``ChatRequest``, and the
pipeline's events back into that API's responses, chunks and errors.

Layout::

    openai/            /v1/chat/completions (chat.py over chat_request.py and chat_response.py),
                       /v1/completions (completions.py)
    anthropic/         /v1/messages and count_tokens: convert.py, events.py, routes.py, hidden_thinking.py
    responses/         /v1/responses: convert.py, events.py, routes.py; stored responses: stateful.py,
                       stored_routes.py, background.py
    conversations/     /v1/conversations and their items
    adapters.py        what anthropic/ and responses/ share: ConvertedChat, to_chat_request, the driver
    event_stream.py    the named-event encoders' common part
    validation.py      field validators every protocol uses (RequestError, param = JSON path)
    schemas.py         JSON Schema checks of the schemas clients send (tools, response formats)
    stored.py          what the stored-object endpoints share: the store and owner, 404s, list pages
    continuity.py      reasoning a client dropped, restored from the store

One request's way in and out of a handler (its id, body, model, key limits, admission, tracking,
SSE) is :mod:`deepseek_frontend.edge`; the server process that composes these routes,
:mod:`deepseek_frontend.server`.
"""
