"""Every recipe manifest is valid for the API server that will receive it, checked offline.

DynamoGraphDeployments validate against the shared CRD schema in strict mode (unknown fields are errors,
as with ``kubeconform -strict``) plus the CRD's CEL rules; core kinds validate with
``kubernetes_validate --strict``.
"""

from __future__ import annotations

import copy

import pytest

from .recipe_checks import (
    DGD_CRD_PATH,
    K8S_VERSIONS,
    VARIANT_DIRS,
    dgd_cel_violations,
    dgd_schema_errors,
    k8s_schema_error,
    load_documents,
    manifest_files,
)

VARIANTS = sorted(VARIANT_DIRS)


def _dgds(variant: str) -> list[dict]:
    docs = load_documents(VARIANT_DIRS[variant] / "deploy.yaml")
    return [d for d in docs if d["kind"] == "DynamoGraphDeployment"]


def _core_documents(variant: str) -> list[tuple[str, dict]]:
    return [
        (path.name, doc)
        for path in manifest_files(variant)
        for doc in load_documents(path)
        if doc["kind"] != "DynamoGraphDeployment"
    ]


def test_the_shared_crd_schema_is_present() -> None:
    assert DGD_CRD_PATH.is_file(), f"missing {DGD_CRD_PATH}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_ships_exactly_one_dynamo_graph_deployment(variant: str) -> None:
    (dgd,) = _dgds(variant)
    assert dgd["apiVersion"] == "nvidia.com/v1alpha1"


@pytest.mark.parametrize("variant", VARIANTS)
def test_dynamo_graph_deployment_validates_strictly_against_the_crd(variant: str) -> None:
    for dgd in _dgds(variant):
        assert dgd_schema_errors(dgd) == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_dynamo_graph_deployment_satisfies_the_crd_cel_rules(variant: str) -> None:
    for dgd in _dgds(variant):
        assert dgd_cel_violations(dgd) == []


def test_strict_dgd_validation_rejects_unknown_and_misspelled_fields() -> None:
    (dgd,) = _dgds("b200")
    broken = copy.deepcopy(dgd)
    # volume mounts use mountPoint in the CRD; mountPath is the core-Kubernetes spelling
    mount = broken["spec"]["services"]["decode"]["volumeMounts"][0]
    mount["mountPath"] = mount.pop("mountPoint")
    broken["spec"]["services"]["decode"]["resources"]["limits"]["gpu"] = 4  # must be a string
    errors = dgd_schema_errors(broken)
    assert any("mountPath" in e for e in errors), errors
    assert any("resources/limits/gpu" in e for e in errors), errors


def test_cel_check_catches_a_pvc_created_without_size_class_and_mode() -> None:
    (dgd,) = _dgds("b200")
    broken = copy.deepcopy(dgd)
    broken["spec"]["pvcs"][0]["create"] = True
    assert dgd_cel_violations(broken) == [
        "spec.pvcs[0] has create: true but no size, storageClass, volumeAccessMode"
    ]
    broken["spec"]["pvcs"][0].update(size="400Gi", storageClass="nfs", volumeAccessMode="ReadWriteMany")
    assert dgd_cel_violations(broken) == []


def test_cel_check_catches_shared_memory_size_set_while_disabled() -> None:
    (dgd,) = _dgds("b200")
    broken = copy.deepcopy(dgd)
    broken["spec"]["services"]["decode"]["sharedMemory"]["disabled"] = True
    assert dgd_cel_violations(broken) == ["spec.services.decode.sharedMemory sets size while disabled"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_core_kinds_validate_strictly_against_kubernetes_schemas(variant: str, version: str) -> None:
    docs = _core_documents(variant)
    kinds = {doc["kind"] for _, doc in docs}
    assert {"Service", "StatefulSet", "Deployment", "PersistentVolumeClaim", "Job"} <= kinds
    errors = [f"{name}: {err}" for name, doc in docs if (err := k8s_schema_error(doc, version))]
    assert errors == []


def test_strict_core_validation_rejects_unknown_fields() -> None:
    _, deployment = next((n, d) for n, d in _core_documents("b200") if d["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    error = k8s_schema_error(broken, K8S_VERSIONS[-1])
    assert error is not None and "readinessProbes" in error
