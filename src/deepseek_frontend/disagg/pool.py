"""Prefill/decode disaggregation: one request, two workers (``--prefill-worker``, ``--decode-worker``).

:class:`DisaggregatedPool` looks like one engine to the pipeline (``generate``, ``abort``,
``statuses``, ...) and runs two :class:`~deepseek_frontend.engines.pool.WorkerPool` s, one per role,
each with its own :class:`~deepseek_frontend.routing.router.Router` (so ``--router-mode`` and
session affinity apply to each role). Per request it waits for room in both roles, picks a pair --
the prefill worker by the prefill router (KV overlap from the prefill workers' events, plus load),
the decode worker by the decode router (load, plus overlap where decode workers publish a cache)
-- and holds a place on both before any leg is sent (``WorkerPool.reserve_on``), so a finished
prefill never meets a decode worker at its limit; then it runs the two legs:

* **SGLang** (its gateway's ``pd_router`` flow): a random ``bootstrap_room`` (0..2**63-1, drawn
  with :mod:`secrets` and never one drawn recently, :class:`Rooms`), ``bootstrap_host`` = the
  prefill worker's host, ``bootstrap_port`` = its ``/server_info`` ``disaggregation_bootstrap_port``
  (:data:`DEFAULT_BOOTSTRAP_PORT` when it does not say; ``--disaggregation-bootstrap-port``
  overrides it). The same ``/generate`` body, token ids included, goes to both legs at once. With
  data-parallel attention the router's best rank on the prefill worker goes out as
  ``routed_dp_rank`` on the prefill leg and ``disagg_prefill_dp_rank`` on both legs (SGLang then
  neither asks the prefill's bootstrap server for the rank nor applies its
  ``follow_bootstrap_room`` check, ``room % dp_size``); the decode router's rank, if any, is the
  decode leg's ``routed_dp_rank``.
* **vLLM** (sequential, as smg runs it): the prefill leg is a non-streamed request with
  :func:`~deepseek_frontend.engines.vllm.prefill_sampling` (``max_tokens`` 1, no ``min_tokens``,
  no stop on EOS or stop ids); then the decode leg streams. NixlConnector: the prefill carries
  ``kv_transfer_params`` ``{"do_remote_decode": true, "do_remote_prefill": false, ...}`` and its
  answer's params go verbatim into the decode request. MooncakeConnector (``--vllm-kv-connector
  mooncake``): the params of both legs are built here, around a minted ``transfer_id``
  (disagg/mooncake.py).

The client's stream is the decode leg's. The prefill leg's answer is read to the end and checked
(a finish that is not an abort); a bad answer after the decode's first token is logged and counted.
The client's response ends when the decode ends: a prefill answer still on its way then (SGLang's
answers at its scheduler's next poll after the transfer) is read in the background, at most
``PdConfig.prefill_settle_s`` (30 s, Dynamo's wait), then the leg is aborted (a late failure).

Roles: every worker's ``/server_info`` ``disaggregation_mode`` (and a vLLM worker's KV connector
and role, when its ``/server_info`` says) is checked at start (a mismatch stops ``serve``), and each
pool's vet checks it again at every later discovery (disagg/roles.py).

Faults (no leg outlives the client's request -- every exit path closes both -- except a prefill leg
whose answer is awaited, at most ``prefill_settle_s``, after a decode that finished; ``aclose``
aborts those at once):

* prefill leg fails before the decode's first token -> the decode leg is aborted (SGLang
  ``/abort_request`` with its rid, by closing its stream) and the pair retried once, on other
  workers where there are any, with a new room and rid;
* decode leg fails before its first token -> the prefill leg is aborted, the pair retried once;
  after the first token -> the prefill leg is aborted and the error propagates to migration
  (routing/migration.py) as for aggregated workers: a new pair continues the stream;
* the KV does not move (``--pd-transfer-timeout`` T, ``transfer_timeout_s``): whichever leg is
  missing -- the decode's first token T after the prefill answered, or, SGLang, both the prefill's
  answer and the decode's first token T plus a prefill allowance
  (:data:`~.parts.PREFILL_ALLOWANCE_S_PER_TOKEN` per prompt token) after the legs were sent -- both
  legs are aborted, :class:`~deepseek_frontend.errors.EngineTimeoutError` (504, the APIs'
  worker-fault shape);
* a refusal (4xx) by either leg is the client's error: both legs aborted, no retry;
* the client leaves -> both legs aborted.

Each request -- whatever the pairs its retries and migrations used -- ends with one log line (logger
``deepseek_frontend.routing.pd``, the name it had before disagg/ was a package) naming every pair's
workers and room, one outcome (``migrated`` when a continuation finished it) and the last pair's
timings; :class:`PdStats` feeds ``disagg/metrics.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from deepseek_frontend.engines.base import Engine
from deepseek_frontend.engines.limits import Slot
from deepseek_frontend.engines.pool import WorkerPool
from deepseek_frontend.errors import (
    EngineError,
    EngineTimeoutError,
    EngineUnavailableError,
    FrontendError,
    NoHealthyWorkerError,
    OverloadedError,
    RequestError,
)
from deepseek_frontend.generation import (
    ConstraintKind,
    EngineChunk,
    GenerateRequest,
    WorkerCapabilities,
    WorkerStatus,
    leg_id,
)

from .legs import sglang_legs, sglang_prefill, vllm_prefill
from .mooncake import MooncakeEngines
from .parts import (
    DEFAULT_BOOTSTRAP_PORT,
    OUTCOMES,
    PAIR_ATTEMPTS,
    TIMINGS,
    TRANSFER_TIMEOUT_S,
    LegFailed,
    PdConfig,
    PdDeployment,
    PdStats,
    RoleMismatchError,
    Rooms,
    Trace,
    first_chunk,
    leg_failure,
    leg_message,
    log_request,
    quietly_cancel,
)
from .roles import role_problem
from .waits import PairTiming, PairWaits

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from deepseek_frontend.routing.router import Router

    from .parts import Role

__all__ = [
    "DEFAULT_BOOTSTRAP_PORT",
    "OUTCOMES",
    "TIMINGS",
    "TRANSFER_TIMEOUT_S",
    "DisaggregatedPool",
    "PdConfig",
    "PdDeployment",
    "PdStats",
    "RoleMismatchError",
    "Rooms",
]

logger = logging.getLogger("deepseek_frontend.routing.pd")


class DisaggregatedPool(PairWaits, Engine):
    """Prefill and decode pools behind one :class:`Engine` (see module docstring)."""

    def __init__(
        self,
        prefill: WorkerPool,
        decode: WorkerPool,
        config: PdConfig | None = None,
        *,
        migration_limit: int = 0,
    ) -> None:
        self.prefill = prefill
        self.decode = decode
        self.config = config or PdConfig()
        self.migration_limit = max(0, migration_limit)
        self.rooms = Rooms()
        self.stats = PdStats()
        #: MooncakeConnector engine ids per prefill worker (``--vllm-kv-connector mooncake``)
        self.mooncake = MooncakeEngines()
        #: background aborts of legs stopped before their first token (aclose waits for them)
        self._aborts: set[asyncio.Task[None]] = set()
        #: background reads of prefill answers still on their way when the decode finished, each
        #: with the prefill leg's task it waits for
        self._settles: dict[asyncio.Task[None], asyncio.Task[Any]] = {}
        self.name = "pd"
        # a worker discovered later (DNS) gets no request until its role has been checked
        prefill.vet = functools.partial(self._vet, "prefill")
        decode.vet = functools.partial(self._vet, "decode")

    def __repr__(self) -> str:
        return f"DisaggregatedPool(prefill={self.prefill!r}, decode={self.decode!r})"

    @property
    def role_routers(self) -> dict[str, Router]:
        """Each role's router (their metrics carry a ``role`` label)."""
        pairs = (("prefill", self.prefill.router), ("decode", self.decode.router))
        return {role: router for role, router in pairs if router is not None}

    def routers(self) -> Sequence[Router]:
        """Both roles' routers."""
        return tuple(self.role_routers.values())

    def collectors(self) -> Sequence[Collector]:
        """The routers' metrics, each labelled with its role (routing/metrics.py), and the
        orchestrator's own (disagg/metrics.py)."""
        from deepseek_frontend.routing.metrics import RoutingCollector

        from .metrics import PdCollector

        routers = self.role_routers
        return [*([RoutingCollector(routers)] if routers else []), PdCollector(self)]

    # ------------------------------------------------------------------ engine interface

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        """Stream ``request`` from a prefill/decode pair; a stream broken after its first token
        continues on a new pair up to ``migration_limit`` times (not for constrained requests)."""
        if self.migration_limit and request.sampling.constraint is None:
            return self._migrating(request)
        return self._pair_stream(request)

    async def _migrating(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        """``request`` over as many pairs as migration needs, as one request: one trace, so one
        outcome (``migrated`` when a continuation finished it) and one log line."""
        from deepseek_frontend.routing.migration import migrating_stream

        trace = Trace(request.request_id)

        def attempt(
            req: GenerateRequest, avoid: frozenset[str], served: list[str]
        ) -> AsyncIterator[EngineChunk]:
            return self._pair_stream(req, avoid, served, trace)

        def migrated(url: str, tokens: int) -> None:
            trace.migrations += 1
            if self.decode.router is not None:
                self.decode.router.migrations += 1  # the decode leg broke: the decode role's count

        stream = migrating_stream(attempt, request, self.migration_limit, on_migrate=migrated)
        try:
            async for chunk in stream:
                yield chunk
        finally:
            try:
                await stream.aclose()  # type: ignore[attr-defined]
            finally:
                if trace.migrations and trace.outcome == "ok":
                    trace.outcome = "migrated"
                self._release(trace)

    async def abort(self, request_id: str) -> None:
        await asyncio.gather(self.prefill.abort(request_id), self.decode.abort(request_id))

    async def check_health(self) -> bool:
        """Ready when both roles have an admitted worker."""
        return self.prefill.healthy_count > 0 and self.decode.healthy_count > 0

    @property
    def healthy_count(self) -> int:
        return min(self.prefill.healthy_count, self.decode.healthy_count)

    def statuses(self) -> list[WorkerStatus]:
        """Both roles' workers; each status's ``extra["role"]`` says which."""
        out = []
        for role, pool in (("prefill", self.prefill), ("decode", self.decode)):
            for status in pool.statuses():
                status.extra["role"] = role
                out.append(status)
        return out

    def supports_constraint(self, kind: ConstraintKind) -> bool:
        # SGLang's prefill samples the first token under the grammar too: both roles must enforce it
        return self.prefill.supports_constraint(kind) and self.decode.supports_constraint(kind)

    def capabilities(self) -> WorkerCapabilities | None:
        """The decode workers' combined capabilities, with the constraint kinds both roles enforce
        and the smaller context length."""
        dec, pre = self.decode.capabilities(), self.prefill.capabilities()
        if dec is None or pre is None:
            return dec or pre
        contexts = [c for c in (dec.context_length, pre.context_length) if c]
        return dataclasses.replace(
            dec,
            constraint_kinds=dec.constraint_kinds & pre.constraint_kinds,
            context_length=min(contexts) if contexts else None,
        )

    async def discover(self) -> WorkerCapabilities | None:
        await asyncio.gather(self.prefill.discover(), self.decode.discover())
        return self.capabilities()

    async def start(self) -> None:
        """Start both pools, then check every worker's role (:class:`RoleMismatchError` on a mismatch)."""
        await asyncio.gather(self.prefill.start(), self.decode.start())
        self.check_roles()

    def check_roles(self) -> None:
        """Check each worker against the role of the flag that named it (disagg/roles.py): a problem
        is a :class:`RoleMismatchError`; a worker that reports nothing (unreachable, or a vLLM
        without ``VLLM_SERVER_DEV_MODE``) is only logged when SGLang. Workers found later by DNS are
        checked by :meth:`_vet` as they are discovered."""
        problems = []
        for role, pool in (("prefill", self.prefill), ("decode", self.decode)):
            for status in pool.statuses():
                found = pool.client_of(status.url)
                caps = found[1] if found is not None else None
                unreported = caps is None or caps.extra.get("disaggregation_mode") is None
                if unreported and self.config.engine == "sglang":
                    logger.warning(
                        "%s worker %s did not report its disaggregation_mode; its role is unchecked",
                        role,
                        status.url,
                    )
                if caps is not None:
                    problem = role_problem(role, status.url, caps, self.config)  # type: ignore[arg-type]
                    if problem is not None:
                        problems.append(problem)
        if problems:
            raise RoleMismatchError("; ".join(problems))

    def _vet(self, role: Role, url: str, caps: WorkerCapabilities) -> str | None:
        """The pools' vet (each discovery of a worker): why a worker must get no ``role`` leg
        (counted in ``role_mismatches``), or None."""
        problem = role_problem(role, url, caps, self.config)
        if problem is None:
            return None
        self.stats.role_mismatches[role] += 1
        return f"it gets no {role} legs: {problem}"

    async def aclose(self) -> None:
        for leg in self._settles.values():
            leg.cancel()  # aborts the leg; its settle then writes the request's line
        await asyncio.gather(*self._settles, *self._aborts, return_exceptions=True)
        await asyncio.gather(self.prefill.aclose(), self.decode.aclose())

    # ------------------------------------------------------------------ one request

    def _choose_pair(
        self, request: GenerateRequest, tried_p: set[str], tried_d: set[str]
    ) -> tuple[str, str] | None:
        """A prefill and a decode worker, preferring ones not tried yet (a retry reuses a worker only
        when its role has no other)."""
        p = self.prefill.choose_url(request, tried_p)
        if p is None and tried_p:
            p = self.prefill.choose_url(request)
        d = self.decode.choose_url(request, tried_d)
        if d is None and tried_d:
            d = self.decode.choose_url(request)
        if p is None or d is None:
            return None
        return p, d

    async def _reserve_pair(
        self, request: GenerateRequest, tried_p: set[str], tried_d: set[str]
    ) -> tuple[str, str, Slot | None, Slot | None] | None:
        """A pair, with a place held on both workers before any leg is sent (the decode's is held
        while the prefill runs: a finished prefill never meets a decode worker at its limit). Waits,
        in arrival order, for room in both roles (``OverloadedError``, 429, after the pools'
        ``capacity_wait_s``); None when a role has no admitted worker."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(self.decode.limits.capacity_wait_s, self.prefill.limits.capacity_wait_s)
        while True:
            await self.decode.wait_for_capacity()
            await self.prefill.wait_for_capacity()
            pair = self._choose_pair(request, tried_p, tried_d)
            if pair is not None:
                p_url, d_url = pair
                # chosen and held in one step (no await between): nobody takes these places
                return p_url, d_url, self.prefill.reserve_on(p_url), self.decode.reserve_on(d_url)
            if self.decode.has_capacity() and self.prefill.has_capacity():
                return None  # room, but no admitted worker to choose
            if loop.time() >= deadline:
                raise OverloadedError(
                    "every prefill/decode pair is at its limit of in-flight requests; retry later",
                    retry_after_s=1,
                )

    def sglang_legs(
        self, request: GenerateRequest, prefill_url: str, decode_url: str, room: int
    ) -> tuple[GenerateRequest, GenerateRequest]:
        """The two legs' requests (disagg/legs.py)."""
        return sglang_legs(self.prefill, self.decode, self.config, request, prefill_url, decode_url, room)

    def _release(self, trace: Trace) -> None:
        """One holder of ``trace`` is done; the last one counts the outcome and writes the line."""
        trace.pending -= 1
        if trace.pending == 0:
            self.stats.outcomes[trace.outcome] += 1
            log_request(trace)

    async def _pair_stream(
        self,
        request: GenerateRequest,
        avoid: frozenset[str] = frozenset(),
        served: list[str] | None = None,
        trace: Trace | None = None,
    ) -> AsyncIterator[EngineChunk]:
        """One request on a pair (see module docstring); ``avoid``: decode URLs not to use (a
        migration's broken worker); ``served`` (out): the decode worker that streamed; ``trace``:
        the request's, when this is one of its pairs (migration), else this stream owns one."""
        owned = trace is None
        if trace is None:
            trace = Trace(request.request_id)
        trace.outcome = "error"  # until this pair says otherwise
        stats = self.stats
        tried_p: set[str] = set()
        tried_d: set[str] = set(avoid)
        errors: list[str] = []
        loop = asyncio.get_running_loop()
        try:
            for attempt in range(PAIR_ATTEMPTS):
                reserved = await self._reserve_pair(request, tried_p, tried_d)
                if reserved is None:
                    break
                p_url, d_url, p_slot, d_slot = reserved
                try:
                    tried_p.add(p_url)
                    tried_d.add(d_url)
                    if attempt:
                        stats.retries += 1
                    leg_request = (
                        request
                        if not attempt
                        else dataclasses.replace(
                            request, request_id=leg_id(request.request_id, f"pd{attempt}")
                        )
                    )
                    started = loop.time()
                    prefill_task: asyncio.Task[Any]
                    prefill_end: float | None = None
                    if self.config.engine == "vllm":
                        trace.pairs.append((p_url, d_url, None))
                        ran = await self._vllm_prefill(leg_request, p_url, p_slot, trace)
                        if isinstance(ran, str):
                            errors.append(ran)
                            continue
                        prefill_task, decode_params = ran
                        prefill_end = loop.time()
                        decode_request = dataclasses.replace(
                            leg_request, extra_fields={"kv_transfer_params": decode_params}
                        )
                    else:
                        room = self.rooms.draw()
                        trace.pairs.append((p_url, d_url, room))
                        prefill_request, decode_request = self.sglang_legs(leg_request, p_url, d_url, room)
                        prefill_task = loop.create_task(
                            sglang_prefill(self.prefill, p_url, prefill_request, p_slot)
                        )
                    decode = self.decode.generate_on(d_url, decode_request, d_slot)
                    first_task: asyncio.Task[EngineChunk] = loop.create_task(first_chunk(decode))
                    timing = PairTiming(started, prefill_end)
                    try:
                        await self._await_first(
                            prefill_task, first_task, timing, len(request.input_ids), trace
                        )
                    except LegFailed as exc:
                        await self._stop_legs(
                            prefill_task, first_task, decode, p_url, d_url, leg_request.request_id
                        )
                        self.mooncake.forget(p_url)  # its bootstrap server is asked again next time
                        errors.append(exc.message)
                        continue
                    except BaseException:
                        await self._stop_legs(
                            prefill_task, first_task, decode, p_url, d_url, leg_request.request_id
                        )
                        raise
                    first = first_task.result()
                    if served is not None:
                        served.append(d_url)
                    # settled before each yield: a consumer holding the last chunk closes the stream there
                    finished = first.finish_reason is not None
                    if finished:
                        trace.outcome = "ok"
                    try:
                        yield first
                        while not finished:
                            chunk = await anext(decode)
                            finished = chunk.finish_reason is not None
                            if finished:
                                trace.outcome = "ok"
                            yield chunk
                    except StopAsyncIteration:
                        trace.note(f"{d_url}: stream ended without a finish", "decode_failed")
                        raise EngineUnavailableError(
                            f"{d_url}: the decode stream ended without a finish"
                        ) from None
                    except EngineError as exc:
                        trace.note(f"{d_url}: {exc.message}", "decode_failed")
                        raise
                    finally:
                        if finished and not prefill_task.done():
                            # the client's response ends with the decode: the answer is read in the background
                            self._settle_later(prefill_task, p_url, trace, timing)
                        else:
                            await quietly_cancel(prefill_task)
                            self._check_late_prefill(prefill_task, p_url, trace, timing)
                        await decode.aclose()  # type: ignore[attr-defined]
                    return
                finally:
                    for slot in (p_slot, d_slot):
                        if slot is not None:
                            slot.release()  # a place no leg took (a prefill that failed first, say)
            if not errors:
                trace.outcome = "no_worker"  # else the last pair's failure (prefill_failed, decode_failed)
            detail = "; ".join(errors) if errors else "no prefill or no decode worker is admitted"
            trace.note(detail)
            raise NoHealthyWorkerError(f"no prefill/decode pair could take the request ({detail})")
        except (GeneratorExit, asyncio.CancelledError):
            if trace.outcome != "ok":
                trace.outcome = "client_gone"
            raise
        except EngineTimeoutError as exc:
            trace.note(exc.message, "decode_failed" if trace.outcome == "error" else None)
            raise
        except RequestError as exc:
            trace.note(exc.message, "rejected")
            raise
        except FrontendError as exc:
            if trace.outcome == "error":
                trace.note(exc.message)
            raise
        finally:
            if owned:
                self._release(trace)

    async def _vllm_prefill(
        self, request: GenerateRequest, p_url: str, slot: Slot | None, trace: Trace
    ) -> tuple[asyncio.Task[Any], dict[str, Any]] | str:
        """vLLM's prefill leg, run to its end: its task and the decode leg's ``kv_transfer_params``
        (the answer's, NixlConnector; built, MooncakeConnector), or what went wrong (a failure
        another pair may not repeat; counted)."""
        mooncake = None
        loop = asyncio.get_running_loop()
        try:
            if self.config.kv_connector == "mooncake":
                mooncake = await self.mooncake.pair(self.prefill, self.config, p_url, request)
        except EngineUnavailableError as exc:
            self.stats.bootstrap_failures += 1
            trace.outcome = "prefill_failed"
            return f"prefill leg: {leg_message(exc)}"
        task = loop.create_task(
            vllm_prefill(
                self.prefill,
                p_url,
                request,
                slot,
                params=mooncake.prefill_params if mooncake is not None else None,
                headers=mooncake.headers if mooncake is not None else None,
            )
        )
        try:
            await asyncio.wait({task})
        except BaseException:
            await quietly_cancel(task)
            raise
        failure = leg_failure("prefill", task.exception())
        if failure is not None:
            self.stats.bootstrap_failures += 1
            trace.outcome = "prefill_failed"
            self.mooncake.forget(p_url)
            return failure
        return task, mooncake.decode_params if mooncake is not None else task.result()
