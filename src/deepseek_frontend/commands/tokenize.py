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
    from deepseek_frontend.tokenization import has_own_tokenizer, load_for_family

    try:
        family, segments = render_request(args)
        ids = load_for_family(family, args.model_path).encode_segments(segments)
    except FrontendError as exc:
        return report_error(exc)
    if family == "deepseek_v41" and not has_own_tokenizer(args.model_path):
        # the same stand-in `serve --served-model-name deepseek-v4.1-flash` runs the simulated engine on
        print(
            "note: DeepSeek-V4.1 without --model-path: these ids are the stand-in tokenizer's (the bundled "
            "DeepSeek-V4 tokenizer with ids 128799 and 129264 renamed to <｜System｜> and "
            "<｜deepseek_image｜>), not the checkpoint's; pass --model-path for the real ids",
            file=sys.stderr,
        )
    if args.json:
        sys.stdout.write(orjson.dumps({"count": len(ids), "ids": ids}).decode() + "\n")
    else:
        sys.stdout.write(f"tokens: {len(ids)}\n{' '.join(map(str, ids))}\n")
    return 0
