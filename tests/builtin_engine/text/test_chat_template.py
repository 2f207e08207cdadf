"""Chat templates render exactly what transformers' apply_chat_template renders."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from builtin_engine.text.chat_template import ChatTemplate, ChatTemplateError
from builtin_engine.text.tokenizer import Tokenizer

SYSTEM = {"role": "system", "content": "You are a concise assistant."}
USER = {"role": "user", "content": "What is the capital of France?"}
ASSISTANT = {"role": "assistant", "content": "The capital of France is Paris."}
CONVERSATIONS = {
    "user": [USER],
    "system_user": [SYSTEM, USER],
    "multi_turn": [SYSTEM, USER, ASSISTANT, {"role": "user", "content": "And of Việt Nam? 🇻🇳 越南"}],
    "untrimmed": [{"role": "user", "content": "  spaces around  \n"}],
}
CONTINUATIONS = {
    "assistant_prefix": [SYSTEM, USER, {"role": "assistant", "content": "The capital of"}],
    "trailing_space": [USER, {"role": "assistant", "content": "The capital is "}],
}


def _check_against_transformers(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(model_dir)
    template = ChatTemplate.from_dir(model_dir)
    tokenizer = Tokenizer.from_dir(model_dir)

    def expect(messages, **kwargs):
        text = hf.apply_chat_template(messages, tokenize=False, **kwargs)
        ids = hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
        return text, ids

    cases = [(m, {"add_generation_prompt": g}) for m in CONVERSATIONS.values() for g in (True, False)]
    cases += [(m, {"add_generation_prompt": False, "continue_final_message": True}) for m in CONTINUATIONS.values()]
    for messages, kwargs in cases:
        text, ids = expect(messages, **kwargs)
        ours = template.render(messages, **kwargs)
        assert ours == text, (messages, kwargs)
        assert tokenizer.encode(ours, add_special_tokens=False) == list(ids)
    # Text parts are flattened for templates that expect strings.
    parts = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "What is the capital"},
                                                  {"type": "text", "text": "of France?"}]}]
    flat = [SYSTEM, {"role": "user", "content": "What is the capital\nof France?"}]
    assert template.render(parts) == expect(flat, add_generation_prompt=True)[0]


def test_tiny_template_matches_transformers(tiny_model_dir: Path) -> None:
    _check_against_transformers(tiny_model_dir)


@pytest.mark.slow
def test_default_template_matches_transformers(default_model_dir: Path) -> None:
    _check_against_transformers(default_model_dir)


@pytest.mark.slow
def test_default_model_france_prompt(default_model_dir: Path) -> None:
    text = ChatTemplate.from_dir(default_model_dir).render([SYSTEM, USER])
    assert text == ("<|im_start|>system\nYou are a concise assistant.<|im_end|>\n"
                    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert len(Tokenizer.from_dir(default_model_dir).encode(text, add_special_tokens=False)) == 27


def test_continue_final_message_cuts_after_content(tiny_model_dir: Path) -> None:
    template = ChatTemplate.from_dir(tiny_model_dir)
    text = template.render(CONTINUATIONS["assistant_prefix"], add_generation_prompt=False,
                           continue_final_message=True)
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\nThe capital of")
    with pytest.raises(ChatTemplateError, match="cannot both be true"):
        template.render(CONTINUATIONS["assistant_prefix"], continue_final_message=True)
    dropping = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content[:3] }}\n{% endfor %}")
    with pytest.raises(ChatTemplateError, match="final message"):
        dropping.render([USER], add_generation_prompt=False, continue_final_message=True)


def test_missing_template_is_a_clear_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "no-template-model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    expected = "model no-template-model has no chat template; set chat_template in plugins.toml"
    with pytest.raises(ChatTemplateError, match=expected):
        ChatTemplate.from_dir(model)
    # An override still works, and sees the model's special tokens.
    override = ChatTemplate.from_dir(model, override="{{ bos_token }}{{ messages[0]['content'] }}")
    assert override.render([USER]) == "<|begin_of_text|>" + USER["content"]
    # chat_template.jinja alone is enough.
    (model / "chat_template.jinja").write_text("[{{ messages | length }}]")
    assert ChatTemplate.from_dir(model).render([USER, ASSISTANT]) == "[2]"
    # An override may be a file path.
    path = tmp_path / "t.jinja"
    path.write_text("file:{{ messages[0].role }}")
    assert ChatTemplate.from_dir(model, override=str(path)).render([USER]) == "file:user"
    with pytest.raises(ChatTemplateError, match="neither a named template of model no-template-model nor a file"):
        ChatTemplate.from_dir(model, override=str(tmp_path / "missing.jinja"))


def test_named_templates(tmp_path: Path) -> None:
    named = [{"name": "default", "template": "D{{ messages | length }}"},
             {"name": "tool_use", "template": "T{{ tools | length }}"},
             {"name": "rag", "template": "R"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    template = ChatTemplate.from_dir(tmp_path)
    assert template.render([USER]) == "D1"
    assert template.render([USER], tools=[{"type": "function", "function": {"name": "f"}}]) == "T1"
    assert ChatTemplate.from_dir(tmp_path, override="rag").render([USER]) == "R"
    with pytest.raises(ChatTemplateError, match="no 'default'"):
        ChatTemplate({"rag": "R"})


def test_template_helpers() -> None:
    template = ChatTemplate(
        "{{ messages[0].content | tojson }}|{{ {'a': [1, 2]} | tojson(indent=2) }}|"
        "{{ strftime_now('%Y') }}|{{ tools[0].function.name }}|{{ flavour }}|{{ bos_token }}|"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}|"
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}|"
        "{% generation %}gen{% endgeneration %}|{{ dict(x=1) | tojson }}",
        special_tokens={"bos_token": "<s>"},
    )
    text = template.render(
        [{"role": "user", "content": "Việt <b>&"}, ASSISTANT],
        tools=[{"type": "function", "function": {"name": "lookup"}}],
        chat_template_kwargs={"flavour": "vanilla"},
    )
    assert text == (f'"Việt <b>&"|{{\n  "a": [\n    1,\n    2\n  ]\n}}|{datetime.now():%Y}|lookup|vanilla|<s>|'
                    'user|2|gen|{"x": 1}')


def test_template_errors_become_chat_template_errors() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    refusing = ChatTemplate("{% if messages[0].role != 'user' %}"
                            "{{ raise_exception('Conversation must start with user') }}{% endif %}ok")
    assert refusing.render([USER]) == "ok"
    with pytest.raises(ChatTemplateError, match="^Conversation must start with user$"):
        refusing.render([ASSISTANT])
    with pytest.raises(ChatTemplateError, match="TypeError"):
        ChatTemplate("{{ messages[0].content + 1 }}").render([USER])
    with pytest.raises(ChatTemplateError):  # the sandbox refuses reaching into Python internals
        ChatTemplate("{{ ''.__class__.__mro__ }}").render([USER])
    with pytest.raises(ChatTemplateError, match="namespace attribute"):
        ChatTemplate("{% set ns = namespace(_x=1) %}").render([USER])
    with pytest.raises(ChatTemplateError, match="non-empty"):
        ChatTemplate("x").render([])
    with pytest.raises(ChatTemplateError, match="may not set messages"):
        ChatTemplate("x").render([USER], chat_template_kwargs={"messages": []})


def test_message_normalisation() -> None:
    echo = ChatTemplate("{% for m in messages %}{{ m | tojson }}\n{% endfor %}")
    tool_call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"city": "Hà Nội"}'}}
    text = echo.render([USER, {"role": "assistant", "content": None, "tool_calls": [tool_call]}])
    second = json.loads(text.splitlines()[1])
    assert "content" not in second  # None values are dropped, as transformers does
    assert second["tool_calls"][0]["function"]["arguments"] == {"city": "Hà Nội"}
    assert tool_call["function"]["arguments"] == '{"city": "Hà Nội"}'  # the caller's message is untouched
    with pytest.raises(ChatTemplateError, match="'image_url' is not supported"):
        echo.render([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_templates_that_loop_over_content_get_the_parts() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% if m.content is string %}{{ m.content }}"
        "{% else %}{% for part in m['content'] %}<{{ part.text }}>{% endfor %}{% endif %}{% endfor %}"
    )
    assert template.content_format == "openai"
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert template.render([{"role": "user", "content": parts}]) == "<a><b>"
    assert template.render([{"role": "user", "content": parts}], add_generation_prompt=False,
                           continue_final_message=True) == "<a><b"
    assert ChatTemplate("{{ messages[0]['content'] }}").content_format == "string"
