"""Load what real servers sent: `tests/recordings/<engine>/*.json` (written by
`scripts/record_upstreams.py`, with the byte boundaries of each network read) and the raw curl
transcripts in `tests/recordings/transcripts/` (copied from docs/transcripts; one body, no
boundaries)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"


@dataclass
class Recording:
    engine: str  # "vllm" | "llamacpp"
    name: str
    status: int
    content_type: str
    body: bytes
    chunks: list[bytes]
    request: Any = None
    path: str = ""
    source: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    built_by_plugin: bool = False

    @property
    def is_sse(self) -> bool:
        return self.content_type.startswith("text/event-stream") or (
            not self.content_type and self.body.lstrip().startswith(b"data:"))

    @property
    def kind(self) -> str:
        return "completion" if self.path.endswith("/completions") and "chat" not in self.path else "chat"

    @property
    def id(self) -> str:
        return f"{self.engine}/{self.name}"


def _split(body: bytes, sizes: list[int]) -> list[bytes]:
    chunks, pos = [], 0
    for size in sizes:
        chunks.append(body[pos : pos + size])
        pos += size
    assert pos == len(body), "chunk sizes do not add up to the body"
    return chunks


def recorded() -> list[Recording]:
    out = []
    for engine in ("vllm", "llamacpp"):
        for path in sorted((RECORDINGS / engine).glob("*.json")):
            doc = json.loads(path.read_text(encoding="utf-8"))
            body = doc["body"].encode("utf-8")
            out.append(Recording(
                engine=engine, name=doc["case"], status=doc["status"], content_type=doc["content_type"], body=body,
                chunks=_split(body, doc["chunk_sizes"]), request=doc.get("request"), path=doc["path"],
                source=str(path.relative_to(RECORDINGS)), spec=doc.get("spec") or {},
                built_by_plugin=doc.get("built_by_plugin", False),
            ))
    return out


def _parse_transcript(path: Path, engine: str) -> Recording | None:
    raw = path.read_bytes()
    if path.suffix == ".bin":  # a raw SSE body
        return Recording(engine=engine, name=path.stem, status=200, content_type="text/event-stream", body=raw,
                         chunks=[raw], path="/v1/chat/completions", source=str(path.relative_to(RECORDINGS)))
    start = raw.find(b"HTTP/1.1 ")
    if start < 0:
        return None
    head_end = raw.find(b"\r\n\r\n", start)
    if head_end < 0:
        return None
    head = raw[start:head_end].decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    end = raw.rfind(b"\n### curl exit")
    body = raw[head_end + 4 : end if end > head_end else len(raw)]
    text = raw[:start].decode("utf-8", "replace")
    req_path = "/v1/chat/completions" if "/chat/completions" in text else ("/v1/completions" if "/completions" in text else "")
    request = None
    marker = "### request body:\n"
    if marker in text:
        try:
            request = json.loads(text.split(marker, 1)[1].split("\n###", 1)[0])
        except ValueError:
            request = None
    elif " -d {" in text:
        try:
            request = json.loads(text.split(" -d ", 1)[1].rsplit(" http", 1)[0])
        except ValueError:
            request = None
    return Recording(engine=engine, name=path.stem, status=status, content_type=headers.get("content-type", ""),
                     body=body, chunks=[body], request=request, path=req_path,
                     source=str(path.relative_to(RECORDINGS)))


def transcripts() -> list[Recording]:
    out = []
    for engine, folder in (("vllm", "vllm-0.32.0"), ("llamacpp", "llama.cpp-b11434")):
        for path in sorted((RECORDINGS / "transcripts" / folder).iterdir()):
            rec = _parse_transcript(path, engine)
            if rec is not None:
                out.append(rec)
    return out


def all_recordings() -> list[Recording]:
    return recorded() + transcripts()


def find(engine: str, name: str) -> Recording:
    for rec in all_recordings():
        if rec.engine == engine and rec.name == name:
            return rec
    raise LookupError(f"no recording {engine}/{name}; run scripts/record_upstreams.py")
