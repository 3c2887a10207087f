"""A served request leaves no reference cycle behind: its state is freed the moment it ends.

Under a burst every request's state that only the cyclic garbage collector can free -- the ASGI
cycle, its transport, tasks, a cancelled task's exception and traceback -- piles up between
collections and makes each collection longer, with the event loop (every stream, ``/live``)
stopped meanwhile: 30-odd such objects a request were measured before this was fixed. This runs
the real server stack as ``serve`` sets it up (its server with the bulk acceptor, the frontend's
HTTP protocol with warm-first arrivals, the app, the in-process simulated engine) in this process,
serves streamed and unstreamed chat completions, as new conversations and as follow-ups, and then
asks the collector what it would have had to free.
"""

from __future__ import annotations

import gc
import socket
import threading
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from deepseek_frontend.engines.config import EngineConfig
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
from deepseek_frontend.server.acceptor import FrontendServer
from deepseek_frontend.server.app import create_app
from deepseek_frontend.server.http_protocol import guarded_protocol
from tests.support.servers import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

#: types whose presence in the garbage means a request's state was kept by a reference cycle
REQUEST_STATE_TYPES = {"RequestResponseCycle", "DisconnectWatch", "TCPTransport", "Task", "CancelledError"}


@pytest.fixture(scope="module")
def server() -> Iterator[uvicorn.Server]:
    app = create_app(
        ServerConfig(ModelConfig(served_model_name="deepseek-v4-flash"), engine=EngineConfig(kind="sim"))
    )
    port = free_port()
    state = app.state.frontend
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        loop="auto",
        # as `serve` sets it up: warm-first arrivals, and the listening socket accepted in bulk
        http=guarded_protocol(
            header_timeout_s=10.0,
            max_connections=64,
            error_body=lambda _p, _e: b"{}",
            arrivals=state.arrivals,
            heads=state.recent_heads,
        ),
        access_log=False,
        log_level="warning",
        lifespan="on",
        log_config=None,
    )
    listening = socket.create_server(("127.0.0.1", port), backlog=64)
    server = FrontendServer(config, public=[listening])
    thread = threading.Thread(target=server.run, kwargs={"sockets": []}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=60, what="the in-process server to start")
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listening.close()


def _garbage_after(requests: int, server: uvicorn.Server, *, stream: bool, warm: bool) -> Counter[str]:
    url = f"http://127.0.0.1:{server.config.port}"
    # a long shared system prompt makes every request after the first start like a recent one
    # (warm: started at once, its answer marked); a short one makes each body new (cold: held)
    system = "You answer briefly. " * (300 if warm else 1)
    body = {
        "model": "deepseek-v4-flash",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Say something short."},
        ],
        "max_tokens": 8,
        "stream": stream,
    }
    gc.collect()
    for i in range(requests):
        # a new connection each time: each request then has its own transport and ASGI cycle
        with httpx.Client(base_url=url, timeout=30) as client:
            response = client.post("/v1/chat/completions", json={**body, "user": f"u{i}"})
            assert response.status_code == 200, response.text
            if stream:
                assert response.text.rstrip().endswith("data: [DONE]")
    # the server's loop finishes each request's tasks just after the client has its last byte
    state = server.server_state
    wait_until(
        lambda: not state.tasks and not state.connections, timeout=10, what="the server's requests to finish"
    )
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return Counter(type(obj).__name__ for obj in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("warm", [False, True], ids=["new-conversations", "follow-ups"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "unstreamed"])
def test_served_requests_leave_no_request_state_to_the_cyclic_collector(
    server: uvicorn.Server, stream: bool, warm: bool
) -> None:
    _garbage_after(3, server, stream=stream, warm=warm)  # first requests: lazily built state settles
    garbage = _garbage_after(40, server, stream=stream, warm=warm)
    arrivals = server.config.http_protocol_class.arrivals  # type: ignore[attr-defined]
    assert (arrivals.warm if warm else arrivals.cold) >= 40, arrivals  # the path under test was taken
    kept = {name: count for name, count in garbage.items() if name in REQUEST_STATE_TYPES}
    assert not kept, f"requests left reference cycles holding {kept} (all garbage: {garbage.most_common(12)})"
