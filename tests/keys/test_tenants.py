"""Tenant tables: keys-file validation (messages name the path, never a key), authentication by
key or by its SHA-256, model restrictions, plain ``--api-key`` tenants."""

from __future__ import annotations

import hashlib
import json

import pytest

from deepseek_frontend.keys.tenants import Tenant, TenantLimits, TenantTable, key_name, load_keys_file

SECRET = "sk-alice-0123456789abcdef"


def entries(**changes: object) -> list[dict[str, object]]:
    """Two valid entries; ``changes`` are applied to the second (``None`` removes a field)."""
    second: dict[str, object] = {"name": "ci", "key_sha256": hashlib.sha256(b"sk-ci").hexdigest()}
    for field, value in changes.items():
        if value is None:
            second.pop(field, None)
        else:
            second[field] = value
    return [
        {
            "name": "alice",
            "key": SECRET,
            "models": ["deepseek-v4-flash"],
            "requests_per_minute": 60,
            "tokens_per_minute": 200000,
            "concurrent_requests": 8,
        },
        second,
    ]


def test_entries_build_tenants_with_models_and_limits() -> None:
    table = TenantTable.from_entries(entries(concurrent_requests=2))
    assert len(table) == 2
    assert table.names == ("alice", "ci")
    alice = table.authenticate(SECRET.encode())
    assert alice is not None and alice.name == "alice"
    assert alice.limits == TenantLimits(60, 200000, 8)
    assert alice.may_use("deepseek-v4-flash")
    assert not alice.may_use("deepseek-v4-pro")
    ci = table.authenticate(b"sk-ci")
    assert ci is not None and ci.name == "ci"
    assert ci.limits == TenantLimits(concurrent_requests=2)
    assert ci.models is None and ci.may_use("anything")


def test_wrong_or_near_keys_are_refused() -> None:
    table = TenantTable.from_entries(entries())
    for presented in (b"", b"sk-alice", SECRET.encode() + b" ", b"sk-cj", hashlib.sha256(b"sk-ci").digest()):
        assert table.authenticate(presented) is None


def test_key_is_not_kept_nor_shown() -> None:
    table = TenantTable.from_entries(entries())
    alice = table.authenticate(SECRET.encode())
    assert alice is not None
    assert alice.key_sha256 == hashlib.sha256(SECRET.encode()).digest()
    assert SECRET not in repr(alice) and SECRET not in repr(table)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"requests_per_minute": -3}, "keys[1].requests_per_minute: must be a positive integer, got -3"),
        ({"tokens_per_minute": 0}, "keys[1].tokens_per_minute: must be a positive integer, got 0"),
        ({"concurrent_requests": 1.5}, "keys[1].concurrent_requests: must be a positive integer, got 1.5"),
        ({"concurrent_requests": True}, "keys[1].concurrent_requests: must be a positive integer, got True"),
        ({"requests_per_minute": "60"}, "keys[1].requests_per_minute: must be a positive integer, got '60'"),
        ({"key": "sk-other"}, "keys[1]: give either key or key_sha256, not both"),
        ({"key_sha256": None}, "keys[1]: give key or key_sha256"),
        ({"name": None}, "keys[1].name: required"),
        ({"name": ""}, "keys[1].name: must be a non-empty string, got ''"),
        ({"name": "alice"}, "keys[1].name: 'alice' is also the name of keys[0]"),
        ({"key_sha256": None, "key": SECRET}, "keys[1]: the same key as keys[0]"),
        (
            {"key_sha256": hashlib.sha256(SECRET.encode()).hexdigest()},
            "keys[1]: the same key as keys[0]",
        ),
        ({"key_sha256": "9f86d0"}, "keys[1].key_sha256: must be 64 hexadecimal digits"),
        ({"key_sha256": "z" * 64}, "keys[1].key_sha256: must be 64 hexadecimal digits"),
        ({"models": "deepseek-v4-flash"}, "keys[1].models: must be a list of model names, got a string"),
        ({"models": []}, "keys[1].models: must name at least one model"),
        ({"models": ["a", ""]}, "keys[1].models[1]: must be a non-empty string, got ''"),
        ({"rpm": 60}, "keys[1]: unknown field 'rpm'"),
    ],
)
def test_entry_errors_name_the_path(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        TenantTable.from_entries(entries(**changes))
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize("bad_key", [12345, "", ["sk-secret-in-a-list"]])
def test_a_bad_key_value_is_never_shown(bad_key: object) -> None:
    with pytest.raises(ValueError) as raised:
        TenantTable.from_entries(entries(key_sha256=None, key=bad_key))
    text = str(raised.value)
    assert text.startswith("keys[1].key: must be a non-empty string")
    assert "12345" not in text and "sk-secret" not in text


def test_the_list_and_its_entries_are_checked() -> None:
    with pytest.raises(ValueError, match=r"^tenants: must be a list of key entries, got a mapping$"):
        TenantTable.from_entries({"name": "alice"}, where="tenants")
    with pytest.raises(ValueError, match=r"^keys: must list at least one key$"):
        TenantTable.from_entries([])
    with pytest.raises(ValueError, match=r"^keys\[0\]: must be a mapping, got a string$"):
        TenantTable.from_entries(["sk-plain"])


def test_plain_keys_are_unlimited_and_named_by_digest() -> None:
    table = TenantTable.from_plain_keys(["sk-one", "sk-two", "sk-one"])
    assert table.names == (key_name(b"sk-one"), key_name(b"sk-two"))
    one = table.authenticate(b"sk-one")
    assert one is not None and one.name.startswith("key-") and len(one.name) == 12
    assert one.limits.unlimited and one.may_use("any-model")
    assert table.authenticate(b"sk-three") is None


def test_tables_combine_and_refuse_duplicates() -> None:
    files = TenantTable.from_entries(entries())
    plain = TenantTable.from_plain_keys(["sk-plain"])
    combined = TenantTable([*files, *plain])
    assert combined.names == ("alice", "ci", key_name(b"sk-plain"))
    with pytest.raises(ValueError, match="same key"):
        TenantTable([*files, *TenantTable.from_plain_keys([SECRET])])
    with pytest.raises(ValueError, match="given twice"):
        TenantTable([*files, Tenant("alice", hashlib.sha256(b"x").digest())])


def test_yaml_file_with_keys_mapping(tmp_path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(
        "keys:\n"
        "  - name: alice\n"
        f"    key: {SECRET}\n"
        "    models: [deepseek-v4-flash]\n"
        "    requests_per_minute: 60\n"
        "  - name: ci\n"
        f"    key_sha256: {hashlib.sha256(b'sk-ci').hexdigest()}\n"
        "    concurrent_requests: 2\n"
    )
    table = load_keys_file(path)
    assert table.names == ("alice", "ci")
    ci = table.authenticate(b"sk-ci")
    assert ci is not None and ci.limits.concurrent_requests == 2


def test_json_file_with_a_list(tmp_path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(entries()))
    assert load_keys_file(path).names == ("alice", "ci")
    path.write_text(json.dumps(entries(requests_per_minute=-3)))
    with pytest.raises(ValueError) as raised:
        load_keys_file(path)
    assert str(raised.value) == f"{path}[1].requests_per_minute: must be a positive integer, got -3"


def test_file_errors_start_with_the_file_name(tmp_path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(f"keys:\n  - name: alice\n    key: {SECRET}\n    requests_per_minute: -3\n")
    with pytest.raises(ValueError) as raised:
        load_keys_file(path)
    assert str(raised.value) == f"{path}: keys[0].requests_per_minute: must be a positive integer, got -3"

    path.write_text(f"keys:\n  - name: alice\n    key: {SECRET}\nextra: 1\n")
    with pytest.raises(ValueError, match="unknown field 'extra'"):
        load_keys_file(path)

    path.write_text("")
    with pytest.raises(ValueError, match="must be a list of key entries or a mapping"):
        load_keys_file(path)

    with pytest.raises(ValueError, match="cannot read"):
        load_keys_file(tmp_path / "missing.yaml")


def test_syntax_errors_do_not_quote_the_file(tmp_path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(f"keys:\n  - name: alice\n    key: [{SECRET}\n")
    with pytest.raises(ValueError) as raised:
        load_keys_file(path)
    assert str(raised.value).startswith(f"{path}: line ")
    assert SECRET not in str(raised.value)

    path = tmp_path / "keys.json"
    path.write_text(f'[{{"name": "alice", "key": "{SECRET}",]')
    with pytest.raises(ValueError) as raised:
        load_keys_file(path)
    assert "not valid JSON" in str(raised.value) and SECRET not in str(raised.value)


def test_batch_limits_are_read_per_key_and_default_to_the_flags() -> None:
    from deepseek_frontend.fleet.batch_config import BatchLimits, BatchOptions

    table = TenantTable.from_entries(entries(batch_max_lines=10, max_active_batches=2))
    ci = table.by_name("ci")
    assert ci is not None and table.by_name("nobody") is None
    assert ci.limits == TenantLimits(batch_max_lines=10, max_active_batches=2)
    assert ci.limits.unlimited  # batch limits are not rate limits
    options = BatchOptions(limits=BatchLimits(max_lines=100, max_bytes=1000, max_active=5))
    assert options.limits_for(ci) == BatchLimits(max_lines=10, max_bytes=1000, max_active=2)
    assert options.limits_for(None) == options.limits
    with pytest.raises(ValueError, match=r"keys\[1\]\.batch_max_bytes: must be a positive integer"):
        TenantTable.from_entries(entries(batch_max_bytes=0))
