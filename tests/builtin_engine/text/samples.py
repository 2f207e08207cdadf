"""Sample texts and small tokenizers built in-test, shared by the text-side tests."""

from __future__ import annotations

import json
from pathlib import Path

from builtin_engine.text.tokenizer import Tokenizer, _byte_level_table

TEXTS = {
    "ascii": "Hello, world! The quick brown fox jumps over the lazy dog. 1 + 2 = 3.",
    "vietnamese": "Tiếng Việt là ngôn ngữ chính thức của Việt Nam. Xin chào, bạn có khỏe không?",
    "cjk": "你好，世界！今天天气很好。こんにちは、元気ですか？안녕하세요.",
    "emoji": "😀😃🎉 👍🏽 ❤️ 🇫🇷 👨‍👩‍👧‍👦 🚀✨",
    "mixed": "Phở 🍜 costs 50.000₫ — 北京 is \"Beijing\"; naïve café ✓\n\tdone 👋🏿!",
}

SPM_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello there, how are you today?",
    "Tiếng Việt là ngôn ngữ chính thức của Việt Nam.",
    "Numbers 1 2 3 and words and more words for the merges.",
    "你好 世界 😀",
]


def byte_level_ids(tokenizer: Tokenizer, data: bytes) -> list[int]:
    """Valid ids of a byte-level BPE tokenizer for any bytes, even a piece of a character:
    the BPE model run directly on the byte-level characters (no pre-tokenization)."""
    to_char = {b: c for c, b in _byte_level_table().items()}
    text = "".join(to_char[b] for b in data)
    return [token.id for token in tokenizer._tk.model.tokenize(text)] if text else []


def make_spm_tokenizer(out_dir: Path) -> Path:
    """A Llama-2-style tokenizer.json: BPE over `▁`-joined text with byte fallback `<0xNN>` tokens,
    the decoder Replace(▁)/ByteFallback/Fuse/Strip(1 leading space). The alphabet is limited so CJK
    and emoji are spelled with byte tokens."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers, processors, trainers

    backend = Backend(models.BPE(unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=40, show_progress=False)
    backend.train_from_iterator(SPM_CORPUS, trainer)
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", backend.token_to_id("<s>"))]
    )
    state = json.loads(backend.to_str())
    vocab = state["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_text(json.dumps(state, ensure_ascii=False))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return out_dir


def make_wordpiece_tokenizer(out_dir: Path) -> Path:
    """A tokenizer whose decoder has no byte semantics (WordPiece)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = Backend(models.WordPiece(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=["[UNK]", "[SEP]"], show_progress=False)
    backend.train_from_iterator(SPM_CORPUS + list(TEXTS.values()), trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    backend.save(str(out_dir / "tokenizer.json"))
    return out_dir
