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
  loopback), and since podman 4.3 ignores `hostAliases`, the gateway pods get an /etc/hosts
  naming `switchyard-redis` 127.0.0.1 (a hostPath volume). Both
  gateway pods listen on the ConfigMap's port 8000 with SO_REUSEPORT (workers = "auto"). On
  the host's network podman maps no port and refuses `containerPort` ("PortMappings can only be
  used with Bridge or slirp4netns networking"): the ports are left out, and probes that named
  one get its number.
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
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from deploy import manifests
from deploy.podman import podman, podman_env
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
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("127.0.0.1\tlocalhost switchyard-redis\n")
    hosts_file.chmod(0o644)
    play, podman_secrets = for_podman(docs, hosts_file)
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
            # the per-key limit counts in Redis (its Lua scripts, run by EVALSHA), without a state error
            stats = podman("exec", redis[0], "redis-cli", "info", "commandstats").stdout.decode()
            assert "cmdstat_evalsha:calls=" in stats or "cmdstat_eval:calls=" in stats, stats
            metrics = client.get(f"{base}/metrics").text
            assert "switchyard_key_state_errors_total{" not in metrics, metrics
            # every gateway pod stopped mid-stream as the kubelet stops one (SIGTERM, the kill only
            # after the grace period; `podman pod stop` also keeps the restart policy from
            # starting it again): the stream completes and the pods exit 0 by themselves
            pods = sorted({g.rsplit("-", 1)[0] for g in gateways})
            grace = manifests.find(docs, "Deployment", "switchyard")["spec"]["template"]["spec"][
                "terminationGracePeriodSeconds"]
            stopping = []

            def sigterm() -> None:
                stopping.append(time.monotonic())
                stopping.append(subprocess.Popen(["podman", "pod", "stop", "--time", str(grace), *pods],
                                                 env=podman_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))

            result = stream_chat(client, base, MODEL, 40, on_first_text=sigterm, headers=auth, messages=LONG)
        assert result.complete and result.finish_reasons == ["length"], result
        assert result.chunks_after_first_text >= 20 and "1\n2. 2\n3. 3" in result.text, result
        assert stopping[1].wait(grace + 30) == 0, stopping[1].stderr.read()
        stopped_s = time.monotonic() - stopping[0]
        assert stopped_s < grace, stopped_s  # they exited by themselves, before the kill
        for gateway in gateways:
            assert _state(gateway)["ExitCode"] == 0, _logs(gateway)[-3000:]
            assert "draining" in _logs(gateway)
        record("kube_play", {"pods": len(gateways) + len(redis), "play_to_ready_s": round(ready_s, 1),
                             "pod_stop_mid_stream_s": round(stopped_s, 1), "stream_complete": True})
    finally:
        podman("kube", "down", str(play_file), check=False, timeout=120)
        for name in created:
            podman("secret", "rm", name, check=False)
        for doc in play:
            if doc["kind"] in ("PersistentVolumeClaim", "ConfigMap"):  # (kube down leaves both)
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


def for_podman(docs: list[dict], hosts_file: Path) -> tuple[list[dict], dict[str, dict]]:
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
        if doc["kind"] == "Deployment":
            pod = doc["spec"]["template"]["spec"]
            for container in pod["containers"]:
                ports = {p["name"]: p["containerPort"] for p in container.pop("ports", [])}
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    for action in ("httpGet", "tcpSocket"):
                        if action in container.get(probe, {}) and container[probe][action]["port"] in ports:
                            container[probe][action]["port"] = ports[container[probe][action]["port"]]
            if doc["metadata"]["name"] == manifests.GATEWAY:
                pod["volumes"].append({"name": "hosts", "hostPath": {"path": str(hosts_file), "type": "File"}})
                pod["containers"][0]["volumeMounts"].append({"name": "hosts", "mountPath": "/etc/hosts", "readOnly": True})
        play.append(doc)
    return play, podman_secrets


def _containers(pod_prefix: str) -> list[str]:
    """The containers of the pods named `<prefix><n>` (kube play names them `<pod>-<container>`)."""
    got = podman("ps", "-a", "--format", "{{.Names}}")
    return sorted(name for name in got.stdout.decode().split()
                  if name.startswith(pod_prefix) and name[len(pod_prefix):].split("-", 1)[0].isdigit()
                  and not name.endswith("-infra"))


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
