"""How a prefill/decode pair's legs are waited for, stopped and timed (the orchestrator's, disagg/pool.py).

* :meth:`PairWaits._await_first` waits for the decode's first token while watching the prefill leg,
  and fires the transfer timeout on whichever leg is missing;
* :meth:`PairWaits._stop_legs` aborts both legs of a pair that failed before its first token;
* a prefill answer still on its way when the decode finished is read in the background
  (:meth:`PairWaits._settle_later`), at most ``PdConfig.prefill_settle_s``: SGLang's prefill answers at
  its scheduler's next poll after the transfer, after the forward in progress (``disaggregation/
  prefill.py`` ``process_disagg_prefill_inflight_queue``), seconds later under long chunked
  prefills, and Dynamo waits 30 s for it;
* :class:`PairTiming` holds a pair's moments, which feed the PD timings (``parts.TIMINGS``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from deepseek_frontend.engines.pool import WorkerPool
from deepseek_frontend.errors import EngineTimeoutError
from deepseek_frontend.generation import EngineChunk

from .parts import (
    PREFILL_ALLOWANCE_S_PER_TOKEN,
    LegFailed,
    PdConfig,
    PdStats,
    Trace,
    leg_failure,
    leg_message,
    quietly_cancel,
)

__all__ = ["PairTiming", "PairWaits"]


class PairTiming:
    """When one pair's legs were sent, its prefill answered and its decode's first token came
    (loop times; :data:`~.parts.TIMINGS`)."""

    __slots__ = ("first_token", "prefill_end", "started")

    def __init__(self, started: float, prefill_end: float | None) -> None:
        self.started = started
        self.prefill_end = prefill_end
        self.first_token: float | None = None


class PairWaits:
    """The part of :class:`~deepseek_frontend.disagg.pool.DisaggregatedPool` that waits for, stops
    and times a pair's legs; the orchestrator sets the attributes below and provides ``_release``
    (the request's line, once its last holder is done)."""

    prefill: WorkerPool
    decode: WorkerPool
    config: PdConfig
    stats: PdStats
    _aborts: set[asyncio.Task[None]]
    _settles: dict[asyncio.Task[None], asyncio.Task[Any]]

    def _release(self, trace: Trace) -> None:
        raise NotImplementedError

    async def _await_first(
        self,
        prefill_task: asyncio.Task[Any],
        first_task: asyncio.Task[EngineChunk],
        timing: PairTiming,
        prompt_tokens: int,
        trace: Trace,
    ) -> None:
        """Wait for the decode's first chunk while watching the prefill leg.

        The transfer timeout fires on whichever leg is missing: the decode's first token
        ``transfer_timeout_s`` after the prefill answered, or -- both legs running (SGLang) --
        both signals ``transfer_timeout_s`` plus the prefill allowance after the legs were sent.
        Raises :class:`LegFailed` for a failure another pair may not repeat, the leg's own
        ``RequestError`` for a refusal, and ``EngineTimeoutError`` when the KV did not move.
        """
        stats = self.stats
        loop = asyncio.get_running_loop()
        limit = self.config.transfer_timeout_s
        if timing.prefill_end is None:
            allowance = prompt_tokens * PREFILL_ALLOWANCE_S_PER_TOKEN
            wait = None if limit is None else limit + allowance
            done, _ = await asyncio.wait(
                {prefill_task, first_task}, timeout=wait, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                stats.transfer_failures += 1
                trace.outcome = "transfer_timeout"
                raise EngineTimeoutError(
                    f"neither the prefill worker's answer nor the decode worker's first token came within "
                    f"{wait:g} s (--pd-transfer-timeout {limit:g} s plus {allowance:g} s of prefill for the "
                    f"prompt's {prompt_tokens} tokens): the KV cache did not move; both legs were aborted"
                )
            if not first_task.done():
                failure = leg_failure("prefill", prefill_task.exception())
                if failure is not None:
                    stats.bootstrap_failures += 1
                    trace.outcome = "prefill_failed"
                    raise LegFailed("prefill", failure)
                timing.prefill_end = prefill_task.result()
        if not first_task.done():
            assert timing.prefill_end is not None
            wait = None if limit is None else max(0.0, timing.prefill_end + limit - loop.time())
            await asyncio.wait({first_task}, timeout=wait)
            if not first_task.done():
                stats.transfer_failures += 1
                trace.outcome = "transfer_timeout"
                raise EngineTimeoutError(
                    f"the decode worker did not receive the prompt's KV cache from the prefill worker "
                    f"within {limit:g} s of the prefill's answer (--pd-transfer-timeout); both legs "
                    "were aborted"
                )
        failure = leg_failure("decode", first_task.exception())
        if failure is not None:
            stats.transfer_failures += 1
            trace.outcome = "decode_failed"
            raise LegFailed("decode", failure)
        timing.first_token = loop.time()
        trace.first_token_s = timing.first_token - timing.started
        stats.observe("first_token", trace.first_token_s)
        if timing.prefill_end is not None:
            stats.observe("decode_after_prefill", timing.first_token - timing.prefill_end)

    async def _stop_legs(
        self,
        prefill_task: asyncio.Task[Any],
        first_task: asyncio.Task[EngineChunk],
        decode: AsyncIterator[EngineChunk],
        p_url: str,
        d_url: str,
        rid: str,
    ) -> None:
        """Abort both legs of a pair before its first token: cancel their tasks (closing a stream the
        worker has answered sends ``/abort_request`` too) and, because a leg cancelled before its
        worker answered may still have reached it, send each worker an abort for ``rid`` as well
        (in the background: the next pair or the client's error must not wait for it)."""
        prefill_running, decode_running = not prefill_task.done(), not first_task.done()
        await quietly_cancel(first_task, prefill_task)
        await decode.aclose()  # type: ignore[attr-defined]
        for running, pool, url in (
            (prefill_running, self.prefill, p_url),
            (decode_running, self.decode, d_url),
        ):
            found = pool.client_of(url) if running else None
            if found is not None:
                task = asyncio.get_running_loop().create_task(found[0].abort(rid))
                self._aborts.add(task)
                task.add_done_callback(self._aborts.discard)

    def _settle_later(self, task: asyncio.Task[Any], url: str, trace: Trace, timing: PairTiming) -> None:
        """Read the prefill answer of a finished request in the background (:meth:`_settle`); the
        request's line waits for it."""
        trace.pending += 1
        settle = asyncio.get_running_loop().create_task(self._settle(task, url, trace, timing))
        self._settles[settle] = task
        settle.add_done_callback(lambda done: self._settles.pop(done, None))

    async def _settle(self, task: asyncio.Task[Any], url: str, trace: Trace, timing: PairTiming) -> None:
        """Wait at most ``prefill_settle_s`` for the prefill answer, then abort the leg (a missing
        answer is a late failure; one aborted by :meth:`aclose` is not), check the answer and
        release the request's trace."""
        settle_s = self.config.prefill_settle_s
        try:
            await asyncio.wait({task}, timeout=settle_s)
        finally:
            shutdown = task.cancelled()  # cancelled by aclose
            missing = not task.done()
            await quietly_cancel(task)
            if missing:
                self.stats.late_prefill_failures += 1
                trace.warn = True
                trace.note(f"{url}: no prefill answer within {settle_s:g} s of the decode's end; aborted")
            elif shutdown:
                trace.note(f"{url}: the prefill answer was still awaited at shutdown; aborted")
            self._check_late_prefill(task, url, trace, timing)
            self._release(trace)

    def _check_late_prefill(
        self, task: asyncio.Task[Any], url: str, trace: Trace, timing: PairTiming
    ) -> None:
        """Time a prefill answer, and count one that went wrong after the decode had started (the
        request's line, at WARNING, says what)."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.stats.late_prefill_failures += 1
            trace.warn = True
            trace.note(f"late prefill answer: {leg_message(exc)}")
            return
        end = timing.prefill_end
        if end is None:
            result = task.result()
            end = result if isinstance(result, float) else None
        if end is None:
            return
        trace.prefill_s = end - timing.started
        self.stats.observe("prefill", trace.prefill_s)
        if timing.first_token is not None and end > timing.first_token:
            self.stats.observe("prefill_lag", end - timing.first_token)
