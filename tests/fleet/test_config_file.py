"""``serve --config FILE`` and ``--keys-file`` read into a Fleet: where files are found, what the
command line contributes, and the errors that name their place (the served end to end:
test_fleet.py)."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest

from deepseek_frontend.fleet.config_file import ConfigFileError, Fleet, fleet_from_args
from deepseek_frontend.server import serve_command
from deepseek_frontend.server.serve_flags import flag_actions


def load(*argv: str) -> Fleet:
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    return fleet_from_args(parser.parse_args(list(argv)), flag_actions())


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_relative_keys_file_flag_is_read_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "secrets" / "keys.yaml", "keys:\n  - {name: alice, key: sk-alice}\n")
    monkeypatch.chdir(tmp_path)
    fleet = load("--keys-file", "secrets/keys.yaml")
    assert fleet.tenants is not None and fleet.tenants.names == ("alice",)
    assert fleet.tenants.authenticate(b"sk-alice") is not None


def test_the_files_keys_file_is_relative_to_it_and_the_flags_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(
        tmp_path / "etc" / "fleet.yaml",
        "models:\n  - name: m1\nkeys_file: keys.yaml\nkeys:\n  - {name: inline, key: sk-inline}\n",
    )
    write(tmp_path / "etc" / "keys.yaml", "- {name: from-file, key: sk-file}\n")
    write(tmp_path / "more.yaml", "keys:\n  - {name: from-flag, key: sk-flag}\n")
    monkeypatch.chdir(tmp_path)
    fleet = load("--config", str(config), "--keys-file", "more.yaml", "--api-key", "sk-plain")
    assert fleet.tenants is not None
    assert fleet.tenants.names == (
        "inline",
        "from-file",
        "from-flag",
        "key-" + hashlib.sha256(b"sk-plain").hexdigest()[:8],
    )


def test_a_name_given_twice_across_the_sources_is_an_error(tmp_path: Path) -> None:
    config = write(
        tmp_path / "fleet.yaml",
        "models:\n  - name: m1\nkeys_file: keys.yaml\nkeys:\n  - {name: alice, key: sk-1}\n",
    )
    write(tmp_path / "keys.yaml", "- {name: alice, key: sk-2}\n")
    with pytest.raises(ValueError, match="'alice' is given twice"):
        load("--config", str(config))


def test_a_key_may_name_only_served_models(tmp_path: Path) -> None:
    config = write(
        tmp_path / "fleet.yaml",
        "models:\n  - name: m1\n    aliases: [m1-latest]\n"
        "keys:\n  - {name: alice, key: sk-1, models: [m1-latest]}\n",
    )
    with pytest.raises(
        ConfigFileError, match="key 'alice' names the model 'm1-latest', which no entry serves"
    ):
        load("--config", str(config))


def test_command_line_flags_are_every_models_defaults_and_entries_override_them(tmp_path: Path) -> None:
    config = write(
        tmp_path / "fleet.yaml",
        "models:\n  - name: m1\n  - name: m2\n    max_concurrent_requests: 7\n    default_thinking: false\n",
    )
    fleet = load("--config", str(config), "--max-concurrent-requests", "64", "--default-thinking", "on")
    m1, m2 = fleet.models
    assert (m1.limits.max_concurrent_requests, m1.model.default_thinking) == (64, True)
    assert (m2.limits.max_concurrent_requests, m2.model.default_thinking) == (7, False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: []\n", "'models' must be a non-empty list"),
        (
            "models:\n  - name: m1\n    max_concurrent_requests: lots\n",
            r"models\[0\]\.max_concurrent_requests",
        ),
        (
            "models:\n  - name: m1\n    workers: http://x:1\n    engine: tgi\n",
            r"models\[0\]\.engine: 'tgi' is not one of",
        ),
        ("models:\n  - name: m1\n    host: 0.0.0.0\n", r"models\[0\]\.host: is set for the whole server"),
        ("models:\n  - {}\n", r"models\[0\]\.name: every model needs its served name"),
        ("models:\n  - name: m1\nkeys_file: 3\n", "keys_file must be a path"),
        (
            "models:\n  - name: m1\nkeys:\n  - {name: a, key: k, requests_per_minute: -1}\n",
            r"keys\[0\]\.requests_per_minute",
        ),
    ],
)
def test_a_bad_value_names_its_place(tmp_path: Path, text: str, message: str) -> None:
    config = write(tmp_path / "fleet.yaml", text)
    with pytest.raises(ValueError, match=message):
        load("--config", str(config))
