"""The limits' configuration is checked once, at start-up, with errors that name the key."""

from __future__ import annotations

import pytest

from gateway.config import parse_config
from gateway.keys import KeyLimits
from gateway.keys.keyring import KeyRing
from gateway.keys.usage import is_loopback
from plugins.contract.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('[[server.keys]]\nkey = "sk-1"\nrpm = 5\n', "a key with limits needs a `name` (its usage is counted under it) at `server.keys[0].name`"),
        ('[[server.keys]]\nname = "a"\nkey = "sk-1"\n[[server.keys]]\nname = "a"\nkey = "sk-2"\n', "duplicate key name 'a' at `server.keys[1].name`"),
        ('[[server.keys]]\nname = "a"\nkey = "sk-1"\nbudget_period = "day"\n', "`budget_period` needs `budget_tokens` at `server.keys[0].budget_period`"),
        ('[[server.keys]]\nname = "a"\nkey = "sk-1"\nbudget_tokens = 5\nbudget_period = "week"\n', "at `server.keys[0].budget_period`"),
        ('[[server.keys]]\nname = "a"\nkey = "sk-1"\nrpm = 0\n', "Expected `int` >= 1 at `server.keys[0].rpm`"),
        ('[[server.keys]]\nname = "a"\nkey = "sk-1"\ntpm = "many"\n', "at `server.keys[0].tpm`"),
        ('[[server.keys]]\nname = "a"\nkey = "sk-1"\nrps = 3\n', "unknown key at `server.keys[0].rps`"),
        ('[server]\nstate = "memcached://x"\n', "at `server.state`"),
        ('[server]\non_state_error = "ignore"\n', "at `server.on_state_error`"),
        ('[server]\nstate_timeout_s = 0\n', "at `server.state_timeout_s`"),
        ('[telemetry]\notlp_endpoint = "grpc://collector:4317"\n', "at `telemetry.otlp_endpoint`"),
        ('[telemetry]\nsample_ratio = 1.5\n', "at `telemetry.sample_ratio`"),
        ('[telemetry]\nservice = "x"\n', "unknown key at `telemetry.service`"),
    ],
)
def test_bad_limits_stop_start_up_naming_the_key(text: str, names: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(text, "plugins.toml")
    assert names in error.value.message


def test_keys_carry_their_limits() -> None:
    config = parse_config(
        '[server]\napi_keys = ["sk-short"]\n'
        '[[server.keys]]\nname = "team"\nkey = "sk-team"\nrpm = 5\ntpm = 1000\nmax_parallel = 2\nbudget_tokens = 10\n'
        '[[server.keys]]\nname = "free"\nkey = "sk-free"\n',
        "plugins.toml",
    )
    keys = {k.name: k.limits for k in KeyRing.from_config(config.server).keys}
    assert keys == {
        "api_keys[0]": None,
        "team": KeyLimits(name="team", rpm=5, tpm=1000, max_parallel=2, budget_tokens=10, budget_period="day"),
        "free": None,
    }


def test_usage_is_served_to_loopback_callers_only() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("127.8.0.1")
    assert not is_loopback("10.0.0.1") and not is_loopback(None) and not is_loopback("testclient")


def test_a_parallel_slot_is_held_at_most_the_longest_deadline() -> None:
    from gateway.keys import LEASE_DEFAULT_S, longest_deadline

    route = '[[backends]]\nname = "b"\ntype = "echo"\n[[routes]]\nname = "r"\n{}[[routes.targets]]\nbackend = "b"\n'
    assert longest_deadline(parse_config("", "p")) == LEASE_DEFAULT_S
    assert longest_deadline(parse_config("[server]\nrequest_timeout_s = 30\n" + route.format("request_timeout_s = 90\n"), "p")) == 90
    assert longest_deadline(parse_config(route.format("request_timeout_s = 90\n"), "p")) == LEASE_DEFAULT_S  # the server has none


def test_the_state_password_is_a_secret() -> None:
    from gateway.keys.keyring import Redactor

    config = parse_config('[server]\nstate = "redis://:hunter2-pass@10.0.0.5:6379/1"\n', "plugins.toml")
    assert "hunter2-pass" not in repr(config.server) and "//***@10.0.0.5" in repr(config.server)
    assert Redactor.from_config(config)("AUTH hunter2-pass failed") == "AUTH [redacted] failed"
