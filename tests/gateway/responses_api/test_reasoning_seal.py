"""Reasoning items' `encrypted_content` (gateway/responses_api/reasoning_seal.py): sealed and read
back under one key, foreign or edited seals recognised, the key file made once and shared."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.responses_api.reasoning_seal import ReasoningSeal, load_seal
from plugins.contract.errors import ConfigError
from tests.support.server import echo_config, running_server

KEY = b"k" * 32
TEXT = "The user wants a colour. Blue is short. ünïcode ✓\n" * 20


def test_a_seal_reads_back_under_its_key_only() -> None:
    seal = ReasoningSeal(KEY)
    sealed = seal.seal(TEXT)
    assert sealed.startswith("sy1.") and TEXT not in sealed
    assert len(sealed) < len(TEXT)  # compressed
    assert seal.unseal(sealed) == TEXT
    assert ReasoningSeal(b"x" * 32).unseal(sealed) is None  # another gateway's key
    assert seal.unseal(seal.seal("")) == ""


@pytest.mark.parametrize("foreign", [
    "gAAAAABo-openai-encrypted-content==",  # OpenAI's own
    "sy1.",
    "sy1.AAAA",
    "sy1.AAAA.AAAA",
    "",
])
def test_foreign_seals_are_none(foreign: str) -> None:
    assert ReasoningSeal(KEY).unseal(foreign) is None


def test_an_edited_seal_is_none() -> None:
    seal = ReasoningSeal(KEY)
    body, mac = seal.seal(TEXT).removeprefix("sy1.").split(".")
    other = seal.seal("something else").removeprefix("sy1.").split(".")[0]
    assert seal.unseal(f"sy1.{other}.{mac}") is None
    assert seal.unseal(f"sy1.{body}.{mac[:-2]}") is None


def test_the_key_file_is_made_once_and_shared(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "reasoning.key"
    with ThreadPoolExecutor(8) as pool:  # workers starting together read one key
        seals = list(pool.map(lambda _: load_seal(str(path)), range(16)))
    sealed = seals[0].seal(TEXT)
    assert all(s.unseal(sealed) == TEXT for s in seals)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["reasoning.key"]  # nothing left aside
    assert load_seal(str(path)).unseal(sealed) == TEXT  # a restart reads the same key


def test_a_bad_key_file_names_the_key(tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_text("too short\n")
    with pytest.raises(ConfigError) as info:
        load_seal(str(short))
    assert info.value.param == "responses.reasoning_key_file" and "at least 32" in info.value.message
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(ConfigError) as info:
        load_seal(str(blocked / "reasoning.key"))  # its folder is a file
    assert info.value.param == "responses.reasoning_key_file"


def test_a_server_with_an_unusable_key_file_does_not_start(tmp_path: Path) -> None:
    short = tmp_path / "reasoning.key"
    short.write_text("short\n")
    config = f'[responses]\nsqlite_path = "{tmp_path}/r.sqlite3"\nreasoning_key_file = "{short}"\n\n' + echo_config()
    with pytest.raises(RuntimeError) as info:
        with running_server(config, tmp_path, ready_timeout=60):
            pass
    assert "responses.reasoning_key_file" in str(info.value) and "Traceback" not in str(info.value)
