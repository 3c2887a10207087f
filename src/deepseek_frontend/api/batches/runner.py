"""The batch runner of one process: it shares the batches in the state store with every other
process and replica, through leases.

Each round (:meth:`BatchRunner._round`) it leases and does one piece of batch-level work
(``lifecycle.py``: read a file into lines, finish a batch), then claims as many pending lines as it
has free slots (``--batch-concurrency``) and runs each in a task of its own through its endpoint's
route (``execute.py``), at the lowest priority. Rounds follow each other at once while there is
work, else every :data:`POLL_S` seconds or when this process creates or cancels a batch.

Beside the rounds, every :data:`WATCH_S` seconds the runner looks at the batches of the lines it
runs: a line whose batch was cancelled or expired (by any replica) is stopped -- its engine request
aborted -- and every third of the lease it renews its leases; a line whose lease was taken over
(this process stalled for a whole lease) is stopped too, and only its new holder's result counts.

A result is written once (``state.finish_line``). A process killed mid-line leaves its leases to
run out; the lines then run again elsewhere, and only lines without a result ever run again. A
process shutting down gives its lines back at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import orjson

from deepseek_frontend.edge.context import FrontendState
from deepseek_frontend.fleet.batch_config import BatchOptions
from deepseek_frontend.state import ClaimedLine, LineResult, new_id

from .execute import MAX_CLAIMS, call_route, classify
from .lifecycle import do_batch_work
from .results import endpoint_result

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from deepseek_frontend.keys.tenants import Tenant

__all__ = ["POLL_S", "WATCH_S", "BatchRunner"]

log = logging.getLogger("deepseek_frontend.batches")

#: seconds between rounds when there is no work (a batch created elsewhere is seen this late)
POLL_S = 1.0
#: seconds between looks at the batches of the running lines (a cancel elsewhere stops them this late)
WATCH_S = 1.0
#: seconds a line waits before its next run after the server was busy (doubled per retry, capped)
RETRY_S = 1.0
MAX_RETRY_S = 30.0


class BatchRunner:
    """Runs batch work in this process; see the module docstring. Event loop only."""

    def __init__(self, state: FrontendState, app: ASGIApp, router: ASGIApp, options: BatchOptions) -> None:
        self.state = state
        self.app = app
        self.router = router
        self.options = options
        #: this process's name in the leases it holds (unique per start)
        self.holder = new_id("runner")
        #: (batch, line) -> (claim, task) of the lines running here
        self.running: dict[tuple[str, int], tuple[str, asyncio.Task[None]]] = {}
        self._wake = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._closing = False

    @property
    def enabled(self) -> bool:
        return self.options.concurrency > 0 and self.state.store.enabled

    def start(self) -> None:
        """Start the rounds and the watch (nothing with ``--batch-concurrency 0`` or no store)."""
        if self.enabled and not self._loops:
            self._loops = [asyncio.create_task(self._rounds()), asyncio.create_task(self._watch())]

    def wake(self) -> None:
        """Run a round now (a batch was created or cancelled here)."""
        self._wake.set()

    async def cancel_local(self, batch_id: str) -> None:
        """Stop this process's lines of ``batch_id`` now (it was cancelled here; other processes stop
        theirs within :data:`WATCH_S`)."""
        tasks = [task for (bid, _), (_, task) in list(self.running.items()) if bid == batch_id]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self.wake()

    async def aclose(self) -> None:
        """Stop: the rounds end, running lines are cancelled and given back (another process or the
        next start runs them at once, without waiting for the leases to run out)."""
        self._closing = True
        for loop in self._loops:
            loop.cancel()
        tasks = [task for _, task in self.running.values()]
        for task in [*self._loops, *tasks]:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self._loops = []
        if self.enabled:
            with contextlib.suppress(Exception):
                await self.state.store.release_lines(self.holder)

    # ---------------------------------------------------------------- rounds
    async def _rounds(self) -> None:
        while True:
            busy = False
            try:
                busy = await self._round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch runner round failed; retrying in %g s", POLL_S)
            if busy:
                await asyncio.sleep(0)
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_S):
                    await self._wake.wait()

    async def _round(self) -> bool:
        """One piece of batch-level work and a claim of lines; whether there may be more to do now."""
        store = self.state.store
        lease = self.options.lease_s
        now = store.now()
        batch = await store.claim_batch_work(self.holder, now, now + lease)
        if batch is not None:
            await do_batch_work(store, batch, self.holder, lease)
        free = self.options.concurrency - len(self.running)
        claimed: list[ClaimedLine] = []
        if free > 0:
            claim = new_id("claim")
            now = store.now()
            claimed = await store.claim_lines(self.holder, claim, now, now + lease, free)
            for line in claimed:
                task = asyncio.create_task(self._run_line(line, claim))
                self.running[(line.batch_id, line.line)] = (claim, task)
        return batch is not None or (bool(claimed) and len(self.running) < self.options.concurrency)

    # ---------------------------------------------------------------- lines
    def _tenant(self, line: ClaimedLine) -> tuple[Tenant | None, bool]:
        """The tenant the line's batch was created by, and whether it is still configured."""
        tenants = self.state.tenants
        if tenants is None:
            return None, True
        tenant = tenants.by_name(line.tenant)
        return tenant, tenant is not None

    async def _run_line(self, line: ClaimedLine, claim: str) -> None:
        store = self.state.store
        key = (line.batch_id, line.line)
        try:
            tenant, known = self._tenant(line)
            if not known:
                result = _key_gone(line)
            elif line.attempts > MAX_CLAIMS:
                result = _given_up(line)
            else:
                answer = await call_route(
                    self.app, self.router, line.url, line.body.encode(), tenant=tenant, owner=line.owner
                )
                verdict = classify(answer.status, line.attempts)
                if verdict != "result":
                    delay = min(MAX_RETRY_S, RETRY_S * 2 ** max(0, line.attempts - 1))
                    await store.release_line(
                        line.batch_id, line.line, claim, store.now() + delay, counted=verdict == "retry"
                    )
                    return
                result = endpoint_result(
                    line.api, line.line, line.custom_id, answer.status, answer.request_id, answer.body
                )
            if not await store.finish_line(line.batch_id, line.line, claim, result):
                log.info("batch %s line %d: its lease moved on; this run's result is dropped", *key)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch %s line %d failed to run; it runs again", *key)
            with contextlib.suppress(Exception):
                await store.release_line(line.batch_id, line.line, claim, store.now() + RETRY_S)
        finally:
            if self.running.get(key, (None,))[0] == claim:
                del self.running[key]
            if not self._closing:
                self.wake()

    # ---------------------------------------------------------------- watch
    async def _watch(self) -> None:
        store = self.state.store
        renew_every = self.options.lease_s / 3
        renewed = store.now()
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                running = dict(self.running)
                if not running:
                    renewed = store.now()
                    continue
                now = store.now()
                alive = await store.running_batches(sorted({bid for bid, _ in running}), now)
                held: set[tuple[str, int, str]] | None = None
                if now - renewed >= renew_every:
                    held = await store.renew_line_leases(self.holder, now + self.options.lease_s)
                    renewed = now
                for (bid, number), (claim, task) in running.items():
                    lost = held is not None and (bid, number, claim) not in held
                    if (bid not in alive or lost) and not task.done():
                        task.cancel()  # closes its engine stream: the engine request is aborted
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch runner watch failed; retrying in %g s", WATCH_S)


def _given_up(line: ClaimedLine) -> LineResult:
    """The result of a line claimed :data:`MAX_CLAIMS` times without a result: every process that
    ran it stopped before it finished."""
    message = (
        f"line {line.line} was started {line.attempts - 1} times and never finished; it is not run again"
    )
    error = {"message": message, "type": "api_error"}
    body: Any = (
        {"type": "error", "error": error} if line.api == "anthropic" else {"error": {**error, "code": None}}
    )
    return endpoint_result(line.api, line.line, line.custom_id, 500, "", orjson.dumps(body))


def _key_gone(line: ClaimedLine) -> LineResult:
    """The result of a line whose batch's API key is no longer configured (a reload removed it)."""
    message = "the API key that created this batch is no longer configured"
    error = {"message": message, "type": "authentication_error"}
    body: Any = (
        {"type": "error", "error": error}
        if line.api == "anthropic"
        else {"error": {**error, "param": None, "code": "invalid_api_key"}}
    )
    return endpoint_result(line.api, line.line, line.custom_id, 401, "", orjson.dumps(body))
