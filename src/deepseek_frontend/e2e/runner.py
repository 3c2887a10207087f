"""Run conformance checks against a live endpoint and report them.

A :class:`Check` is a named function that raises to fail. Two categories exist because two different things
can go wrong behind an OpenAI-compatible endpoint:

- ``protocol``: the wire contract a client library relies on (shapes, ids, finish reasons, valid JSON
  arguments, no markup in text). Any failure is a bug in the deployment; the command exits non-zero.
- ``model-judgement``: what a model decides (whether it calls the right tool, quotes a tool result). A failure
  there may just be the model; it is reported separately and never changes the exit code.

A protocol check whose precondition is a model decision (for example "the model chose to call two tools in
parallel") raises :class:`Inconclusive` when the model did not cooperate, rather than failing the protocol.

Statuses: ``pass``, ``fail`` (an assertion about the response was false), ``error`` (the request itself
failed: HTTP error, timeout, connection refused), ``inconclusive``.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, TextIO

Category = Literal["protocol", "model-judgement"]
Status = Literal["pass", "fail", "error", "inconclusive", "skip"]
CATEGORIES: tuple[Category, ...] = ("protocol", "model-judgement")

#: longest detail text shown in the table (the JSON output keeps it whole)
TABLE_DETAIL_WIDTH = 60


class CheckFailed(AssertionError):
    """The response broke the contract the check pins; the message says how."""


class Inconclusive(Exception):
    """The model did not do what the check needs to test the protocol (e.g. it called no tool)."""


class Skipped(Exception):
    """The deployment's model lacks the feature the check tests (e.g. it reads no images); the message
    says why. Only a capability the model genuinely lacks may skip a check, never a failed request."""


@dataclass(frozen=True, slots=True)
class Check:
    """One conformance check: ``run(ctx)`` returns a short detail string or raises."""

    name: str
    category: Category
    description: str
    run: Callable[[Any], str | None]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of one check. ``latency_ms`` is wall time of the whole check (all its requests)."""

    name: str
    category: Category
    status: Status
    latency_ms: float
    detail: str

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass(frozen=True, slots=True)
class SuiteReport:
    """All results of one run, with the endpoint they were measured against."""

    base_url: str
    model: str
    results: tuple[CheckResult, ...]

    def by_category(self, category: Category) -> list[CheckResult]:
        return [r for r in self.results if r.category == category]

    @property
    def protocol_ok(self) -> bool:
        """True when no protocol check failed or errored (inconclusive and skipped ones do not count)."""
        return all(r.status in ("pass", "inconclusive", "skip") for r in self.by_category("protocol"))

    def counts(self, category: Category) -> dict[Status, int]:
        out: dict[Status, int] = {"pass": 0, "fail": 0, "error": 0, "inconclusive": 0, "skip": 0}
        for result in self.by_category(category):
            out[result.status] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        """The machine-readable form written by ``--json``."""
        return {
            "base_url": self.base_url,
            "model": self.model,
            "protocol_ok": self.protocol_ok,
            "summary": {category: self.counts(category) for category in CATEGORIES},
            "results": [asdict(r) for r in self.results],
        }


def run_check(check: Check, ctx: Any) -> CheckResult:
    """Run one check and classify its outcome; never raises (except KeyboardInterrupt)."""
    start = time.perf_counter()
    status: Status
    try:
        detail = check.run(ctx) or ""
        status = "pass"
    except Inconclusive as exc:
        status, detail = "inconclusive", str(exc)
    except Skipped as exc:
        status, detail = "skip", str(exc)
    except AssertionError as exc:
        status, detail = "fail", str(exc) or _last_frame(exc)
    except Exception as exc:  # transport and API errors: the endpoint did not answer properly
        status, detail = "error", f"{type(exc).__name__}: {exc}"
    latency_ms = (time.perf_counter() - start) * 1000.0
    return CheckResult(check.name, check.category, status, round(latency_ms, 1), _one_line(detail))


def run_suite(
    checks: Sequence[Check],
    ctx: Any,
    *,
    base_url: str,
    model: str,
    progress: TextIO | None = None,
) -> SuiteReport:
    """Run ``checks`` in order, printing one progress line per check to ``progress`` as it finishes."""
    results: list[CheckResult] = []
    width = max((len(c.name) for c in checks), default=0)
    for i, check in enumerate(checks, 1):
        if progress is not None:
            print(f"[{i:>2}/{len(checks)}] {check.name:<{width}} ...", end="", file=progress, flush=True)
        result = run_check(check, ctx)
        results.append(result)
        if progress is not None:
            suffix = f" ({result.detail})" if result.detail and not result.passed else ""
            print(f" {result.status.upper()} {result.latency_ms:.0f} ms{suffix}", file=progress, flush=True)
    return SuiteReport(base_url=base_url, model=model, results=tuple(results))


def format_table(report: SuiteReport) -> str:
    """The end-of-run summary: one table per category, then the totals line."""
    lines: list[str] = []
    for category in CATEGORIES:
        rows = report.by_category(category)
        if not rows:
            continue
        title = (
            "Protocol checks"
            if category == "protocol"
            else "Model-judgement checks (do not affect exit code)"
        )
        lines.append(title)
        lines.extend(_table(rows))
        counts = report.counts(category)
        lines.append("  " + ", ".join(f"{n} {status}" for status, n in counts.items() if n))
        lines.append("")
    verdict = "PASS" if report.protocol_ok else "FAIL"
    lines.append(f"{verdict}: protocol conformance of {report.model} at {report.base_url}")
    return "\n".join(lines)


def _table(rows: Iterable[CheckResult]) -> list[str]:
    header = ("check", "status", "latency", "detail")
    cells = [
        (r.name, r.status, f"{r.latency_ms:.0f} ms", _truncate(r.detail, TABLE_DETAIL_WIDTH)) for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]

    def fmt(row: Sequence[str]) -> str:
        return (
            "  "
            + "  ".join(
                cell.rjust(w) if i == 2 else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )

    return [fmt(header), "  " + "  ".join("-" * w for w in widths), *(fmt(c) for c in cells)]


def write_json(report: SuiteReport, out: TextIO) -> None:
    json.dump(report.to_json(), out, indent=2, ensure_ascii=False)
    out.write("\n")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _last_frame(exc: BaseException) -> str:
    """Where a bare ``assert`` failed, for assertions written without a message."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    frame = frames[-1]
    return f"assertion failed: {frame.line} (line {frame.lineno})"
