"""The echo test backend, with a `detokenize` that stays small for any token id (the echo
backend spells token t as t x's, which a fuzzer's 2**31 - 1 would make a 2 GB string)."""

from __future__ import annotations

from plugins import hookimpl
from plugins.contract.config_types import BackendType
from tests.support.echo_backend import EchoBackend, EchoOptions


class FuzzEchoBackend(EchoBackend):
    async def detokenize(self, upstream_model: str, tokens: list[int]) -> str:
        return " ".join(f"t{t}" for t in tokens)


@hookimpl
def switchyard_backend_types() -> list[BackendType]:
    return [BackendType(name="fuzz_echo", options=EchoOptions, create=FuzzEchoBackend, description="fuzz test backend")]
