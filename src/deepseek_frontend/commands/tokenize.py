"""``deepseek-frontend tokenize FILE.json``: token count and ids of an OpenAI chat request's prompt."""

from __future__ import annotations

import argparse
import sys

import orjson

from deepseek_frontend.commands._request import add_request_arguments, render_request, report_error
from deepseek_frontend.errors import FrontendError

HELP = "print the token count and ids of the prompt an OpenAI chat request body renders to"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_request_arguments(parser)
    parser.add_argument("--json", action="store_true", help='print {"count": N, "ids": [...]} as JSON')


def run(args: argparse.Namespace) -> int:
    from deepseek_frontend.tokenization import PromptTokenizer

    try:
        segments = render_request(args)
        ids = PromptTokenizer.load(args.model_path).encode_segments(segments)
    except FrontendError as exc:
        return report_error(exc)
    if args.json:
        sys.stdout.write(orjson.dumps({"count": len(ids), "ids": ids}).decode() + "\n")
    else:
        sys.stdout.write(f"tokens: {len(ids)}\n{' '.join(map(str, ids))}\n")
    return 0
