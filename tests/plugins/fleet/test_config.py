"""Fleet options: bad input stops start-up naming the key; a discovery source that never
resolves leaves the backend unhealthy saying why, while the gateway starts; every knob has a
README entry."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import msgspec
import pytest

from gateway.config import parse_config, resolve_backend_options
from gateway.service.gateway import Gateway
from plugins.contract.errors import ConfigError, UpstreamError
from plugins.fleet import options as fleet_options
from plugins.manager import backend_types, build_plugin_manager
from tests.plugins.fleet.conftest import DnsZone, chat

README = Path(__file__).resolve().parents[3] / "README.md"


def backend_table(options: str, type_: str = "vllm") -> str:
    return f'[plugins]\ndisable = ["builtin"]\n\n[[backends]]\nname = "fleet"\ntype = "{type_}"\n[backends.options]\n{options}\n'


def resolve(text: str) -> list:
    config = parse_config(text, "plugins.toml")
    types = backend_types(build_plugin_manager(["builtin"], []))
    return [btype.create(cfg.name, opts) for cfg, btype, opts in resolve_backend_options(config, types)]


@pytest.mark.parametrize(("options", "names"), [
    ("endpoints = []", "`options.endpoints` is empty"),
    ('endpoints = ["http://a:1"]\nbase_url = "http://b:1"', "not both"),
    ('endpoints = ["http://a:1", "ftp://b"]', "`options.endpoints[1]`"),
    ('endpoints = ["http://a:1"]\nbalance = "fastest"', "`backends[0].options.balance`"),
    ('endpoints = ["http://a:1"]\n[backends.options.prefix_cache]\nblock_chars = 0', "`backends[0].options.prefix_cache.block_chars`"),
    ('[backends.options.discovery]\ntype = "dns"\nname = "vllm.svc"', "`discovery.port`"),
    ('[backends.options.discovery]\ntype = "file"', "`discovery.path`"),
    ('[backends.options.discovery]\ntype = "consul"', "`backends[0].options.discovery.type`"),
    ('base_url = "http://a:1"\n[backends.options.discovery]\ntype = "file"\npath = "x.json"', "not both"),
    ('endpoints = ["http://a:1"]\n[backends.options.load_signals]\nsource = "guess"', "`backends[0].options.load_signals.source`"),
])
def test_bad_fleet_options_stop_start_up_naming_the_key(options: str, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(backend_table(options))
    assert names in info.value.message


def test_a_discovery_that_never_resolves_leaves_the_backend_unhealthy_saying_why(dns_zone: DnsZone) -> None:
    async def run() -> None:
        text = backend_table(
            f'[backends.options.discovery]\ntype = "dns"\nname = "nowhere.test"\nport = 8000\nresolver = "{dns_zone.resolver}"\n'
            'interval_s = 60\n', "llamacpp")
        gateway = Gateway.from_config(parse_config("[server]\nhealth_interval_s = 0\n" + text, "plugins.toml"))
        await gateway.start()  # the gateway starts all the same
        try:
            backend = gateway.backends["fleet"]
            assert not await backend.health()
            assert not await gateway.ready()
            with pytest.raises(UpstreamError) as info:
                await anext(backend.generate(chat("hello")))
            assert info.value.kind == "unavailable"
            assert "dns name `nowhere.test`" in info.value.message and "lists no replica" in info.value.message
        finally:
            await gateway.close()

    asyncio.run(run())


def test_a_dns_server_that_does_not_answer_is_named() -> None:
    async def run() -> None:
        import socket

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # bound, never read: queries time out
            silent.bind(("127.0.0.1", 0))
            port = silent.getsockname()[1]
            (backend,) = resolve(backend_table(
                f'[backends.options.discovery]\ntype = "dns"\nname = "vllm.test"\nport = 8000\n'
                f'resolver = "127.0.0.1:{port}"\ntimeout_s = 0.3\n'))
            await backend.start()
            try:
                assert not await backend.health()
                assert "did not resolve" in backend.fleet.problem and "vllm.test" in backend.fleet.problem
            finally:
                await backend.close()

    asyncio.run(run())


def _fleet_keys() -> set[str]:
    structs = [s for _, s in vars(fleet_options).items() if isinstance(s, type) and issubclass(s, msgspec.Struct)]
    keys = {f.encode_name for s in structs for f in msgspec.structs.fields(s)}
    from plugins.proxy.options import ProxyOptions

    # the proxy options a fleet adds (the others are documented with the proxy backends)
    fleet_fields = {"endpoints", "discovery", "balance", "replica_attempts", "replica_breaker", "load_signals", "prefix_cache"}
    assert fleet_fields <= set(ProxyOptions.__struct_fields__)
    return keys | fleet_fields


def test_every_fleet_option_is_documented_in_the_readme() -> None:
    readme = README.read_text()
    section = readme[readme.index("## Fronting a fleet"):]
    missing = sorted(k for k in _fleet_keys() if not re.search(rf"\b{k}\b", section))
    assert not missing, f"fleet options without an entry in README's 'Fronting a fleet': {missing}"
