"""The field validators every protocol adapter uses: one message style, the path first."""

from __future__ import annotations

from typing import Any

import pytest

from deepseek_frontend.api.validation import (
    check_array,
    check_boolean,
    check_integer,
    check_number,
    check_object,
    check_string,
    check_tool_name,
    json_type,
)
from deepseek_frontend.errors import RequestError

PATH = "messages[2].content"


def rejection(check: Any, value: Any, **options: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        check(value, PATH, **options)
    assert info.value.param == PATH
    assert info.value.status_code == 400
    return info.value


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (None, "null"),
        (True, "boolean"),
        (3, "number"),
        (2.5, "number"),
        ("x", "string"),
        ([], "array"),
        ({}, "object"),
    ],
)
def test_json_type_names_values_as_json_does(value: Any, name: str) -> None:
    assert json_type(value) == name


@pytest.mark.parametrize(
    ("check", "value", "message"),
    [
        (check_string, 3, f"{PATH}: expected a string, got number"),
        (check_object, [], f"{PATH}: expected an object, got array"),
        (check_array, "x", f"{PATH}: expected an array, got string"),
        (check_boolean, 1, f"{PATH}: expected a boolean, got number"),
        (check_integer, 1.5, f"{PATH}: expected an integer, got number"),
        (check_integer, True, f"{PATH}: expected an integer, got boolean"),
    ],
)
def test_a_wrong_type_names_the_path_then_what_was_expected_and_what_came(
    check: Any, value: Any, message: str
) -> None:
    assert rejection(check, value).message == message


def test_bounds_are_checked_and_named() -> None:
    assert rejection(check_integer, 0, minimum=1).message == f"{PATH}: must be at least 1, got 0"
    assert rejection(check_integer, 9, maximum=8).message == f"{PATH}: must be at most 8, got 9"
    too_hot = rejection(check_number, 3, minimum=0, maximum=2)
    assert too_hot.message == f"{PATH}: must be between 0 and 2, got 3"
    assert rejection(check_string, "", non_empty=True).message == f"{PATH}: must not be empty"
    assert rejection(check_array, [], non_empty=True).message == f"{PATH}: must not be empty"


def test_true_is_no_number_and_infinity_is_refused() -> None:
    assert (
        rejection(check_number, True, minimum=0, maximum=2).message
        == f"{PATH}: expected a number, got boolean"
    )
    assert "finite" in rejection(check_number, float("inf"), minimum=0, maximum=2).message


def test_absent_fields_take_the_default_only_when_one_is_given() -> None:
    assert check_number(None, PATH, minimum=0, maximum=2, default=1.0) == 1.0
    assert check_integer(None, PATH, default=None) is None
    assert check_boolean(None, PATH, default=False) is False
    assert check_string(None, PATH, default="") == ""
    assert check_object(None, PATH, default=None) is None
    assert rejection(check_string, None).message == f"{PATH}: expected a string, got null"


def test_valid_values_come_back_typed() -> None:
    assert check_number(1, PATH, minimum=0, maximum=2) == 1.0
    assert isinstance(check_number(1, PATH, minimum=0, maximum=2), float)
    assert check_integer(-1, PATH, minimum=-1) == -1
    assert check_string("x", PATH, non_empty=True) == "x"


def test_a_named_tool_must_be_declared() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    assert check_tool_name("get_weather", "tool_choice.name", tools) == {
        "type": "function",
        "function": {"name": "get_weather"},
    }
    with pytest.raises(RequestError) as info:
        check_tool_name("nope", "tool_choice.name", tools)
    assert info.value.param == "tool_choice.name"
    assert info.value.message == "tool_choice.name: no tool named 'nope' is declared"
