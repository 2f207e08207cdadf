"""tests/ mirrors the code: one test folder per code folder, under the same name (the tests of
gateway/chat_api in tests/gateway/chat_api), and the tests that cross rooms with real parts in
tests/e2e. Three checks keep it so:
- every test folder is a code folder's mirror, or tests/e2e or tests/support (and their folders);
- every test folder is a package, so that test modules in different folders may share a name;
- a test whose imports of the code all come from one folder lives in that folder's mirror: the
  import says which folder it tests. A test that imports from several folders, or from none
  (it drives a real server), is placed by judgment, and not checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
CODE = ("gateway", "plugins", "builtin_engine", "kernels", "engines", "switchyard", "deploy")
NOT_MIRRORS = ("e2e", "support")
# Types every test on its side speaks (a backend's requests, events and errors; the engine's
# sampling parameters): importing them says nothing about which folder a test is about.
VOCABULARY = ("plugins.contract", "builtin_engine.scheduling.sampling_params")
# tests/e2e crosses rooms by design; tests/bench runs bench/'s scripts by path, not by import.
UNCHECKED = ("e2e", "bench")
# Where the imports mislead, the reason why.
JUDGED = {
    "tests/builtin_engine/process/test_engine_process_apis.py":
        "the engine process runs in a server; the in-process built-in backend is imported as the reference",
}


def python_folders() -> list[Path]:
    return sorted({p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts})


def test_every_test_folder_mirrors_a_code_folder() -> None:
    strays = [folder.relative_to(TESTS) for folder in python_folders()
              if folder != TESTS and folder.relative_to(TESTS).parts[0] not in NOT_MIRRORS
              and not (ROOT / folder.relative_to(TESTS)).is_dir()]
    assert strays == [], f"test folders that mirror no code folder: {strays}"


def test_every_test_folder_is_a_package() -> None:
    loose = [folder.relative_to(ROOT) for folder in python_folders() if not (folder / "__init__.py").is_file()]
    assert loose == [], f"test folders without __init__.py: {loose}"


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def imported_modules(path: Path) -> Iterator[str]:
    """Every module of this repository's code the file imports, wherever the import stands."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}") else node.module for a in node.names]
        else:
            continue
        yield from (name for name in names if name.split(".")[0] in CODE)


def folder_of(module: str) -> Path:
    path = ROOT.joinpath(*module.split("."))
    return (path if path.is_dir() else path.parent).relative_to(ROOT)


def test_a_test_of_one_folder_lives_in_its_mirror() -> None:
    assert [p for p in JUDGED if not (ROOT / p).is_file()] == []
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        if path.relative_to(TESTS).parts[0] in UNCHECKED or str(path.relative_to(ROOT)) in JUDGED:
            continue
        folders = {folder_of(m) for m in imported_modules(path) if not m.startswith(VOCABULARY)}
        if len(folders) == 1 and path.parent != TESTS / (folder := folders.pop()):
            misplaced.append(f"{path.relative_to(ROOT)} tests {folder}/ only: belongs in tests/{folder}/")
    assert misplaced == [], "\n".join(misplaced)
