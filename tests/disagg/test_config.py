"""``serve``'s prefill/decode flags: what they resolve to, what they refuse, the backend they build."""

from __future__ import annotations

import argparse

import pytest

from deepseek_frontend.disagg.pool import DisaggregatedPool
from deepseek_frontend.fleet.config import ServerConfig
from deepseek_frontend.server import serve_command
from deepseek_frontend.server.compose import build_engine
from deepseek_frontend.tokenization import PromptTokenizer


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_prefill_and_decode_workers_serve_the_model_disaggregated_over_sglang(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    config = ServerConfig.from_args(
        parse(
            "--prefill-worker",
            "http://p1:30000/",
            "--prefill-worker",
            "dns+http://prefill:30000",
            "--decode-worker",
            "http://d1:30000",
            "--pd-transfer-timeout",
            "12.5",
            "--disaggregation-bootstrap-port",
            "9000",
        )
    )
    assert config.engine.kind == "sglang" and config.engine.workers == ()
    assert config.pd.prefill_workers == ("http://p1:30000", "dns+http://prefill:30000")
    assert config.pd.decode_workers == ("http://d1:30000",)
    assert config.pd.orchestrator.transfer_timeout_s == 12.5 and config.pd.orchestrator.bootstrap_port == 9000
    pool = build_engine(config, prompt_tokenizer)
    assert isinstance(pool, DisaggregatedPool)
    assert pool.config.transfer_timeout_s == 12.5 and pool.config.bootstrap_port == 9000
    assert {s.url for s in pool.prefill.statuses()} == {"http://p1:30000"}  # the dns+ one resolves at start
    assert pool.prefill.router is not pool.decode.router  # one router per role


def test_a_transfer_timeout_of_zero_means_none_and_the_defaults_are_sglangs() -> None:
    config = ServerConfig.from_args(
        parse("--prefill-worker", "http://p", "--decode-worker", "http://d", "--pd-transfer-timeout", "0")
    )
    assert config.pd.orchestrator.transfer_timeout_s is None and config.pd.orchestrator.bootstrap_port is None
    default = ServerConfig.from_args(parse("--prefill-worker", "http://p", "--decode-worker", "http://d"))
    assert default.pd.orchestrator.transfer_timeout_s == 60.0


def test_the_vllm_kv_connector_flag_reaches_the_orchestrator() -> None:
    argv = ("--engine", "vllm", "--prefill-worker", "http://p", "--decode-worker", "http://d")
    mooncake = ServerConfig.from_args(parse(*argv, "--vllm-kv-connector", "mooncake"))
    assert mooncake.pd.orchestrator.kv_connector == "mooncake" and mooncake.pd.orchestrator.engine == "vllm"
    assert ServerConfig.from_args(parse(*argv)).pd.orchestrator.kv_connector == "nixl"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            (
                "--prefill-worker",
                "http://p",
                "--decode-worker",
                "http://d",
                "--vllm-kv-connector",
                "mooncake",
            ),
            "--vllm-kv-connector applies to vLLM prefill/decode workers only",
        ),
        (("--prefill-worker", "http://p"), "both --prefill-worker and --decode-worker"),
        (("--decode-worker", "http://d"), "both --prefill-worker and --decode-worker"),
        (
            ("--worker", "http://w", "--prefill-worker", "http://p", "--decode-worker", "http://d"),
            "cannot be combined",
        ),
        (("--engine", "sim", "--prefill-worker", "http://p", "--decode-worker", "http://d"), "sim-engine"),
    ],
)
def test_inconsistent_pd_flags_are_refused_with_a_message(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerConfig.from_args(parse(*argv))
