"""The fleet recipe (``recipes/fleet/``): one frontend serving DeepSeek-V4-Flash and DeepSeek-V4.1-Flash.

Checked offline, as the model recipes are: the manifests against the Kubernetes schemas, the frontend's
args with this project's CLI, the ConfigMap's ``config.yaml`` with the frontend's own loader (on a staged
copy of the pod's files: every path the args and the configuration name is looked up through the
Deployment's mounts), and every worker URL against the headless Service and worker pods of the model
recipe that defines it.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from deepseek_frontend.cli import build_parser
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
from deepseek_frontend.fleet.config_file import Fleet, fleet_from_args
from deepseek_frontend.server.serve_flags import flag_actions

from .recipe_checks import (
    K8S_VERSIONS,
    NAMESPACE_REF,
    REPO_ROOT,
    VARIANT_DIRS,
    Workload,
    all_workloads,
    container_port_numbers,
    defined_pvcs,
    headless_services,
    http_probes,
    k8s_schema_error,
    load_documents,
    parse_dockerfile,
    parse_worker_url,
    selects,
    service_target_port,
    workloads,
)

FLEET_DIR = REPO_ROOT / "recipes" / "fleet"
MANIFESTS = sorted((FLEET_DIR / "k8s").glob("*.yaml"))
KEYS_EXAMPLE = FLEET_DIR / "keys.example.yaml"
CONFIG_FILE = "/etc/deepseek-frontend/config.yaml"
V4, V41 = "deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4.1-Flash"
#: served name -> the model recipe (recipe_checks variant) whose workers serve it
MODEL_RECIPE = {V4: "b200", V41: "v41-b200"}
FAMILY = {V4: "deepseek_v4", V41: "deepseek_v41"}
#: where the model recipes' workers mount their model cache (DGD volumeMounts mountPoint)
WORKER_CACHE_MOUNT = "/models"


# --------------------------------------------------------------------------------------------------------
# the recipe's objects


def _documents() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, doc) for path in MANIFESTS for doc in load_documents(path)]


def _one(kind: str) -> dict[str, Any]:
    (doc,) = [doc for _, doc in _documents() if doc["kind"] == kind]
    return doc


def _frontend() -> Workload:
    (frontend,) = [w for path in MANIFESTS for w in workloads(path)]
    assert frontend.role == "frontend", frontend.source
    return frontend


def _frontend_args(argv: list[str]) -> Any:
    assert argv[0] == "deepseek-frontend", argv
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse reports the problem on stderr and exits
        raise AssertionError(f"frontend args do not parse: {argv[1:]}") from exc


def _config_data() -> dict[str, Any]:
    return yaml.safe_load(_one("ConfigMap")["data"]["config.yaml"])


def _volume_at(container_path: str) -> tuple[dict[str, Any], str]:
    """The pod volume a path of the frontend container lies on, and the path inside that volume."""
    container = _frontend().container
    pod = _one("Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = sorted(container["volumeMounts"], key=lambda m: len(m["mountPath"]), reverse=True)
    for mount in mounts:
        root = mount["mountPath"].rstrip("/")
        if container_path.startswith(root + "/"):
            assert "subPath" not in mount, f"{root}: a subPath mount"
            return volumes[mount["name"]], container_path[len(root) + 1 :]
    raise AssertionError(f"{container_path} is on no volume the frontend container mounts")


def _file_in_volume(container_path: str, kind: str) -> tuple[str, str]:
    """(object name, key) of the ConfigMap or Secret item a mounted file path shows."""
    volume, inside = _volume_at(container_path)
    assert kind in volume, f"{container_path} is not on a {kind} volume: {volume}"
    source = volume[kind]
    (item,) = [i for i in source["items"] if i["path"] == inside]
    return source.get("name") or source.get("secretName"), item["key"]


# --------------------------------------------------------------------------------------------------------
# stand-ins for what the pod would see


def _checkpoint(root: Path, family: str) -> Path:
    """A checkpoint directory as the model cache holds it: config.json, and V4.1's own tokenizer.json."""
    from deepseek_frontend.tokenization import bundled_tokenizer_path, v41_stand_in_tokenizer_json

    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": family}), encoding="utf-8")
    if family == "deepseek_v41":
        text = v41_stand_in_tokenizer_json(bundled_tokenizer_path().read_text(encoding="utf-8"))
        (root / "tokenizer.json").write_text(text, encoding="utf-8")
    return root


def _staged_fleet(tmp_path: Path, data: dict[str, Any] | None = None) -> Fleet:
    """Load the recipe's configuration as the pod would: the Deployment's own args with every path the
    args and the file name mapped onto a directory per pod volume (the keys file: keys.example.yaml)."""
    data = copy.deepcopy(_config_data() if data is None else data)

    def staged(container_path: str) -> Path:
        volume, inside = _volume_at(container_path)
        return tmp_path / volume["name"] / inside

    for entry in data["models"]:
        host = staged(entry["model_path"])
        _checkpoint(host, FAMILY[entry["name"]])
        entry["model_path"] = str(host)
    keys_file = staged(data["keys_file"])
    keys_file.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(KEYS_EXAMPLE, keys_file)
    data["keys_file"] = str(keys_file)
    config_file = staged(CONFIG_FILE)
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")

    argv = list(_frontend().argv)
    argv[argv.index("--config") + 1] = str(config_file)
    return fleet_from_args(_frontend_args(argv), flag_actions())


# --------------------------------------------------------------------------------------------------------
# worker URLs


def _recipe_workers(variant: str) -> list[Workload]:
    return [w for w in all_workloads(variant) if w.role == "worker"]


def _worker_url_problem(model: str, url: str) -> str | None:
    """Why ``url`` does not reach ``model``'s workers as its recipe defines them (None: it does).

    A short host name resolves in the pod's own namespace (the DNS search path); it is checked as the
    model recipes' ``<service>.$(POD_NAMESPACE).svc.cluster.local`` URLs are.
    """
    variant = MODEL_RECIPE[model]
    scheme, _, rest = url.partition("://")
    host = rest.split(":", 1)[0]
    if "." in host:
        return f"{url}: not a Service short name (the file cannot expand $(POD_NAMESPACE))"
    target = parse_worker_url(url.replace(host, f"{host}.{NAMESPACE_REF}.svc.cluster.local", 1))
    if scheme != "dns+http":
        return f"{url}: dns+http:// gives one worker per ready pod; got {scheme}"
    service = headless_services(variant).get(target.service)
    if service is None:
        return f"{url}: {target.service} is no headless Service of {VARIANT_DIRS[variant]}"
    shared = [v for v in set(MODEL_RECIPE.values()) - {variant} if target.service in headless_services(v)]
    if shared:
        return f"{url}: {target.service} is also a Service of {VARIANT_DIRS[shared[0]]} (same namespace)"
    if service["spec"].get("publishNotReadyAddresses", False):
        return f"{url}: {target.service} lists pods that are not ready"
    selected = [w for w in _recipe_workers(variant) if selects(service, w.pod_labels)]
    if len(selected) != 1:
        return f"{url}: {target.service} selects {len(selected)} worker workloads"
    (worker,) = selected
    listen = int(worker.flag_value("--port") or 0)
    if service_target_port(service, target.port, worker) != listen:
        return f"{url}: port {target.port} does not reach SGLang's port {listen} on {worker.source}"
    return None


# --------------------------------------------------------------------------------------------------------
# manifests


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_validate_strictly_against_kubernetes_schemas(version: str) -> None:
    docs = _documents()
    assert sorted(doc["kind"] for _, doc in docs) == ["ConfigMap", "Deployment", "Service"]
    errors = [f"{name}: {err}" for name, doc in docs if (err := k8s_schema_error(doc, version))]
    assert errors == []


def test_the_recipe_ships_no_worker_manifests_and_no_secret() -> None:
    kinds = {
        doc["kind"] for path in FLEET_DIR.rglob("*.yaml") for doc in load_documents(path) if "kind" in doc
    }
    assert not kinds & {"StatefulSet", "DynamoGraphDeployment", "Secret", "PersistentVolumeClaim"}


def test_frontend_runs_several_replicas_behind_its_service() -> None:
    frontend = _frontend()
    assert frontend.replicas >= 2
    service = _one("Service")
    assert selects(service, frontend.pod_labels)
    (port,) = service["spec"]["ports"]
    assert (
        container_port_numbers(frontend.container).get(port["targetPort"])
        == _frontend_args(frontend.argv).port
    )


# --- frontend args and probes ----------------------------------------------------------------------------


def test_frontend_args_parse_and_leave_the_models_to_the_configuration_file() -> None:
    args = _frontend_args(_frontend().argv)
    assert args.command == "serve"
    assert args.config == CONFIG_FILE
    assert (args.host, args.port) == ("0.0.0.0", 8000)
    # with --config these are per model, in the file (the loader refuses them on the command line)
    assert args.model_path is None and args.served_model_name is None
    assert args.worker == [] and args.model_alias == []
    assert args.keys_file is None  # the file names it


def test_frontend_probes_hit_live_and_health_on_its_port() -> None:
    from deepseek_frontend.fleet.config import ServerConfig
    from deepseek_frontend.server.app import create_app

    routes = {r.path for r in create_app(ServerConfig(ModelConfig(served_model_name=V4))).routes}
    container = _frontend().container
    port = _frontend_args(_frontend().argv).port
    probes = http_probes(container)
    assert {k: p["path"] for k, p in probes.items()} == {
        "startupProbe": "/live",
        "readinessProbe": "/health",
        "livenessProbe": "/live",
    }
    for kind, probe in probes.items():
        assert probe["path"] in routes, kind
        assert container_port_numbers(container).get(probe["port"]) == port, kind


def test_pid_1_is_the_frontend_so_kill_hup_1_reloads_it() -> None:
    """The README reloads with `kill -HUP 1`: the container must run the frontend itself, not a shell."""
    container = _frontend().container
    assert container["command"] == ["deepseek-frontend"]
    assert parse_dockerfile().entrypoint == ["deepseek-frontend"]
    assert container["image"].endswith("/deepseek-frontend:0.1.0")


# --- mounts ----------------------------------------------------------------------------------------------


def test_the_config_file_is_the_configmaps_item_mounted_whole() -> None:
    name, key = _file_in_volume(CONFIG_FILE, "configMap")
    assert name == _one("ConfigMap")["metadata"]["name"]
    assert key == "config.yaml" and key in _one("ConfigMap")["data"]


def test_the_keys_file_is_the_secrets_item_mounted_whole() -> None:
    name, key = _file_in_volume(_config_data()["keys_file"], "secret")
    assert (name, key) == ("deepseek-fleet-keys", "keys.yaml")


def test_mount_lookup_rejects_a_path_on_no_volume_and_a_file_on_the_wrong_volume_kind() -> None:
    with pytest.raises(AssertionError, match="on no volume"):
        _volume_at("/etc/elsewhere/config.yaml")
    with pytest.raises(AssertionError, match="not on a secret volume"):
        _file_in_volume(CONFIG_FILE, "secret")


@pytest.mark.parametrize("model", [V4, V41])
def test_each_checkpoint_is_the_one_its_workers_load_on_the_claim_its_recipe_fills(model: str) -> None:
    (entry,) = [e for e in _config_data()["models"] if e["name"] == model]
    volume, inside = _volume_at(entry["model_path"])
    variant = MODEL_RECIPE[model]
    assert volume["persistentVolumeClaim"]["claimName"] in defined_pvcs(variant)
    assert volume["persistentVolumeClaim"].get("readOnly") is True
    for worker in _recipe_workers(variant):
        assert worker.flag_value("--model-path") == f"{WORKER_CACHE_MOUNT}/{inside}", worker.source


# --- the configuration file ------------------------------------------------------------------------------


def test_config_loads_into_the_two_models(tmp_path: Path) -> None:
    fleet = _staged_fleet(tmp_path)
    assert [m.model.served_model_name for m in fleet.models] == [V4, V41]  # V4 first: the default model
    by_name = {m.model.served_model_name: m for m in fleet.models}
    assert {name: m.model.family for name, m in by_name.items()} == FAMILY
    assert {m.engine.kind for m in fleet.models} == {"sglang"}
    assert by_name[V4].engine.workers == ("dns+http://dsv4-flash-sglang-workers:30000",)
    assert by_name[V41].engine.workers == ("dns+http://dsv41-flash-sglang-workers:30000",)
    assert by_name[V4].model.model_aliases == ()  # V4 keeps only its own name
    assert [a.pattern for a in by_name[V41].model.model_aliases] == ["deepseek-flash", "claude-*"]
    assert {m.router.mode for m in fleet.models} == {"kv"}
    assert all(m.model.default_thinking for m in fleet.models)
    assert all(not m.pd.prefill_workers and not m.pd.decode_workers for m in fleet.models)  # aggregated


@dataclass(frozen=True)
class _RoutedModel:
    """What the model registry reads of a served model: its name and configuration."""

    name: str
    config: ServerConfig


def test_request_names_reach_the_model_the_readme_says(tmp_path: Path) -> None:
    from deepseek_frontend.errors import ModelNotFoundError
    from deepseek_frontend.fleet.registry import ModelRegistry

    fleet = _staged_fleet(tmp_path)
    registry = ModelRegistry([_RoutedModel(m.model.served_model_name, m) for m in fleet.models])
    assert fleet.tenants is not None
    tenants = {t.name: t for t in fleet.tenants}

    def served(name: str | None, key: str = "eval-pipeline") -> str:
        return registry.resolve(name, tenants[key]).name

    assert served(V4) == V4
    assert served(V41) == V41
    assert served("deepseek-flash") == V41
    assert served("claude-sonnet-4-5") == served("claude-3-5-haiku-latest") == V41
    assert served(None) == V4  # the first entry
    assert served(None, "coding-agents") == V41  # the first model the key may use
    assert [name for name, _ in registry.listed(tenants["eval-pipeline"])] == [V4, V41, "deepseek-flash"]
    with pytest.raises(ModelNotFoundError):
        served("claude-sonnet-4-5", "batch-v4")  # V4-only key
    with pytest.raises(ModelNotFoundError):
        served("deepseek-chat")


def test_keys_come_from_the_configmap_and_the_secret_as_digests_only(tmp_path: Path) -> None:
    fleet = _staged_fleet(tmp_path)
    assert fleet.tenants is not None
    allowed = {t.name: t.models for t in fleet.tenants}
    assert allowed == {
        "eval-pipeline": frozenset({V4, V41}),
        "coding-agents": frozenset({V41}),
        "batch-v4": frozenset({V4}),
    }
    example = yaml.safe_load(KEYS_EXAMPLE.read_text(encoding="utf-8"))["keys"]
    for entry in [*_config_data()["keys"], *example]:
        assert "key" not in entry and len(entry["key_sha256"]) == 64, entry["name"]


def test_config_loader_refuses_a_key_for_a_model_no_entry_serves(tmp_path: Path) -> None:
    data = _config_data()
    data["keys"][0]["models"] = ["deepseek-v3.2"]
    with pytest.raises(ValueError, match="no entry serves"):
        _staged_fleet(tmp_path, data)


# --- worker URLs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [V4, V41])
def test_worker_urls_name_the_headless_service_of_their_model_recipe(model: str) -> None:
    (entry,) = [e for e in _config_data()["models"] if e["name"] == model]
    assert entry["workers"], model
    for url in entry["workers"]:
        assert _worker_url_problem(model, url) is None


def test_the_two_models_reach_different_worker_services() -> None:
    hosts = [url for e in _config_data()["models"] for url in e["workers"]]
    assert len(set(hosts)) == len(hosts) == 2


def test_worker_url_check_catches_the_wrong_service_port_and_a_namespaced_host() -> None:
    assert "no headless Service" in (
        _worker_url_problem(V4, "dns+http://dsv41-flash-sglang-workers:30000") or ""
    )
    assert "does not reach" in (_worker_url_problem(V41, "dns+http://dsv41-flash-sglang-workers:5557") or "")
    assert "short name" in (
        _worker_url_problem(V4, "dns+http://dsv4-flash-sglang-workers.deepseek.svc.cluster.local:30000") or ""
    )
    assert "dns+http" in (_worker_url_problem(V4, "http://dsv4-flash-sglang-workers:30000") or "")
    # the plain manifests of both model recipes name their Service sglang-worker: not in one namespace
    assert "also a Service" in (_worker_url_problem(V4, "dns+http://sglang-worker:30000") or "")
