"""Several models from one ``serve --config FILE`` server, end to end over real processes and HTTP.

* a DeepSeek-V4 model on an aggregated sim-engine worker and a DeepSeek-V4.1 model (a stand-in
  checkpoint) on a sim-engine prefill/decode pair answer side by side on both APIs, each response
  echoing the name asked for; an exact alias is answered by its model's workers in its model's
  prompt format; ``/v1/models``, ``/health`` and ``/metrics`` cover both;
* one model's worker dying fails only that model's requests (503 in the client's shape, at once)
  while the other model answers every request of a concurrent stream;
* SIGHUP under load swaps models and keys without failing or cutting short any request, lets the
  requests of a removed model finish, and refuses a configuration that does not load;
* ``serve --config`` with a bad file exits 2 with a message naming the place.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.support.checkpoints import v41_checkpoint
from tests.support.servers import Server, start_frontend, start_sim_engine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

V4 = "deepseek-v4-flash"
V41 = "deepseek-v4.1-flash"
ALIAS = "deepseek-v4-flash-legacy"
SAY_OK = [{"role": "user", "content": "Reply with exactly: ok"}]
#: a system message: V4.1 opens the prompt with its own <｜System｜> token, V4 does not
WITH_SYSTEM = [{"role": "system", "content": "You are terse."}, *SAY_OK]
#: bounds every single HTTP request of these tests
REQUEST_TIMEOUT_S = 30.0


# ---------------------------------------------------------------- processes and configuration


def start_all(stack: contextlib.ExitStack, *starters: Callable[[], Server]) -> list[Server]:
    """Start the processes side by side (each stopped when ``stack`` closes, also on a failed start)."""
    with ThreadPoolExecutor(len(starters)) as pool:
        futures = [pool.submit(start) for start in starters]
    servers = [stack.enter_context(f.result()) for f in futures if f.exception() is None]
    for error in (f.exception() for f in futures):
        if error is not None:
            raise error
    return servers


def prefill_sim(*extra: str) -> Server:
    return start_sim_engine(
        "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0", *extra
    )


def decode_sim(*extra: str) -> Server:
    return start_sim_engine("--disaggregation-mode", "decode", *extra)


def write_config(path: Path, models: list[dict[str, Any]], keys: list[dict[str, Any]] | None = None) -> Path:
    data: dict[str, Any] = {"models": models}
    if keys is not None:
        data["keys"] = keys
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def serve_config(path: Path) -> Server:
    """``serve --config PATH``, with quick health checks for every model (a command-line default)."""
    return start_frontend("--config", str(path), "--health-check-interval", "0.5")


# ---------------------------------------------------------------- requests


def headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def chat_failure(
    url: str, model: str, *, stream: bool, key: str | None = None, content: str = ""
) -> str | None:
    """One chat completion; None when it finished normally, else what went wrong.

    Normally: 200 answering under ``model``, and a stream ends with a finish reason and ``[DONE]``.
    """
    messages = [{"role": "user", "content": content}] if content else SAY_OK
    body = {"model": model, "messages": messages, "max_tokens": 200, "stream": stream}
    try:
        with httpx.stream(
            "POST", url + "/v1/chat/completions", json=body, headers=headers(key), timeout=REQUEST_TIMEOUT_S
        ) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:300]}"
            if not stream:
                answer = json.loads(r.read())
                if answer["model"] != model or answer["choices"][0]["finish_reason"] not in (
                    "stop",
                    "length",
                ):
                    return f"unexpected answer {answer}"
                return None
            finish, done = None, False
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return f"error event {chunk}"
                    if chunk["model"] != model:
                        return f"chunk for {chunk['model']!r}"
                    finish = next(
                        (c["finish_reason"] for c in chunk["choices"] if c["finish_reason"]), finish
                    )
            if not done or finish not in ("stop", "length"):
                return f"stream cut short (finish={finish}, [DONE] seen: {done})"
            return None
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
        return f"{type(exc).__name__}: {exc}"


def anthropic_message(url: str, model: str) -> httpx.Response:
    body = {"model": model, "max_tokens": 64, "messages": SAY_OK}
    return httpx.post(
        url + "/v1/messages",
        json=body,
        headers={"anthropic-version": "2023-06-01"},
        timeout=REQUEST_TIMEOUT_S,
    )


@dataclass
class Load:
    """Threads each looping over chat completions to one model (streamed and not, alternately)."""

    url: str
    model: str
    key: str | None = None
    threads: int = 4
    #: (start, end, failure or None) per finished request
    results: list[tuple[float, float, str | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _loop(self, index: int) -> None:
        i = index
        while not self._stop.is_set():
            started = time.monotonic()
            failure = chat_failure(self.url, self.model, stream=i % 2 == 0, key=self.key)
            self.results.append((started, time.monotonic(), failure))
            i += 1

    def __enter__(self) -> Load:
        for index in range(self.threads):
            thread = threading.Thread(target=self._loop, args=(index,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=REQUEST_TIMEOUT_S + 5)

    def started_after(self, moment: float) -> int:
        return sum(1 for started, _, _ in list(self.results) if started > moment)

    def failures(self) -> list[str]:
        return [failure for _, _, failure in self.results if failure is not None]


# ---------------------------------------------------------------- what the server reports


def metric_samples(server: Server, name: str) -> dict[str, float]:
    """``name``'s samples in ``/metrics``, by their label text (``{a="b",...}``, '' without labels)."""
    text = httpx.get(server.url + "/metrics", timeout=5).text
    return {
        m.group(1) or "": float(m.group(2))
        for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M)
    }


def requests_of(server: Server, model: str) -> float:
    """``requests_total`` summed over the series labelled ``model``."""
    samples = metric_samples(server, "deepseek_frontend_requests_total")
    return sum(v for labels, v in samples.items() if f'model="{model}"' in labels)


def listed(server: Server, key: str | None = None) -> set[str]:
    r = httpx.get(server.url + "/v1/models", headers=headers(key), timeout=5)
    assert r.status_code == 200, r.text
    return {m["id"] for m in r.json()["data"]}


def health(server: Server, model: str | None = None) -> httpx.Response:
    return httpx.get(server.url + "/health", params={"model": model} if model else None, timeout=5)


def sim_started(server: Server) -> int:
    return int(httpx.get(server.url + "/sim/stats", timeout=5).json()["started"])


# ---------------------------------------------------------------- two models side by side


@dataclass
class TwoModels:
    frontend: Server
    v4_worker: Server
    prefill: Server
    decode: Server


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoModels]:
    """V4 on an aggregated worker and V4.1 on a prefill/decode pair, from one configuration file."""
    tmp_path = tmp_path_factory.mktemp("two-models")
    checkpoint = v41_checkpoint(tmp_path / "DeepSeek-V4.1-Flash")
    with contextlib.ExitStack() as stack:
        v4_worker, prefill, decode = start_all(stack, start_sim_engine, prefill_sim, decode_sim)
        config = write_config(
            tmp_path / "fleet.yaml",
            [
                {"name": V4, "engine": "sglang", "workers": [v4_worker.url]},
                {
                    "name": V41,
                    "aliases": [ALIAS],
                    "model_path": str(checkpoint),
                    "engine": "sglang",
                    "prefill_workers": [prefill.url],
                    "decode_workers": [decode.url],
                },
            ],
        )
        frontend = stack.enter_context(serve_config(config))
        wait_until(lambda: health(frontend).json()["status"] == "ok", "every worker of both models healthy")
        models = TwoModels(frontend, v4_worker, prefill, decode)
        yield models
        models.v4_worker.stop()  # the worker a test started again in place of the first one


def test_two_models_answer_side_by_side_on_both_apis(two_models: TwoModels) -> None:
    fe = two_models.frontend
    client = openai.OpenAI(
        base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    )
    sent = {V4: 0, V41: 0}
    for name, served in ((V4, V4), (V41, V41), (ALIAS, V41)):
        answer = client.chat.completions.create(model=name, messages=SAY_OK)  # type: ignore[arg-type]
        assert answer.model == name and answer.choices[0].message.content == "ok"
        chunks = list(client.chat.completions.create(model=name, messages=SAY_OK, stream=True))  # type: ignore[arg-type]
        assert {c.model for c in chunks} == {name}
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
            "stop"
        ]
        message = anthropic_message(fe.url, name)
        assert message.status_code == 200, message.text
        assert message.json()["model"] == name and message.json()["content"][-1]["text"] == "ok"
        sent[served] += 3

    # the alias is answered by the V4.1 workers, with V4.1's prompt (its <｜System｜> token)
    workers = {"v4": two_models.v4_worker, "prefill": two_models.prefill, "decode": two_models.decode}
    before = {role: sim_started(s) for role, s in workers.items()}
    usage = {
        name: client.chat.completions.create(model=name, messages=WITH_SYSTEM).usage  # type: ignore[arg-type]
        for name in (V4, V41, ALIAS)
    }
    sent[V4] += 1
    sent[V41] += 2
    prompt_tokens = {name: u.prompt_tokens for name, u in usage.items() if u is not None}
    assert prompt_tokens[ALIAS] == prompt_tokens[V41] != prompt_tokens[V4], prompt_tokens
    started = {role: sim_started(s) - before[role] for role, s in workers.items()}
    assert started == {"v4": 1, "prefill": 2, "decode": 2}

    models = httpx.get(fe.url + "/v1/models", timeout=5).json()["data"]
    assert [m["id"] for m in models] == [V4, V41, ALIAS]
    assert next(m for m in models if m["id"] == ALIAS)["parent"] == V41

    report = health(fe)
    assert report.status_code == 200 and report.json()["status"] == "ok"
    by_model = {m["model"]: m for m in report.json()["models"]}
    assert set(by_model) == {V4, V41}
    assert by_model[V4]["family"] == "deepseek_v4" and by_model[V41]["family"] == "deepseek_v41"
    assert {w["url"] for w in by_model[V41]["workers"]} == {two_models.prefill.url, two_models.decode.url}
    assert [w["url"] for w in by_model[V4]["workers"]] == [two_models.v4_worker.url]

    # each model's requests are counted under its served name (the alias's under V4.1)
    wait_until(
        lambda: (requests_of(fe, V4), requests_of(fe, V41)) == (sent[V4], sent[V41]),
        f"requests_total per model {sent}",
    )


def test_a_dead_worker_fails_only_its_own_models_requests(two_models: TwoModels) -> None:
    fe = two_models.frontend
    client = openai.OpenAI(
        base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    )
    with Load(fe.url, V41, threads=3) as v41_load:
        wait_until(lambda: len(v41_load.results) >= 3, "V4.1 answers before the kill", timeout=20)
        two_models.v4_worker.proc.kill()
        two_models.v4_worker.proc.wait(timeout=10)
        killed_at = time.monotonic()
        for stream in (False, True):
            started = time.monotonic()
            with pytest.raises(openai.APIStatusError) as refused:
                answer = client.chat.completions.create(model=V4, messages=SAY_OK, stream=stream)  # type: ignore[arg-type]
                if stream:
                    list(answer)  # type: ignore[arg-type]
            assert refused.value.status_code == 503, refused.value
            assert time.monotonic() - started < 10, "a request to a model with no worker waits for none"
            error = refused.value.body
            assert isinstance(error, dict) and error["type"] and error["message"], error
        message = anthropic_message(fe.url, V4)
        assert message.status_code == 503, message.text
        assert message.json()["type"] == "error" and message.json()["error"]["message"], message.text

        wait_until(lambda: health(fe, V4).status_code == 503, "/health?model=V4 is 503", timeout=10)
        assert health(fe, V4).json()["status"] == "unavailable"
        report = health(fe)
        assert report.status_code == 200 and report.json()["status"] == "degraded", report.text
        assert {m["model"]: m["status"] for m in report.json()["models"]} == {V4: "unavailable", V41: "ok"}
        assert health(fe, V41).status_code == 200
        wait_until(lambda: v41_load.started_after(killed_at) >= 6, "V4.1 answers after the kill", timeout=30)
    assert v41_load.failures() == []
    assert len(v41_load.results) >= 9

    # the worker back on its address: the model answers again
    port = two_models.v4_worker.url.rsplit(":", 1)[1]
    two_models.v4_worker = start_sim_engine("--port", port)
    wait_until(lambda: health(fe, V4).status_code == 200, "V4 healthy again", timeout=15)
    assert chat_failure(fe.url, V4, stream=True) is None


# ---------------------------------------------------------------- reloading the configuration

KEPT = "deepseek-v4-flash"
CHANGED = "deepseek-v4-pro"
REMOVED = "deepseek-v4-flash-slow"
ADDED = "deepseek-v4-flash-new"
LOAD_KEY, OLD_KEY, NEW_KEY = "sk-load-0123456789", "sk-old-0123456789", "sk-new-0123456789"


def sighup(server: Server) -> None:
    os.kill(server.proc.pid, signal.SIGHUP)


def reloads(server: Server, result: str) -> float:
    samples = metric_samples(server, "deepseek_frontend_config_reloads_total")
    return samples.get(f'{{result="{result}"}}', 0.0)


def test_sighup_swaps_models_and_keys_under_load(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        # the changed model moves from the kept model's worker to a worker of its own
        kept_worker, new_worker, slow_worker = start_all(
            stack, start_sim_engine, start_sim_engine, lambda: start_sim_engine("--itl-ms", "150")
        )
        path = tmp_path / "fleet.yaml"
        write_config(
            path,
            [
                {"name": KEPT, "workers": [kept_worker.url]},
                {"name": CHANGED, "workers": [kept_worker.url]},
                {"name": REMOVED, "workers": [slow_worker.url]},
            ],
            keys=[{"name": "load", "key": LOAD_KEY}, {"name": "old", "key": OLD_KEY}],
        )
        fe = stack.enter_context(serve_config(path))
        wait_until(lambda: health(fe).json()["status"] == "ok", "every worker healthy")
        assert listed(fe, OLD_KEY) == {KEPT, CHANGED, REMOVED}
        assert httpx.get(fe.url + "/v1/models", headers=headers(NEW_KEY), timeout=5).status_code == 401

        slow: list[str | None] = []
        slow_request = threading.Thread(  # about 115 tokens, 150 ms apart: in flight through the reload
            target=lambda: slow.append(
                chat_failure(
                    fe.url, REMOVED, stream=True, key=LOAD_KEY, content="Write 60 words about the sea."
                )
            )
        )
        with (
            Load(fe.url, KEPT, LOAD_KEY, threads=2) as kept_load,
            Load(fe.url, CHANGED, LOAD_KEY, threads=2) as changed_load,
        ):
            wait_until(
                lambda: min(len(kept_load.results), len(changed_load.results)) >= 2,
                "requests before the reload",
            )
            kept_before = requests_of(fe, KEPT)
            counted_at = time.monotonic()  # requests started from now on are not in kept_before
            slow_request.start()
            wait_until(
                lambda: httpx.get(slow_worker.url + "/sim/stats", timeout=5).json()["running"] == 1,
                "the slow request runs on the model to be removed",
            )
            write_config(
                path,
                [
                    {"name": KEPT, "workers": [kept_worker.url]},
                    {"name": CHANGED, "workers": [new_worker.url]},
                    {"name": ADDED, "workers": [kept_worker.url]},
                ],
                keys=[{"name": "load", "key": LOAD_KEY}, {"name": "new", "key": NEW_KEY}],
            )
            sighup(fe)
            wait_until(
                lambda: listed(fe, LOAD_KEY) == {KEPT, CHANGED, ADDED}, "the new models listed", timeout=40
            )
            swapped_at = time.monotonic()
            assert slow_request.is_alive(), "the removed model's request was still running at the swap"
            wait_until(
                lambda: min(kept_load.started_after(swapped_at), changed_load.started_after(swapped_at)) >= 3,
                "requests after the reload",
                timeout=30,
            )
        slow_request.join(timeout=REQUEST_TIMEOUT_S)
        assert slow == [None], "the request in flight on the removed model finished normally"
        assert kept_load.failures() == [] and changed_load.failures() == []
        assert reloads(fe, "applied") == 1
        # the unchanged model was kept as it was: its counters go on (a new one would start at 0)
        counted_since = kept_before + kept_load.started_after(counted_at)
        wait_until(lambda: requests_of(fe, KEPT) >= counted_since, "the kept model's requests counted on")
        assert set(metric_samples(fe, "deepseek_frontend_model_info")) == {
            f'{{model="{name}"}}' for name in (KEPT, CHANGED, ADDED)
        }

        removed = httpx.post(
            fe.url + "/v1/chat/completions",
            json={"model": REMOVED, "messages": SAY_OK},
            headers=headers(LOAD_KEY),
            timeout=REQUEST_TIMEOUT_S,
        )
        assert removed.status_code == 404 and removed.json()["error"]["code"] == "model_not_found", (
            removed.text
        )
        assert chat_failure(fe.url, ADDED, stream=True, key=NEW_KEY) is None
        assert chat_failure(fe.url, ADDED, stream=False, key=NEW_KEY) is None
        assert httpx.get(fe.url + "/v1/models", headers=headers(OLD_KEY), timeout=5).status_code == 401
        assert (chat_failure(fe.url, KEPT, stream=False, key=OLD_KEY) or "").startswith("HTTP 401")
        # the changed model's requests now go to its new worker only
        old_started, new_started = sim_started(kept_worker), sim_started(new_worker)
        assert chat_failure(fe.url, CHANGED, stream=False, key=LOAD_KEY) is None
        assert (sim_started(kept_worker), sim_started(new_worker)) == (old_started, new_started + 1)

        # a configuration that does not load is refused: the server keeps the one it serves
        path.write_text(
            path.read_text(encoding="utf-8").replace(
                f"name: {KEPT}", f"name: {KEPT}\n  router_mode: sideways"
            )
        )
        assert "sideways" in path.read_text(encoding="utf-8")
        sighup(fe)
        wait_until(lambda: reloads(fe, "refused") == 1, "the broken configuration refused", timeout=20)
        assert reloads(fe, "applied") == 1
        assert listed(fe, NEW_KEY) == {KEPT, CHANGED, ADDED}
        assert chat_failure(fe.url, KEPT, stream=True, key=NEW_KEY) is None
        assert "models[0].router_mode" in fe.log()


# ---------------------------------------------------------------- configuration errors

#: (what the file says, extra command-line flags, what the message must say)
BAD_CONFIGS = [
    (
        {"models": [{"name": V4}, {"name": "deepseek-v4-pro", "router_mode": "sideways"}]},
        [],
        "models[1].router_mode: 'sideways' is not one of",
    ),
    ({"models": [{"name": V4, "colour": "blue"}]}, [], "models[0].colour: is not a serve flag"),
    ({"models": [{"name": V4}], "modles": []}, [], "unknown key 'modles'"),
    ({"models": [{"name": V4, "port": 8000}]}, [], "models[0].port: is set for the whole server"),
    (
        {"models": [{"name": V4}, {"name": "deepseek-v4-pro"}, {"name": V4}]},
        [],
        f"models[2]: the name '{V4}' is already answered by models[0]",
    ),
    (
        {"models": [{"name": V4}, {"name": "deepseek-v4-pro", "aliases": [V4]}]},
        [],
        f"models[1]: the name '{V4}' is already answered by models[0]",
    ),
    ({"models": [{"name": V4}]}, ["--worker", "http://127.0.0.1:9"], "--worker: set per model"),
]


def test_a_bad_configuration_file_stops_serve_with_its_place(tmp_path: Path) -> None:
    runs = []
    for i, (data, extra, _) in enumerate(BAD_CONFIGS):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        command = [
            sys.executable,
            "-m",
            "deepseek_frontend",
            "serve",
            "--port",
            "0",
            "--config",
            str(path),
            *extra,
        ]
        runs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc, (_, _, expected) in zip(runs, BAD_CONFIGS, strict=True):
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 2, (expected, out, err)
        assert expected in err, (expected, err)
        assert "listening on" not in out + err
