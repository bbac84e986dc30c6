"""examples/ray/raycluster.yaml against the RayCluster (ray.io/v1) fields KubeRay's CRD requires
and types (the subset this manifest uses, written down from the CRD: no Kubernetes runs here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
"""KubeRay's rayStartParams: map[string]string (a number must be quoted)."""
CONTAINER = {
    "type": "object",
    "required": ["name", "image"],
    "properties": {
        "name": {"type": "string"},
        "image": {"type": "string"},
        "ports": {"type": "array", "items": {"type": "object", "required": ["containerPort"],
                                              "properties": {"containerPort": {"type": "integer"}}}},
        "resources": {"type": "object", "properties": {
            "limits": {"type": "object", "additionalProperties": {"type": ["string", "integer"]}}}},
    },
}
TEMPLATE = {
    "type": "object",
    "required": ["spec"],
    "properties": {"spec": {"type": "object", "required": ["containers"], "properties": {
        "containers": {"type": "array", "minItems": 1, "items": CONTAINER}}}},
}
RAYCLUSTER_V1 = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["headGroupSpec"],
            "properties": {
                "rayVersion": {"type": "string"},
                "headGroupSpec": {"type": "object", "required": ["template"], "properties": {
                    "rayStartParams": STRINGS, "template": TEMPLATE}},
                "workerGroupSpecs": {"type": "array", "items": {
                    "type": "object",
                    "required": ["groupName", "template"],
                    "properties": {
                        "groupName": {"type": "string"},
                        "replicas": {"type": "integer", "minimum": 0},
                        "minReplicas": {"type": "integer", "minimum": 0},
                        "maxReplicas": {"type": "integer", "minimum": 0},
                        "rayStartParams": STRINGS,
                        "template": TEMPLATE,
                    },
                }},
            },
        },
    },
}


def _manifest() -> dict[str, Any]:
    return yaml.safe_load((REPO / "examples/ray/raycluster.yaml").read_text())


def test_the_manifest_is_a_valid_raycluster() -> None:
    jsonschema.validate(_manifest(), RAYCLUSTER_V1)


def test_the_schema_rejects_an_unquoted_start_parameter() -> None:
    manifest = _manifest()
    manifest["spec"]["workerGroupSpecs"][1]["rayStartParams"]["num-gpus"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(manifest, RAYCLUSTER_V1)


def test_the_sandbox_group_offers_the_docker_resource_and_the_ray_version_matches() -> None:
    manifest = _manifest()
    sandbox = next(g for g in manifest["spec"]["workerGroupSpecs"] if g["groupName"] == "sandbox")
    assert json.loads(json.loads(sandbox["rayStartParams"]["resources"])) == {"docker": 1}
    import ray

    assert manifest["spec"]["rayVersion"] == ray.__version__
