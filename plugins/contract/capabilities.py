"""What a backend can do (`Capabilities`) against what a request asks for: the check every
route runs before anything is sent to the chosen backend, so an unsupported extension or
feature is a 400 naming it and the backend rather than an upstream's own failure."""

from __future__ import annotations

from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import Capabilities, RequestSpec


def check_capabilities(spec: RequestSpec, caps: Capabilities, backend: str) -> None:
    """Refuse what the chosen backend cannot do, before anything is sent to it."""
    for name in sorted(spec.extensions - caps.extensions):
        raise InvalidRequest(f"`{name}` is not supported by backend `{backend}`.", param=name)
    if spec.response_format and spec.response_format.get("type") != "text" and not caps.supports_response_format:
        raise InvalidRequest(f"JSON `response_format` is not supported by backend `{backend}`.", param="response_format")
    if spec.tools and not caps.supports_tools:
        raise InvalidRequest(f"`tools` are not supported by backend `{backend}`.", param="tools")
    if spec.sampling.logprobs and not caps.supports_logprobs:
        raise InvalidRequest(f"`logprobs` are not supported by backend `{backend}`.", param="logprobs")
    if caps.max_n is not None and spec.sampling.n > caps.max_n:
        raise InvalidRequest(f"`n` is {spec.sampling.n}; backend `{backend}` serves at most {caps.max_n}.", param="n")
    if spec.kind == "completion" and not caps.supports_completions:
        raise InvalidRequest(f"Backend `{backend}` does not serve /v1/completions.", param="model")
    if spec.kind == "embedding" and not caps.supports_embeddings:
        raise InvalidRequest(f"Backend `{backend}` does not serve embeddings (/v1/embeddings).", param="model")
