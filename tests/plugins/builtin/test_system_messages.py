"""System messages after the first: rendered in place where the chat template takes them, folded
into the first system message where it refuses them or the backend says `system_messages =
"fold"` (`plugins.contract.system_turns`)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from plugins.builtin.backend import BuiltinBackend, BuiltinOptions
from plugins.contract.system_turns import fold_system_messages
from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import TokenizeRequest
from tests.plugins.builtin.conftest import run

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# as Gemma's and Mistral's templates do
FIRST_ONLY = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
              "{{ raise_exception('System role only supported at the beginning of the conversation') }}"
              "{% endif %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
                {"role": "system", "content": "# Environment\ncwd: /tmp"}]


def test_fold() -> None:
    assert fold_system_messages(CONVERSATION) == [
        {"role": "system", "content": "Be brief.\n\n# Environment\ncwd: /tmp"}, {"role": "user", "content": "Name a colour."}]
    assert fold_system_messages(CONVERSATION[1:]) == [{"role": "system", "content": "# Environment\ncwd: /tmp"},
                                                      {"role": "user", "content": "Name a colour."}]
    parts = [{"role": "user", "content": "x"}, {"role": "system", "content": [{"type": "text", "text": "a"},
                                                                             {"type": "text", "text": "b"}]}]
    assert fold_system_messages(parts)[0] == {"role": "system", "content": "a\nb"}
    assert fold_system_messages(CONVERSATION[:2]) is None  # nothing after the first to fold


def _text(backend: BuiltinBackend, template: str, messages: list[dict]) -> str:
    result = run(backend.tokenize(TokenizeRequest(upstream_model="tiny", messages=messages, chat_template=template)))
    return run(backend.detokenize("tiny", result.tokens))


def test_in_place_where_the_template_takes_them(backend: BuiltinBackend) -> None:
    text = _text(backend, CHATML, CONVERSATION)
    assert text.index("Name a colour.") < text.index("# Environment")


def test_folded_where_the_template_refuses_them(backend: BuiltinBackend) -> None:
    text = _text(backend, FIRST_ONLY, CONVERSATION)
    assert text.startswith("[system] Be brief.\n\n# Environment\ncwd: /tmp\n[user] Name a colour.")


def test_a_refusal_folding_does_not_cure_is_the_templates(backend: BuiltinBackend) -> None:
    refuses_all = "{{ raise_exception('no system messages') }}"
    with pytest.raises(InvalidRequest, match="no system messages"):
        _text(backend, refuses_all, CONVERSATION)


def test_folded_always_when_the_backend_says_so(tiny_model_dir: Path) -> None:
    options = msgspec.convert({"model": str(tiny_model_dir), "served_model_name": "tiny", "num_threads": 1,
                               "system_messages": "fold"}, BuiltinOptions)
    folding = BuiltinBackend("folding", options)
    run(folding.start())
    try:
        text = _text(folding, CHATML, CONVERSATION)
    finally:
        run(folding.close())
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Environment\ncwd: /tmp<|im_end|>\n<|im_start|>user\n")
    with pytest.raises(msgspec.ValidationError, match="system_messages"):
        msgspec.convert({"system_messages": "sometimes"}, BuiltinOptions)
