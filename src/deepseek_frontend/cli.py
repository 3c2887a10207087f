"""The ``deepseek-frontend`` command line.

Each subcommand lives in its own module exposing ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int``; this file only maps names to modules, so a command's
flags sit next to the code that uses them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from deepseek_frontend import __version__

#: subcommand name -> module implementing it
COMMANDS: dict[str, str] = {
    "serve": "deepseek_frontend.server.serve_command",
    "sim-engine": "deepseek_frontend.engines.sim.command",
    "render": "deepseek_frontend.commands.render",
    "tokenize": "deepseek_frontend.commands.tokenize",
    "e2e": "deepseek_frontend.e2e.command",
}


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every subcommand's flags."""
    parser = argparse.ArgumentParser(
        prog="deepseek-frontend",
        description="OpenAI and Anthropic APIs for DeepSeek-V4 / V3.2 over SGLang or vLLM token-id workers.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP, allow_abbrev=False)
        module.add_arguments(command_parser)
        command_parser.set_defaults(_command_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._command_module.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
