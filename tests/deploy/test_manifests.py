"""deploy/kubernetes: every overlay renders with kubectl's kustomize, validates strictly against the
Kubernetes schemas (offline, bundled by kubernetes-validate), keeps the policy (deploy.manifests),
and its plugins.toml passes `switchyard check-config`. The policy check is itself checked: each
rule fails on a manifest that breaks it."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from deploy import manifests
from engines import install

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = [p.name for p in manifests.overlays()]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    if not install.kubectl_installed():
        pytest.skip("kubectl is not installed; run `python -m engines.install kubectl` (part of `make engines`)")
    return {name: manifests.render(manifests.OVERLAYS_DIR / name) for name in OVERLAYS}


def test_the_overlays_the_issue_names_exist():
    assert {"builtin", "vllm-fleet", "otlp", "external-redis"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_against_the_kubernetes_schemas(rendered, overlay):
    docs = rendered[overlay]
    assert docs
    assert manifests.schema_errors(docs) == []


def test_the_schema_check_fails_on_a_bad_field(rendered):
    docs = copy.deepcopy(rendered["builtin"])
    deployment = manifests.find(docs, "Deployment", "switchyard")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/ready"}}
    errors = manifests.schema_errors(docs, versions=("1.37.0",))
    assert len(errors) == 1 and "'readinesProbe' was unexpected" in errors[0], errors
    docs = copy.deepcopy(rendered["builtin"])
    manifests.find(docs, "Deployment", "switchyard")["spec"]["replicas"] = "two"
    errors = manifests.schema_errors(docs, versions=("1.37.0",))
    assert len(errors) == 1 and "'two' is not of type" in errors[0], errors


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_keeps_the_policy(rendered, overlay):
    assert manifests.violations(rendered[overlay]) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_config_passes_check_config(rendered, overlay, tmp_path):
    text, config = manifests.gateway_config(rendered[overlay])
    path = tmp_path / "plugins.toml"
    path.write_text(text)
    env = {**os.environ, "SWITCHYARD_KEY_DEFAULT": "a-key-for-the-check"}
    got = subprocess.run([sys.executable, "-m", "gateway.cli", "check-config", str(path)], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    # and with the Secret's value missing, as the base ships it, the gateway refuses to start
    env.pop("SWITCHYARD_KEY_DEFAULT")
    got = subprocess.run([sys.executable, "-m", "gateway.cli", "check-config", str(path)], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert got.returncode == 2 and "SWITCHYARD_KEY_DEFAULT" in got.stderr, got.stderr


def test_every_pod_in_every_overlay_is_covered(rendered):
    kinds = {(d["kind"], d["metadata"]["name"]) for docs in rendered.values() for d in docs}
    for expected in [("Deployment", "switchyard"), ("StatefulSet", "switchyard-redis"), ("Deployment", "vllm"),
                     ("Deployment", "otel-collector"), ("Service", "vllm"), ("PodDisruptionBudget", "switchyard"),
                     ("HorizontalPodAutoscaler", "switchyard"), ("NetworkPolicy", "switchyard-redis")]:
        assert expected in kinds
    secrets = [d for d in rendered["builtin"] if d["kind"] == "Secret"]
    assert [s["metadata"]["name"].rsplit("-", 1)[0] for s in secrets] == ["switchyard-keys"]


def test_the_vllm_replicas_are_found_through_the_headless_service(rendered):
    docs = rendered["vllm-fleet"]
    service = manifests.find(docs, "Service", "vllm")
    assert service["spec"]["clusterIP"] == "None"
    vllm = manifests.find(docs, "Deployment", "vllm")
    labels = vllm["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    _, config = manifests.gateway_config(docs)
    backend = config["backends"][0]
    assert backend["type"] == "vllm"
    discovery = backend["options"]["discovery"]
    namespace = service["metadata"]["namespace"]
    assert discovery == {**discovery, "type": "dns", "name": f"vllm.{namespace}.svc.cluster.local",
                         "port": service["spec"]["ports"][0]["port"]}


def test_external_redis_replaces_the_statefulset_with_a_dns_alias(rendered):
    docs = rendered["external-redis"]
    assert manifests.find(docs, "StatefulSet", "switchyard-redis") is None
    assert manifests.find(docs, "NetworkPolicy", "switchyard-redis") is None
    service = manifests.find(docs, "Service", "switchyard-redis")
    assert service["spec"]["type"] == "ExternalName" and "selector" not in service["spec"]
    _, config = manifests.gateway_config(docs)
    assert config["server"]["state"].startswith("redis://switchyard-redis:")
    assert config["responses"]["redis_url"].startswith("redis://switchyard-redis:")


def test_the_otlp_overlay_is_the_base_config_plus_telemetry(rendered):
    base = tomllib.loads((manifests.KUBERNETES_DIR / "base" / "plugins.toml").read_text())
    _, config = manifests.gateway_config(rendered["otlp"])
    telemetry = config.pop("telemetry")
    assert config == base
    service = manifests.find(rendered["otlp"], "Service", "otel-collector")
    assert telemetry["otlp_endpoint"] == f"http://otel-collector:{service['spec']['ports'][0]['port']}"


# ------------------------------------------------------------------ the policy, rule by rule


def _gateway(docs):
    return manifests.find(docs, "Deployment", "switchyard")


def _container(docs):
    return _gateway(docs)["spec"]["template"]["spec"]["containers"][0]


def _break_root(docs):
    _gateway(docs)["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = False
    _container(docs)["securityContext"].pop("runAsNonRoot")


def _break_rootfs(docs):
    _container(docs)["securityContext"]["readOnlyRootFilesystem"] = False


def _break_probe(docs):
    _container(docs).pop("readinessProbe")


def _break_limits(docs):
    _container(docs)["resources"]["limits"].pop("memory")


def _break_tag(docs):
    _container(docs)["image"] = "registry.example.com/switchyard:latest"


def _break_untagged(docs):
    redis = manifests.find(docs, "StatefulSet", "switchyard-redis")
    redis["spec"]["template"]["spec"]["containers"][0]["image"] = "docker.io/library/redis"


def _break_grace(docs):
    _gateway(docs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30


def _break_prestop(docs):
    _container(docs).pop("lifecycle")


def _break_replicas(docs):
    _gateway(docs)["spec"]["replicas"] = 1


def _break_namespace(docs):
    manifests.find(docs, "Service", "switchyard")["metadata"].pop("namespace")


def _break_scrape(docs):
    _gateway(docs)["spec"]["template"]["metadata"]["annotations"].pop("prometheus.io/scrape")


@pytest.mark.parametrize(("breaking", "expected"), [
    (_break_root, "runAsNonRoot is not true"),
    (_break_rootfs, "readOnlyRootFilesystem is not true"),
    (_break_probe, "no readinessProbe"),
    (_break_limits, "no resources.limits.memory"),
    (_break_tag, "uses the tag `latest`"),
    (_break_untagged, "has no tag"),
    (_break_grace, "terminationGracePeriodSeconds 30 < preStop 10 + drain_timeout_s 30 + 5"),
    (_break_prestop, "no preStop sleep"),
    (_break_replicas, "fewer than 2 replicas"),
    (_break_scrape, "no Prometheus scrape annotations"),
    (_break_namespace, "Service/switchyard: not in the manifests' namespace"),
])
def test_the_policy_names_what_breaks_it(rendered, breaking, expected):
    docs = copy.deepcopy(rendered["builtin"])
    breaking(docs)
    found = manifests.violations(docs)
    assert any(expected in v for v in found), found


def test_the_command_line_check_passes():
    if not install.kubectl_installed():
        pytest.skip("kubectl is not installed; run `python -m engines.install kubectl`")
    got = subprocess.run([sys.executable, "-m", "deploy.manifests", "check"], cwd=ROOT, capture_output=True, text=True)
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"{len(OVERLAYS)} overlays, 0 problems" in got.stdout


def test_the_image_lock_matches_pyproject():
    from deploy import lock

    assert lock.mismatches("cpu") == []
    assert lock.mismatches("cuda") == []
