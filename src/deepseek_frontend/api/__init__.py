"""The HTTP server: each protocol in its own package over the protocol-neutral pipeline.

Layout::

    serve_command.py   `deepseek-frontend serve`: flags (add_arguments) and run()
    config.py          ServerConfig: resolved flags (family, context length, aliases, engine wiring)
    app.py             create_app(config) -> Starlette: routes, auth, lifespan, /health /live /metrics
    openai/            /v1/chat/completions (chat.py), /v1/completions (completions.py)
    anthropic/         /v1/messages and count_tokens: convert.py, events.py, routes.py
    responses/         /v1/responses: convert.py, events.py, routes.py
    adapters.py        what anthropic/ and responses/ share: ConvertedChat, to_chat_request, the driver
    event_stream.py    the named-event encoders' common part
    validation.py      field validators every protocol uses (RequestError, param = JSON path)
    http.py            shared plumbing: FrontendState, read_json, api_route, EventStreamResponse
    http_protocol.py   serve's HTTP/1.1 connection: header deadline, connection limit, JSON
                       parser errors, GET /live answered in the connection, warm requests first
    arrivals.py        ArrivalPacer: which arriving POSTs start at once (follow-ups of recent
                       conversations) and the pace at which the rest are started
    acceptor.py        serve's listening socket, accepted in bulk (FrontendServer: uvicorn's
                       Server with that acceptor)
    sse.py, errors.py  SSE framing and error bodies, one place each
    metrics.py, logs.py

The pipeline itself (ChatRequest -> PreparedRequest -> ChoiceStream -> PipelineChunk) is the
package :mod:`deepseek_frontend.pipeline`.
"""

from deepseek_frontend.api.app import create_app
from deepseek_frontend.api.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
