"""A key's priority and ceiling, from a ``--config`` file's ``keys:`` and from a keys file."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_config_file import load, write


def test_keys_carry_their_priority_and_ceiling_from_the_config_and_the_keys_file(tmp_path: Path) -> None:
    config = write(
        tmp_path / "fleet.yaml",
        "models:\n  - name: m1\nkeys_file: keys.json\n"
        "keys:\n  - {name: agents, key: sk-a, priority: 10}\n"
        "  - {name: batch, key: sk-b, priority: -10, max_priority: 0}\n",
    )
    write(tmp_path / "keys.json", '[{"name": "plain", "key": "sk-p"}]')
    fleet = load("--config", str(config))
    assert fleet.tenants is not None
    limits = {name: fleet.tenants.by_name(name).limits for name in fleet.tenants.names}  # type: ignore[union-attr]
    assert (limits["agents"].priority, limits["agents"].max_priority) == (10, None)
    assert (limits["batch"].priority, limits["batch"].max_priority) == (-10, 0)
    assert (limits["plain"].priority, limits["plain"].max_priority) == (None, None)


def test_a_default_above_the_ceiling_is_refused_naming_its_place(tmp_path: Path) -> None:
    config = write(
        tmp_path / "fleet.yaml",
        "models:\n  - name: m1\nkeys:\n  - {name: k, key: sk-k, priority: 3, max_priority: 1}\n",
    )
    with pytest.raises(ValueError, match=r"keys\[0\]\.priority: 3 is above the key's max_priority \(1\)"):
        load("--config", str(config))
