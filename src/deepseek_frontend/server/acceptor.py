"""``serve``'s listening socket: pending connections accepted in bulk at each wake-up.

uvloop's own server accepts one connection per event-loop iteration: with 0.5 ms of other work
per iteration, 257 connections made at once are accepted over 150 ms (over 540 ms with 2 ms per
iteration), while asyncio's server and the loop below accept them in a handful of iterations
(``benchmarks/bench_accept.py``; docs/performance.md, "Accepting a burst"). Under a burst
every iteration carries the steps of the requests accepted before, so the last arrival -- often a
follow-up whose prompt is in the caches -- was accepted 100-180 ms after its client connected.

:class:`BulkAcceptor` watches the listening socket with ``loop.add_reader`` and, at each
wake-up, accepts until the kernel's queue is empty or ``per_wake`` (64) connections are in. The
reader stays ready, so the rest come at the next iteration, and one iteration never reads and
starts thousands of requests (with 2,048 per wake-up, ``/live`` during the 5,000-request burst test
had a p95 of 36 ms, against 21 ms with 64). Each socket goes to the loop's
``connect_accepted_socket`` with uvicorn's protocol factory: the connection is then what uvicorn's
server would have made. When the process is out of
file descriptors (or the kernel of buffers), accepting pauses for ``PAUSE_S`` instead of
spinning on a socket that stays readable, and the connections wait in the kernel's queue.

:class:`FrontendServer` is uvicorn's ``Server`` with its public sockets served this way; any
other socket it is given (``--workers N``'s private metrics socket) is served by uvicorn as usual.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

log = logging.getLogger("deepseek_frontend.api")

#: seconds accepting pauses when the process or the kernel is out of a resource (as asyncio's server)
PAUSE_S = 1.0
#: accept errors that say "out of a resource": pause rather than retry at once
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class BulkAcceptor:
    """Accepts up to ``per_wake`` pending connections of ``sock`` at each wake-up (module docstring).

    ``protocol_factory()`` makes each connection's protocol. ``start()`` begins watching,
    ``close()`` stops (the socket itself stays open: its owner closes it). ``accepted`` counts
    connections, ``paused`` the pauses for lack of a resource.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        per_wake: int = 64,
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.protocol_factory = protocol_factory
        self.per_wake = max(1, per_wake)
        self.accepted = 0
        self.paused = 0
        self._watching = False
        self._closed = False
        self._resume: asyncio.TimerHandle | None = None

    def start(self) -> BulkAcceptor:
        self.sock.setblocking(False)
        self._watch()
        return self

    def _watch(self) -> None:
        self._resume = None
        if not self._closed and not self._watching:
            self.loop.add_reader(self.sock.fileno(), self._accept_pending)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self.loop.remove_reader(self.sock.fileno())
            self._watching = False

    def close(self) -> None:
        """Stop accepting (connections already accepted are the server's to shut down)."""
        self._closed = True
        self._unwatch()
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None

    def _accept_pending(self) -> None:
        for _ in range(self.per_wake):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return  # the queue is empty
            except ConnectionAbortedError:
                continue  # the client gave up while it waited in the queue
            except OSError as exc:
                self.paused += 1
                level = logging.WARNING if exc.errno in _RESOURCE_ERRNOS else logging.ERROR
                log.log(level, "accepting connections paused for %g s: %s", PAUSE_S, exc)
                self._unwatch()
                self._resume = self.loop.call_later(PAUSE_S, self._watch)
                return
            self.accepted += 1
            self._hand_over(conn)

    def _hand_over(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            # what uvloop's and asyncio's own servers set: small SSE writes go out at once
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # ``connect_accepted_socket`` only waits for the protocol's ``connection_made``: it is
        # stepped here rather than given a task (and its context and loop steps) per connection
        self._step(conn, self.loop.connect_accepted_socket(self.protocol_factory, conn), None)

    def _step(self, conn: socket.socket, setup: Any, waited: asyncio.Future[Any] | None) -> None:
        try:
            if waited is not None and waited.cancelled():
                waiting = setup.throw(asyncio.CancelledError())
            else:
                waiting = setup.send(None)
        except StopIteration:
            return  # the connection is set up: its protocol serves it from here
        except (Exception, asyncio.CancelledError) as exc:  # a failed setup must not stop accepting
            log.warning("could not set up an accepted connection: %s", exc)
            conn.close()
            return
        if waiting is None:  # a bare yield (``asyncio.sleep(0)``): go on at the next iteration
            self.loop.call_soon(self._step, conn, setup, None)
        else:
            waiting.add_done_callback(functools.partial(self._step, conn, setup))


class FrontendServer(uvicorn.Server):
    """uvicorn's ``Server`` whose ``public`` listening sockets are served by :class:`BulkAcceptor`.

    ``run(sockets=...)`` serves the other sockets (if any) through uvicorn's own servers; the
    public ones start accepting once the application has started, and stop first at shutdown.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        public: list[socket.socket],
        slot: Any = None,
        probes: list[tuple[socket.socket, Any]] | None = None,
    ) -> None:
        super().__init__(config)
        self.public = public
        #: (socket, protocol class) of probe listeners (``serve --probe-port``), accepted the same way
        self.probes = probes or []
        #: ``serve --workers N``'s ProcessSlot: this process also accepts on a dead sibling's socket
        self.slot = slot
        self.acceptors: list[BulkAcceptor] = []
        self._standby: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets if sockets is not None else [])
        except SystemExit:
            # uvicorn exits (status 3) when the app's start-up failed; ``serve`` reports that
            # failure itself, as one line and status 2 (server/startup.py): return from ``run``
            self.should_exit = True
            return
        if self.should_exit:
            return
        loop = asyncio.get_running_loop()
        make_protocol = functools.partial(
            self.config.http_protocol_class,
            config=self.config,
            server_state=self.server_state,
            app_state=self.lifespan.state,
        )
        for sock in self.public:
            acceptor = BulkAcceptor(loop, sock, make_protocol)
            try:
                self.acceptors.append(acceptor.start())
            except NotImplementedError:  # a loop without add_reader (Windows' proactor): uvicorn's way
                server = await loop.create_server(make_protocol, sock=sock, backlog=self.config.backlog)
                self.servers.append(server)
        for sock, protocol_class in self.probes:
            make_probe = functools.partial(
                protocol_class,
                config=self.config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
            )
            self.acceptors.append(BulkAcceptor(loop, sock, make_probe).start())
        if self.slot is not None and self.acceptors:

            def adopt(sock: socket.socket) -> Callable[[], None]:
                acceptor = BulkAcceptor(loop, sock, make_protocol).start()
                self.acceptors.append(acceptor)
                return acceptor.close

            self.slot.mark_accepting()
            self._standby = loop.create_task(self.slot.watch_siblings(adopt))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._standby is not None:
            self._standby.cancel()
        for acceptor in self.acceptors:
            acceptor.close()
        await super().shutdown(sockets=sockets)
