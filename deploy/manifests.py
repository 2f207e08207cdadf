"""Render, validate and check `deploy/kubernetes`: what `make test` asks of every overlay.

    python -m deploy.manifests check            # every overlay: render, schemas, policy
    python -m deploy.manifests render OVERLAY   # the rendered YAML of one overlay

Rendering is kubectl's own kustomize (`kubectl kustomize`, v5.8.1 in kubectl 1.37.1, installed
by `python -m engines.install kubectl`). Validation is kubernetes-validate against the
Kubernetes OpenAPI schemas it bundles (strict: an unknown field is an error), for the oldest and
newest Kubernetes versions the manifests claim (`KUBERNETES_VERSIONS`), offline. The policy
(`violations`) is what this project promises of its pods: non-root with a read-only root
filesystem and no privilege escalation, probes, requests and limits, pinned images (no `latest`,
no missing tag), and for the gateway a drain that fits inside its grace period.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from engines.install import kubectl_installed, kubectl_path

ROOT = Path(__file__).resolve().parents[1]
KUBERNETES_DIR = ROOT / "deploy" / "kubernetes"
OVERLAYS_DIR = KUBERNETES_DIR / "overlays"
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")  # the oldest and the newest supported
GATEWAY = "switchyard"
DRAIN_BACKSTOP_S = 5  # gateway/serve.py: uvicorn's own timeout is the drain period plus this
POD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


class RenderError(Exception):
    pass


def overlays() -> list[Path]:
    return sorted(p for p in OVERLAYS_DIR.iterdir() if (p / "kustomization.yaml").is_file())


def render(directory: Path) -> list[dict[str, Any]]:
    """The documents `kubectl kustomize DIRECTORY` renders."""
    if not kubectl_installed():
        raise RenderError("kubectl is not installed; run `python -m engines.install kubectl`")
    got = subprocess.run([str(kubectl_path()), "kustomize", str(directory)], capture_output=True, text=True, check=False)
    if got.returncode != 0:
        raise RenderError(f"kubectl kustomize {directory} failed: {got.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(got.stdout) if doc]


def schema_errors(docs: list[dict[str, Any]], versions: tuple[str, ...] = KUBERNETES_VERSIONS) -> list[str]:
    """Every document checked against the Kubernetes schemas of each version, strictly."""
    import kubernetes_validate

    errors = []
    for doc in docs:
        for version in versions:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError,
                    kubernetes_validate.InvalidSchemaError) as exc:
                first = str(exc).split("\n", 1)[0]
                errors.append(f"{_name(doc)} (Kubernetes {version}): {first}")
    return errors


def _name(doc: dict[str, Any]) -> str:
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def pod_templates(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for doc in docs:
        if doc.get("kind") in POD_KINDS:
            yield doc, doc["spec"]["template"]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any] | None:
    for doc in docs:
        if doc.get("kind") == kind and (name is None or doc["metadata"]["name"] == name
                                        or doc["metadata"]["name"].startswith(f"{name}-")):
            return doc
    return None


def gateway_config(docs: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The gateway's plugins.toml (text and parsed) from the ConfigMap its pods mount."""
    deployment = find(docs, "Deployment", GATEWAY)
    assert deployment is not None
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"].get("volumes", [])}
    name = volumes["config"]["configMap"]["name"]
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)
    text = configmap["data"]["plugins.toml"]
    return text, tomllib.loads(text)


def _image_problem(image: str) -> str | None:
    if "@sha256:" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return f"image {image!r} has no tag"
    if last.rsplit(":", 1)[1] == "latest":
        return f"image {image!r} uses the tag `latest`"
    return None


def _container_violations(where: str, pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    out = []
    pod_sc = pod.get("securityContext", {})
    sc = container.get("securityContext", {})
    if not (sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True):
        out.append(f"{where}: runAsNonRoot is not true")
    if sc.get("runAsUser", pod_sc.get("runAsUser")) in (None, 0):
        out.append(f"{where}: no non-zero runAsUser (the kubelet cannot verify a named user)")
    if sc.get("readOnlyRootFilesystem") is not True:
        out.append(f"{where}: readOnlyRootFilesystem is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append(f"{where}: allowPrivilegeEscalation is not false")
    if "ALL" not in sc.get("capabilities", {}).get("drop", []):
        out.append(f"{where}: capabilities do not drop ALL")
    if sc.get("privileged"):
        out.append(f"{where}: privileged")
    problem = _image_problem(container.get("image", ""))
    if problem:
        out.append(f"{where}: {problem}")
    resources = container.get("resources", {})
    for kind, keys in (("requests", ("cpu", "memory")), ("limits", ("memory",))):
        for key in keys:
            if key not in resources.get(kind, {}):
                out.append(f"{where}: no resources.{kind}.{key}")
    for probe in ("readinessProbe", "livenessProbe"):
        if probe not in container:
            out.append(f"{where}: no {probe}")
    return out


def _sleep_seconds(container: dict[str, Any]) -> float | None:
    pre_stop = container.get("lifecycle", {}).get("preStop", {})
    if "sleep" in pre_stop:
        return float(pre_stop["sleep"]["seconds"])
    command = pre_stop.get("exec", {}).get("command", [])
    if len(command) == 2 and command[0] in ("sleep", "/bin/sleep") and re.fullmatch(r"\d+(\.\d+)?", command[1]):
        return float(command[1])
    return None


def gateway_violations(docs: list[dict[str, Any]]) -> list[str]:
    """What the gateway's Deployment must have for rolling restarts that lose nothing."""
    out = []
    deployment = find(docs, "Deployment", GATEWAY)
    if deployment is None:
        return [f"no Deployment {GATEWAY}"]
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    container = next((c for c in pod["containers"] if c["name"] == "gateway"), None)
    if container is None:
        return [f"Deployment {GATEWAY} has no container `gateway`"]
    if spec.get("replicas", 1) < 2:
        out.append(f"Deployment {GATEWAY}: fewer than 2 replicas")
    rolling = spec.get("strategy", {}).get("rollingUpdate", {})
    if str(rolling.get("maxUnavailable", "25%")) not in ("0", "0%"):
        out.append(f"Deployment {GATEWAY}: rollingUpdate.maxUnavailable is not 0")
    if container.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/ready":
        out.append(f"Deployment {GATEWAY}: the readiness probe is not GET /ready")
    if container.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/health":
        out.append(f"Deployment {GATEWAY}: the liveness probe is not GET /health")
    _, config = gateway_config(docs)
    server = config.get("server", {})
    if server.get("workers") != "auto":
        out.append(f"Deployment {GATEWAY}: plugins.toml's server.workers is not \"auto\"")
    drain = float(server.get("drain_timeout_s", 30.0))
    sleep = _sleep_seconds(container)
    if sleep is None:
        out.append(f"Deployment {GATEWAY}: no preStop sleep (the Service must drop the pod before it drains)")
        sleep = 0.0
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace < sleep + drain + DRAIN_BACKSTOP_S:
        out.append(f"Deployment {GATEWAY}: terminationGracePeriodSeconds {grace} < preStop {sleep:g} + "
                   f"drain_timeout_s {drain:g} + {DRAIN_BACKSTOP_S} (the kubelet would kill streams mid-drain)")
    port = next((p["containerPort"] for p in container.get("ports", []) if p.get("name") == "http"), None)
    annotations = spec["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") != "true" or annotations.get("prometheus.io/path") != "/metrics" \
            or annotations.get("prometheus.io/port") != str(port):
        out.append(f"Deployment {GATEWAY}: no Prometheus scrape annotations for /metrics on port {port}")
    if server.get("port", 8000) != port:
        out.append(f"Deployment {GATEWAY}: plugins.toml's port {server.get('port', 8000)} is not the container's {port}")
    labels = spec["template"]["metadata"]["labels"]
    service = find(docs, "Service", GATEWAY)
    if service is None or any(labels.get(k) != v for k, v in service["spec"].get("selector", {}).items()):
        out.append(f"Service {GATEWAY} does not select the gateway pods")
    pdb = find(docs, "PodDisruptionBudget", GATEWAY)
    if pdb is None or any(labels.get(k) != v for k, v in pdb["spec"]["selector"]["matchLabels"].items()):
        out.append(f"no PodDisruptionBudget selecting the gateway pods")
    hpa = find(docs, "HorizontalPodAutoscaler", GATEWAY)
    if hpa is None or hpa["spec"]["scaleTargetRef"]["name"] != GATEWAY or hpa["spec"].get("minReplicas", 1) < 2:
        out.append(f"no HorizontalPodAutoscaler of Deployment {GATEWAY} with minReplicas >= 2")
    for source in container.get("envFrom", []):
        ref = source.get("secretRef", {}).get("name")
        if ref and not any(d["kind"] == "Secret" and d["metadata"]["name"] == ref for d in docs):
            out.append(f"Deployment {GATEWAY}: Secret {ref} is not in the manifests")
    return out


CLUSTER_SCOPED = ("Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass",
                  "CustomResourceDefinition", "PriorityClass")


def violations(docs: list[dict[str, Any]]) -> list[str]:
    """Every way the rendered `docs` break the policy (empty: none)."""
    out = []
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    for doc in docs:
        if doc["kind"] not in CLUSTER_SCOPED and doc["metadata"].get("namespace") not in namespaces:
            out.append(f"{_name(doc)}: not in the manifests' namespace {sorted(namespaces)}")
        if doc["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") != "switchyard":
            out.append(f"{_name(doc)}: no label app.kubernetes.io/part-of=switchyard")
    for doc, template in pod_templates(docs):
        pod = template["spec"]
        where = _name(doc)
        if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
            out.append(f"{where}: shares the host's namespaces")
        if pod.get("automountServiceAccountToken") is not False:
            out.append(f"{where}: automountServiceAccountToken is not false")
        if pod.get("securityContext", {}).get("seccompProfile", {}).get("type") != "RuntimeDefault":
            out.append(f"{where}: no RuntimeDefault seccomp profile")
        for container in pod.get("initContainers", []) + pod["containers"]:
            out += _container_violations(f"{where} container {container['name']}", pod, container)
    return out + gateway_violations(docs)


def check_all() -> list[str]:
    problems = []
    for overlay in overlays():
        docs = render(overlay)
        problems += [f"{overlay.name}: {p}" for p in schema_errors(docs) + violations(docs)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.manifests", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("check")
    one = sub.add_parser("render")
    one.add_argument("overlay", help="an overlay's name or directory")
    args = parser.parse_args(argv)
    try:
        if args.what == "render":
            path = Path(args.overlay) if Path(args.overlay).is_dir() else OVERLAYS_DIR / args.overlay
            print(yaml.safe_dump_all(render(path), sort_keys=False), end="")
            return 0
        problems = check_all()
    except RenderError as exc:
        print(f"deploy.manifests: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem)
    print(f"{len(overlays())} overlays, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
