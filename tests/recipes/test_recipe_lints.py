"""Lints for the DeepSeek-V4-Flash SGLang recipes: the mistakes seen in public recipes cannot come back.

Each test reads every manifest of both variants (B200 FP4 and H200 FP8; DGD and plain Kubernetes) through the
``Workload`` view in ``recipe_checks``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deepseek_frontend.cli import build_parser
from tests.support.checkpoints import v41_checkpoint

from .recipe_checks import (
    NAMESPACE_REF,
    SGLANG_PROBE_PATHS,
    VARIANT_DIRS,
    Workload,
    all_workloads,
    claim_references,
    container_port_numbers,
    cuda_visible_devices_problem,
    defined_pvcs,
    headless_services,
    http_probes,
    load_documents,
    parse_dockerfile,
    parse_worker_url,
    selects,
    service_target_port,
    sglang_flag_problems,
)

VARIANTS = sorted(VARIANT_DIRS)
GPUS_PER_WORKER = 4

#: The B200 launch flags of SGLang's published DeepSeek-V4-Flash FP4 low-latency recipe, plus the token
#: protocol flags; flag -> value (None for switches).
B200_WORKER_FLAGS: dict[str, str | None] = {
    "--tensor-parallel-size": "4",
    "--moe-runner-backend": "flashinfer_mxfp4",
    "--speculative-algorithm": "EAGLE",
    "--speculative-num-steps": "3",
    "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "4",
    "--chunked-prefill-size": "4096",
    "--disable-flashinfer-autotune": None,
    "--swa-full-tokens-ratio": "0.1",
    "--grammar-backend": "xgrammar",
    "--incremental-streaming-output": None,
}
B200_WORKER_ENV = {
    "SGLANG_JIT_DEEPGEMM_PRECOMPILE": "0",
    "SGLANG_JIT_DEEPGEMM_FAST_WARMUP": "1",
}
#: SGLang's published H200 FP8 low-latency recipe for DeepSeek-V4-Flash, plus the token protocol flags.
H200_WORKER_FLAGS: dict[str, str | None] = {
    "--tensor-parallel-size": "4",
    "--speculative-algorithm": "EAGLE",
    "--speculative-num-steps": "3",
    "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "4",
    "--grammar-backend": "xgrammar",
    "--incremental-streaming-output": None,
}
H200_WORKER_ENV = {"SGLANG_DSV4_FP4_EXPERTS": "0"}
GPU_PRODUCT = {"b200": "NVIDIA-B200", "h200": "NVIDIA-H200", "v41-b200": "NVIDIA-B200"}
CHECKPOINT = {
    "b200": "/models/deepseek-ai/DeepSeek-V4-Flash",
    "h200": "/models/sgl-project/DeepSeek-V4-Flash-FP8",
    "v41-b200": "/models/deepseek-ai/DeepSeek-V4.1-Flash",
}
SERVED_NAME = {
    "b200": "deepseek-ai/DeepSeek-V4-Flash",
    "h200": "deepseek-ai/DeepSeek-V4-Flash",
    "v41-b200": "deepseek-ai/DeepSeek-V4.1-Flash",
}
MODEL_CACHE_PVC = {"b200": "dsv4-model-cache", "h200": "dsv4-model-cache", "v41-b200": "dsv41-model-cache"}
FAMILY = {"b200": "deepseek_v4", "h200": "deepseek_v4", "v41-b200": "deepseek_v41"}
#: The DeepSeek-V4.1-Flash settings of the published SGLang V4.1 deployments (Dynamo's V4.1 SGLang recipe:
#: TP 4 + EP 4, 256-token pages, DSpark block 5, decode graphs to batch 64), plus the token, grammar (and,
#: with the tokenizer loaded, image) protocol flags.
V41_WORKER_FLAGS: dict[str, str | None] = {
    "--tensor-parallel-size": "4",
    "--expert-parallel-size": "4",
    "--page-size": "256",
    "--mem-fraction-static": "0.8",
    "--max-running-requests": "256",
    "--speculative-algorithm": "DSPARK",
    "--speculative-dspark-block-size": "5",
    "--cuda-graph-max-bs-decode": "64",
    "--grammar-backend": "xgrammar",
    "--incremental-streaming-output": None,
}


def _workers(variant: str) -> list[Workload]:
    found = [w for w in all_workloads(variant) if w.role == "worker"]
    assert len(found) == 2, [w.source for w in found]  # one in deploy.yaml, one in k8s/
    return found


def _frontends(variant: str) -> list[Workload]:
    found = [w for w in all_workloads(variant) if w.role == "frontend"]
    assert len(found) == 2, [w.source for w in found]
    return found


def _parse_frontend_args(frontend: Workload):
    argv = frontend.argv
    assert argv[0] == "deepseek-frontend", frontend.source
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse reports the problem on stderr and exits
        raise AssertionError(f"{frontend.source}: frontend args do not parse: {argv[1:]}") from exc


def _deployment_path(workload: Workload) -> str:
    """ "dgd" for deploy.yaml (Dynamo operator), "k8s" for the plain manifests."""
    return "dgd" if workload.source.startswith("deploy.yaml:") else "k8s"


def _has_switch(argv: list[str], flag: str, value: str | None) -> bool:
    if value is None:
        return flag in argv
    return any(argv[i] == flag and argv[i + 1] == value for i in range(len(argv) - 1))


# --- workers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_worker_tensor_parallel_size_equals_its_gpu_limit(variant: str) -> None:
    for worker in _workers(variant):
        tp = worker.flag_value("--tensor-parallel-size", "--tp-size")
        assert tp is not None, f"{worker.source}: no tensor parallel size"
        assert worker.gpu_limit == int(tp) == GPUS_PER_WORKER, worker.source


@pytest.mark.parametrize("variant", VARIANTS)
def test_worker_flags_are_full_sglang_flag_names(variant: str) -> None:
    for worker in _workers(variant):
        assert worker.argv[:3] == ["python3", "-m", "sglang.launch_server"], worker.source
        assert sglang_flag_problems(worker.argv[3:]) == [], worker.source


def test_flag_lint_rejects_argparse_abbreviations() -> None:
    assert sglang_flag_problems(
        ["--speculative-algo", "EAGLE", "--tp", "4", "--tensor-parallel-size", "4"]
    ) == [
        "unknown or abbreviated SGLang flag --speculative-algo",
        "unknown or abbreviated SGLang flag --tp",
    ]


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_worker_sets_cuda_visible_devices_beyond_its_gpus(variant: str) -> None:
    for worker in _workers(variant):
        assert cuda_visible_devices_problem(worker) is None


def test_cuda_visible_devices_lint_catches_eight_devices_on_a_four_gpu_pod() -> None:
    worker = _workers("b200")[0]
    worker.container.setdefault("env", []).append(
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0,1,2,3,4,5,6,7"}
    )
    problem = cuda_visible_devices_problem(worker)
    assert problem is not None and "lists 8 devices, GPU limit 4" in problem


def test_b200_workers_run_the_published_fp4_recipe_with_the_token_protocol() -> None:
    for worker in _workers("b200"):
        for flag, value in B200_WORKER_FLAGS.items():
            assert _has_switch(worker.argv, flag, value), f"{worker.source}: missing {flag} {value or ''}"
        env = {name: e.get("value") for name, e in worker.env().items()}
        assert B200_WORKER_ENV.items() <= env.items(), worker.source
        assert worker.flag_value("--model-path") == CHECKPOINT["b200"]


def test_h200_workers_run_the_published_fp8_recipe_with_the_token_protocol() -> None:
    for worker in _workers("h200"):
        for flag, value in H200_WORKER_FLAGS.items():
            assert _has_switch(worker.argv, flag, value), f"{worker.source}: missing {flag} {value or ''}"
        # MXFP4 MoE kernels are for the FP4 checkpoint on Blackwell; the FP8 checkpoint must not ask for them.
        assert worker.flag_value("--moe-runner-backend") is None, worker.source
        env = {name: e.get("value") for name, e in worker.env().items()}
        assert H200_WORKER_ENV.items() <= env.items(), worker.source
        assert worker.flag_value("--model-path") == CHECKPOINT["h200"]


def test_v41_workers_run_the_published_v41_settings_with_the_token_protocol() -> None:
    for worker in _workers("v41-b200"):
        for flag, value in V41_WORKER_FLAGS.items():
            assert _has_switch(worker.argv, flag, value), f"{worker.source}: missing {flag} {value or ''}"
        # SGLang resolves the backends for V4.1; a hand-set one selects a slower fallback
        assert worker.flag_value("--moe-runner-backend") is None, worker.source
        env = {name: e.get("value") for name, e in worker.env().items()}
        assert B200_WORKER_ENV.items() <= env.items(), worker.source
        assert worker.flag_value("--model-path") == CHECKPOINT["v41-b200"]


def test_v41_workers_reserve_what_the_frontend_computes_from_their_server_info() -> None:
    """The frontend sizes requests without max_tokens from /server_info's speculative settings: what it
    computes for the recipe's launch must be what SGLang reserves (0 for DSpark: not EAGLE-family)."""
    from deepseek_frontend.engines.sglang import reserved_output_tokens

    for worker in _workers("v41-b200"):
        info = {"speculative_algorithm": worker.flag_value("--speculative-algorithm")}
        assert reserved_output_tokens(info) == 0, worker.source
    for worker in _workers("b200"):  # EAGLE 3/1/4 reserves 4
        info = {
            "speculative_algorithm": worker.flag_value("--speculative-algorithm"),
            "speculative_num_steps": int(worker.flag_value("--speculative-num-steps") or 0),
            "speculative_eagle_topk": int(worker.flag_value("--speculative-eagle-topk") or 0),
            "speculative_num_draft_tokens": int(worker.flag_value("--speculative-num-draft-tokens") or 0),
        }
        assert reserved_output_tokens(info) == 4, worker.source


@pytest.mark.parametrize("variant", VARIANTS)
def test_workers_land_on_the_right_gpu_nodes(variant: str) -> None:
    for path in (VARIANT_DIRS[variant] / "deploy.yaml", VARIANT_DIRS[variant] / "k8s" / "sglang-worker.yaml"):
        for doc in load_documents(path):
            if doc["kind"] == "StatefulSet":
                pod = doc["spec"]["template"]["spec"]
            elif doc["kind"] == "DynamoGraphDeployment":
                pod = doc["spec"]["services"]["decode"]["extraPodSpec"]
            else:
                continue
            assert pod["nodeSelector"] == {"nvidia.com/gpu.product": GPU_PRODUCT[variant]}, path
            assert any(
                t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule" for t in pod["tolerations"]
            )


@pytest.mark.parametrize("variant", VARIANTS)
def test_workers_have_shared_memory_and_a_long_startup_budget(variant: str) -> None:
    for worker in _workers(variant):
        assert worker.shm_configured, f"{worker.source}: no /dev/shm"
        startup = worker.container["startupProbe"]
        # Weights plus CUDA-graph capture and JIT warm-up: at least an hour before the kubelet gives up.
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600, worker.source


# --- probes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_worker_probes_hit_sglang_health_on_the_port_sglang_listens_on(variant: str) -> None:
    for worker in _workers(variant):
        ports = container_port_numbers(worker.container)
        listen = int(worker.flag_value("--port") or 0)
        probes = http_probes(worker.container)
        assert set(probes) == {"startupProbe", "readinessProbe", "livenessProbe"}, worker.source
        for kind, probe in probes.items():
            assert ports.get(probe["port"]) == listen, f"{worker.source} {kind} port {probe['port']}"
            assert probe["path"] in SGLANG_PROBE_PATHS, f"{worker.source} {kind} path {probe['path']}"


#: SGLang 0.5.23's /health and /health_generate run a one-token generation and wait up to
#: SGLANG_HEALTH_CHECK_TIMEOUT (20 s) for the scheduler before answering 503 themselves
SGLANG_HEALTH_WAIT_S = 20
#: SGLang environment variables SGLang no longer reads (setting them misleads whoever reads the manifest)
RETIRED_SGLANG_ENV = frozenset({"SGLANG_ENABLE_SPEC_V2"})


@pytest.mark.parametrize("variant", VARIANTS)
def test_worker_probes_wait_longer_than_sglangs_own_health_check(variant: str) -> None:
    """A busy worker answers /health late, not never: a shorter probe timeout would restart or unlist it."""
    for worker in _workers(variant):
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            timeout = worker.container[kind].get("timeoutSeconds", 1)
            assert timeout > SGLANG_HEALTH_WAIT_S, f"{worker.source} {kind} timeoutSeconds {timeout}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_workers_keep_a_grammar_backend_and_set_no_retired_environment(variant: str) -> None:
    """--skip-tokenizer-init leaves SGLang without a grammar backend: tool_choice required and
    response_format json_schema would then be refused on the deployment we ship."""
    for worker in _workers(variant):
        assert "--skip-tokenizer-init" not in worker.argv, worker.source
        assert worker.flag_value("--grammar-backend") not in (None, "none"), worker.source
        assert not RETIRED_SGLANG_ENV & set(worker.env()), worker.source


def _frontend_routes() -> set[str]:
    """Paths the frontend app serves, read from the app itself."""
    from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
    from deepseek_frontend.server.app import create_app

    app = create_app(ServerConfig(ModelConfig(served_model_name="deepseek-ai/DeepSeek-V4-Flash")))
    return {route.path for route in app.routes}


@pytest.mark.parametrize("variant", VARIANTS)
def test_frontend_probes_hit_real_frontend_paths_on_its_port(variant: str) -> None:
    routes = _frontend_routes()
    assert {"/health", "/live"} <= routes
    for frontend in _frontends(variant):
        args = _parse_frontend_args(frontend)
        ports = container_port_numbers(frontend.container)
        probes = http_probes(frontend.container)
        assert {"readinessProbe", "livenessProbe"} <= set(probes), frontend.source
        assert probes["readinessProbe"]["path"] == "/health", frontend.source
        for kind, probe in probes.items():
            assert ports.get(probe["port"]) == args.port, f"{frontend.source} {kind} port {probe['port']}"
            assert probe["path"] in routes, f"{frontend.source} {kind} path {probe['path']}"


# --- frontend ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_frontend_args_parse_with_the_projects_own_cli(variant: str) -> None:
    for frontend in _frontends(variant):
        args = _parse_frontend_args(frontend)
        assert args.command == "serve"
        assert args.engine == "sglang"
        assert args.host == "0.0.0.0"
        assert args.model_path == CHECKPOINT[variant]
        assert args.served_model_name == SERVED_NAME[variant]
        assert len(args.worker) == 1, frontend.source


def test_frontend_arg_check_rejects_a_flag_the_cli_does_not_know() -> None:
    frontend = _frontends("b200")[0]
    frontend.container["args"] = [*frontend.container["args"], "--tool-call-parser", "deepseekv4"]
    with pytest.raises(AssertionError, match="frontend args do not parse"):
        _parse_frontend_args(frontend)


@pytest.mark.parametrize("variant", VARIANTS)
def test_frontends_run_several_replicas(variant: str) -> None:
    for frontend in _frontends(variant):
        assert frontend.replicas > 1, frontend.source


@pytest.mark.parametrize("variant", VARIANTS)
def test_frontend_worker_url_resolves_to_the_headless_worker_service(variant: str) -> None:
    services = headless_services(variant)
    workers = _workers(variant)
    for frontend in _frontends(variant):
        (url,) = _parse_frontend_args(frontend).worker
        target = parse_worker_url(url)
        assert target.scheme == "dns+http", url
        # The namespace comes from the Downward API, so the manifests work in any namespace.
        assert target.namespace == NAMESPACE_REF, url
        ns_env = frontend.env().get("POD_NAMESPACE")
        assert ns_env is not None and ns_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        service = services.get(target.service)
        assert service is not None, f"{frontend.source}: {target.service} is not a headless Service"
        assert service["spec"].get("publishNotReadyAddresses", False) is False
        # The Service must select the workers of the same deployment path, and forward the URL's port to
        # the port SGLang listens on.
        same_path = [w for w in workers if _deployment_path(w) == _deployment_path(frontend)]
        (worker,) = [w for w in same_path if selects(service, w.pod_labels)]
        assert service_target_port(service, target.port, worker) == int(worker.flag_value("--port") or 0)


def test_plain_worker_statefulset_is_governed_by_the_headless_service() -> None:
    for variant in VARIANTS:
        docs = load_documents(VARIANT_DIRS[variant] / "k8s" / "sglang-worker.yaml")
        (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
        assert sts["spec"]["serviceName"] in headless_services(variant)


def test_worker_url_lint_rejects_a_url_that_misses_the_service() -> None:
    with pytest.raises(AssertionError):
        parse_worker_url("http://10.0.0.5:30000")


# --- storage -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_pvc_reference_resolves_to_the_one_model_cache_claim(variant: str) -> None:
    pvcs = defined_pvcs(variant)
    assert list(pvcs) == [MODEL_CACHE_PVC[variant]]
    (pvc,) = pvcs.values()
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    refs = claim_references(variant)
    assert {where.split(":")[0] for _, where in refs} >= {
        "deploy.yaml",
        "frontend.yaml",
        "sglang-worker.yaml",
    }
    unresolved = [(name, where) for name, where in refs if name not in pvcs]
    assert unresolved == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_download_job_fills_the_path_the_workers_load(variant: str) -> None:
    (job,) = load_documents(VARIANT_DIRS[variant] / "k8s" / "model-download-job.yaml")
    container = job["spec"]["template"]["spec"]["containers"][0]
    repo = {e["name"]: e.get("value") for e in container["env"]}["MODEL_REPO"]
    mount = container["volumeMounts"][0]["mountPath"]
    assert f"{mount}/{repo}" == CHECKPOINT[variant]
    assert '--local-dir "/models/$MODEL_REPO"' in container["command"][-1]


# --- image ---------------------------------------------------------------------------------------------


def test_frontend_image_exposes_the_port_the_manifests_use() -> None:
    dockerfile = parse_dockerfile()
    for variant in VARIANTS:
        for frontend in _frontends(variant):
            port = _parse_frontend_args(frontend).port
            assert dockerfile.exposed == [port]
            assert set(container_port_numbers(frontend.container).values()) == {port}
            assert frontend.container["image"].endswith("/deepseek-frontend:0.1.0")


@pytest.mark.parametrize("variant", VARIANTS)
def test_frontend_args_resolve_to_a_server_config_for_sglang_workers(variant: str, tmp_path: Path) -> None:
    from deepseek_frontend.fleet.config import ServerConfig

    for frontend in _frontends(variant):
        args = _parse_frontend_args(frontend)
        if FAMILY[variant] == "deepseek_v41":
            # V4.1 on real workers reads the checkpoint's tokenizer.json and config.json from --model-path
            # (the frontend refuses to start without them): a checkpoint directory stands in for the PVC.
            args.model_path = str(v41_checkpoint(tmp_path / Path(frontend.source).name))
        config = ServerConfig.from_args(args)
        assert config.model.family == FAMILY[variant], frontend.source
        assert config.engine.kind == "sglang"
        assert config.model.default_thinking is True
        assert len(config.engine.workers) == 1 and config.engine.workers[0].startswith("dns+http://")


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_worker_pool_turns_the_manifest_worker_url_into_one_worker_per_address(variant: str) -> None:
    import asyncio

    from deepseek_frontend.engines.pool import from_urls

    (url,) = _parse_frontend_args(_frontends(variant)[0]).worker
    target = parse_worker_url(url)
    # Same URL shape with a name this machine can resolve (the cluster name resolves only in the cluster).
    local = url.replace(f"{target.service}.{target.namespace}.svc.cluster.local", "localhost")

    async def resolve() -> set[str]:
        pool = from_urls("sglang", [local])
        try:
            await pool.refresh_dns()
            return {status.url for status in pool.statuses()}
        finally:
            await pool.aclose()

    urls = asyncio.run(resolve())
    assert urls and urls <= {f"http://127.0.0.1:{target.port}", f"http://[::1]:{target.port}"}
