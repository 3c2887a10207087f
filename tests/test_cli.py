"""The command line: every command is registered, and render / tokenize print what the server would send."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from deepseek_frontend.cli import COMMANDS, build_parser, main
from deepseek_frontend.commands._request import EXAMPLE_REQUEST
from deepseek_frontend.formats import attach_request_tools, dsv4
from deepseek_frontend.tokenization import (
    PromptTokenizer,
    bundled_tokenizer_path,
    v41_stand_in_tokenizer_json,
)


def test_every_command_is_registered_with_its_own_flags() -> None:
    parser = build_parser()
    for name in COMMANDS:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([name, "--help"])
        assert exit_info.value.code == 0


def test_render_prints_the_reference_prompt_of_the_bundled_example(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["render"]) == 0
    printed = capsys.readouterr().out
    body = json.loads(EXAMPLE_REQUEST.read_text())
    # The example asks for thinking and declares tools: the encoder's prompt, tools on a system message.
    messages = attach_request_tools(body["messages"], body["tools"])
    assert printed == dsv4.encode_messages(messages, "thinking") + "\n"


def test_render_segments_mark_only_template_tokens_special(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"messages": [{"role": "user", "content": "say </think> please"}]}))
    assert main(["render", "--segments", "--default-thinking", "off", str(request)]) == 0
    segments = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [s["text"] for s in segments if s["special"]] == [
        "<｜begin▁of▁sentence｜>",
        "<｜User｜>",
        "<｜Assistant｜>",
        "</think>",
    ]
    assert {"text": "say </think> please", "special": False} in segments


def test_tokenize_prints_the_count_and_ids_of_the_rendered_prompt(
    capsys: pytest.CaptureFixture[str], prompt_tokenizer: PromptTokenizer
) -> None:
    assert main(["tokenize", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    body = json.loads(EXAMPLE_REQUEST.read_text())
    prompt = dsv4.encode_messages(attach_request_tools(body["messages"], body["tools"]), "thinking")
    assert out["ids"] == prompt_tokenizer.encode_raw(prompt)
    assert out["count"] == len(out["ids"])


def test_a_bad_request_names_the_field_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = tmp_path / "bad.json"
    request.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "wizard"}]}))
    assert main(["render", str(request)]) == 2
    assert "messages[1].role" in capsys.readouterr().err


def test_the_console_entry_point_runs_as_a_module() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "deepseek_frontend", "render", str(EXAMPLE_REQUEST)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("<｜begin▁of▁sentence｜>")


def test_a_file_that_is_not_a_json_object_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = tmp_path / "list.json"
    request.write_text("[1, 2]")
    assert main(["render", str(request)]) == 2
    assert f"{request} must be a JSON object, got list" in capsys.readouterr().err
    request.write_text("{not json")
    assert main(["tokenize", str(request)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


def test_tokenize_of_a_v41_request_without_a_checkpoint_uses_the_stand_in_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = json.loads(EXAMPLE_REQUEST.read_text())
    body["model"] = "deepseek-v4.1-flash"
    request = tmp_path / "v41.json"
    request.write_text(json.dumps(body))
    assert main(["render", str(request)]) == 0
    prompt = capsys.readouterr().out.removesuffix("\n")
    assert prompt.startswith("<｜begin▁of▁sentence｜><｜System｜>")

    assert main(["tokenize", "--json", str(request)]) == 0
    captured = capsys.readouterr()
    stand_in = Tokenizer.from_str(v41_stand_in_tokenizer_json(bundled_tokenizer_path().read_text("utf-8")))
    ids = json.loads(captured.out)["ids"]
    assert ids == stand_in.encode(prompt, add_special_tokens=False).ids
    assert ids[1] == stand_in.token_to_id("<｜System｜>")
    assert "stand-in tokenizer" in captured.err and "--model-path" in captured.err
