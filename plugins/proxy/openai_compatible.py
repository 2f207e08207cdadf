"""Backend type `openai_compatible`: any other OpenAI-compatible server — TensorRT-LLM's
`trtllm-serve`, SGLang, a hosted API with an API key — through the same proxy core.

No extensions by default: the gateway refuses vLLM-style fields with a 400. A server that does
honour some of them (SGLang, for instance, takes top_k / min_p / repetition_penalty) lists them
in `extensions`, and they are forwarded under their vLLM names; `top_k`, `min_p` and
`repetition_penalty` are then always sent (explicit defaults), like the OpenAI ones.

    [[backends]]
    name = "hosted"
    type = "openai_compatible"
    [backends.options]
    base_url = "https://api.example.com"       # without /v1
    api_key_env = "EXAMPLE_API_KEY"
    models = { "gpt-small" = "gpt-4.1-mini" }  # gateway name -> upstream name
    health_path = "/v1/models"                 # hosted APIs have no /health
    max_tokens_field = "max_completion_tokens"
"""

from __future__ import annotations

from typing import Any, Literal

from plugins.contract.config_types import BackendType
from plugins.contract.hookspecs import hookimpl
from plugins.contract.protocol import Capabilities, RequestSpec
from plugins.proxy.backend import ProxyBackend
from plugins.proxy.options import ProxyOptions, check_extensions


class OpenAICompatibleOptions(ProxyOptions):
    """- `extensions`: the vLLM-style fields this server honours (default none).
    - `max_n`: the most choices per request it serves (default: no limit of its own).
    - `tools`, `logprobs`, `completions`: whether it serves tools, logprobs, /v1/completions.
    - `response_format`: whether it honours OpenAI's JSON `response_format` (json_object /
      json_schema; a hosted OpenAI API does). vLLM's `structured_outputs` is separate: list it in
      `extensions` for a server that takes it.
    - `health_path`: probed with GET; 200 means healthy.
    - `max_tokens_field`: `max_tokens` or `max_completion_tokens` (OpenAI's newer models take
      only the latter)."""

    extensions: list[str] = []
    max_n: int | None = None
    tools: bool = True
    response_format: bool = True
    logprobs: bool = True
    completions: bool = True
    health_path: str = "/health"
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"


class OpenAICompatibleBackend(ProxyBackend):
    engine = "openai-compatible"
    options: OpenAICompatibleOptions

    def __init__(self, name: str, options: OpenAICompatibleOptions) -> None:
        self.extensions = check_extensions(options.extensions, backend_type="openai_compatible")  # type: ignore[misc]
        self.max_n = options.max_n  # type: ignore[misc]
        self.health_path = options.health_path  # type: ignore[misc]
        self.max_tokens_field = options.max_tokens_field  # type: ignore[misc]
        super().__init__(name, options)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            extensions=self.extensions,
            reports_cached_tokens=False,
            max_model_len=self._max_model_len,
            max_n=self.max_n,
            supports_tools=self.options.tools,
            supports_response_format=self.options.response_format,
            supports_logprobs=self.options.logprobs,
            supports_completions=self.options.completions,
            supports_embeddings=self.options.embeddings,
        )

    def _forward_extensions(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        s = spec.sampling
        ext = self.extensions
        if "top_k" in ext:
            body["top_k"] = s.top_k if s.top_k is not None else -1
        if "min_p" in ext:
            body["min_p"] = s.min_p
        if "repetition_penalty" in ext:
            body["repetition_penalty"] = s.repetition_penalty
        used = spec.extensions & ext
        if not used:  # most requests: no extension to forward
            return body
        values = {
            "priority": spec.priority or None,
            "structured_outputs": spec.structured_outputs,
            "chat_template": spec.chat_template,
            "chat_template_kwargs": spec.chat_template_kwargs,
            "min_tokens": s.min_tokens or None,
            "ignore_eos": s.ignore_eos or None,
            "stop_token_ids": list(s.stop_token_ids) or None,
            "include_stop_str_in_output": s.include_stop_str_in_output or None,
            "skip_special_tokens": None if s.skip_special_tokens else False,
        }
        for key in used:
            if values.get(key) is not None:
                body[key] = values[key]
        if spec.kind == "chat" and "add_generation_prompt" in used:
            body["add_generation_prompt"] = spec.add_generation_prompt
        if spec.kind == "chat" and "continue_final_message" in used:
            body["continue_final_message"] = spec.continue_final_message
        return body

    def translate_chat(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        return self._forward_extensions(body, spec)

    def translate_completion(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        return self._forward_extensions(body, spec)


@hookimpl
def switchyard_backend_types() -> list[BackendType]:
    return [BackendType(name="openai_compatible", options=OpenAICompatibleOptions, create=OpenAICompatibleBackend,
                        description="any OpenAI-compatible server (trtllm-serve, SGLang, a hosted API)")]
