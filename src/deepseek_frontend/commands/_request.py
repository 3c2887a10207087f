"""Shared by ``render`` and ``tokenize``: read an OpenAI chat request body and render it offline.

The request goes through exactly the server's path (``api.openai.chat_request.to_chat_request``
then ``PromptRenderer``), so what these commands print is what ``serve`` would send.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from deepseek_frontend.errors import FrontendError
from deepseek_frontend.formats.segments import PromptSegment

#: the bundled example request (``deepseek-frontend render`` with no FILE)
EXAMPLE_REQUEST = Path(__file__).resolve().parent.parent / "examples" / "chat_request.json"


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        nargs="?",
        default=str(EXAMPLE_REQUEST),
        metavar="FILE.json",
        help="an OpenAI /v1/chat/completions request body ('-' for stdin; default: a bundled example)",
    )
    parser.add_argument(
        "--model-path", default=None, help="checkpoint directory (config.json, tokenizer.json)"
    )
    parser.add_argument(
        "--reasoning-effort-profile",
        choices=("preview", "official", "release", "prerelease"),
        default=None,
        help="effort profile of the checkpoint (default: detected from the checkpoint, else preview)",
    )
    parser.add_argument(
        "--default-thinking",
        choices=("on", "off"),
        default="on",
        help="thinking mode when the request does not say (as the server's flag)",
    )


def load_body(file: str) -> dict[str, Any]:
    """The request body in ``file`` (``-``: stdin) as a JSON object (``RequestError`` otherwise)."""
    from deepseek_frontend.edge.body import parse_json_object

    raw = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    return parse_json_object(raw, "stdin" if file == "-" else file)


def render_request(args: argparse.Namespace) -> tuple[str, list[PromptSegment]]:
    """The format family and the prompt segments of the request in ``args.file``, rendered as ``serve``
    would (the family from ``--model-path``, else the request's ``model``, else DeepSeek-V4)."""
    from deepseek_frontend.api.openai.chat_request import to_chat_request
    from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
    from deepseek_frontend.formats import default_effort_profile, detect_family, read_checkpoint
    from deepseek_frontend.pipeline.chat import PromptRenderer

    body = load_body(args.file)
    model = body.get("model") if isinstance(body.get("model"), str) else None
    checkpoint = read_checkpoint(args.model_path)
    family = detect_family(checkpoint, model) or "deepseek_v4"
    config = ServerConfig(
        ModelConfig(
            served_model_name=model or "deepseek",
            family=family,
            model_path=args.model_path,
            default_thinking=args.default_thinking == "on",
            reasoning_effort_profile=args.reasoning_effort_profile
            or default_effort_profile(checkpoint, model),
        )
    )
    req = to_chat_request(body, config, "offline")
    return family, PromptRenderer(family, config.model.reasoning_effort_profile).render(req)


def report_error(exc: FrontendError) -> int:
    where = f" ({exc.param})" if exc.param else ""
    print(f"error{where}: {exc.message}", file=sys.stderr)
    return 2
