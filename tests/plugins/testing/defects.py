"""Backends with one defect each, made from a correct one: the battery must name each defect with
its own check and pass everything else."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from plugins.contract.errors import ContextLengthExceeded, InvalidRequest
from plugins.contract.protocol import Capabilities, EmbedRequest, EmbedResult, Event, Finish, RequestSpec, Usage


class Defective:
    """Delegates everything to a correct backend; subclasses break one thing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        return self.inner.generate(spec)


class UsageBeforeFinish(Defective):
    async def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        held: list[Finish] = []
        async for event in self.inner.generate(spec):
            if isinstance(event, Finish) and event.index == spec.sampling.n - 1:
                held.append(event)
                continue
            yield event
        for event in held:
            yield event


class TwoFinishes(Defective):
    async def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        async for event in self.inner.generate(spec):
            yield event
            if isinstance(event, Finish):
                yield event


class IgnoresCancellation(Defective):
    """Generates in a task of its own that runs to max_tokens whether or not anyone still reads:
    closing the stream returns at once, but the engine stays busy."""

    TOKEN_S = 0.002

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.tasks: set[asyncio.Task[None]] = set()

    def in_flight(self) -> int:
        return sum(not task.done() for task in self.tasks)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.inner.close()

    async def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        queue: asyncio.Queue[Event | BaseException | None] = asyncio.Queue()

        async def engine() -> None:
            produced = 0
            try:
                async for event in self.inner.generate(spec):
                    produced += 1
                    await queue.put(event)
            except Exception as exc:  # noqa: BLE001 - handed to the reader
                await queue.put(exc)
                return
            await queue.put(None)
            for _ in range(produced, spec.sampling.max_tokens or 0):  # decodes on, unread
                await asyncio.sleep(self.TOKEN_S)

        task = asyncio.get_running_loop().create_task(engine())
        self.tasks.add(task)
        while (item := await queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item


class BareError(Defective):
    async def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        try:
            async for event in self.inner.generate(spec):
                yield event
        except ContextLengthExceeded:
            raise RuntimeError("prompt too long") from None


class UsageDisagrees(Defective):
    async def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        async for event in self.inner.generate(spec):
            if isinstance(event, Usage):
                event = Usage(prompt_tokens=event.prompt_tokens + 1, completion_tokens=event.completion_tokens)
            yield event


class PhantomReasoning(Defective):
    """Counts reasoning tokens for reasoning it never sent."""

    async def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        async for event in self.inner.generate(spec):
            if isinstance(event, Usage):
                event = Usage(prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens,
                              reasoning_tokens=event.completion_tokens)
            yield event


class CrossedStreams(Defective):
    """Keeps the request in a shared attribute across an await: concurrent requests read the
    latest one's."""

    async def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        self.current = spec
        await asyncio.sleep(0.01)
        async for event in self.inner.generate(self.current):
            yield event


class ServedByANumber(Defective):
    """Says which replica served with something that names no replica."""

    def generate(self, spec: RequestSpec) -> AsyncIterator[Event]:
        return _Numbered(self.inner.generate(spec))


class _Numbered:
    served_by = 3

    def __init__(self, events: Any) -> None:
        self.events = events

    def __aiter__(self) -> _Numbered:
        return self

    async def __anext__(self) -> Event:
        return await anext(self.events)

    async def aclose(self) -> None:
        await self.events.aclose()


class Embeds(Defective):
    """A correct backend that also serves embeddings: a hashed bag of words per input."""

    WIDTH = 16

    def capabilities(self) -> Capabilities:
        return msgspec.structs.replace(self.inner.capabilities(), supports_embeddings=True)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        if request.dimensions is not None and request.dimensions > self.WIDTH:
            raise InvalidRequest(f"dimensions must be at most {self.WIDTH}", param="dimensions")
        vectors = [self.vector(str(text))[: request.dimensions or self.WIDTH] for text in request.inputs]
        return EmbedResult(embeddings=vectors, prompt_tokens=sum(len(str(t).split()) for t in request.inputs))

    def vector(self, text: str) -> list[float]:
        vector = [0.0] * self.WIDTH
        for word in text.split():
            vector[hashlib.sha256(word.encode()).digest()[0] % self.WIDTH] += 1.0
        return vector


class EmbedsOutOfOrder(Embeds):
    async def embed(self, request: EmbedRequest) -> EmbedResult:
        result = await super().embed(request)
        return EmbedResult(embeddings=result.embeddings[::-1], prompt_tokens=result.prompt_tokens)


# defect -> (the check that must fail, words its verdict must say)
CAUGHT_BY = {
    UsageBeforeFinish: ("event_grammar", "must be the last"),
    TwoFinishes: ("event_grammar", "2 Finish events"),
    ServedByANumber: ("event_grammar", "served_by is 3"),
    IgnoresCancellation: ("cancellation", "keeps generating for a client that left"),
    BareError: ("errors", "builtins.RuntimeError"),
    UsageDisagrees: ("usage", "but tokenize() counts"),
    PhantomReasoning: ("usage", "but no ReasoningDelta came"),
    CrossedStreams: ("concurrency", "streams crossed"),
    EmbedsOutOfOrder: ("embeddings", "out of order or crossed"),
}
