"""Bounding the requests whose body is still arriving: :class:`BodyReaders`, apart from admission."""

from __future__ import annotations

from deepseek_frontend.errors import FrontendError, OverloadedError
from deepseek_frontend.fleet.admission import QUEUE_TIMEOUT_S, Admission

#: requests whose body is still arriving, at once per frontend, and per client address
MAX_BODY_READERS = 512
MAX_BODY_READERS_PER_CLIENT = 32


class BodyReaders:
    """Bounds the requests whose body is still arriving, apart from :class:`Admission`.

    A request takes no admission slot while its body arrives (a client trickling a byte a second
    would hold it for the whole body timeout, and a thousand such clients would turn every other
    request into a 429). A body that is not complete at its first read takes a reader slot here
    instead: at most ``max_per_client`` per client address, then ``max_total`` in all, each with a
    FIFO waiting room of the same size bounded by ``queue_timeout_s``; past them the request is
    refused with a 429 (``Retry-After``). So slow bodies from one address cost that address, and a
    body that arrives whole with its headers -- almost every request -- never waits here.
    ``rejected`` counts refusals. Event loop only.
    """

    __slots__ = ("_clients", "max_per_client", "queue_timeout_s", "rejected", "total")

    def __init__(
        self,
        max_total: int = MAX_BODY_READERS,
        max_per_client: int = MAX_BODY_READERS_PER_CLIENT,
        queue_timeout_s: float = QUEUE_TIMEOUT_S,
    ) -> None:
        self.total = Admission(max_total, max_total, queue_timeout_s)
        self.max_per_client = max(1, max_per_client)
        self.queue_timeout_s = queue_timeout_s
        self.rejected = 0
        #: one Admission per client address with a body arriving (dropped when idle: bounded by connections)
        self._clients: dict[str, Admission] = {}

    @property
    def active(self) -> int:
        """Bodies being read now."""
        return self.total.active

    def clients(self) -> int:
        """Client addresses with a body arriving or waiting to be read."""
        return len(self._clients)

    async def enter(self, client: str) -> FrontendError | None:
        """Take a reader slot for ``client`` (waiting in its bounded queue); the refusal is returned."""
        per = self._clients.get(client)
        if per is None:
            per = self._clients[client] = Admission(
                self.max_per_client, self.max_per_client, self.queue_timeout_s
            )
        try:
            refusal = await per.enter()
        except BaseException:
            self._forget_if_idle(client, per)
            raise
        if refusal is not None:
            self._forget_if_idle(client, per)
            self.rejected += 1
            return OverloadedError(
                f"this client address is sending {per.active} request bodies at once, the most it may, "
                f"and {per.queued} more wait; retry after {per.retry_after_s} s",
                retry_after_s=per.retry_after_s,
            )
        try:
            refusal = await self.total.enter()
        except BaseException:
            self._leave_client(client, per)
            raise
        if refusal is not None:
            self._leave_client(client, per)
            self.rejected += 1
        return refusal

    def leave(self, client: str) -> None:
        """Give back the slot :meth:`enter` took for ``client``."""
        self.total.release()
        per = self._clients.get(client)
        if per is not None:
            self._leave_client(client, per)

    def _leave_client(self, client: str, per: Admission) -> None:
        per.release()
        self._forget_if_idle(client, per)

    def _forget_if_idle(self, client: str, per: Admission) -> None:
        if per.active == 0 and per.queued == 0 and self._clients.get(client) is per:
            del self._clients[client]
