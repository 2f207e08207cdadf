"""Backend type `llamacpp`: a llama.cpp `llama-server` (tested with build b11434).

What differs from the generic proxy:
- Sampling: llama.cpp's server defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, and
  whatever the server's command line set) never apply: every sampler is sent explicitly —
  `top_k` (0 = off), `min_p`, `repeat_penalty` (from `repetition_penalty`), and the samplers
  OpenAI does not know at their neutral values (typical_p 1, dry/xtc/mirostat off,
  top_n_sigma -1, dynatemp 0, repeat_last_n 64).
- Extensions it honours: top_k, min_p, repetition_penalty, structured_outputs (json → its
  `json_schema`, grammar → `grammar` (GBNF), choice → an equivalent grammar, regex → an
  equivalent grammar where GBNF can say it (no lookaround, backreferences or word boundaries:
  those are a 400; both grammars from `plugins.proxy.gbnf`), json_object → `response_format`;
  structural_tag and whitespace_pattern are refused with a 400), chat_template_kwargs, ignore_eos. OpenAI's `response_format` goes as it is
  (llama-server reads json_object and json_schema itself).
- Tools (with `tools = true`: the server runs with `--jinja`) go to its chat template, and "auto"
  calls come back parsed by llama-server. A named or "required" `tool_choice` (which llama-server
  takes only for templates it knows, and not named at all) is enforced here as vLLM and the
  built-in engine do: the tool's arguments schema (or the list-of-calls schema) as `json_schema`,
  and the content read back as tool calls (`content_calls`). Anything else (e.g. `priority`) the gateway refuses with a 400 naming it before
  sending. `n` is at most 1 (`Capabilities.max_n`).
- `cached_tokens`: `usage.prompt_tokens_details.cached_tokens`, else `timings.cache_n`.
  `completion_tokens` counts the end-of-generation token.
- With stop strings the request sets `verbose`, so that the final chunk's `__verbose.stopping_word`
  tells which one matched (Anthropic's `stop_sequence`).
- Catalogue: `/v1/models` for the name (the server's `--alias`), `/props`
  (`default_generation_settings.n_ctx`, the per-slot context = `-c` / `-np`) for max_model_len.
- Tokens: `/apply-template` then `/tokenize` (chat), `/tokenize`, `/detokenize`.
- Optional `launch` table: the plugin starts `llama-server` (built by
  `python -m engines.install llamacpp`) on the default model's GGUF, and stops it on shutdown.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from plugins.contract.config_types import BackendType
from plugins.contract.errors import InvalidRequest
from plugins.contract.hookspecs import hookimpl
from plugins.contract.protocol import Rendered, RequestSpec, TokenizeRequest, TokenizeResult
from plugins.contract.system_turns import system_messages_as
from plugins.proxy.backend import ProxyBackend
from plugins.proxy.gbnf import choice_grammar, regex_grammar
from plugins.proxy.options import ProxyOptions

DEFAULT_ALIAS = "smollm2-135m-instruct"

LLAMACPP_EXTENSIONS = frozenset(
    {"top_k", "min_p", "repetition_penalty", "structured_outputs", "chat_template_kwargs", "ignore_eos"}
)

# llama.cpp samplers OpenAI has no name for, pinned to "off" so the server's command line
# cannot change what a request means.
NEUTRAL_SAMPLERS: dict[str, Any] = {
    "typical_p": 1.0,
    "repeat_last_n": 64,
    "dry_multiplier": 0.0,
    "xtc_probability": 0.0,
    "mirostat": 0,
    "top_n_sigma": -1.0,
    "dynatemp_range": 0.0,
}


class LlamaCppLaunch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Have the plugin start `llama-server` itself (`[backends.options.launch]`).

    - `model`: a GGUF path; empty: the default model's GGUF (`python -m engines.install gguf`).
    - `alias`: the name the server serves it under.
    - `ctx_size` / `parallel`: `-c` / `-np`; each request gets ctx_size // parallel tokens.
    - `binary`: default: the build from `python -m engines.install llamacpp`.
    """

    model: str = ""
    alias: str = DEFAULT_ALIAS
    host: str = "127.0.0.1"
    port: int = 0
    ctx_size: int = 4096
    parallel: int = 2
    threads: int = 2
    extra_args: list[str] = []
    binary: str | None = None
    start_timeout_s: float = 60.0
    log_dir: str | None = None


class LlamaCppOptions(ProxyOptions):
    """`tools`: the server runs with `--jinja`, so `tools` may be forwarded."""

    launch: LlamaCppLaunch | None = None
    tools: bool = False


class LlamaCppBackend(ProxyBackend):
    engine = "llama.cpp"
    extensions = LLAMACPP_EXTENSIONS
    max_n = 1
    load_sources = ("llamacpp_metrics", "llamacpp_slots")  # /metrics needs --metrics, /slots --slots
    honours_dimensions = False
    options: LlamaCppOptions

    def supports_tools(self) -> bool:
        return self.options.tools

    async def launch(self) -> None:
        cfg = self.options.launch
        if cfg is None:
            return
        from engines.launch import start_llamacpp

        server = await asyncio.to_thread(
            start_llamacpp, model=Path(cfg.model) if cfg.model else None, alias=cfg.alias, host=cfg.host,
            port=cfg.port, ctx_size=cfg.ctx_size, parallel=cfg.parallel, threads=cfg.threads,
            api_key=self.upstream.api_key(), extra=cfg.extra_args, binary=Path(cfg.binary) if cfg.binary else None,
            log_dir=Path(cfg.log_dir) if cfg.log_dir else None, timeout=cfg.start_timeout_s,
            embeddings=self.options.embeddings,
        )
        self.launched = server
        self._launched_url = server.base_url

    # -- catalogue -----------------------------------------------------------------------------

    async def discover_models(self) -> dict[str, int | None]:
        listing = await self.upstream.get_json("/v1/models")
        names = [c["id"] for c in listing.get("data") or () if isinstance(c, dict) and isinstance(c.get("id"), str)]
        n_ctx: int | None = None
        try:
            props = await self.upstream.get_json("/props")
            value = (props.get("default_generation_settings") or {}).get("n_ctx")
            n_ctx = value if isinstance(value, int) and value > 0 else None
        except Exception:  # noqa: BLE001 - /props is optional; the catalogue still works without it
            n_ctx = None
        if n_ctx is None:
            metas = [c.get("meta") or {} for c in listing.get("data") or () if isinstance(c, dict)]
            ctxs = [m.get("n_ctx") for m in metas if isinstance(m.get("n_ctx"), int)]
            n_ctx = min(ctxs) if ctxs else None
        lens = {name: n_ctx for name in names}
        self._set_model_lens(lens)
        return lens

    # -- request body ----------------------------------------------------------------------------

    def _common(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        s = spec.sampling
        body.pop("n", None)  # max_n = 1; llama.cpp's default is 1
        body["top_k"] = s.top_k if s.top_k is not None else 0
        body["min_p"] = s.min_p
        body["repeat_penalty"] = s.repetition_penalty
        body.update(NEUTRAL_SAMPLERS)
        if s.stop:
            body["verbose"] = True  # its final chunk then names the stop string that matched
        if s.ignore_eos:
            body["ignore_eos"] = True
        if spec.structured_outputs is not None:
            self._structured(body, spec.structured_outputs)
        return body

    def _structured(self, body: dict[str, Any], so: dict[str, Any]) -> None:
        for key in ("structural_tag", "whitespace_pattern"):
            if so.get(key) is not None:
                raise InvalidRequest(f"`structured_outputs.{key}` is not supported by backend `{self.name}`.",
                                     param=f"structured_outputs.{key}")
        if so.get("json") is not None:
            schema = so["json"]
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError:
                    raise InvalidRequest("`structured_outputs.json` is not a valid JSON schema.",
                                         param="structured_outputs.json") from None
            body["json_schema"] = schema
        elif so.get("grammar") is not None:
            body["grammar"] = so["grammar"]
        elif so.get("choice") is not None:
            body["grammar"] = choice_grammar(list(so["choice"]))
        elif so.get("regex") is not None:
            body["grammar"] = regex_grammar(so["regex"])
        elif so.get("json_object"):
            body["response_format"] = {"type": "json_object"}

    def translate_chat(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        body = self._common(body, spec)
        if spec.chat_template_kwargs is not None:
            body["chat_template_kwargs"] = spec.chat_template_kwargs
        schema = _tool_choice_schema(spec)
        if schema is not None:
            # enforced here, as the built-in engine does: the tool's schema as `json_schema`, and
            # llama-server told to read no calls itself (the content is read by `content_calls`)
            body["json_schema"] = schema
            body["tool_choice"] = "none"
            body.pop("response_format", None)
            body.pop("grammar", None)
        return body

    def content_calls(self, spec: RequestSpec) -> Callable[[], Any] | None:
        from plugins.parsers.tools import NamedCallParser, RequiredCallsParser

        choice = spec.tool_choice
        if spec.kind != "chat" or not spec.tools:
            return None
        if isinstance(choice, dict):
            name = str((choice.get("function") or {}).get("name"))
            return lambda: NamedCallParser(name)
        if choice == "required":
            return RequiredCallsParser
        return None

    def translate_completion(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        return self._common(body, spec)

    # -- tokens ------------------------------------------------------------------------------

    async def apply_template(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                             chat_template_kwargs: dict[str, Any] | None = None,
                             tools: list[dict[str, Any]] | None = None) -> str:
        body: dict[str, Any] = {"messages": system_messages_as(self.options.system_messages, messages),
                                "add_generation_prompt": add_generation_prompt}
        if chat_template_kwargs is not None:
            body["chat_template_kwargs"] = chat_template_kwargs
        if tools:
            body["tools"] = tools
        out = await self.upstream.request_json("POST", "/apply-template", body)
        return out.get("prompt", "") if isinstance(out, dict) else ""

    async def _tokenize_text(self, text: str, *, add_special: bool, with_pieces: bool) -> tuple[list[int], list[str] | None]:
        out = await self.upstream.request_json("POST", "/tokenize", {"content": text, "add_special": add_special,
                                                                     "parse_special": True, "with_pieces": with_pieces})
        raw = out.get("tokens") if isinstance(out, dict) else None
        tokens: list[int] = []
        pieces: list[str] | None = [] if with_pieces else None
        for item in raw or ():
            if isinstance(item, dict):
                tokens.append(int(item["id"]))
                piece = item.get("piece", "")
                if pieces is not None:
                    pieces.append(piece if isinstance(piece, str) else bytes(piece).decode("utf-8", "replace"))
            else:
                tokens.append(int(item))
        return tokens, pieces

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        if request.messages is not None:
            text = await self.apply_template(request.messages, add_generation_prompt=request.add_generation_prompt,
                                             chat_template_kwargs=request.chat_template_kwargs, tools=request.tools)
            add_special = True  # what llama-server does with a rendered chat prompt
        else:
            text = request.prompt or ""
            add_special = request.add_special_tokens
        tokens, pieces = await self._tokenize_text(text, add_special=add_special, with_pieces=request.return_token_strs)
        return TokenizeResult(tokens=tokens, max_model_len=self._max_model_len, token_strs=pieces)

    async def detokenize(self, upstream_model: str, tokens: list[int]) -> str:
        out = await self.upstream.request_json("POST", "/detokenize", {"tokens": tokens})
        return out.get("content", "") if isinstance(out, dict) else ""

    async def render(self, upstream_model: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                     chat_template_kwargs: dict[str, Any] | None = None,
                     tools: list[dict[str, Any]] | None = None) -> Rendered:
        """llama.cpp's `/apply-template` (the text a chat request is built from), then
        `/tokenize` of that text with special tokens parsed."""
        text = await self.apply_template(messages, add_generation_prompt=add_generation_prompt,
                                         chat_template_kwargs=chat_template_kwargs, tools=tools)
        tokens, pieces = await self._tokenize_text(text, add_special=True, with_pieces=True)
        return Rendered(text=text, tokens=tokens, token_strs=pieces)


def _tool_choice_schema(spec: RequestSpec) -> dict[str, Any] | None:
    """The JSON schema that enforces a named or "required" tool_choice (as vLLM and the built-in
    engine build it), or None for "auto" / "none"."""
    from plugins.parsers.tools import required_calls_schema, tool_parameters

    choice = spec.tool_choice
    if spec.kind != "chat" or not spec.tools:
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        for tool in spec.tools:
            if (tool.get("function") or {}).get("name") == name:
                return tool_parameters(tool)
        raise InvalidRequest(f"`tool_choice` names function {name!r}, which is not in `tools`.", param="tool_choice")
    if choice == "required":
        return required_calls_schema(spec.tools, parallel=spec.parallel_tool_calls is not False)
    return None


@hookimpl
def switchyard_backend_types() -> list[BackendType]:
    return [BackendType(name="llamacpp", options=LlamaCppOptions, create=LlamaCppBackend,
                        description="a llama.cpp llama-server (proxied over HTTP/SSE)")]
