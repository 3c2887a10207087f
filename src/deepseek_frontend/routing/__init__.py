"""Routing requests over many workers: KV-cache aware, session affinity, migration.

::

    hashing.py     chained block hashes of prompt ids; PrefixHashCache (incremental, per conversation)
    index.py       KvIndex: which worker / DP rank holds which blocks (events and predictions), capped
    discovery.py   a worker's ranks, event and load endpoints, block size, SWA gating from /server_info
    events.py      SGLang / vLLM KV event batches on the wire (msgpack), decode + encode
    subscriber.py  ZMQ subscriber per worker rank: ordering, gaps, replay, restarts, bounded slices
    load.py        SGLang's per-rank load publisher (LoadStat)
    swa.py         DeepSeek-V4's sliding-window cache: which hits are real
    session.py     the agent session from request headers (context variable + ASGI middleware)
    router.py      Router: --router-mode kv | kv-approx | session | least-outstanding | round-robin
    migration.py   continuing a broken stream on another worker

The pool (:mod:`deepseek_frontend.engines.pool`) asks the router to choose among the workers
it admits and reports each request's start and end; everything else lives here. See
docs/routing.md.
"""

from deepseek_frontend.routing.hashing import PrefixHashCache, block_hashes
from deepseek_frontend.routing.index import KvIndex
from deepseek_frontend.routing.router import ROUTER_MODES, Router, RouterConfig, RouterMode, RouteTicket
from deepseek_frontend.routing.session import SessionMiddleware, current_session, use_session

__all__ = [
    "ROUTER_MODES",
    "KvIndex",
    "PrefixHashCache",
    "RouteTicket",
    "Router",
    "RouterConfig",
    "RouterMode",
    "SessionMiddleware",
    "block_hashes",
    "current_session",
    "use_session",
]
