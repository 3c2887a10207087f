"""The server's shared state and its Starlette app: what every route starts from.

* :class:`FrontendState` -- what the app holds at ``app.state.frontend``; :func:`get_state` finds it
  from a request.
* :func:`served_model` -- the model a request was routed to (``api/route.py`` routes it).
* :func:`new_request_id` -- a request's id, also its engine request id.
* :class:`FrontendApp` -- the Starlette app, which hands the server's own ``send`` to the event
  streams (``api/streaming.py``).

Reading and parsing request bodies is ``api/request_body.py``; the order requests take the event
loop's turns, ``api/request_turns.py``; per-request bookkeeping, ``api/tracking.py``; the endpoint
decorator, ``api/route.py``; SSE responses and disconnects, ``api/streaming.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

if TYPE_CHECKING:
    from deepseek_frontend._tracing import Tracer
    from deepseek_frontend.fleet.config import ServerConfig
    from deepseek_frontend.fleet.metrics import FrontendMetrics
    from deepseek_frontend.fleet.registry import ModelRegistry
    from deepseek_frontend.fleet.served_model import ServedModel
    from deepseek_frontend.keys.rate_limits import KeyUsageMetrics, RateLimiter
    from deepseek_frontend.keys.tenants import TenantTable
    from deepseek_frontend.pipeline.chat import ChatPipeline

    from .arrivals import ArrivalPacer
    from .body_readers import BodyReaders
    from .memory import MemoryReleaser
    from .turns import RecentHeads


@dataclass(slots=True)
class FrontendState:
    """Shared state of one server (``app.state.frontend``)."""

    #: the served models (api/model_registry.py); a reload swaps the registry, never edits it
    models: ModelRegistry
    #: the server's own metrics: requests not (yet) routed to a model, keys' usage, model_info
    metrics: FrontendMetrics
    extra: dict[str, Any] = field(default_factory=dict)
    #: bounds the requests whose body is still arriving, before admission (None: unlimited)
    body_readers: BodyReaders | None = None
    #: gives the memory of large requests back once they are done (None: left to the allocator)
    memory: MemoryReleaser | None = None
    #: heads of recent request bodies: a request that starts like one of them is served first
    recent_heads: RecentHeads | None = None
    #: paces the starts of cold requests (used by ``serve``'s HTTP protocol)
    arrivals: ArrivalPacer | None = None
    #: stored responses, conversations and kept reasoning (a ``state.StateStore``; opened by the lifespan)
    store: Any = None
    #: OpenTelemetry traces of requests (``_tracing.tracer_from_env``; None: tracing off)
    tracer: Tracer | None = None
    #: the API keys (api/tenants.py; None: no key needed)
    tenants: TenantTable | None = None
    #: the keys' request, token and concurrency limits (api/rate_limits.py)
    limiter: RateLimiter | None = None
    #: the keys' usage counters in ``metrics``
    key_usage: KeyUsageMetrics | None = None
    #: what the server was configured with (api/fleet_config.py); a reload replaces it
    fleet: Any = None

    @property
    def config(self) -> ServerConfig:
        """The server-wide settings (the first model's configuration, whose server fields every
        model shares)."""
        return self.models.default.config

    @property
    def pipeline(self) -> ChatPipeline:
        """The first model's pipeline (its loop turns and offload threads are every model's)."""
        return self.models.default.pipeline


def get_state(request: Request) -> FrontendState:
    app = request.scope["app"]
    # FrontendApp's attribute first: Starlette's State resolves attributes in Python
    state = getattr(app, "frontend", None)
    return state if state is not None else app.state.frontend


def new_request_id(prefix: str = "chatcmpl") -> str:
    """``<prefix>-<32 hex>``: unique per request; also the engine request id."""
    return f"{prefix}-{os.urandom(16).hex()}"  # what uuid4().hex carries, without building a UUID


#: where :func:`~.route.api_route` leaves the model a request was routed to (``request.state``)
MODEL_ATTR = "served_model"


def served_model(request: Request) -> ServedModel:
    """The model ``request`` was routed to (:func:`~.route.api_route`), or the server's first model."""
    model = getattr(request.state, MODEL_ATTR, None)
    return model if model is not None else get_state(request).models.default


#: where :class:`FrontendApp` puts the server's own ``send`` in the ASGI scope (read by
#: ``streaming.EventStreamResponse``)
RAW_SEND_KEY = "deepseek_frontend.raw_send"


class FrontendApp(Starlette):
    """The Starlette app, which also hands the server's own ``send`` to the responses in the scope.

    Starlette's error middlewares wrap ``send`` only to learn whether a response has started; an
    event stream sends its start through them and its body parts -- one per engine chunk, the
    hot path -- straight to the server (two Python calls less per chunk and stream).
    """

    #: the server's shared state (also ``app.state.frontend``), set by ``create_app``
    frontend: FrontendState | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[RAW_SEND_KEY] = send
        try:
            await super().__call__(scope, receive, send)
        finally:
            # uvicorn's ``send`` is a method of the request cycle, which holds this scope: left in
            # place, every request would be a reference cycle only the cyclic GC frees
            scope.pop(RAW_SEND_KEY, None)
