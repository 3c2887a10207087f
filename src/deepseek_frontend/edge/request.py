"""One API request as its handler sees it: :class:`RequestContext`, resolved once at the edge.

``edge/route.py`` builds it for every request before the handler runs -- the request's id, the
server's state, the model the request was routed to, the tenant of its API key, its tracker, the
API it speaks and its body -- and the handler reads everything it needs from it rather than from
the server's state or the ASGI scope.

A request may also come from the server itself, on a client's behalf: a batch line run through
its endpoint's own route (api/batches/). Its scope then carries an :class:`OnBehalf` at
:data:`ON_BEHALF_KEY` -- whose stored objects it reads and writes, and its priority -- and the
route takes it from there (no API key is presented: the key's tenant is in the scope already).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from starlette.requests import Request

from deepseek_frontend.pipeline.request import DEFAULT_SCHEDULING, Scheduling
from deepseek_frontend.state import StateStore, owner_key

from .auth import presented_key
from .body import parse_json_object, take_prompt_turn
from .context import FrontendState
from .errors import ApiShape

if TYPE_CHECKING:
    from deepseek_frontend.fleet.served_model import ServedModel
    from deepseek_frontend.keys.tenants import Tenant

    from .tracking import RequestTracker

#: where the scope of a request made on a client's behalf carries its :class:`OnBehalf`
ON_BEHALF_KEY: Final = "deepseek_frontend.on_behalf"


@dataclass(frozen=True, slots=True)
class OnBehalf:
    """A request the server makes to its own route for a client (a batch line): the owner of
    what it stores and reads (``RequestContext.owner``), and the priority it runs at."""

    owner: str
    priority: int


def on_behalf(request: Request) -> OnBehalf | None:
    """The :class:`OnBehalf` of a request the server made itself, else None (a client's request)."""
    found = request.scope.get(ON_BEHALF_KEY)
    return found if isinstance(found, OnBehalf) else None


@dataclass(slots=True, eq=False)
class RequestContext:
    """What one API request is, resolved once at the edge (``edge/route.py``)."""

    #: the HTTP request (headers, path and query parameters, the client's disconnect)
    request: Request
    #: the request's id (``x-request-id``; also its engine request id, with suffixes per leg)
    id: str
    #: the server's shared state
    state: FrontendState
    #: the API the route speaks (its error shape and rate-limit headers)
    api: ApiShape
    #: the request's bookkeeping (counted and logged once, when it is done)
    tracker: RequestTracker
    #: the model the request was routed to (the one its body's ``model`` names, or the server's first)
    model: ServedModel
    #: the API key's tenant (None: the server checks no key)
    tenant: Tenant | None = None
    #: the body as received (empty for a request without one)
    body: bytes = b""
    #: the body parsed as a JSON object, once parsed (to route the request, or by :meth:`json`)
    parsed: dict[str, Any] | None = field(default=None, repr=False)
    #: its priority (higher first), service tier and deadline, resolved before admission
    #: (``edge/priority.py``): a client's from its headers, body and key; a request the server makes
    #: runs at the :class:`OnBehalf`'s priority (a batch line at the lowest)
    scheduling: Scheduling = DEFAULT_SCHEDULING

    @property
    def priority(self) -> int:
        """How important the request is (higher first)."""
        return self.scheduling.priority

    async def json(self) -> dict[str, Any]:
        """The body as a JSON object (``RequestError`` 400 for invalid JSON or a non-object body).

        First the request takes its loop turn for the prompt work (``edge/body.take_prompt_turn``),
        so a burst of requests is parsed, validated and prepared in turns, a follow-up of a recent
        conversation first.
        """
        state = self.state
        await take_prompt_turn(self.request, self.body, state.turns, state.recent_heads)
        if self.parsed is None:
            self.parsed = parse_json_object(self.body)
        return self.parsed

    @property
    def store(self) -> StateStore:
        """The server's state store (a ``NullStore`` under ``--state-store none``)."""
        return self.state.store

    @property
    def owner(self) -> str:
        """The owner of what the request stores or reads: a hash of the API key it presented (the
        auth middleware has checked it already, by the same rule: ``auth.presented_key``), or the
        anonymous owner when the server checks no key; for a request the server makes on a client's
        behalf, that client's owner."""
        behalf = on_behalf(self.request)
        if behalf is not None:
            return behalf.owner
        if self.state.tenants is None:
            return owner_key(None)
        key = presented_key(self.request.scope["headers"])
        # as Starlette decodes header values: the owners of stored objects stay what they were
        return owner_key(key.decode("latin-1") if key else None)
