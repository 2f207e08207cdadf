"""Chat templates: the model's Jinja template turned into prompt text, as transformers'
`apply_chat_template(..., tokenize=False)` does (transformers 5.24 semantics, pinned by tests).

The template comes from `tokenizer_config.json` ("chat_template": a string, or a list of named
templates of which "default" is used, "tool_use" when tools are given) or from
`chat_template.jinja`, or from an override (plugins.toml). It runs in Jinja's immutable sandbox
with what Hub templates expect: `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII
text, `{% generation %}` blocks, the special token names, `messages`, `tools`, `documents`,
`add_generation_prompt` and any `chat_template_kwargs`.

Messages are copied to plain data first: keys whose value is None are dropped, tool-call
`arguments` given as JSON strings (OpenAI's wire form) become objects (what templates index into,
as vLLM does), and lists of text parts become one string (parts joined by "\\n", as vLLM does)
unless the template itself loops over `message.content`. Non-text parts are refused: this engine
reads text only.

Every failure, from a syntax error to a template's own `raise_exception`, is a `ChatTemplateError`
whose message the gateway returns as a 400.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from builtin_engine.text.tokenizer import load_special_tokens

# The tag transformers appends to the final message to find where it ends in the rendered text.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_RESERVED_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

ContentFormat = Literal["string", "openai"]


class ChatTemplateError(Exception):
    """The chat template is missing, does not compile, or refused the conversation."""


class ChatTemplate:
    """A compiled chat template. `ChatTemplate.from_dir(model_dir)` for the model's own;
    `ChatTemplate(source)` for an override."""

    def __init__(
        self,
        source: str | Mapping[str, str],
        *,
        special_tokens: Mapping[str, str] | None = None,
        model_name: str = "model",
    ) -> None:
        """`source`: the template text, or named templates (needs a "default"). `special_tokens`:
        `bos_token`, `eos_token`, ... passed to the template as variables."""
        templates = {"default": source} if isinstance(source, str) else dict(source)
        if "default" not in templates:
            raise ChatTemplateError(
                f"model {model_name} has several chat templates ({', '.join(sorted(templates))}) and no "
                "'default'; set chat_template in plugins.toml"
            )
        self.model_name = model_name
        self.special_tokens = dict(special_tokens or {})
        self._sources = templates
        self._compiled = {name: _compile(text, model_name) for name, text in templates.items()}

    @classmethod
    def from_dir(cls, path: str | Path, *, override: str | None = None) -> ChatTemplate:
        """The template of the model in `path`. `override` replaces it: the name of one of the
        model's named templates, a path to a template file, or the template text itself."""
        path = Path(path)
        name = path.name or str(path)
        special = load_special_tokens(path)
        found = _find_template(path)
        if override is not None:
            if isinstance(found, dict) and override in found:
                return cls({**found, "default": found[override]}, special_tokens=special, model_name=name)
            if "{" not in override and "\n" not in override:  # a name or a path, not template text
                override_path = Path(override).expanduser()
                if not override_path.is_file():
                    raise ChatTemplateError(
                        f"chat template {override!r} is neither a named template of model {name} nor a file"
                    )
                override = override_path.read_text(encoding="utf-8")
            return cls(override, special_tokens=special, model_name=name)
        if found is None:
            raise ChatTemplateError(f"model {name} has no chat template; set chat_template in plugins.toml")
        return cls(found, special_tokens=special, model_name=name)

    @property
    def source(self) -> str:
        """The text of the default template."""
        return self._sources["default"]

    @property
    def content_format(self) -> ContentFormat:
        """"openai" when the default template loops over `message.content` itself (content part
        lists are passed through), else "string" (text parts are joined into one string)."""
        return _content_format(self.source)

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for `messages`; encode it with `add_special_tokens=False`.

        `continue_final_message`: leave the final message open so the model continues it (no
        generation prompt; the text ends right after that message's content). It cannot be
        combined with `add_generation_prompt`, as in transformers and vLLM."""
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message and add_generation_prompt cannot both be true: use "
                "continue_final_message to continue the final message, add_generation_prompt to start a new one"
            )
        kwargs = dict(chat_template_kwargs or {})
        if clash := sorted(_RESERVED_VARIABLES & kwargs.keys()):
            raise ChatTemplateError(f"chat_template_kwargs may not set {', '.join(clash)}")
        name = "tool_use" if tools is not None and "tool_use" in self._compiled else "default"
        template = self._compiled[name]
        chat = _prepare_messages(messages, keep_parts=_content_format(self._sources[name]) == "openai")
        final_text = _tag_final_message(chat, self._sources[name]) if continue_final_message else None
        variables = {**self.special_tokens, **_plain(kwargs)}
        try:
            rendered = template.render(
                messages=chat,
                tools=_plain(tools),
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(exc.message or type(exc).__name__) from exc
        except Exception as exc:  # the template is untrusted code: any failure is the request's
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
        if final_text is not None:
            rendered = _cut_after_final_message(rendered, final_text)
        return rendered


# ---------------------------------------------------------------------------------------------


def _prepare_messages(messages: list[dict[str, Any]], *, keep_parts: bool) -> list[dict[str, Any]]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    chat = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"each message must be an object, got {type(message).__name__}")
        message = {k: _plain(v) for k, v in message.items() if v is not None}
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = _text_parts(content) if keep_parts else "\n".join(
                part["text"] for part in _text_parts(content))
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                try:
                    arguments = json.loads(function["arguments"])
                except ValueError:
                    continue
                if isinstance(arguments, dict):
                    function["arguments"] = arguments
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:  # transformers' aliases: templates read either name
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat


def _find_template(path: Path) -> str | dict[str, str] | None:
    config_path = path / "tokenizer_config.json"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ChatTemplateError(f"{config_path} is not valid JSON: {exc}") from exc
        template = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(template, str):
            return template
        if isinstance(template, list):
            named = {t["name"]: t["template"] for t in template
                     if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)}
            if named:
                return named
    jinja_path = path / "chat_template.jinja"
    if jinja_path.is_file():
        return jinja_path.read_text(encoding="utf-8")
    return None


def _text_parts(parts: list[Any]) -> list[dict[str, Any]]:
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ChatTemplateError(f"content part of type {kind!r} is not supported: this model reads text only")
    return parts


def _tag_final_message(chat: list[dict[str, Any]], source: str) -> str:
    """Append transformers' continue tag to the final message's text; return that text."""
    final = chat[-1]
    content = final.get("content")
    if content is None:
        raise ChatTemplateError('continue_final_message is set but the final message has no "content" to continue')
    if "content" not in source:
        raise ChatTemplateError("continue_final_message is set but the chat template does not read message content")
    if isinstance(content, list):
        for part in reversed(content):
            if "text" in part:
                text = part["text"]
                part["text"] = text + _CONTINUE_TAG
                return text
        raise ChatTemplateError("continue_final_message is set but the final message has no text to continue")
    final["content"] = content + _CONTINUE_TAG
    return content


def _cut_after_final_message(rendered: str, final_text: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final_text.strip() not in rendered or tag not in rendered:
        raise ChatTemplateError(
            "continue_final_message is set but the chat template does not keep the final message's text as is"
        )
    at = rendered.rindex(tag)
    if rendered[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the message's trailing space


def _plain(value: Any) -> Any:
    """A copy made of JSON types only, so the sandboxed template sees no rich objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    raise ChatTemplateError(f"chat template input must be JSON data, got {type(value).__name__}")


class _GenerationBlock(jinja2.ext.Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (marks assistant text for training
    masks): here it just renders its body, so templates using it compile."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _render_body(caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """Jinja's `namespace()`, refusing underscore attributes (as transformers does)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates may not set namespace attribute {name!r}")


class _Dict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without exposing the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters and cannot indent; Hub templates expect this one.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = _Dict()
    return env


@lru_cache(maxsize=32)
def _compile(source: str, model_name: str) -> jinja2.Template:
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"chat template of {model_name} does not compile: {exc.message} (line {exc.lineno})"
        ) from exc


@lru_cache(maxsize=32)
def _content_format(source: str) -> ContentFormat:
    """Whether a template iterates over message content (`for x in message['content']`)."""
    try:
        tree = _environment().parse(source)
    except jinja2.TemplateSyntaxError:
        return "string"
    for loop in tree.find_all(jinja2.nodes.For):
        if _reads_content(loop.iter):
            return "openai"
    return "string"


def _reads_content(node: jinja2.nodes.Node) -> bool:
    for sub in _walk(node):
        if isinstance(sub, jinja2.nodes.Getattr) and sub.attr == "content":
            return True
        if (isinstance(sub, jinja2.nodes.Getitem) and isinstance(sub.arg, jinja2.nodes.Const)
                and sub.arg.value == "content"):
            return True
    return False


def _walk(node: jinja2.nodes.Node) -> Iterator[jinja2.nodes.Node]:
    yield node
    for child in node.iter_child_nodes():
        yield from _walk(child)
