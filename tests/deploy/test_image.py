"""The image built from deploy/Containerfile, run with Podman as it ships: non-root, read-only root
filesystem, `switchyard serve` as its entrypoint. It answers /ready, a chat completion from the
built-in engine (the model converted at build time) and one proxied to llama.cpp's llama-server
on the host; SIGTERM mid-stream lets the stream complete and the container exit 0."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest

from deploy import image as deploy_image
from deploy.lock import canonical as lock_names
from deploy.lock import pip_check_allowed, read_lock
from deploy.podman import podman
from tests.deploy.conftest import record, write_config
from tests.deploy.containers import in_image, run_container
from tests.deploy.streams import LONG, chat_body, stream_chat
from tests.support.server import free_port

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.slow


def test_the_image_is_what_the_issue_asks(built_image, image):
    inspect = json.loads(podman("image", "inspect", image).stdout)[0]
    config = inspect["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["switchyard", "serve", "--config", "/etc/switchyard/plugins.toml"]
    assert "/var/cache/switchyard" in config["Volumes"]
    assert config["Labels"]["io.switchyard.torch"] == "cpu" and config["Labels"]["io.switchyard.with-model"] == "1"
    assert "8000/tcp" in config["ExposedPorts"]
    size = built_image["size_bytes"]
    record("image", {"tag": image, "size_bytes": size, "size_mb": round(size / 1e6),
                     "build_seconds": built_image.get("build_seconds"), "base": built_image.get("base")})
    print(f"image {image}: {size / 1e6:.0f} MB")
    # no compiler in the final stage
    got = in_image(image, "sh", "-c", "for c in gcc cc g++ c++ clang cpp make ld; do command -v $c; done; true")
    assert got.returncode == 0 and got.stdout.decode().strip() == "", got.stdout
    # what runs: the locked dependencies, consistent; the model converted inside; the user
    got = in_image(image, "sh", "-c", "id -u; pip check; ls /opt/switchyard-models/smollm2-135m-instruct; "
                                      "python3 -c 'import torch; print(torch.__version__)'")
    out = got.stdout.decode()
    assert got.returncode == 0, out + got.stderr.decode()
    assert out.splitlines()[0] == "10001"
    allowed = set(pip_check_allowed("cpu"))
    checked = [line for line in out.splitlines()[1:] if "requires" in line or "No broken" in line]
    assert checked and set(checked) <= allowed, checked  # only what the lock leaves out on purpose
    # exactly the lock's distributions, at the lock's versions (a stale layer would show here)
    listed = json.loads(in_image(image, "pip", "list", "--format", "json").stdout)
    installed = {lock_names(d["name"]): d["version"] for d in listed}
    expected = {**read_lock("cpu"), "switchyard": deploy_image.project_version()}
    assert {k: v for k, v in installed.items() if k not in ("pip",)} == expected
    assert "model.safetensors" in out and "switchyard-model.json" in out
    assert out.strip().endswith("2.13.0+cpu")


def test_an_unchanged_tree_reuses_the_image(built_image, podman_base):
    started = time.monotonic()
    info = deploy_image.build(deploy_image.BuildSpec(engine="podman", base=podman_base))
    elapsed = time.monotonic() - started
    assert info["cached"] is True and info["tag"] == built_image["tag"]
    assert elapsed < 30, f"a cached build took {elapsed:.1f} s"


def test_workers_auto_follows_the_containers_cpu_limit(image):
    count = ["python3", "-c", "from gateway.worker_pool import worker_count; print(worker_count('auto'))"]
    limited = in_image(image, *count, extra=("--cpus", "1"))
    assert limited.returncode == 0, limited.stderr
    assert limited.stdout.decode().strip() == "1"
    free = in_image(image, *count)
    assert free.stdout.decode().strip() == str(len(os.sched_getaffinity(0)))


def test_builtin_engine_ready_answers_and_drains_a_stream_on_sigterm(image):
    container = run_container(image, free_port())  # the image's own plugins.toml: built-in engine, workers = auto
    try:
        cold = container.wait_ready(300)
        record("cold_start_to_ready_s", {"builtin_engine": round(cold, 1)})
        print(f"cold start to /ready (built-in engine): {cold:.1f} s")
        with httpx.Client(timeout=120) as client:
            models = client.get(f"{container.base}/v1/models").json()
            assert [m["id"] for m in models["data"]] == [MODEL]
            answer = client.post(f"{container.base}/v1/chat/completions", json=chat_body(MODEL, 16, stream=False))
            assert answer.status_code == 200, answer.text
            assert "Paris" in answer.json()["choices"][0]["message"]["content"]
            # structured outputs (xgrammar) on the CPU, without triton in the image
            shaped = client.post(f"{container.base}/v1/chat/completions", json={
                **chat_body(MODEL, 24, stream=False),
                "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": {
                    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                    "required": ["city"], "additionalProperties": False}}}})
            assert shaped.status_code == 200, shaped.text
            content = shaped.json()["choices"][0]["message"]["content"]
            assert content.lstrip().startswith("{") and '"city"' in content, content
            # the responses store writes to the cache volume: the root filesystem is read-only
            stored = client.post(f"{container.base}/v1/responses",
                                 json={"model": MODEL, "input": "Say hi.", "max_output_tokens": 4})
            assert stored.status_code == 200, stored.text
            again = client.get(f"{container.base}/v1/responses/{stored.json()['id']}")
            assert again.status_code == 200 and again.json()["id"] == stored.json()["id"]
            signalled = []

            def sigterm() -> None:
                container.signal("TERM")
                signalled.append(time.monotonic())

            result = stream_chat(client, container.base, MODEL, 40, on_first_text=sigterm, messages=LONG)
        assert signalled, "the stream produced no text"
        assert result.complete, result
        assert result.finish_reasons == ["length"] and result.usage["completion_tokens"] == 40
        assert result.chunks_after_first_text >= 20, result  # it ran on well after the signal
        assert "1\n2. 2\n3. 3" in result.text, result.text  # the whole answer, greedy
        code = container.wait_exit(45)
        stopped_s = time.monotonic() - signalled[0]
        assert code == 0, container.logs()[-3000:]
        logs = container.logs()
        assert "draining" in logs
        record("sigterm_mid_stream", {"stream_complete": True, "exit_code": code, "exit_after_sigterm_s": round(stopped_s, 1)})
    finally:
        container.remove()


PROXY_CONFIG = """
[server]
workers = 2
[[backends]]
name = "llamacpp"
type = "llamacpp"
[backends.options]
base_url = "{url}"
"""


def test_the_proxy_only_image_has_no_model_and_fronts_vllm(proxy_image):
    got = in_image(proxy_image, "sh", "-c", "ls -A /opt/switchyard-models; cat /etc/switchyard/plugins.toml")
    out = got.stdout.decode()
    assert got.returncode == 0 and not out.startswith("smollm2"), out
    assert 'type = "vllm"' in out and 'type = "dns"' in out
    labels = json.loads(podman("image", "inspect", proxy_image).stdout)[0]["Config"]["Labels"]
    assert labels["io.switchyard.with-model"] == "0"


def test_proxied_chat_completion_from_llamacpp_on_the_host(proxy_image, llama_server, tmp_path):
    config = write_config(tmp_path, PROXY_CONFIG.format(url=llama_server.base_url))
    container = run_container(proxy_image, free_port(), config=config)
    try:
        cold = container.wait_ready(120)
        record("cold_start_to_ready_s", {"proxy_llamacpp": round(cold, 1)})
        print(f"cold start to /ready (proxy to llama.cpp): {cold:.1f} s")
        with httpx.Client(timeout=60) as client:
            answer = client.post(f"{container.base}/v1/chat/completions", json=chat_body(MODEL, 16, stream=False))
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert "Paris" in body["choices"][0]["message"]["content"]
            assert body["usage"]["prompt_tokens"] == 27  # llama.cpp's count of the question, as transformers counts
            result = stream_chat(client, container.base, MODEL, 16)
            assert result.complete and "Paris" in result.text, result
            metrics = client.get(f"{container.base}/metrics").text
            assert 'backend="llamacpp"' in metrics
        container.signal("TERM")
        assert container.wait_exit(45) == 0
    finally:
        container.remove()


@pytest.mark.parametrize(("arg", "message"), [
    ("TORCH=rocm", "TORCH must be cpu or cuda, not 'rocm'"),
    ("TORCH=cuda", "TORCH=cuda, but the context holds the cpu lock"),
    ("WITH_MODEL=yes", "WITH_MODEL must be 0 or 1, not 'yes'"),
])
def test_a_bad_build_argument_stops_the_build(built_image, podman_base, tmp_path, arg, message):
    spec = deploy_image.BuildSpec(engine="podman", base=podman_base)
    deploy_image.prepare_context(spec, tmp_path / "context")
    got = podman("build", "-f", str(deploy_image.CONTAINERFILE), "--network", "none", "--target", "build",
                 "--build-arg", f"PYTHON_BASE={podman_base}", "--build-arg", arg, str(tmp_path / "context"),
                 check=False, timeout=600)
    assert got.returncode != 0
    assert message in (got.stdout + got.stderr).decode()
