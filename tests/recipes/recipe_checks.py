"""Offline checks for the Kubernetes recipes under ``recipes/``: loading, schema validation and lints.

The tests in this folder call these helpers; they are kept in one module so each rule is written once and
the tests read as a list of behaviours. Nothing here needs a cluster:

- DynamoGraphDeployment documents validate against the CRD schema in ``tests/fixtures/k8s/``, made strict the
  way kubeconform's ``-strict`` mode does (an object schema that lists ``properties`` rejects unknown fields
  unless it allows them explicitly), plus the CRD's CEL rules re-implemented by hand (a JSON-schema validator
  does not run ``x-kubernetes-validations``).
- Core kinds validate with ``kubernetes_validate`` in strict mode against the Kubernetes versions below.
- Lints pin the mistakes seen in public recipes (see the recipe README): TP size equal to the GPU limit,
  full SGLang flag names, no CUDA_VISIBLE_DEVICES beyond the GPUs requested, one PVC name that resolves,
  probes on real ports/paths, frontend args that parse, worker URLs that name the worker Service.
"""

from __future__ import annotations

import copy
import functools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.support.golden import K8S_DIR

REPO_ROOT = Path(__file__).resolve().parents[2]
DGD_CRD_PATH = K8S_DIR / "nvidia.com_dynamographdeployments.yaml"
RECIPE_DIR = REPO_ROOT / "recipes" / "deepseek-v4-flash" / "sglang"
DOCKERFILE_PATH = RECIPE_DIR / "Dockerfile.frontend"

#: variant name -> folder holding ``deploy.yaml`` and ``k8s/`` (same layout for every variant)
VARIANT_DIRS: dict[str, Path] = {
    "b200": RECIPE_DIR,
    "h200": RECIPE_DIR / "h200",
    # DeepSeek-V4.1-Flash (text and images), same layout: every lint runs on it too
    "v41-b200": REPO_ROOT / "recipes" / "deepseek-v4.1-flash" / "sglang",
}
#: DeepSeek-V4-Pro prefill/decode disaggregated (H200, multi-node, Dynamo operator only): another layout, its
#: own checks in test_disagg_recipe.py
DISAGG_RECIPE_DIR = REPO_ROOT / "recipes" / "deepseek-v4-pro" / "sglang-disagg"

#: Kubernetes minor versions the core manifests must validate against (oldest supported, newest bundled).
K8S_VERSIONS: tuple[str, ...] = ("1.30", "1.37")

#: Every SGLang flag the recipes may use, spelled in full as SGLang's argparse declares it. argparse accepts
#: unique prefixes (``--tp`` for ``--tp-size``, ``--speculative-algo``), which break as soon as SGLang adds a
#: flag sharing the prefix, so anything not listed here fails the lint.
SGLANG_FLAGS: frozenset[str] = frozenset(
    {
        "--model-path",
        "--trust-remote-code",
        "--host",
        "--port",
        "--tensor-parallel-size",
        "--tp-size",
        "--moe-runner-backend",
        "--speculative-algorithm",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--chunked-prefill-size",
        "--disable-flashinfer-autotune",
        "--swa-full-tokens-ratio",
        "--skip-tokenizer-init",
        "--grammar-backend",
        "--incremental-streaming-output",
        "--mem-fraction-static",
        "--served-model-name",
        # DeepSeek-V4.1-Flash recipe
        "--expert-parallel-size",
        "--page-size",
        "--max-running-requests",
        "--speculative-dspark-block-size",
        "--cuda-graph-max-bs-decode",
        # KV cache events for the frontend's KV-aware router (srt/arg_groups/fields/observability.py)
        "--kv-events-config",
        "--load-publish-endpoint",
        # DeepSeek-V4-Pro prefill/decode recipe: DP-attention, DeepEP, the PD role and its KV transfer
        "--attn-dp-size",
        "--dp-size",
        "--enable-dp-attention",
        "--moe-a2a-backend",
        "--cuda-graph-max-bs",
        "--disaggregation-mode",
        "--disaggregation-transfer-backend",
        "--disaggregation-ib-device",
        "--disaggregation-bootstrap-port",
    }
)
#: SGLang endpoints a probe may use (SGLang's HTTP server routes).
SGLANG_PROBE_PATHS: frozenset[str] = frozenset({"/health", "/health_generate"})
#: Labels the Dynamo operator puts on every component pod (KubeLabelDynamoGraphDeploymentName /
#: KubeLabelDynamoComponent in the operator's consts).
DYNAMO_DGD_LABEL = "nvidia.com/dynamo-graph-deployment-name"
DYNAMO_COMPONENT_LABEL = "nvidia.com/dynamo-component"
#: The namespace placeholder the manifests expand from the Downward API.
NAMESPACE_REF = "$(POD_NAMESPACE)"


# --------------------------------------------------------------------------------------------------------
# loading


def load_documents(path: Path) -> list[dict[str, Any]]:
    """All non-empty YAML documents of one manifest file."""
    with path.open(encoding="utf-8") as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


def manifest_files(variant: str) -> list[Path]:
    """Every manifest of a variant: ``deploy.yaml`` then ``k8s/*.yaml``."""
    root = VARIANT_DIRS[variant]
    return [root / "deploy.yaml", *sorted((root / "k8s").glob("*.yaml"))]


def variant_documents(variant: str, *, dgd: bool) -> list[dict[str, Any]]:
    """Documents of one deployment path: the DGD path (``deploy.yaml`` + the PVC/download Job it relies on)
    or the plain path (``k8s/`` only)."""
    root = VARIANT_DIRS[variant]
    docs: list[dict[str, Any]] = []
    for path in sorted((root / "k8s").glob("*.yaml")):
        if dgd and path.name not in ("model-cache-pvc.yaml", "model-download-job.yaml"):
            continue
        docs.extend(load_documents(path))
    if dgd:
        docs.extend(load_documents(root / "deploy.yaml"))
    return docs


# --------------------------------------------------------------------------------------------------------
# DynamoGraphDeployment schema


def make_strict(schema: Any) -> Any:
    """A copy of an OpenAPI v3 schema where every object schema that lists ``properties`` (and neither sets
    ``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields``) rejects unknown fields, which is
    what kubeconform's strict mode does."""
    if isinstance(schema, list):
        return [make_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: make_strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields", False)
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def dgd_schema() -> dict[str, Any]:
    """The strict ``openAPIV3Schema`` of DynamoGraphDeployment ``v1alpha1`` from the shared CRD."""
    crd = load_documents(DGD_CRD_PATH)[0]
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return make_strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))


def dgd_schema_errors(doc: dict[str, Any]) -> list[str]:
    """Schema violations of one DGD document, as ``path: message`` strings (empty when valid)."""
    import jsonschema

    validator = jsonschema.Draft7Validator(dgd_schema())
    return [
        f"{'/'.join(str(p) for p in err.absolute_path) or '<root>'}: {err.message}"
        for err in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    ]


def dgd_cel_violations(doc: dict[str, Any]) -> list[str]:
    """The CRD's CEL rules (``x-kubernetes-validations``), checked by hand.

    - ``spec.pvcs[]``: when ``create`` is true, ``size``, ``storageClass`` and ``volumeAccessMode`` are
      required.
    - ``services.*.sharedMemory``: ``size`` must not be set when ``disabled`` is true.
    - ``services.*.checkpoint``: when ``enabled``, a non-empty ``checkpointRef`` or both ``identity.model``
      and ``identity.backendFramework``.
    """
    spec = doc.get("spec", {})
    problems: list[str] = []
    for i, pvc in enumerate(spec.get("pvcs", [])):
        if pvc.get("create") is True:
            missing = [k for k in ("size", "storageClass", "volumeAccessMode") if k not in pvc]
            if missing:
                problems.append(f"spec.pvcs[{i}] has create: true but no {', '.join(missing)}")
    for name, service in spec.get("services", {}).items():
        shm = service.get("sharedMemory") or {}
        if shm.get("disabled") is True and "size" in shm:
            problems.append(f"spec.services.{name}.sharedMemory sets size while disabled")
        checkpoint = service.get("checkpoint") or {}
        if checkpoint.get("enabled"):
            identity = checkpoint.get("identity") or {}
            if not checkpoint.get("checkpointRef") and not (
                "model" in identity and "backendFramework" in identity
            ):
                problems.append(f"spec.services.{name}.checkpoint enabled without checkpointRef or identity")
    return problems


# --------------------------------------------------------------------------------------------------------
# core kinds


def k8s_schema_error(doc: dict[str, Any], version: str) -> str | None:
    """The first strict-schema violation of a core Kubernetes object for ``version``, or None."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in exc.absolute_path) or "<root>"
        return f"{doc['kind']}/{doc['metadata']['name']} {path}: {exc.message}"
    return None


# --------------------------------------------------------------------------------------------------------
# workloads: one view over DGD components and Deployments/StatefulSets


@dataclass
class Workload:
    """One container the recipe runs, with what the lints need to know about its pod."""

    source: str  #: "<file>:<kind>/<name>" or "<file>:<dgd>/<component>", for messages
    role: str  #: "frontend" or "worker"
    container: dict[str, Any]
    gpu_limit: int | None
    replicas: int
    pod_labels: dict[str, str] = field(default_factory=dict)
    claim_names: list[str] = field(default_factory=list)  #: PVCs the pod mounts
    shm_configured: bool = False

    @property
    def argv(self) -> list[str]:
        return [*self.container.get("command", []), *self.container.get("args", [])]

    def flag_value(self, *names: str) -> str | None:
        """Value of the first of ``names`` in the container's argv (``--flag value`` or ``--flag=value``)."""
        argv = self.argv
        for i, token in enumerate(argv):
            for name in names:
                if token == name and i + 1 < len(argv):
                    return argv[i + 1]
                if token.startswith(name + "="):
                    return token.split("=", 1)[1]
        return None

    def env(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.container.get("env", [])}


def _role_of(container: dict[str, Any]) -> str:
    argv = [*container.get("command", []), *container.get("args", [])]
    if "sglang.launch_server" in argv:
        return "worker"
    if argv and argv[0] == "deepseek-frontend":
        return "frontend"
    raise AssertionError(f"container {container.get('name')!r} runs neither SGLang nor deepseek-frontend")


def workloads(path: Path) -> Iterator[Workload]:
    """Every frontend/worker container defined in one manifest file."""
    for doc in load_documents(path):
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "DynamoGraphDeployment":
            for comp_name, comp in doc["spec"]["services"].items():
                container = copy.deepcopy(comp["extraPodSpec"]["mainContainer"])
                # Component-level probes replace the main container's (the operator merges them that way).
                for probe in ("livenessProbe", "readinessProbe"):
                    if probe in comp:
                        container[probe] = comp[probe]
                gpu = comp.get("resources", {}).get("limits", {}).get("gpu")
                yield Workload(
                    source=f"{path.name}:{name}/{comp_name}",
                    role=_role_of(container),
                    container=container,
                    gpu_limit=int(gpu) if gpu is not None else None,
                    replicas=comp.get("replicas", 1),
                    pod_labels={DYNAMO_DGD_LABEL: name, DYNAMO_COMPONENT_LABEL: comp_name},
                    claim_names=[m["name"] for m in comp.get("volumeMounts", [])],
                    shm_configured="size" in (comp.get("sharedMemory") or {}),
                )
        elif kind in ("Deployment", "StatefulSet"):
            template = doc["spec"]["template"]
            pod = template["spec"]
            volumes = pod.get("volumes", [])
            claims = [
                v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
            ]
            shm_volumes = {v["name"] for v in volumes if v.get("emptyDir", {}).get("medium") == "Memory"}
            for container in pod["containers"]:
                gpu = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
                mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
                yield Workload(
                    source=f"{path.name}:{kind}/{name}",
                    role=_role_of(container),
                    container=container,
                    gpu_limit=int(gpu) if gpu is not None else None,
                    replicas=doc["spec"].get("replicas", 1),
                    pod_labels=template["metadata"].get("labels", {}),
                    claim_names=claims,
                    shm_configured=any(mounts.get(v) == "/dev/shm" for v in shm_volumes),
                )


def all_workloads(variant: str) -> list[Workload]:
    return [w for path in manifest_files(variant) for w in workloads(path)]


def headless_services(variant: str) -> dict[str, dict[str, Any]]:
    """Headless Services (``clusterIP: None``) of a variant by name."""
    out: dict[str, dict[str, Any]] = {}
    for path in manifest_files(variant):
        for doc in load_documents(path):
            if doc["kind"] == "Service" and doc["spec"].get("clusterIP") == "None":
                out[doc["metadata"]["name"]] = doc
    return out


def defined_pvcs(variant: str) -> dict[str, dict[str, Any]]:
    """PersistentVolumeClaims the variant's ``k8s/`` folder creates, by name."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((VARIANT_DIRS[variant] / "k8s").glob("*.yaml")):
        for doc in load_documents(path):
            if doc["kind"] == "PersistentVolumeClaim":
                out[doc["metadata"]["name"]] = doc
    return out


def claim_references(variant: str) -> list[tuple[str, str]]:
    """Every PVC name any manifest of the variant refers to, with where: pod volumes, Jobs, DGD ``pvcs``."""
    refs: list[tuple[str, str]] = []
    for path in manifest_files(variant):
        for doc in load_documents(path):
            kind, name = doc["kind"], doc["metadata"]["name"]
            if kind == "DynamoGraphDeployment":
                refs += [(p["name"], f"{path.name}:{name}.spec.pvcs") for p in doc["spec"].get("pvcs", [])]
                for comp_name, comp in doc["spec"]["services"].items():
                    refs += [
                        (m["name"], f"{path.name}:{name}/{comp_name}") for m in comp.get("volumeMounts", [])
                    ]
            elif kind in ("Deployment", "StatefulSet", "Job"):
                for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                    if "persistentVolumeClaim" in volume:
                        refs.append(
                            (volume["persistentVolumeClaim"]["claimName"], f"{path.name}:{kind}/{name}")
                        )
    return refs


# --------------------------------------------------------------------------------------------------------
# lints on single containers


def container_port_numbers(container: dict[str, Any]) -> dict[str | int, int]:
    """containerPort by name and by number, so probes may refer to either."""
    ports: dict[str | int, int] = {}
    for port in container.get("ports", []):
        ports[port["containerPort"]] = port["containerPort"]
        if "name" in port:
            ports[port["name"]] = port["containerPort"]
    return ports


def http_probes(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The container's HTTP probes by kind (startupProbe, readinessProbe, livenessProbe)."""
    return {
        kind: probe["httpGet"]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe")
        if (probe := container.get(kind)) and "httpGet" in probe
    }


def sglang_flag_problems(argv: list[str]) -> list[str]:
    """SGLang flags that are not spelled in full (abbreviations, typos, unknown flags)."""
    return [
        f"unknown or abbreviated SGLang flag {tok}"
        for tok in argv
        if tok.startswith("--") and tok.split("=")[0] not in SGLANG_FLAGS
    ]


def cuda_visible_devices_problem(workload: Workload) -> str | None:
    """A CUDA_VISIBLE_DEVICES that lists more devices than the pod requests (the device plugin already sets
    the right value, so the recipes should not set it at all)."""
    entry = workload.env().get("CUDA_VISIBLE_DEVICES")
    if entry is None:
        return None
    devices = [d for d in str(entry.get("value", "")).split(",") if d.strip()]
    if workload.gpu_limit is None or len(devices) > workload.gpu_limit:
        return (
            f"{workload.source}: CUDA_VISIBLE_DEVICES lists {len(devices)} devices, "
            f"GPU limit {workload.gpu_limit}"
        )
    return None


# --------------------------------------------------------------------------------------------------------
# worker URLs


@dataclass(frozen=True)
class WorkerUrl:
    scheme: str
    service: str
    namespace: str
    port: int


WORKER_HOST_RE = re.compile(r"^(?P<service>[a-z0-9-]+)\.(?P<namespace>[^.]+)\.svc\.cluster\.local$")


def parse_worker_url(url: str) -> WorkerUrl:
    """Split ``dns+http://<service>.<namespace>.svc.cluster.local:<port>``; AssertionError otherwise."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit(":", 1)[0]
    match = WORKER_HOST_RE.match(host)
    assert match, f"worker URL host {host!r} is not <service>.<namespace>.svc.cluster.local"
    assert parts.port is not None, f"worker URL {url!r} has no port"
    return WorkerUrl(parts.scheme, match["service"], match["namespace"], parts.port)


def service_target_port(service: dict[str, Any], port: int, worker: Workload) -> int | None:
    """The worker container port a Service port forwards to, or None when the Service has no such port."""
    for sp in service["spec"]["ports"]:
        if sp["port"] == port:
            target = sp.get("targetPort", sp["port"])
            return container_port_numbers(worker.container).get(target)
    return None


def selects(service: dict[str, Any], labels: dict[str, str]) -> bool:
    selector = service["spec"].get("selector", {})
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# --------------------------------------------------------------------------------------------------------
# Dockerfile


@dataclass
class Dockerfile:
    """The instructions of the final stage of a Dockerfile (plus every RUN line, for the build steps)."""

    user: str | None
    exposed: list[int]
    healthcheck: list[str] | None
    entrypoint: list[str]
    cmd: list[str]
    run_lines: list[str]
    #: ``COPY`` instructions from the build context (not ``--from`` another stage): (sources, destination)
    context_copies: list[tuple[list[str], str]]


def _exec_form(text: str) -> list[str]:
    import json

    text = text.strip()
    if text.startswith("["):
        return list(json.loads(text))
    return shlex.split(text)


def parse_dockerfile(path: Path = DOCKERFILE_PATH) -> Dockerfile:
    """Parse the instructions the checks need; line continuations are joined first."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    result = Dockerfile(None, [], None, [], [], run_lines=[], context_copies=[])
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        rest = rest.strip()
        if instruction == "FROM":  # a new stage resets what the final image gets
            result = Dockerfile(None, [], None, [], [], result.run_lines, result.context_copies)
        elif instruction == "USER":
            result.user = rest
        elif instruction == "EXPOSE":
            result.exposed += [int(p.split("/")[0]) for p in rest.split()]
        elif instruction == "HEALTHCHECK":
            _, _, command = rest.partition("CMD ")
            result.healthcheck = _exec_form(command) if command else None
        elif instruction == "ENTRYPOINT":
            result.entrypoint = _exec_form(rest)
        elif instruction == "CMD":
            result.cmd = _exec_form(rest)
        elif instruction == "RUN":
            result.run_lines.append(rest)
        elif instruction == "COPY" and not rest.startswith("--from"):
            *sources, destination = rest.split()
            result.context_copies.append((sources, destination))
    return result
