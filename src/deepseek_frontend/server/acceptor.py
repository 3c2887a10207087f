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

An acceptor can be told whether to take the next connection (``admits``): ``serve --workers N``
balances connections over its processes that way (server/processes.py). Connections left in the
queue are looked at again ``DEFER_S`` later, not at every iteration of a loop whose socket stays
readable (500 looks a second at most: about 1% of a core while a stopped sibling's queue is
full); with ``patience_s`` the acceptor takes them anyway once it has left them queued that long
(the sibling meant to take them is stopped or busy).

:class:`FrontendServer` is uvicorn's ``Server`` with its public sockets served this way; any
other socket it is given (``--workers N``'s private metrics socket) is served by uvicorn as usual.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import select
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

from .processes import HEARTBEAT_S

log = logging.getLogger("deepseek_frontend.api")

#: seconds accepting pauses when the process or the kernel is out of a resource (as asyncio's server)
PAUSE_S = 1.0
#: seconds before connections an acceptor declined are looked at again
DEFER_S = 0.002
#: seconds a process leaves its own socket's connections to a lighter sibling before taking them
#: itself (a sibling whose loop stopped is not left any: server/processes.py)
PATIENCE_S = 0.3
#: accept errors that say "out of a resource": pause rather than retry at once
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class BulkAcceptor:
    """Accepts up to ``per_wake`` pending connections of ``sock`` at each wake-up (module docstring).

    ``protocol_factory()`` makes each connection's protocol. ``admits(n)``, when given, says
    whether to take the next connection, ``n`` being those taken at this wake-up so far;
    ``patience_s``: seconds after which declined connections are taken anyway (None: never).
    ``start()`` begins watching, ``close()`` stops (the socket itself stays open: its owner
    closes it). ``accepted`` counts connections, ``paused`` the pauses for lack of a resource,
    ``declined`` the wake-ups that left connections queued.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        per_wake: int = 64,
        admits: Callable[[int], bool] | None = None,
        patience_s: float | None = None,
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.protocol_factory = protocol_factory
        self.per_wake = max(1, per_wake)
        self.admits = admits
        self.patience_s = patience_s
        self.accepted = 0
        self.paused = 0
        self.declined = 0
        self._watching = False
        self._closed = False
        self._resume: asyncio.TimerHandle | None = None
        #: loop time of the first decline of connections still queued (None: none declined)
        self._declined_at: float | None = None
        self._poll: select.poll | None = None

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

    def _admitted(self, taken: int) -> bool:
        """Whether to take the next connection now (else the wake-up ends and a look is scheduled)."""
        if self.admits is None or self.admits(taken):
            self._declined_at = None
            return True
        now = self.loop.time()
        if self._declined_at is None:
            self._declined_at = now
        elif self.patience_s is not None and now - self._declined_at >= self.patience_s:
            return True  # left long enough: taken until the queue is empty
        self.declined += 1
        self._unwatch()
        self._resume = self.loop.call_later(DEFER_S, self._look_again)
        return False

    def _look_again(self) -> None:
        if self._declined_at is not None and not self._queued():
            self._declined_at = None  # the queue emptied meanwhile (a sibling took its connections)
        self._watch()

    def _queued(self) -> bool:
        """Whether connections wait in the socket's queue (a poll that does not wait)."""
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.sock.fileno(), select.POLLIN)
        return bool(self._poll.poll(0))

    def _accept_pending(self) -> None:
        for taken in range(self.per_wake):
            if not self._admitted(taken):
                return
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                self._declined_at = None
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
        public_protocol: Any = None,
    ) -> None:
        super().__init__(config)
        #: the protocol class of the public sockets' connections (None: ``config``'s)
        self.public_protocol = public_protocol
        self.public = public
        #: (socket, protocol class) of probe listeners (``serve --probe-port``), accepted the same way
        self.probes = probes or []
        #: ``serve --workers N``'s ProcessSlot: connections balanced with the siblings, and a dead
        #: sibling's socket accepted here
        self.slot = slot
        self.acceptors: list[BulkAcceptor] = []
        self._heartbeat: asyncio.TimerHandle | None = None

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
            self.public_protocol or self.config.http_protocol_class,
            config=self.config,
            server_state=self.server_state,
            app_state=self.lifespan.state,
        )
        slot = self.slot
        for sock in self.public:
            acceptor = BulkAcceptor(
                loop,
                sock,
                make_protocol,
                # balanced with the siblings (server/processes.py)
                admits=slot.admits_own if slot is not None else None,
                patience_s=PATIENCE_S if slot is not None else None,
            )
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
        if slot is not None and self.acceptors:
            self._beat()
            slot.mark_accepting()
            # a sibling's socket: taken over while it is down, helped while it holds more connections
            for index, sock in slot.siblings.items():
                admits = functools.partial(slot.admits_from, index)
                self.acceptors.append(BulkAcceptor(loop, sock, make_protocol, admits=admits).start())

    def _beat(self) -> None:
        self.slot.beat()
        self._heartbeat = asyncio.get_running_loop().call_later(HEARTBEAT_S, self._beat)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        for acceptor in self.acceptors:
            acceptor.close()
        await super().shutdown(sockets=sockets)
