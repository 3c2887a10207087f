"""Sending one request through a worker pool: choosing its worker, retrying before the first chunk,
checking the output, and continuing a broken stream elsewhere.

Routing: each request goes to an admitted worker; with a ``router``
(:class:`~deepseek_frontend.routing.Router`: KV-cache aware, session affinity, ...) the router
chooses among the admitted workers and is told of each request's start, first token and end;
without one, the worker with the fewest in-flight requests, ties rotated.

Retry: a failure before the first chunk moves the request to another worker (at most
``max_attempts``); after it nothing is retried -- the client has seen tokens -- and the error
propagates. Output is checked (:class:`OutputChecker`): ids outside the vocabulary and chunks the
client cannot read are the worker's fault, output past ``max_new_tokens`` is cut (finish ``length``).

Migration: with ``migration_limit`` > 0, a stream that breaks after its first chunk continues on
another worker with the prompt plus the tokens generated so far (never for grammar-constrained
requests; see :mod:`deepseek_frontend.routing.migration`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Collection
from typing import TYPE_CHECKING

from deepseek_frontend import _tracing
from deepseek_frontend.engines.base import EngineClient
from deepseek_frontend.engines.limits import Slot, StreamLimits, Watch
from deepseek_frontend.engines.workers import Worker
from deepseek_frontend.errors import (
    EngineStreamError,
    EngineTimeoutError,
    EngineUnavailableError,
    FrontendError,
    NoHealthyWorkerError,
    WorkerSilentError,
    WorkersStartingError,
)
from deepseek_frontend.generation import ConstraintKind, EngineChunk, GenerateRequest

if TYPE_CHECKING:
    from deepseek_frontend.routing.router import Router

__all__ = ["SETTLE_TIMEOUT_S", "Dispatch", "OutputChecker", "settle", "with_rank"]

#: the pool's log lines keep one logger name, whichever of its modules holds the code
logger = logging.getLogger("deepseek_frontend.engines.pool")


#: seconds a finished stream may take to deliver its end marker (``[DONE]``) before it is closed
SETTLE_TIMEOUT_S = 0.05


async def settle(stream: AsyncIterator[EngineChunk]) -> None:
    """Let a client read what follows its finish chunk (``[DONE]``), briefly.

    The consumer closes the stream as soon as it has the last chunk; an HTTP response closed with
    unread bytes loses its keep-alive connection, and a frontend would then open a new TCP
    connection to the worker for every request (a quarter of its CPU under a burst). Nothing the
    stream yields here is used: output after the finish chunk does not count.
    """
    with contextlib.suppress(Exception):
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            await anext(stream)


def with_rank(request: GenerateRequest, rank: int | None) -> GenerateRequest:
    """``request`` with the data-parallel rank the router chose as SGLang's ``routed_dp_rank``
    (``managers/io_struct.py``), unless it names one already (a prefill/decode leg's hints)."""
    extra = request.extra_fields
    if rank is None or (extra is not None and "routed_dp_rank" in extra):
        return request
    return dataclasses.replace(request, extra_fields={**(extra or {}), "routed_dp_rank": rank})


class OutputChecker:
    """Checks a worker's chunks against the request: ids in the vocabulary, at most ``max_new`` of them.

    :meth:`check` returns the chunk to pass on: unchanged, or cut at ``max_new`` tokens with finish
    ``length`` (``overflowed`` then says what happened); an id outside the vocabulary (or not an
    integer) raises :class:`EngineStreamError` -- the worker's fault, never the client's.
    """

    __slots__ = ("emitted", "max_new", "overflowed", "url", "vocab")

    def __init__(self, max_new: int, vocab: int | None, url: str) -> None:
        self.max_new = max_new
        self.vocab = vocab
        self.url = url
        self.emitted = 0
        self.overflowed = ""

    def check(self, chunk: EngineChunk) -> EngineChunk:
        ids = chunk.token_ids
        if not ids:
            return chunk
        vocab = self.vocab
        if vocab is not None:
            for tid in ids:
                if tid.__class__ is not int or not 0 <= tid < vocab:
                    # the message reaches the client: it names the fault, not the worker's address
                    raise EngineStreamError(
                        f"the engine worker sent token id {tid!r}, outside the vocabulary (0..{vocab - 1})"
                    )
        before = self.emitted
        self.emitted = before + len(ids)
        if self.emitted <= self.max_new:
            return chunk
        keep = max(0, self.max_new - before)
        self.overflowed = (
            f"{self.url}: sent more than max_new_tokens={self.max_new} tokens; output cut at the limit"
        )
        return dataclasses.replace(
            chunk,
            token_ids=list(ids[:keep]),
            finish_reason="length",
            matched_stop=None,
            completion_tokens=self.max_new,
            logprobs=chunk.logprobs[:keep] if chunk.logprobs else None,
        )


class Dispatch:
    """The part of :class:`~deepseek_frontend.engines.pool.WorkerPool` that sends requests (see module
    docstring); the pool sets the attributes below and provides the admission bookkeeping
    (``_record_success``, ``_record_failure``, ``_silenced``) and the capacity and deadline methods
    of :class:`~deepseek_frontend.engines.limits.CapacityAndDeadlines` these methods use."""

    _workers: list[Worker]
    router: Router | None
    limits: StreamLimits
    max_attempts: int
    migration_limit: int
    readmit_after_s: float
    _clock: Callable[[], float]
    _rr: int
    _total_in_flight: int
    _watches: set[Watch]

    def _pick(
        self, tried: set[int], kind: ConstraintKind | None = None, request: GenerateRequest | None = None
    ) -> Worker | None:
        """The next worker for a request; ``kind``: the constraint it needs (only workers enforcing it)."""
        candidates = [
            w
            for w in self._workers
            if w.healthy
            and w.refused is None
            and not w.discovering
            and id(w) not in tried
            and (kind is None or w.can_enforce(kind))
            and w.in_flight < self.limits.max_in_flight_per_worker
        ]
        if not candidates:
            now = self._clock()
            candidates = [
                w
                for w in self._workers
                if id(w) not in tried
                and w.refused is None
                and not w.discovering
                and w.ejected_at is not None
                and now - w.ejected_at >= self.readmit_after_s
                and (kind is None or w.can_enforce(kind))
            ]
            if not candidates:
                return None
            # one trial at a time: move the clock so concurrent requests do not pile onto it
            candidates[0].ejected_at = now
            return candidates[0]
        if self.router is not None and request is not None:
            return self.router.choose(candidates, request)  # type: ignore[return-value]
        low = min(w.in_flight for w in candidates)
        best = [w for w in candidates if w.in_flight == low]
        self._rr += 1
        return best[self._rr % len(best)]

    def choose_url(self, request: GenerateRequest, avoid: Collection[str] = ()) -> str | None:
        """The worker the router would give ``request`` now, among admitted ones not in ``avoid``
        (None: none); nothing is started. The prefill/decode orchestrator (disagg/pool.py) picks
        each leg's worker with this, then runs the leg there with :meth:`generate_on`."""
        constraint = request.sampling.constraint
        tried = {id(w) for w in self._workers if w.url in avoid}
        worker = self._pick(tried, constraint.kind if constraint is not None else None, request)
        return None if worker is None else worker.url

    def reserve_on(self, url: str) -> Slot | None:
        """Hold a place on worker ``url`` now, before its request is sent (the prefill/decode
        orchestrator holds the decode worker's while the prefill runs, so a finished prefill never
        meets a full decode worker); None when the worker is gone. The caller chose ``url`` with
        :meth:`choose_url` in the same step, so it is below its limit. See
        :class:`~deepseek_frontend.engines.limits.Slot`."""
        worker = next((w for w in self._workers if w.url == url), None)
        return None if worker is None else self.reserve(worker)  # type: ignore[attr-defined]

    def generate_on(
        self, url: str, request: GenerateRequest, slot: Slot | None = None
    ) -> AsyncIterator[EngineChunk]:
        """Stream ``request`` on worker ``url`` alone, with the pool's limits, deadlines, output checks
        and health accounting; a failure before the first chunk raises (no other worker is tried).
        ``slot``: the place :meth:`reserve_on` held for it (no wait for capacity then)."""
        others = frozenset(w.url for w in self._workers if w.url != url)
        return self._generate_once(request, others, routed=False, slot=slot)  # chosen already

    @contextlib.asynccontextmanager
    async def occupy(
        self, url: str, request: GenerateRequest, slot: Slot | None = None
    ) -> AsyncIterator[EngineClient]:
        """Hold a slot on worker ``url`` for a request the caller sends through the yielded client
        itself (vLLM's unstreamed prefill leg): it waits for capacity (unless ``slot`` holds one
        already), counts in flight and with the router as a stream of :meth:`generate_on` does, and
        charges the worker an ``EngineUnavailableError`` or ``EngineTimeoutError`` raised inside (a
        success clears them)."""
        if slot is not None:
            worker = slot.claim()  # type: ignore[assignment]
        else:
            await self._await_capacity()
            found = next((w for w in self._workers if w.url == url), None)
            if found is None:
                raise NoHealthyWorkerError(f"no healthy engine worker could take the request ({url}: gone)")
            worker = found
            worker.in_flight += 1
            self._total_in_flight += 1
        assert isinstance(worker, Worker)
        ticket = self.router.begin(url, request) if self.router is not None else None
        worker.requests += 1
        try:
            yield worker.client
        except (EngineUnavailableError, EngineTimeoutError) as exc:
            self._record_failure(worker, exc.message)
            raise
        else:
            self._record_success(worker)
        finally:
            if ticket is not None:
                ticket.end()
            worker.in_flight -= 1
            self._total_in_flight -= 1
            self._wake_capacity_waiter()
            if worker.in_flight == 0 and all(w is not worker for w in self._workers):
                await worker.client.aclose()  # removed by discovery meanwhile

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        """Stream ``request``: one worker, retried elsewhere only before the first chunk; a stream
        that breaks later continues on another worker up to ``migration_limit`` times, unless the
        request is grammar-constrained (see routing/migration.py)."""
        if self.migration_limit and request.sampling.constraint is None:
            from deepseek_frontend.routing.migration import migrating_stream

            return migrating_stream(
                self._generate_once, request, self.migration_limit, on_migrate=self._count_migration
            )
        return self._generate_once(request)

    def _count_migration(self, url: str, tokens: int) -> None:
        if self.router is not None:
            self.router.migrations += 1

    async def _generate_once(
        self,
        request: GenerateRequest,
        avoid: frozenset[str] = frozenset(),
        served: list[str] | None = None,
        *,
        routed: bool = True,
        slot: Slot | None = None,
    ) -> AsyncIterator[EngineChunk]:
        """One request on one worker at a time (see :meth:`generate`); ``avoid``: worker URLs not to
        use; ``served`` (out): the URL of the worker that produced the first chunk; ``routed=False``:
        the worker was chosen by :meth:`choose_url` already (the router counts no second decision);
        ``slot``: the first attempt's place, held already (:meth:`reserve_on`)."""
        tried: set[int] = {id(w) for w in self._workers if w.url in avoid}
        errors: list[str] = []
        constraint = request.sampling.constraint
        kind = constraint.kind if constraint is not None else None
        limits = self.limits
        watch = Watch(asyncio.get_running_loop().time(), limits.request_timeout_s)
        for _ in range(self.max_attempts):
            worker: Worker | None
            if slot is not None:
                worker = slot.claim()  # type: ignore[assignment]
                slot = None
            else:
                with _tracing.phase("routing") as span:
                    await self._await_capacity()
                    worker = self._pick(tried, kind, request if routed else None)
                    if span is not None:
                        router = self.router.mode if self.router is not None else "least-in-flight"
                        url = worker.url if worker is not None else ""
                        span.set_attributes(
                            {
                                "deepseek.worker": url,
                                "deepseek.router": router,
                                "deepseek.attempt": len(tried),
                            }
                        )
                if worker is None:
                    break
                worker.in_flight += 1
                self._total_in_flight += 1
            assert worker is not None
            tried.add(id(worker))
            ticket = self.router.begin(worker.url, request) if self.router is not None else None
            worker.requests += 1
            stream = worker.client.generate(with_rank(request, ticket.rank if ticket is not None else None))
            started = False
            if limits.watched:
                self._watch(watch)
            watch.moved = ""
            worker.waiting.add(watch)
            try:
                try:
                    first = await self._next(stream, watch, limits.first_token_timeout_s, "the first token")
                except EngineUnavailableError as exc:
                    worker.waiting.discard(watch)
                    if isinstance(exc, WorkerSilentError):
                        self._silenced(worker, exc.message)
                    elif not watch.moved:  # a moved request's worker was charged already
                        self._record_failure(worker, exc.message)
                    errors.append(f"{worker.url}: {exc.message}")
                    continue
                except (FrontendError, asyncio.CancelledError):
                    raise
                except Exception as exc:
                    # the client choked on what the worker sent (a malformed chunk): the worker's fault
                    message = f"{worker.url}: malformed output ({type(exc).__name__}: {exc})"
                    self._record_failure(worker, message)
                    errors.append(message)
                    continue
                started = True
                worker.waiting.discard(watch)
                if ticket is not None:
                    ticket.first_token(first.cached_tokens)
                if served is not None:
                    served.append(worker.url)
                checker = OutputChecker(request.sampling.max_new_tokens, limits.vocab_size, worker.url)
                chunk = first
                while True:
                    chunk = checker.check(chunk)
                    if chunk.finish_reason is not None:
                        # Settle the worker's record now: a consumer that has the last chunk closes this
                        # generator at the yield, and nothing after it runs.
                        if checker.overflowed:
                            # it ignored max_new_tokens: the output is cut and the request aborted on close
                            logger.warning("%s", checker.overflowed)
                            self._record_failure(worker, checker.overflowed)
                        else:
                            self._record_success(worker)
                            await settle(stream)
                        yield chunk
                        return
                    yield chunk
                    try:
                        chunk = await self._next(stream, watch, limits.idle_timeout_s, "the next token")
                    except StopAsyncIteration:
                        return
            except EngineUnavailableError as exc:
                if started:
                    self._record_failure(worker, exc.message)
                raise
            except (EngineStreamError, EngineTimeoutError) as exc:
                self._record_failure(worker, exc.message)
                raise
            except (FrontendError, asyncio.CancelledError, GeneratorExit):
                raise
            except Exception as exc:
                message = f"{worker.url}: malformed output ({type(exc).__name__}: {exc})"
                self._record_failure(worker, message)
                raise EngineStreamError(message) from exc
            finally:
                if ticket is not None:
                    ticket.end()
                watch.task = None
                self._watches.discard(watch)
                worker.waiting.discard(watch)
                worker.in_flight -= 1
                self._total_in_flight -= 1
                self._wake_capacity_waiter()
                await stream.aclose()  # type: ignore[attr-defined]
                if worker.in_flight == 0 and all(w is not worker for w in self._workers):
                    # removed by discovery while this request ran: close it now
                    await worker.client.aclose()
        if not errors and any(w.discovering for w in self._workers):
            raise WorkersStartingError(
                "no engine worker is ready yet: the server is still discovering its workers; retry shortly"
            )
        detail = "; ".join(errors) if errors else "no worker is admitted"
        raise NoHealthyWorkerError(f"no healthy engine worker could take the request ({detail})")
