"""The server's shared state, and the Starlette app that holds it: what every request starts from.

* :class:`FrontendState` -- what the app holds (``app.frontend``, also ``app.state.frontend``): the
  served models, the API keys and their limits, the state store, the server's own helpers. Every
  member is a typed field; the server (``server/app.py``) fills them once.
* :func:`get_state` -- the state of the app a request came to (``edge/route.py`` resolves it once
  per request into the request's :class:`~.request.RequestContext`).
* :func:`new_request_id` -- a request's id, also its engine request id.
* :class:`FrontendApp` -- the Starlette app, which hands the server's own ``send`` to the event
  streams (``edge/streaming.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from deepseek_frontend._random_ids import random_hex

if TYPE_CHECKING:
    from deepseek_frontend._tracing import Tracer
    from deepseek_frontend.fleet.config import ServerConfig
    from deepseek_frontend.fleet.config_file import Fleet
    from deepseek_frontend.fleet.metrics import FrontendMetrics
    from deepseek_frontend.fleet.registry import ModelRegistry
    from deepseek_frontend.images import ImageResolver
    from deepseek_frontend.keys.rate_limits import KeyUsageMetrics, RateLimiter
    from deepseek_frontend.keys.tenants import TenantTable
    from deepseek_frontend.pipeline.offload import LoopTurns
    from deepseek_frontend.state import StateStore
    from deepseek_frontend.state.continuity import ReasoningContinuity

    from .arrivals import ArrivalPacer
    from .background import BackgroundTasks
    from .body_readers import BodyReaders
    from .errors import ApiShape
    from .memory import MemoryReleaser
    from .turns import RecentHeads


class ProcessGroup(Protocol):
    """This process's place among the ``serve --workers N`` processes (``server/processes.py``)."""

    async def sibling_metrics(self, own: bytes) -> bytes:
        """Every process's metrics, this one's (``own``) merged with the others'."""
        ...


class BatchWork(Protocol):
    """This process's batch runner, as the batch endpoints reach it (``api/batches/runner.py``)."""

    def wake(self) -> None:
        """Look for batch work now (a batch was created here)."""
        ...

    async def cancel_local(self, batch_id: str) -> None:
        """Stop this process's lines of a batch that was just cancelled."""
        ...


@dataclass(slots=True, eq=False)
class FrontendState:
    """Shared state of one server (``app.frontend``)."""

    #: the served models (fleet/registry.py); a reload swaps the registry, never edits it
    models: ModelRegistry
    #: the server's own metrics: requests not (yet) routed to a model, keys' usage, model_info
    metrics: FrontendMetrics
    #: stored responses, conversations and kept reasoning (opened by the app's lifespan)
    store: StateStore
    #: resolves the image parts of requests (images.py)
    images: ImageResolver
    #: the event loop's turns every model's prompt work takes (one loop per process)
    turns: LoopTurns
    #: this process's background work (background responses), stopped when the server shuts down
    background: BackgroundTasks
    #: reasoning of tool-calling answers, kept in ``store`` to restore what a client drops
    continuity: ReasoningContinuity
    #: when the server started (Unix seconds; ``created`` of /v1/models)
    started_at: int
    #: bounds the requests whose body is still arriving, before admission (None: unlimited)
    body_readers: BodyReaders | None = None
    #: gives the memory of large requests back once they are done (None: left to the allocator)
    memory: MemoryReleaser | None = None
    #: heads of recent request bodies: a request that starts like one of them is served first
    recent_heads: RecentHeads | None = None
    #: paces the starts of cold requests (used by ``serve``'s HTTP protocol)
    arrivals: ArrivalPacer | None = None
    #: OpenTelemetry traces of requests (``_tracing.tracer_from_env``; None: tracing off)
    tracer: Tracer | None = None
    #: the API keys (keys/tenants.py; None: no key needed)
    tenants: TenantTable | None = None
    #: the keys' request, token and concurrency limits (keys/rate_limits.py)
    limiter: RateLimiter | None = None
    #: the keys' usage counters in ``metrics``
    key_usage: KeyUsageMetrics | None = None
    #: what the server was configured with (fleet/config_file.py); a reload replaces it
    fleet: Fleet | None = None
    #: which paths belong to an API other than OpenAI's (path prefix, its shape): errors answered
    #: before a handler runs take that API's shape (``edge/errors.shape_for``)
    api_shapes: tuple[tuple[str, ApiShape], ...] = ()
    #: this process among ``serve --workers N`` (None: a single process)
    process_group: ProcessGroup | None = None
    #: the HTTP protocol's counters (``server/http_protocol.py``; None: not served by ``serve``)
    connection_stats: dict[str, int] | None = None
    #: the HTTP protocol's connection counts (``open`` among them; None: not served by ``serve``)
    connection_counts: dict[str, int] | None = None
    #: this process's batch runner (None: batches are run by other processes only, or not at all)
    batch_runner: BatchWork | None = None

    @property
    def config(self) -> ServerConfig:
        """The server-wide settings (the first model's configuration, whose server fields every
        model shares)."""
        return self.models.default.config


def get_state(request: Request) -> FrontendState:
    """The state of the app ``request`` came to."""
    app = request.scope["app"]
    # FrontendApp's attribute first: Starlette's State resolves attributes in Python
    state: FrontendState | None = app.frontend if isinstance(app, FrontendApp) else None
    return state if state is not None else app.state.frontend  # type: ignore[no-any-return]


def new_request_id(prefix: str = "chatcmpl") -> str:
    """``<prefix>-<32 hex>``: unique per request; also the engine request id."""
    return f"{prefix}-{random_hex(16)}"  # what uuid4().hex carries (see _random_ids: no system call each)


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
        # a wrapper of the server's ``send`` that only watches the response's start may have put
        # the server's own here already (server/http_protocol.py)
        scope.setdefault(RAW_SEND_KEY, send)
        try:
            await super().__call__(scope, receive, send)
        finally:
            # uvicorn's ``send`` is a method of the request cycle, which holds this scope: left in
            # place, every request would be a reference cycle only the cyclic GC frees
            scope.pop(RAW_SEND_KEY, None)
