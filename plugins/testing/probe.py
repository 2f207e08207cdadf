"""What a check works with: the started backend, the model under test, and ways to send it
requests the way the gateway does and to record what comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from plugins.contract.errors import InvalidRequest, SwitchyardError
from plugins.contract.protocol import Backend, Capabilities, ModelInfo, RequestSpec, TokenizeRequest
from plugins.testing.specs import SpecBuilder, gateway_refusal
from plugins.testing.trace import Trace


@dataclass
class Opening:
    """How `start()` and `models()` went (the lifecycle check reports it)."""

    start_s: float | None = None
    start_error: BaseException | None = None
    models: list[ModelInfo] | None = None
    models_error: BaseException | None = None
    healthy: object = None  # what health() returned after start()


def in_flight_of(backend: Backend) -> int | None:
    """The backend's `in_flight()` (requests it still holds resources for), or None when it does
    not report one."""
    report = getattr(backend, "in_flight", None)
    return int(report()) if callable(report) else None


class Probe:
    def __init__(self, backend: Backend, *, build_spec: SpecBuilder, model: str | None = None,
                 request_timeout_s: float = 120.0) -> None:
        self.backend = backend
        self.build_spec = build_spec
        self.wanted_model = model
        self.request_timeout_s = request_timeout_s
        self.opening = Opening()
        self.model: str = ""
        self.info: ModelInfo | None = None
        self.closed = False
        self._memo: dict[str, Any] = {}

    async def open(self) -> None:
        """start(), models(), health(); when they work, `model` names the model every check asks for."""
        began = time.perf_counter()
        try:
            await self.backend.start()
        except Exception as exc:  # noqa: BLE001 - reported by the lifecycle check
            self.opening.start_error = exc
            return
        self.opening.start_s = time.perf_counter() - began
        try:
            self.opening.models = list(await self.backend.models())
        except Exception as exc:  # noqa: BLE001 - reported by the lifecycle check
            self.opening.models_error = exc
            return
        try:
            self.opening.healthy = await self.backend.health()
        except Exception as exc:  # noqa: BLE001 - reported by the lifecycle check
            self.opening.healthy = exc
        wanted = self.wanted_model
        chosen = [i for i in self.opening.models if isinstance(i, ModelInfo) and (not wanted or i.id == wanted)]
        if chosen and self.opening.healthy is True:
            self.info, self.model = chosen[0], chosen[0].id

    @property
    def ready(self) -> bool:
        return bool(self.model) and not self.closed

    @property
    def caps(self) -> Capabilities:
        return self.backend.capabilities()

    @property
    def max_model_len(self) -> int | None:
        return self.caps.max_model_len or (self.info.max_model_len if self.info else None)

    def allows_n(self, n: int) -> bool:
        return self.caps.max_n is None or self.caps.max_n >= n

    # -- requests ------------------------------------------------------------------------------

    def chat(self, content: str | list[dict[str, Any]], **body: Any) -> RequestSpec:
        messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
        body.setdefault("temperature", 0)
        return self.build_spec("chat", self.model, {"messages": messages, **body})

    def completion(self, prompt: str | list[int], **body: Any) -> RequestSpec:
        body.setdefault("temperature", 0)
        return self.build_spec("completion", self.model, {"prompt": prompt, **body})

    def refusal(self, spec: RequestSpec) -> SwitchyardError | None:
        return gateway_refusal(spec, self.caps, self.backend.name)

    async def run(self, spec: RequestSpec, label: str) -> Trace:
        """Send `spec` and record every event until the stream ends, raises, or runs past the
        request timeout; the iterator is closed afterwards, as the gateway closes it, and its
        `served_by` read then, as the gateway reads it."""
        trace = Trace(spec=spec, label=label)
        began = time.perf_counter()
        events = self.backend.generate(spec)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                async for event in events:
                    trace.events.append(event)
        except TimeoutError:
            trace.error = TimeoutError(f"the stream did not end within {self.request_timeout_s:g} s")
        except Exception as exc:  # noqa: BLE001 - what the backend raised is the finding
            trace.error = exc
        finally:
            try:
                await events.aclose()  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001
                trace.error = trace.error or exc
            trace.elapsed_s = time.perf_counter() - began
            trace.served_by = getattr(events, "served_by", None)
        return trace

    async def prompt_tokens(self, spec: RequestSpec) -> int | None:
        """How many tokens `tokenize()` counts for the spec's prompt; None when the backend does
        not tokenize (it raises `InvalidRequest`)."""
        if spec.messages is not None:
            request = TokenizeRequest(upstream_model=spec.upstream_model, messages=spec.messages,
                                      add_generation_prompt=spec.add_generation_prompt,
                                      continue_final_message=spec.continue_final_message,
                                      chat_template=spec.chat_template, chat_template_kwargs=spec.chat_template_kwargs,
                                      tools=spec.tools)
        elif isinstance(spec.prompt, str):
            request = TokenizeRequest(upstream_model=spec.upstream_model, prompt=spec.prompt)
        else:
            return len(spec.prompt or ())
        try:
            return len((await self.backend.tokenize(request)).tokens)
        except InvalidRequest:
            return None

    async def memo(self, key: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """A result several checks share (the reference story), computed once."""
        if key not in self._memo:
            self._memo[key] = await make()
        return self._memo[key]

    def in_flight(self) -> int | None:
        return in_flight_of(self.backend)

    async def wait_idle(self, within_s: float) -> int | None:
        """`in_flight()` once it is 0, or what it still says after `within_s` (None: not reported)."""
        deadline = time.monotonic() + within_s
        while True:
            count = self.in_flight()
            if not count or time.monotonic() >= deadline:
                return count
            await asyncio.sleep(0.01)
