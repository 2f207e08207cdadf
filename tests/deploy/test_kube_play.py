"""The rendered Kubernetes manifests run for real under `podman kube play`: the `builtin` overlay's
gateway Deployment (2 pods of the image) with its ConfigMap and Secret, and its Redis, answering
the same smoke test as the image alone — /ready, a chat completion with the Secret's key, a
response stored in Redis through one pod and read back, SIGTERM mid-stream completing the stream.

The manifests are the overlay's own, rendered by kubectl's kustomize through a test overlay that
sets only what any deployment sets: the images (the image just built, and a Redis made from
Debian's packages since no registry is reachable) and the key (a `behavior: merge` Secret, as
README "Deploying" says). What podman 4.3 (Debian 12) cannot play is adapted, each for a reason
podman gives, in `for_podman` below:

- `kube play` knows only Pod, Deployment and PersistentVolumeClaim: the Redis StatefulSet is
  played as a Deployment with the same pod template, its volume claim template as a claim;
  Namespace, Service, PodDisruptionBudget, HorizontalPodAutoscaler and NetworkPolicy have no
  podman equivalent and are left out.
- A Secret document is stored as YAML and then read back as JSON ("secret ... is not valid JSON"):
  the Secret is created with `podman secret create` in the form podman reads (its data as JSON).
- No Service DNS: the pods share the host's network (which also keeps every address on
  loopback) and the gateway pods get a hostAlias naming `switchyard-redis` 127.0.0.1. Both
  gateway pods listen on the ConfigMap's port 8000 with SO_REUSEPORT (workers = "auto").
- Probes become podman health checks that need systemd timers (none run here): the test asks
  /ready itself.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import secrets
import socket
import time
from pathlib import Path

import httpx
import pytest
import yaml

from deploy import manifests
from deploy.podman import podman
from engines import install
from tests.deploy.conftest import record
from tests.deploy.streams import LONG, chat_body, stream_chat

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
GATEWAY_PORT = 8000  # the ConfigMap's
REDIS_PORT = 6379  # the StatefulSet's
LEFT_OUT = ("Namespace", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy")


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def test_overlay_for_kube_play(image, tmp_path) -> None:
    if not install.kubectl_installed():
        pytest.skip("kubectl is not installed; run `python -m engines.install kubectl`")
    busy = [p for p in (GATEWAY_PORT, REDIS_PORT) if _port_in_use(p)]
    if busy:
        pytest.skip(f"ports {busy} are in use on this machine: the pods share the host's network and "
                    f"listen where the manifests say")
    redis_image = install.make_debian_image(install.REDIS_IMAGE)
    key = secrets.token_hex(16)
    docs = render_test_overlay(tmp_path / "overlay", image, redis_image, key)
    # the test overlay keeps every promise of the shipped one
    assert manifests.schema_errors(docs) == [] and manifests.violations(docs) == []
    play, podman_secrets = for_podman(docs)
    play_file = tmp_path / "play.yaml"
    play_file.write_text(yaml.safe_dump_all(play, sort_keys=False))
    created = []
    try:
        for name, data in podman_secrets.items():
            podman("secret", "create", name, "-", input=json.dumps(data).encode())
            created.append(name)
        started = time.monotonic()
        got = podman("kube", "play", "--network", "host", str(play_file), check=False, timeout=300)
        assert got.returncode == 0, (got.stdout + got.stderr).decode()
        gateways = _containers("switchyard-pod-")
        assert len(gateways) == 2, gateways  # the Deployment's 2 replicas
        redis = _containers("switchyard-redis-pod-")
        assert len(redis) == 1
        _wait(lambda: podman("exec", redis[0], "redis-cli", "ping", check=False).stdout.strip() == b"PONG", 60,
              lambda: _logs(redis[0]))
        for gateway in gateways:
            _wait(lambda: _logs(gateway).count("Application startup complete.") >= 2, 300, lambda: _logs(gateway))
        base = f"http://127.0.0.1:{GATEWAY_PORT}"
        with httpx.Client(timeout=120) as client:
            _wait(lambda: _status(client, f"{base}/ready") == 200, 120, lambda: _logs(gateways[0]))
            ready_s = time.monotonic() - started
            record("kube_play", {"pods": len(gateways) + len(redis), "play_to_ready_s": round(ready_s, 1)})
            auth = {"Authorization": f"Bearer {key}"}
            assert client.post(f"{base}/v1/chat/completions", json=chat_body(MODEL, 8, stream=False)).status_code == 401
            answer = client.post(f"{base}/v1/chat/completions", json=chat_body(MODEL, 16, stream=False), headers=auth)
            assert answer.status_code == 200, answer.text
            assert "Paris" in answer.json()["choices"][0]["message"]["content"]
            # the Responses store is Redis (db 1), seen from every pod: read back through new connections
            stored = client.post(f"{base}/v1/responses", json={"model": MODEL, "input": "Say hi.",
                                                                "max_output_tokens": 4}, headers=auth)
            assert stored.status_code == 200, stored.text
            response_id = stored.json()["id"]
            keys = podman("exec", redis[0], "redis-cli", "-n", "1", "--scan", "--pattern", f"*{response_id}*").stdout
            assert response_id.encode() in keys
            for _ in range(4):
                with httpx.Client(timeout=30) as fresh:
                    again = fresh.get(f"{base}/v1/responses/{response_id}", headers=auth)
                    assert again.status_code == 200 and again.json()["id"] == response_id
            # the per-key limit counts in Redis (db 0)
            assert podman("exec", redis[0], "redis-cli", "-n", "0", "dbsize").stdout.strip() not in (b"0", b"")
            # SIGTERM to every gateway pod mid-stream: the stream completes, the pods exit 0
            def sigterm() -> None:
                for gateway in gateways:
                    podman("kill", "--signal", "TERM", gateway)

            result = stream_chat(client, base, MODEL, 40, on_first_text=sigterm, headers=auth, messages=LONG)
        assert result.complete and result.finish_reasons == ["length"], result
        assert result.chunks_after_first_text >= 20 and "1\n2. 2\n3. 3" in result.text, result
        for gateway in gateways:
            _wait(lambda: not _state(gateway).get("Running"), 50, lambda: _logs(gateway))
            assert _state(gateway)["ExitCode"] == 0, _logs(gateway)[-3000:]
    finally:
        podman("kube", "down", str(play_file), check=False, timeout=120)
        for name in created:
            podman("secret", "rm", name, check=False)
        for doc in play:
            if doc["kind"] == "PersistentVolumeClaim":
                podman("volume", "rm", "--force", doc["metadata"]["name"], check=False)


def render_test_overlay(directory: Path, image: str, redis_image: str, key: str) -> list[dict]:
    directory.mkdir(parents=True)
    name, tag = image.rsplit(":", 1)
    redis_name, redis_tag = redis_image.rsplit(":", 1)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(manifests.OVERLAYS_DIR / "builtin", directory)],
        "secretGenerator": [{"name": "switchyard-keys", "behavior": "merge",
                             "literals": [f"SWITCHYARD_KEY_DEFAULT={key}"]}],
        "images": [{"name": "registry.example.com/switchyard", "newName": name, "newTag": tag},
                   {"name": "docker.io/library/redis", "newName": redis_name, "newTag": redis_tag}],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return manifests.render(directory)


def for_podman(docs: list[dict]) -> tuple[list[dict], dict[str, dict]]:
    """What podman 4.3's `kube play` can play of `docs` (see the module's docstring), and the
    Secrets as podman secrets: name -> data."""
    play, podman_secrets = [], {}
    for doc in copy.deepcopy(docs):
        kind = doc["kind"]
        if kind in LEFT_OUT:
            continue
        if kind == "Secret":
            podman_secrets[doc["metadata"]["name"]] = doc.get("data", {}) or {
                k: base64.b64encode(v.encode()).decode() for k, v in doc.get("stringData", {}).items()}
            continue
        if kind == "StatefulSet":
            name = doc["metadata"]["name"]
            for claim in doc["spec"].get("volumeClaimTemplates", []):
                claim_name = f"{claim['metadata']['name']}-{name}"
                play.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "metadata": {"name": claim_name}, "spec": claim["spec"]})
                doc["spec"]["template"]["spec"].setdefault("volumes", []).append(
                    {"name": claim["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim_name}})
            doc = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": doc["metadata"],
                   "spec": {"replicas": doc["spec"].get("replicas", 1), "selector": doc["spec"]["selector"],
                            "template": doc["spec"]["template"]}}
        if kind == "Deployment" and doc["metadata"]["name"] == manifests.GATEWAY:
            doc["spec"]["template"]["spec"]["hostAliases"] = [{"ip": "127.0.0.1", "hostnames": ["switchyard-redis"]}]
        play.append(doc)
    return play, podman_secrets


def _containers(pod_prefix: str) -> list[str]:
    got = podman("ps", "-a", "--format", "{{.Names}} {{.PodName}}")
    return sorted(name for name, pod in (line.split() for line in got.stdout.decode().splitlines() if " " in line)
                  if pod.startswith(pod_prefix) and not name.endswith("-infra"))


def _state(name: str) -> dict:
    got = podman("inspect", "--format", "{{json .State}}", name, check=False)
    return json.loads(got.stdout) if got.returncode == 0 else {}


def _logs(name: str) -> str:
    got = podman("logs", name, check=False)
    return (got.stdout + got.stderr).decode(errors="replace")


def _status(client: httpx.Client, url: str) -> int:
    try:
        return client.get(url).status_code
    except httpx.HTTPError:
        return 0


def _wait(condition, timeout: float, explain) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s:\n{explain()[-4000:]}")
        time.sleep(0.5)
