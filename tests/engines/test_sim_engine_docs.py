"""Every ``sim-engine`` flag is documented in docs/serving.md's sim-engine section.

The flags are read from the command's real ``argparse`` parser, so a flag added to
``engines/sim/command.py`` (or its KV / PD argument groups) without a row in the table fails here.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from deepseek_frontend.engines.sim.command import add_arguments

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
HEADING = "## The simulated engine: `deepseek-frontend sim-engine`"


def sim_engine_flags() -> set[str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return {
        option
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        for option in action.option_strings
        if option.startswith("--")
    }


def documented_flags() -> set[str]:
    text = DOC.read_text(encoding="utf-8")
    assert HEADING in text, f"docs/serving.md has no section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    # a table row names its flag first: | `--flag ARG` | default | meaning |
    return set(re.findall(r"^\| `(--[a-z0-9-]+)", section, flags=re.MULTILINE))


def test_the_parser_has_the_flags_users_script() -> None:
    # guards the reader itself: a broken parser walk would make the next test pass vacuously
    assert {"--cumulative", "--fail-after", "--seed", "--speculative-num-steps"} <= sim_engine_flags()


def test_every_sim_engine_flag_has_a_row_in_the_serving_docs() -> None:
    missing = sorted(sim_engine_flags() - documented_flags())
    assert not missing, f"sim-engine flags missing from docs/serving.md ({HEADING}): {missing}"


def test_the_docs_name_no_flag_the_command_does_not_have() -> None:
    stale = sorted(documented_flags() - sim_engine_flags())
    assert not stale, f"docs/serving.md documents sim-engine flags that do not exist: {stale}"


def test_the_simulated_models_rules_are_documented_where_its_docstring_points() -> None:
    """``engines/sim/model.py`` states its rules for developers and points users to docs/serving.md,
    whose section must exist (the quick start and the README link to it)."""
    from deepseek_frontend.engines.sim import model

    section = "What the simulated model answers"
    assert f'docs/serving.md, "{section}"' in (model.__doc__ or "")
    text = DOC.read_text(encoding="utf-8")
    assert f"### {section}" in text
    readme = (DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    assert "docs/serving.md#what-the-simulated-model-answers" in readme
