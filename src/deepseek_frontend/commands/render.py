"""``deepseek-frontend render FILE.json``: print the DeepSeek prompt of an OpenAI chat request."""

from __future__ import annotations

import argparse
import sys

import orjson

from deepseek_frontend.commands._request import add_request_arguments, render_request, report_error
from deepseek_frontend.errors import FrontendError
from deepseek_frontend.formats.segments import join_segments

HELP = "print the DeepSeek prompt an OpenAI chat request body renders to"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_request_arguments(parser)
    parser.add_argument(
        "--segments",
        action="store_true",
        help="print the segments as JSON lines ({'text', 'special'}) instead of the prompt string",
    )


def run(args: argparse.Namespace) -> int:
    try:
        _family, segments = render_request(args)
    except FrontendError as exc:
        return report_error(exc)
    if args.segments:
        for seg in segments:
            sys.stdout.write(orjson.dumps({"text": seg.text, "special": seg.special}).decode() + "\n")
    else:
        sys.stdout.write(join_segments(segments) + "\n")
    return 0
