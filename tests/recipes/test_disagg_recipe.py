"""The DeepSeek-V4-Pro prefill/decode recipe (``recipes/deepseek-v4-pro/sglang-disagg``), checked offline.

The recipe is a DynamoGraphDeployment with multi-node prefill and decode workers and two headless
Services, so it gets its own checks next to the aggregated recipes': the same strict CRD / Kubernetes
schemas and CEL rules, full SGLang flag names, and the PD-specific wiring a typo would break only on a
32-GPU cluster -- the frontend's flags exist in ``deepseek-frontend serve`` spelled in full, each worker URL
names a Service that selects only the leader pods of the right role, both roles agree on the model, the
parallel layout and the KV transfer backend, the KV event ports of 16 data-parallel ranks do not collide,
and TP equals the GPUs of all nodes of a worker.
"""

from __future__ import annotations

import argparse
import copy
import json
from typing import Any

import pytest

from deepseek_frontend.cli import build_parser

from .recipe_checks import (
    DISAGG_RECIPE_DIR,
    K8S_VERSIONS,
    NAMESPACE_REF,
    SGLANG_PROBE_PATHS,
    Workload,
    container_port_numbers,
    dgd_cel_violations,
    dgd_schema_errors,
    http_probes,
    k8s_schema_error,
    load_documents,
    parse_worker_url,
    selects,
    service_target_port,
    sglang_flag_problems,
    workloads,
)

DEPLOY = DISAGG_RECIPE_DIR / "deploy.yaml"
CHECKPOINT = "/models/sgl-project/DeepSeek-V4-Pro-FP8"
MODEL_CACHE_PVC = "dsv4-pro-model-cache"
#: LeaderWorkerSet's label with a pod's index in its group (the leader is "0"); the operator runs multinode
#: workers as LeaderWorkerSets when the DGD turns Grove off
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
#: flags the Dynamo operator appends to a multinode SGLang worker (backend_sglang.go): set by hand they clash
OPERATOR_MULTINODE_FLAGS = ("--dist-init-addr", "--nnodes", "--node-rank")
#: SGLang's H200 DeepSeek-V4-Pro PD cell (cookbook), spelled in full, plus the token protocol flags
H200_PD_FLAGS: dict[str, str | None] = {
    "--tensor-parallel-size": "16",
    "--attn-dp-size": "16",
    "--moe-a2a-backend": "deepep",
    "--cuda-graph-max-bs": "128",
    "--mem-fraction-static": "0.9",
    "--disaggregation-transfer-backend": "mooncake",
    "--disaggregation-ib-device": "mlx5_0",
    "--grammar-backend": "xgrammar",
    "--incremental-streaming-output": None,
}
H200_PD_ENV = {"SGLANG_DSV4_FP4_EXPERTS": "0", "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": "128"}
#: SGLang's default bootstrap port (disaggregation_bootstrap_port in server_args.py)
SGLANG_DEFAULT_BOOTSTRAP_PORT = 8998
SGLANG_HEALTH_WAIT_S = 20


def _documents() -> list[dict[str, Any]]:
    return load_documents(DEPLOY)


def _dgd() -> dict[str, Any]:
    (dgd,) = [d for d in _documents() if d["kind"] == "DynamoGraphDeployment"]
    return dgd


def _services() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _documents() if d["kind"] == "Service"}


def _by_component() -> dict[str, Workload]:
    return {w.source.rsplit("/", 1)[1]: w for w in workloads(DEPLOY)}


def _workers() -> dict[str, Workload]:
    """The worker per PD role (``prefill``, ``decode``), by its component's ``subComponentType``."""
    components = _dgd()["spec"]["services"]
    return {
        components[name]["subComponentType"]: w for name, w in _by_component().items() if w.role == "worker"
    }


def _frontend() -> Workload:
    (frontend,) = [w for w in _by_component().values() if w.role == "frontend"]
    return frontend


def _serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices["serve"]


def _frontend_args(frontend: Workload) -> argparse.Namespace:
    """The frontend's argv parsed by this project's CLI, each flag spelled exactly as ``serve`` declares it
    (argparse would also take unique prefixes, which break as soon as a longer flag shares them)."""
    argv = frontend.argv
    assert argv[:2] == ["deepseek-frontend", "serve"], frontend.source
    known = set(_serve_parser()._option_string_actions)
    unknown = [t for t in argv[2:] if t.startswith("--") and t.split("=")[0] not in known]
    assert unknown == [], f"{frontend.source}: not flags of `deepseek-frontend serve`: {unknown}"
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        raise AssertionError(f"{frontend.source}: frontend args do not parse: {argv[1:]}") from exc


def _leader_labels(worker: Workload, index: str = "0") -> dict[str, str]:
    return {**worker.pod_labels, LWS_WORKER_INDEX: index}


def _has(argv: list[str], flag: str, value: str | None) -> bool:
    if value is None:
        return flag in argv
    return any(argv[i] == flag and argv[i + 1] == value for i in range(len(argv) - 1))


def _kv_event_ports(worker: Workload) -> tuple[int, int]:
    config = json.loads(worker.flag_value("--kv-events-config") or "{}")
    assert config.get("publisher") == "zmq", worker.source
    return int(config["endpoint"].rsplit(":", 1)[1]), int(config["replay_endpoint"].rsplit(":", 1)[1])


# --- schemas -------------------------------------------------------------------------------------------


def test_the_dgd_validates_strictly_against_the_crd_and_its_cel_rules() -> None:
    dgd = _dgd()
    assert dgd["apiVersion"] == "nvidia.com/v1alpha1"
    assert dgd_schema_errors(dgd) == []
    assert dgd_cel_violations(dgd) == []


def test_strict_validation_catches_a_node_count_of_one() -> None:
    broken = copy.deepcopy(_dgd())
    broken["spec"]["services"]["prefill"]["multinode"]["nodeCount"] = 1
    assert any("multinode/nodeCount" in e for e in dgd_schema_errors(broken))


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_kinds_validate_strictly_against_kubernetes_schemas(version: str) -> None:
    docs = [d for d in _documents() if d["kind"] != "DynamoGraphDeployment"]
    for path in sorted((DISAGG_RECIPE_DIR / "k8s").glob("*.yaml")):
        docs += load_documents(path)
    assert sorted(d["kind"] for d in docs) == ["Job", "PersistentVolumeClaim", "Service", "Service"]
    assert [err for d in docs if (err := k8s_schema_error(d, version))] == []


# --- workers -------------------------------------------------------------------------------------------


def test_one_prefill_and_one_decode_worker_run_sglang_in_their_role() -> None:
    workers = _workers()
    assert sorted(workers) == ["decode", "prefill"]
    for role, worker in workers.items():
        assert worker.argv[:3] == ["python3", "-m", "sglang.launch_server"], worker.source
        assert worker.flag_value("--disaggregation-mode") == role, worker.source


def test_worker_flags_are_full_sglang_flag_names() -> None:
    for worker in _workers().values():
        assert sglang_flag_problems(worker.argv[3:]) == [], worker.source


def test_tensor_parallel_size_spans_every_gpu_of_every_node_of_a_worker() -> None:
    components = _dgd()["spec"]["services"]
    for name, worker in _by_component().items():
        if worker.role != "worker":
            continue
        nodes = components[name]["multinode"]["nodeCount"]
        assert nodes == 2, worker.source  # the FP8 checkpoint needs 16 H200
        tp = int(worker.flag_value("--tensor-parallel-size") or 0)
        assert worker.gpu_limit is not None and tp == nodes * worker.gpu_limit == 16, worker.source


def test_workers_leave_the_multinode_flags_to_the_operator() -> None:
    """The operator appends --dist-init-addr/--nnodes/--node-rank to a python3 command; a second copy from the
    recipe would be a duplicate argparse keeps the last of, and a wrong rank hangs the group."""
    for worker in _workers().values():
        assert [f for f in OPERATOR_MULTINODE_FLAGS if f in worker.argv] == [], worker.source


def test_workers_run_sglangs_published_h200_pd_cell_with_the_token_protocol() -> None:
    for worker in _workers().values():
        for flag, value in H200_PD_FLAGS.items():
            assert _has(worker.argv, flag, value), f"{worker.source}: missing {flag} {value or ''}"
        env = {name: e.get("value") for name, e in worker.env().items()}
        assert H200_PD_ENV.items() <= env.items(), worker.source
        assert worker.flag_value("--model-path") == CHECKPOINT, worker.source
        assert "--skip-tokenizer-init" not in worker.argv, worker.source
    # a decode worker cannot retract a request whose KV it has received: it caps what it admits
    assert _workers()["decode"].flag_value("--max-running-requests") == "256"


def test_both_roles_agree_on_what_the_kv_transfer_depends_on() -> None:
    prefill, decode = _workers()["prefill"], _workers()["decode"]
    for flag in (
        "--model-path",
        "--tensor-parallel-size",
        "--attn-dp-size",
        "--disaggregation-transfer-backend",
        "--disaggregation-ib-device",
        "--page-size",
    ):
        assert prefill.flag_value(flag) == decode.flag_value(flag), flag


def test_mooncake_over_infiniband_gets_rdma_devices_and_may_pin_memory() -> None:
    components = _dgd()["spec"]["services"]
    for name, worker in _by_component().items():
        if worker.role != "worker":
            continue
        custom = components[name]["resources"]["limits"].get("custom", {})
        assert int(custom.get("rdma/ib", 0)) == worker.gpu_limit, worker.source
        caps = worker.container.get("securityContext", {}).get("capabilities", {}).get("add", [])
        assert "IPC_LOCK" in caps, worker.source


def test_kv_event_ports_of_all_data_parallel_ranks_do_not_collide() -> None:
    """SGLang binds rank r's publisher on endpoint + r, its replay socket on replay + r and, with
    --load-publish-endpoint auto, its load publisher on endpoint + ranks + r (kv_events.py:140)."""
    worker = _workers()["prefill"]
    dp = int(worker.flag_value("--attn-dp-size") or 1)
    endpoint, replay = _kv_event_ports(worker)
    events, replays = set(range(endpoint, endpoint + dp)), set(range(replay, replay + dp))
    assert not events & replays, worker.source
    assert worker.flag_value("--load-publish-endpoint") == "auto"
    assert not set(range(endpoint + dp, endpoint + 2 * dp)) & replays, "load ports collide with replay"
    ports = set(container_port_numbers(worker.container).values())
    assert {endpoint, replay} <= ports, worker.source


def test_the_deprecated_dp_attention_spelling_is_gone() -> None:
    for worker in _workers().values():
        assert "--enable-dp-attention" not in worker.argv and "--dp-size" not in worker.argv, worker.source


def test_the_decode_worker_publishes_no_kv_events() -> None:
    """A PD decode worker keeps no radix cache, so its publisher would send nothing (SGLang 0.5.23
    pd_disaggregation_hook.py, unified_radix_cache.py); on DeepSeek-V4 the decode radix cache needs the
    HIP-only unified KV layout (kv_cache_builder.py)."""
    decode = _workers()["decode"]
    assert "--kv-events-config" not in decode.argv
    assert "--disaggregation-decode-enable-radix-cache" not in decode.argv
    assert not {5557, 5600} & set(container_port_numbers(decode.container).values())


def test_port_collision_check_catches_the_single_rank_layout() -> None:
    worker = _workers()["prefill"]
    argv = worker.container["args"]
    argv[argv.index("--kv-events-config") + 1] = json.dumps(
        {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}
    )
    endpoint, replay = _kv_event_ports(worker)
    assert set(range(endpoint, endpoint + 16)) & set(range(replay, replay + 16))


def test_worker_probes_hit_sglangs_health_on_its_port_with_room_for_its_wait() -> None:
    for worker in _workers().values():
        probes = http_probes(worker.container)
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(probes), worker.source
        for kind, probe in probes.items():
            assert probe["path"] in SGLANG_PROBE_PATHS, f"{worker.source} {kind}"
            assert probe["port"] == int(worker.flag_value("--port") or 0), f"{worker.source} {kind}"
            assert worker.container[kind]["timeoutSeconds"] > SGLANG_HEALTH_WAIT_S, f"{worker.source} {kind}"


# --- frontend and discovery ----------------------------------------------------------------------------


def test_frontend_runs_in_pd_mode_with_flags_serve_declares() -> None:
    args = _frontend_args(_frontend())
    assert args.engine == "sglang"
    assert args.host == "0.0.0.0"
    assert args.model_path == CHECKPOINT
    assert args.served_model_name == "deepseek-ai/DeepSeek-V4-Pro"
    assert not args.worker, "aggregated --worker next to PD workers"
    assert len(args.prefill_worker) == 1 and len(args.decode_worker) == 1
    assert args.router_mode == "kv"


def test_frontend_flag_check_rejects_an_abbreviated_pd_flag() -> None:
    frontend = _frontend()
    args = frontend.container["args"]
    args[args.index("--prefill-worker")] = "--prefill"
    with pytest.raises(AssertionError, match="not flags of"):
        _frontend_args(frontend)


def _role_urls() -> dict[str, str]:
    args = _frontend_args(_frontend())
    return {"prefill": args.prefill_worker[0], "decode": args.decode_worker[0]}


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_each_worker_url_resolves_to_the_leaders_of_its_role_only(role: str) -> None:
    frontend, workers, services = _frontend(), _workers(), _services()
    target = parse_worker_url(_role_urls()[role])
    assert target.scheme == "dns+http"
    assert target.namespace == NAMESPACE_REF
    assert frontend.env()["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    service = services.get(target.service)
    assert service is not None and service["spec"].get("clusterIP") == "None", target.service
    assert service["spec"].get("publishNotReadyAddresses", False) is False
    # Only the leader serves SGLang's HTTP API and bootstrap server; the other pod of the group does not.
    worker = workers[role]
    assert selects(service, _leader_labels(worker, "0"))
    assert not selects(service, _leader_labels(worker, "1"))
    other = workers["decode" if role == "prefill" else "prefill"]
    assert not selects(service, _leader_labels(other, "0")), "the Service selects the other role's leaders"
    assert service_target_port(service, target.port, worker) == int(worker.flag_value("--port") or 0)


def test_url_check_catches_swapped_roles() -> None:
    workers, services = _workers(), _services()
    target = parse_worker_url(_role_urls()["decode"])
    assert not selects(services[target.service], _leader_labels(workers["prefill"]))


def test_the_bootstrap_port_the_frontend_sends_is_the_one_the_prefill_leader_serves() -> None:
    prefill = _workers()["prefill"]
    served = int(prefill.flag_value("--disaggregation-bootstrap-port") or SGLANG_DEFAULT_BOOTSTRAP_PORT)
    assert served in container_port_numbers(prefill.container).values()
    # the frontend uses what /server_info reports unless told otherwise; an override must name the same port
    override = getattr(_frontend_args(_frontend()), "disaggregation_bootstrap_port", None)
    assert override in (None, served)


def test_frontend_probes_hit_real_frontend_paths_on_its_port() -> None:
    from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
    from deepseek_frontend.server.app import create_app

    app = create_app(ServerConfig(ModelConfig(served_model_name="deepseek-ai/DeepSeek-V4-Pro")))
    routes = {route.path for route in app.routes}
    frontend = _frontend()
    port = _frontend_args(frontend).port
    probes = http_probes(frontend.container)
    assert probes["readinessProbe"]["path"] == "/health"
    for kind, probe in probes.items():
        assert container_port_numbers(frontend.container).get(probe["port"]) == port, kind
        assert probe["path"] in routes, kind
    assert frontend.replicas > 1


# --- storage -------------------------------------------------------------------------------------------


def test_every_claim_is_the_one_model_cache_the_download_job_fills() -> None:
    (pvc,) = load_documents(DISAGG_RECIPE_DIR / "k8s" / "model-cache-pvc.yaml")
    assert pvc["metadata"]["name"] == MODEL_CACHE_PVC
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    dgd = _dgd()
    assert [p["name"] for p in dgd["spec"]["pvcs"]] == [MODEL_CACHE_PVC]
    for name, component in dgd["spec"]["services"].items():
        assert [m["name"] for m in component["volumeMounts"]] == [MODEL_CACHE_PVC], name
    (job,) = load_documents(DISAGG_RECIPE_DIR / "k8s" / "model-download-job.yaml")
    pod = job["spec"]["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == MODEL_CACHE_PVC
    container = pod["containers"][0]
    repo = {e["name"]: e.get("value") for e in container["env"]}["MODEL_REPO"]
    assert f"{container['volumeMounts'][0]['mountPath']}/{repo}" == CHECKPOINT
