"""infra/ manifests: they parse, carry the required fields, expose nothing publicly, keep Ray token auth on, take
credentials from secrets, use the project's images, and their entrypoints are real `tracerl` commands."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tracerl.workflows.cli.app import COMMANDS, build_parser

INFRA = ROOT / "infra"
MANIFESTS = sorted((INFRA / "k8s").glob("*.yaml"))
SECRET_NAMES = re.compile(r"PASSWORD|TOKEN|SECRET|ACCESS_KEY|DB_URI", re.I)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _walk(node: Any) -> Any:
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for n in _walk(doc) if isinstance(n, dict) and "containers" in n for c in n["containers"]]


def test_every_manifest_parses_with_kind_and_namespace() -> None:
    assert len(MANIFESTS) >= 6
    for path in MANIFESTS:
        for doc in _docs(path):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), path
            if doc["kind"] != "Namespace":
                assert doc["metadata"].get("namespace") == "tracerl", path


def test_nothing_is_exposed_publicly() -> None:
    for path in MANIFESTS:
        for doc in _docs(path):
            for n in _walk(doc):
                if isinstance(n, dict):
                    assert n.get("type") not in ("LoadBalancer", "NodePort"), path
                    assert n.get("serviceType", "ClusterIP") == "ClusterIP", path
            assert doc["kind"] != "Ingress", path


def test_ray_pods_keep_token_auth_and_secrets_come_from_secrets() -> None:
    ray_kinds = {"RayCluster", "RayJob"}
    for path in MANIFESTS:
        for doc in _docs(path):
            for c in _containers(doc):
                env = {e["name"]: e for e in c.get("env", [])}
                if doc["kind"] in ray_kinds:
                    assert env["RAY_AUTH_MODE"]["value"] == "token", (path, c["name"])
                    assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"], (path, c["name"])
                for name, e in env.items():
                    if SECRET_NAMES.search(name):
                        assert "value" not in e and "secretKeyRef" in e.get("valueFrom", {}), (path, name)


def test_images_are_built_by_the_dockerfiles() -> None:
    built = set()
    for df in (INFRA / "docker").glob("Dockerfile.*"):
        tag = re.search(r"-t (\S+) \.", df.read_text())
        assert tag, df
        built.add(tag.group(1).split(":")[-1])
        assert "RAY_AUTH_MODE=token" in df.read_text()
    assert built == {"cpu", "cuda"}
    for path in MANIFESTS:
        for doc in _docs(path):
            if doc["kind"] in ("RayCluster", "RayJob"):
                for c in _containers(doc):
                    assert c["image"] in ("tracerl:cpu", "tracerl:cuda"), (path, c["image"])
    launcher = yaml.safe_load((INFRA / "launcher" / "cluster.yaml").read_text())
    assert launcher["docker"]["image"] == "tracerl:cuda"
    assert any("--dashboard-host=127.0.0.1" in cmd for cmd in launcher["head_start_ray_commands"])
    assert {"cluster_name", "provider", "available_node_types", "head_node_type"} <= set(launcher)


@pytest.mark.parametrize("path", [p for p in MANIFESTS if p.name.startswith("rayjob")], ids=lambda p: p.name)
def test_job_entrypoints_are_real_commands_with_valid_configs(path: Path) -> None:
    from tracerl.config_loader import compose

    (doc,) = _docs(path)
    argv = shlex.split(doc["spec"]["entrypoint"])
    assert argv[0] == "tracerl"
    args = build_parser().parse_args(argv[1:])
    name = args.command
    assert name in COMMANDS
    cfg_path = ROOT / args.config
    assert cfg_path.is_file()
    cfg = compose(COMMANDS[name].schema, cfg_path, args.overrides)  # the config and its overrides validate
    assert cfg.cluster.address == "auto" and cfg.tracking.uri.startswith("http://mlflow.tracerl.svc")
