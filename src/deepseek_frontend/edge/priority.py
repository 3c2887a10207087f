"""How soon a request runs: its :class:`~deepseek_frontend.pipeline.request.Scheduling` -- priority,
service tier and deadline -- resolved once, before admission (``edge/route.py``).

**Priority** (higher is more important; the scale is generation.py's), the first that is given:

1. the ``x-request-priority`` header, else ``x-dynamo-request-priority`` (Dynamo's header, with
   Dynamo's meaning: an integer, higher first): any integer from ``MIN_PRIORITY`` to
   ``MAX_PRIORITY``;
2. the body's ``service_tier`` (the OpenAI APIs): ``priority`` is :data:`PRIORITY_TIER` (10),
   ``default`` and ``auto`` are :data:`DEFAULT_TIER` (0), ``flex`` is :data:`FLEX_TIER` (-10), and
   ``scale`` (OpenAI's reserved-capacity tier, which a self-hosted server has no separate capacity
   for) is ``default``. The Anthropic API's ``service_tier`` (``auto``, ``standard_only``: whether
   Anthropic's priority capacity may be used) is not read: it chooses nothing here, and a value a
   newer client sends is no reason to refuse it;
3. the API key's ``priority`` (keys/tenants.py);
4. 0, the default tier.

Then the key's ``max_priority`` caps it: a request asking for more gets the ceiling, and says so only
through the tier its answer reports. A request the server makes for a client (a batch line) runs at
its own priority (api/batches/execute.py: the lowest), whatever its body says.

The gaps between the tiers (10) equal SGLang's default ``--priority-scheduling-preemption-threshold``
(10, a strict ``>``): on a worker that schedules by priority the tiers reorder its queue, and a
request preempts a running one only across two tiers or more (priority over flex), or over a batch
line.

**Service tier** the answer reports (OpenAI's ``service_tier``, chat completions and Responses,
objects and chunks): the tier the effective priority falls in -- ``priority`` from
:data:`PRIORITY_TIER` up, ``default`` from 0 up, ``flex`` below (batch lines included).

**Deadline**: ``x-request-timeout-ms`` -- a positive integer of milliseconds, counted from when the
route began handling the request -- gives the event loop's time at which the budget runs out.

A header or tier that is not one of these is a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from starlette.datastructures import Headers

from deepseek_frontend.errors import RequestError
from deepseek_frontend.generation import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from deepseek_frontend.pipeline.request import DEFAULT_SCHEDULING, Scheduling

from .body import parse_json_object

__all__ = [
    "DEFAULT_TIER",
    "FLEX_TIER",
    "MAX_TIMEOUT_MS",
    "PRIORITY_HEADERS",
    "PRIORITY_TIER",
    "TIMEOUT_HEADER",
    "behalf_scheduling",
    "resolve_scheduling",
    "tier_of",
]

#: the headers a request's priority is read from, the first present wins
PRIORITY_HEADERS: Final = ("x-request-priority", "x-dynamo-request-priority")
#: the header of a request's time budget, in milliseconds from its arrival
TIMEOUT_HEADER: Final = "x-request-timeout-ms"
#: the longest budget taken (a day): more is a mistake in units, not a deadline
MAX_TIMEOUT_MS: Final = 86_400_000

#: the OpenAI service tiers on the priority scale
PRIORITY_TIER: Final = 10
DEFAULT_TIER: Final = DEFAULT_PRIORITY
FLEX_TIER: Final = -10
_OPENAI_TIERS: Final[Mapping[str, int]] = {
    "auto": DEFAULT_TIER,
    "default": DEFAULT_TIER,
    "scale": DEFAULT_TIER,
    "flex": FLEX_TIER,
    "priority": PRIORITY_TIER,
}
_TIER_FIELD: Final = b'"service_tier"'


def tier_of(priority: int) -> str:
    """The OpenAI ``service_tier`` an answer at ``priority`` reports."""
    if priority >= PRIORITY_TIER:
        return "priority"
    if priority >= DEFAULT_TIER:
        return "default"
    return "flex"


def _header_int(headers: Headers, name: str, low: int, high: int, meaning: str) -> int | None:
    raw = headers.get(name)
    if raw is None:
        return None
    text = raw.strip()
    try:
        value = int(text, 10)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        shown = text if len(text) <= 20 else text[:17] + "..."
        raise RequestError(
            f"{name}: must be an integer from {low} to {high} ({meaning}), got {shown!r}", param=name
        )
    return value


def _header_priority(headers: Headers) -> int | None:
    for name in PRIORITY_HEADERS:
        value = _header_int(headers, name, MIN_PRIORITY, MAX_PRIORITY, "higher is more important")
        if value is not None:
            return value
    return None


def _tier_priority(
    api: str, body: bytes, parsed: dict[str, object] | None
) -> tuple[int | None, dict[str, object] | None]:
    """The priority the body's ``service_tier`` asks for (None: none) and the body parsed, when it
    had to be to read it (a body that does not spell the field is not parsed here)."""
    if api == "anthropic":
        return None, parsed
    if parsed is None:
        if _TIER_FIELD not in body:
            return None, None
        parsed = parse_json_object(body)
    tier = parsed.get("service_tier")
    if tier is None:
        return None, parsed
    if not isinstance(tier, str) or tier not in _OPENAI_TIERS:
        raise RequestError(
            f"service_tier: must be one of {', '.join(map(repr, _OPENAI_TIERS))}, got {tier!r}"[:300],
            param="service_tier",
        )
    return _OPENAI_TIERS[tier], parsed


def resolve_scheduling(
    headers: Headers,
    api: str,
    body: bytes,
    parsed: dict[str, object] | None,
    default_priority: int | None,
    max_priority: int | None,
    arrival: float,
) -> tuple[Scheduling, dict[str, object] | None]:
    """A client request's scheduling (see the module docstring) and its body parsed, when reading
    ``service_tier`` parsed it (else ``parsed`` as given). ``api``: "openai" or "anthropic";
    ``default_priority`` / ``max_priority``: its key's (None: none); ``arrival``: the event loop's
    time the request arrived at. Raises ``RequestError`` (400) naming a bad header or tier."""
    budget = _header_int(
        headers, TIMEOUT_HEADER, 1, MAX_TIMEOUT_MS, "milliseconds from the request's arrival"
    )
    priority = _header_priority(headers)
    # read (and checked) even under a header, which wins: a wrong tier is a 400 either way
    tier, parsed = _tier_priority(api, body, parsed)
    if priority is None:
        priority = tier
    if priority is None:
        priority = default_priority if default_priority is not None else DEFAULT_PRIORITY
    if max_priority is not None and priority > max_priority:
        priority = max_priority
    if budget is None and priority == DEFAULT_PRIORITY:
        return DEFAULT_SCHEDULING, parsed
    return Scheduling(
        priority=priority,
        service_tier=tier_of(priority),
        deadline=arrival + budget / 1000 if budget is not None else None,
        budget_ms=budget,
    ), parsed


def behalf_scheduling(priority: int) -> Scheduling:
    """The scheduling of a request the server makes for a client (a batch line): its priority, no
    deadline (the batch's own window bounds it)."""
    return Scheduling(priority=priority, service_tier=tier_of(priority))
