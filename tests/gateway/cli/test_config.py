"""`switchyard check-config`: a good file passes; each kind of mistake exits non-zero with a
message naming the file and the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli.main import main
from tests.support.server import ROOT, echo_config

GOOD = echo_config(models=["a", "b"], token_delay_s=0.01)
ROUTE = """
[[routes]]
name = "chat"
[[routes.targets]]
backend = "echo"
model = "a"
weight = 3
"""


def check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    path = tmp_path / "plugins.toml"
    path.write_text(text)
    rc = main(["check-config", str(path)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_good_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = check(tmp_path, '[server]\nport = 9000\napi_keys = ["a"]\n' + GOOD + ROUTE, capsys)
    assert rc == 0, err
    assert "OK" in out and "1 backends" in out and "1 routes" in out
    assert err == ""


BAD = [
    # (id, config text, key the message must name, reason substring)
    ("unknown-top-level-key", "colour = 1\n" + GOOD, "`colour`", "unknown key"),
    ("unknown-table", GOOD + "\n[servers]\nport = 1\n", "`servers`", "unknown key"),
    ("unknown-server-key", "[server]\nprot = 8000\n" + GOOD, "`server.prot`", "unknown key"),
    ("bad-value-type", '[server]\nport = "eighty"\n' + GOOD, "`server.port`", "Expected `int`"),
    ("bad-value-range", "[server]\nport = 70000\n" + GOOD, "`server.port`", "<= 65535"),
    ("bad-max_n", "[server]\nmax_n = 0\n" + GOOD, "`server.max_n`", ">= 1"),
    ("bad-strip_billing_header", '[server]\nstrip_billing_header = "on"\n' + GOOD, "`server.strip_billing_header`", "Expected `bool`"),
    ("unknown-plugins-key", GOOD.replace("[plugins]", "[plugins]\nenable = []"), "`plugins.enable`", "unknown key"),
    ("unknown-backend-type", GOOD.replace('type = "echo"', 'type = "nope"'), "`backends[0].type`", "'nope'"),
    ("unknown-backend-key", GOOD.replace('type = "echo"', 'type = "echo"\nkind = "x"'), "`backends[0].kind`", "unknown key"),
    ("unknown-option-key", echo_config(token_dealy_s=1), "`backends[0].options.token_dealy_s`", "unknown key"),
    ("bad-option-type", echo_config(max_model_len="big"), "`backends[0].options.max_model_len`", "Expected `int`"),
    ("bad-backend-name", GOOD.replace('name = "echo"', 'name = "has space"'), "`backends[0].name`", "regex"),
    ("duplicate-backend", GOOD + GOOD.split("[plugins]")[1].split("\n", 3)[3], "`backends[1].name`", "duplicate"),
    ("route-to-unknown-backend", GOOD + ROUTE.replace('backend = "echo"', 'backend = "ghost"'), "`routes[0].targets[0].backend`", "'ghost'"),
    ("unknown-routing-strategy", GOOD + ROUTE.replace('name = "chat"', 'name = "chat"\nstrategy = "roulette"'), "`routes[0].strategy`", "'roulette'"),
    ("route-without-targets", GOOD + '\n[[routes]]\nname = "r"\ntargets = []\n', "`routes[0].targets`", "length >= 1"),
    ("negative-weight", GOOD + ROUTE.replace("weight = 3", "weight = -1"), "`routes[0].targets[0].weight`", ">= 0"),
    ("bad-hosted-tools", '[server]\nhosted_tools = "maybe"\n' + GOOD, "`server.hosted_tools`", "'maybe'"),
    ("bad-route-hosted-tools", GOOD + ROUTE.replace('name = "chat"', 'name = "chat"\nhosted_tools = "keep"'),
     "`routes[0].hosted_tools`", "'keep'"),
    ("empty-reasoning-key-file", '[responses]\nreasoning_key_file = " "\n' + GOOD, "`responses.reasoning_key_file`", "empty"),
    ("not-toml", "[server\n", "", "not valid TOML"),
    ("source-is-not-a-key", 'source = "x"\n' + GOOD, "`source`", "unknown key"),
]


@pytest.mark.parametrize("text,key,reason", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str, reason: str) -> None:
    rc, out, err = check(tmp_path, text, capsys)
    assert rc != 0
    assert out == ""
    assert "Traceback" not in err
    assert str(tmp_path / "plugins.toml") in err, err
    assert key in err, err
    assert reason in err, err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check-config", str(tmp_path / "absent.toml")])
    err = capsys.readouterr().err
    assert rc != 0 and "absent.toml" in err and "Traceback" not in err


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )


def test_cli_subprocess_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nprot = 1\n" + GOOD)
    ok = _cli("check-config", str(good))
    assert ok.returncode == 0, ok.stderr
    failed = _cli("check-config", str(bad))
    assert failed.returncode != 0
    assert str(bad) in failed.stderr and "server.prot" in failed.stderr
    assert "Traceback" not in failed.stderr


def test_serve_refuses_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(echo_config(token_dealy_s=1))
    proc = _cli("serve", "--config", str(bad), "--port", "0")
    assert proc.returncode != 0
    assert "backends[0].options.token_dealy_s" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_shipped_plugins_toml_is_valid() -> None:
    proc = _cli("check-config", str(ROOT / "plugins.toml"))
    assert proc.returncode == 0, proc.stderr
