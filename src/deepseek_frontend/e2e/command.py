"""``deepseek-frontend e2e``: the conformance suite against any live endpoint.

Runs :func:`deepseek_frontend.e2e.checks.all_checks` through the official ``openai`` and ``anthropic``
client libraries (the optional ``[e2e]`` extra), prints a line per check as it finishes and a summary table at
the end, and exits 0 when every protocol check passed (inconclusive ones allowed), 1 when one failed, 2 on
usage errors (missing client libraries, unknown check names, unreachable endpoint).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

HELP = (
    "run the conformance suite (OpenAI + Anthropic APIs, tools, reasoning, streaming) against a live endpoint"
)

#: Requests of a thinking model may take a while; one check issues at most two.
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MAX_TOKENS = 4096
MISSING_CLIENTS = (
    "deepseek-frontend e2e needs the openai, anthropic and jsonschema packages: "
    "pip install 'deepseek-frontend[e2e]'"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``e2e`` flags on ``parser``."""
    parser.add_argument(
        "--base-url",
        default=None,
        help="server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted); required unless --list",
    )
    parser.add_argument(
        "--model", default=None, help="model name to send, as /v1/models lists it; required unless --list"
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="API key sent as Bearer token and x-api-key (default: $DEEPSEEK_FRONTEND_API_KEY, else none)",
    )
    parser.add_argument(
        "--json",
        dest="json_path",
        default=None,
        metavar="PATH",
        help="also write machine-readable results to PATH ('-' for stdout; the table then goes to stderr)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="CHECK",
        help="run only this check (repeatable); see --list",
    )
    parser.add_argument(
        "--category",
        choices=("protocol", "model-judgement"),
        default=None,
        help="run only the checks of one category",
    )
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"max_tokens per request (default: {DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds per request (default: {DEFAULT_TIMEOUT_S:g})",
    )


def normalize_base_url(url: str) -> str:
    """The server root without a trailing ``/`` or ``/v1`` (the OpenAI client gets ``<root>/v1``, the
    Anthropic client ``<root>``, which appends ``/v1/messages`` itself)."""
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def run(args: argparse.Namespace) -> int:
    """Run the suite; returns the process exit code."""
    from deepseek_frontend.e2e.checks import all_checks

    checks = all_checks()
    if args.list:
        for check in checks:
            print(f"{check.name:<30} {check.category:<16} {check.description}")
        return 0
    missing = [flag for flag, value in (("--base-url", args.base_url), ("--model", args.model)) if not value]
    if missing:
        print(f"deepseek-frontend e2e: {' and '.join(missing)} required", file=sys.stderr)
        return 2
    known = {c.name for c in checks}
    unknown = [name for name in args.only if name not in known]
    if unknown:
        print(f"deepseek-frontend e2e: unknown check(s): {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    if args.only:
        checks = [c for c in checks if c.name in args.only]
    if args.category:
        checks = [c for c in checks if c.category == args.category]

    try:
        ctx = make_context(args)
    except ImportError:
        print(MISSING_CLIENTS, file=sys.stderr)
        return 2

    from deepseek_frontend.e2e.runner import format_table, run_suite, write_json

    to_stdout_json = args.json_path == "-"
    human: TextIO = sys.stderr if to_stdout_json else sys.stdout
    root = normalize_base_url(args.base_url)
    print(
        f"deepseek-frontend e2e: {len(checks)} checks against {root} model={args.model}",
        file=human,
        flush=True,
    )
    report = run_suite(checks, ctx, base_url=root, model=args.model, progress=human)
    print("", file=human)
    print(format_table(report), file=human, flush=True)
    if args.json_path:
        if to_stdout_json:
            write_json(report, sys.stdout)
        else:
            with open(args.json_path, "w", encoding="utf-8") as fh:
                write_json(report, fh)
    return 0 if report.protocol_ok else 1


def make_context(args: argparse.Namespace):  # -> SuiteContext (imports lazily: the clients are optional)
    """Build the clients; raises ImportError when the ``[e2e]`` extra is not installed."""
    import anthropic
    import jsonschema  # noqa: F401  (used by the checks; fail early with the install hint)
    import openai

    from deepseek_frontend.e2e.checks import SuiteContext

    root = normalize_base_url(args.base_url)
    key = args.api_key or os.environ.get("DEEPSEEK_FRONTEND_API_KEY")
    # Both clients insist on a key; a server without auth ignores the placeholder.
    key = key or "not-needed"
    return SuiteContext(
        openai=openai.OpenAI(base_url=f"{root}/v1", api_key=key, timeout=args.timeout, max_retries=0),
        anthropic=anthropic.Anthropic(base_url=root, api_key=key, timeout=args.timeout, max_retries=0),
        model=args.model,
        max_tokens=args.max_tokens,
    )
