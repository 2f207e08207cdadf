"""Model fixtures, loaded as a pytest plugin (`pytest_plugins = ["tests.fixtures_models"]`).

- `tiny_model_dir` / `tiny_model_dir_tied`: a random-weight Llama checkpoint with a small
  byte-level BPE tokenizer and a Llama-3-style chat template, built in seconds with no download.
  Built once per builder version under `cache_root()/test-models/` and copied into each test
  session's tmp dir, so tests may modify their copy.
- `default_model_dir`: the real default model (SmolLM2-135M-Instruct), fetched and converted once
  per machine; for `@pytest.mark.slow` tests.

`make_tiny_model(out_dir)` is importable for benchmarks and scripts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from builtin_engine.model.store import DEFAULT_MODEL, cache_root, fetch_model

BUILDER_VERSION = "1"  # bump when the tiny model's tokenizer, template or weights change

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
EOT = "<|eot_id|>"
SPECIAL_TOKENS = [BOS, EOS, START_HEADER, END_HEADER, EOT]  # ids 0..4, in this order

# Llama 3's template (bos, header ids, eot; content trimmed).
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# A little of several scripts, so the tokenizer has merges for each (and byte tokens for the rest).
CORPUS = """\
The quick brown fox jumps over the lazy dog. What is the capital of France? The capital of France is Paris.
You are a concise assistant. Hello! How can I help you today? Please answer in one sentence.
def add(a, b):
    return a + b
print("hello, world")  # 1 + 2 = 3; 10 * 20 = 200; 3.14159
Tiếng Việt là ngôn ngữ chính thức của Việt Nam. Xin chào, bạn có khỏe không? Tôi tên là Minh.
Hà Nội là thủ đô của Việt Nam. Phở bò rất ngon. Cảm ơn bạn rất nhiều!
你好，世界！今天天气很好。我们一起去公园散步吧。中国的首都是北京。
日本語のテキストも少し入れます。こんにちは、元気ですか？東京は日本の首都です。
한국어 문장도 있습니다. 안녕하세요, 만나서 반갑습니다.
Emoji: 😀 😃 😄 🎉 👍🏽 ❤️ 🇫🇷 👨‍👩‍👧‍👦 🚀 ✨ and symbols € £ ¥ © ® ™ — “quotes” ‘single’ …
Ünïcödé àccents: café, naïve, résumé, Straße, São Paulo, Zürich, Ελληνικά, Русский язык.
Numbers and lists: 1. first 2. second 3. third; JSON: {"key": "value", "list": [1, 2, 3]}
Once upon a time, there was a little robot who wanted to learn how to paint the ocean at sunset.
Every morning the robot walked to the beach, watched the waves, and mixed blue, green and orange.
The weather today is sunny with a light breeze; tomorrow brings rain, thunder and cooler nights.
Machine learning models predict the next token from the previous tokens in the sequence.
import json, math, sys
for i in range(10):
    if i % 2 == 0:
        print(f"even {i}")
    else:
        continue
class Point:
    def __init__(self, x: float, y: float) -> None:
        self.x, self.y = x, y
SELECT name, count(*) FROM users WHERE active = true GROUP BY name ORDER BY 2 DESC;
Người Việt thường ăn cơm với rau, cá và nước mắm. Mùa thu ở Hà Nội rất đẹp và mát mẻ.
学习中文需要时间和耐心。我喜欢读书、写字和听音乐。上海是一个国际化的大城市。
"""


def make_tiny_model(out_dir: Path, *, tie_word_embeddings: bool = False, num_layers: int = 2,
                    seed: int = 0) -> Path:
    """Write a random-weight Llama checkpoint with a trained byte-level BPE tokenizer into
    `out_dir` (created; must not exist or be empty) and return it. Deterministic for a seed."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = _train_tokenizer()
    backend.save(str(out_dir / "tokenizer.json"))
    ids = {tok: backend.token_to_id(tok) for tok in SPECIAL_TOKENS}
    vocab_size = backend.get_vocab_size(with_added_tokens=True)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": EOS,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": LLAMA3_CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        # Wider than the default 0.02, so logits are far from uniform and greedy choices are not
        # near-ties that tiny numeric differences between implementations could flip.
        initializer_range=0.1,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=ids[BOS],
        eos_token_id=[ids[EOS], ids[EOT]],
        pad_token_id=ids[EOS],
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=ids[BOS], eos_token_id=[ids[EOS], ids[EOT]], pad_token_id=ids[EOS]
    )
    model.save_pretrained(out_dir)
    return out_dir


def cached_tiny_model(*, tie_word_embeddings: bool = False) -> Path:
    """The tiny model under `cache_root()/test-models/`, built on first use (atomically)."""
    key = hashlib.sha256(
        f"{BUILDER_VERSION}|{tie_word_embeddings}|{CORPUS}|{LLAMA3_CHAT_TEMPLATE}|{_library_versions()}".encode()
    ).hexdigest()[:12]
    name = f"tiny-{'tied-' if tie_word_embeddings else ''}{key}"
    target = cache_root() / "test-models" / name
    if (target / "config.json").is_file() and (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=target.parent))
    try:
        make_tiny_model(work / "model", tie_word_embeddings=tie_word_embeddings)
        (work / "model" / ".complete").write_text(BUILDER_VERSION + "\n")
        try:
            os.rename(work / "model", target)
        except OSError:  # another session won the race
            if not (target / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the tiny random Llama (untied embeddings, 2 layers, float32)."""
    return _session_copy(tmp_path_factory, cached_tiny_model(), "tiny-model")


@pytest.fixture(scope="session")
def tiny_model_dir_tied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As `tiny_model_dir`, with tied embeddings (no `lm_head.weight` in the checkpoint)."""
    return _session_copy(tmp_path_factory, cached_tiny_model(tie_word_embeddings=True), "tiny-model-tied")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The real default model, converted once per machine (about 30 s the first time)."""
    return fetch_model(DEFAULT_MODEL)


def _session_copy(factory: pytest.TempPathFactory, source: Path, name: str) -> Path:
    dest = factory.mktemp(name) / "model"
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".complete"))
    return dest


def _library_versions() -> str:
    import tokenizers
    import torch
    import transformers

    return f"{tokenizers.__version__}|{transformers.__version__}|{torch.__version__}"


def _train_tokenizer():  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS.splitlines(), trainer)
    bos_id = backend.token_to_id(BOS)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return backend
