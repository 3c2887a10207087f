"""The HTTP server: OpenAI (and, when present, Anthropic / Responses) APIs over the serving pipeline.

Layout::

    serve_command.py   `deepseek-frontend serve`: flags (add_arguments) and run()
    config.py          ServerConfig: resolved flags (family, context length, aliases, engine wiring)
    app.py             create_app(config) -> Starlette: routes, auth, lifespan, /health /live /metrics
    pipeline.py        protocol-neutral core: ChatRequest -> PreparedRequest -> ChoiceStream -> PipelineChunk
    openai_chat.py     /v1/chat/completions: mapping, chunk bytes, non-stream response
    completions.py     /v1/completions: raw prompt / token-id passthrough
    validation.py      field validators every protocol uses (RequestError, param = JSON path)
    http.py            shared plumbing: FrontendState, read_json, api_route, EventStreamResponse
    sse.py, errors.py  SSE framing and error bodies, one place each
    stop.py            frontend stop strings with hold-back across chunks
    metrics.py, logs.py

Protocol adapters (``anthropic*.py``, ``responses*.py``) map their JSON onto a
``ConvertedChat`` and render the same ``PipelineChunk`` stream as named events; what they
share (``ConvertedChat``, ``to_chat_request``, the endpoint driver) is ``adapters.py``, the
encoders' common part ``event_stream.py``. ``app.py`` mounts their ``ROUTES``.
"""

from deepseek_frontend.api.app import create_app
from deepseek_frontend.api.config import ServerConfig
from deepseek_frontend.api.pipeline import (
    ChatPipeline,
    ChatRequest,
    ChoiceAccumulator,
    ChoiceStream,
    PipelineChunk,
    PreparedRequest,
    StreamEnd,
    Usage,
)

__all__ = [
    "ChatPipeline",
    "ChatRequest",
    "ChoiceAccumulator",
    "ChoiceStream",
    "PipelineChunk",
    "PreparedRequest",
    "ServerConfig",
    "StreamEnd",
    "Usage",
    "create_app",
]
