"""The HTTP server: each protocol in its own package over the protocol-neutral pipeline.

Layout::

    serve_command.py   `deepseek-frontend serve`: run() (binding, processes, the app)
    serve_flags.py     the serve flags (add_arguments)
    config.py          ServerConfig: one model's resolved flags (family, context length, aliases, engine)
    fleet_config.py    --config FILE: several models and their API keys
    app.py             create_app(config) -> Starlette: routes, middlewares, lifespan
    served_model.py    ServedModel: one model's tokenizer, backend, pipeline, admission, metrics
    model_registry.py  which model a request's name means (per API key)
    reload.py          SIGHUP: the configuration swapped in without dropping a request
    info_routes.py     /v1/models, /health, /live, /metrics (per model)
    auth.py, tenants.py, rate_limits.py, limit_state.py
                       API keys at the edge: the key's tenant, its limits (shared across processes)
    openai/            /v1/chat/completions (chat.py over chat_request.py and chat_response.py),
                       /v1/completions (completions.py)
    anthropic/         /v1/messages and count_tokens: convert.py, events.py, routes.py
    responses/         /v1/responses: convert.py, events.py, routes.py
    adapters.py        what anthropic/ and responses/ share: ConvertedChat, to_chat_request, the driver
    event_stream.py    the named-event encoders' common part
    validation.py      field validators every protocol uses (RequestError, param = JSON path)
    http.py            FrontendState, get_state, served_model, FrontendApp
    route.py           api_route: body, model, the key's limits, admission, then the handler
    request_body.py, request_turns.py, tracking.py, streaming.py
                       reading bodies, the loop's turns, per-request bookkeeping, SSE responses
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
