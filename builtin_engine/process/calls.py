"""The engine's calls as msgspec structs: one struct per call a client makes, and the replies.

The built-in backend makes these calls on an `EngineService` in its own process or, through
`builtin_engine.process.client`, on one in an engine process of its own (`builtin_engine.process.server`),
where they travel msgpack-encoded over ZeroMQ:

    client -> engine   Envelope(id, call)            call: Generate | Embed | Abort | Describe | Stats
    engine -> client   [Output | End | Result | Failure, ...]   every reply ready at once, batched

`Generate` and `Embed` are streams (`Output`s, then `End`); the other calls get one `Result` (or a
`Failure`); `Abort` gets nothing. A new engine feature is one more call struct here (with its
`result` type), one method on `EngineService` and its entry in the dispatch table there
(`STREAMS` / `RESULTS`); the backend then makes it with `engine.call(...)` / `engine.stream(...)`
whether the engine runs in process or not: no client or server code changes.

Torch-free: the gateway's worker processes import this module, never the engine itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

import msgspec

from builtin_engine.config import EngineConfig
from builtin_engine.errors import ContextLengthExceeded, EngineDeadError, EngineError, InvalidRequestError, QueueFull
from builtin_engine.outputs import RequestOutput
from builtin_engine.scheduling.sampling_params import SamplingParams
from builtin_engine.text.grammar import GrammarSpec

# ---- what an engine is built from, and what it says about itself ---------------------------------


class EngineLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """Everything an engine is built from: a checkpoint directory and the engine settings."""

    model_dir: str
    config: EngineConfig


class EngineInfo(msgspec.Struct, frozen=True, kw_only=True):
    max_model_len: int
    vocab_size: int
    hidden_size: int  # an embedding's full length
    pid: int  # the process the engine runs in
    placement: str = ""  # device, dtype and how the decode step runs, e.g. "cpu (AMD EPYC), bfloat16, eager"


class EngineStats(msgspec.Struct, frozen=True, kw_only=True):
    alive: bool  # the step thread runs
    num_unfinished_requests: int
    num_running_seqs: int = 0
    num_free_blocks: int
    num_blocks: int
    num_steps: int
    # seconds from each abort's request (the client's `Abort.requested_at`) to its blocks being freed
    abort_latencies: list[float]


# ---- calls -----------------------------------------------------------------------------------------


class Generate(msgspec.Struct, tag="generate", frozen=True, kw_only=True):
    """Generate for one request; a stream of `RequestOutput`s. Errors before anything is
    scheduled (context length, a full queue, a grammar that does not compile) end it at once."""

    request_id: str  # unique among the engine's live requests
    prompt_ids: list[int]
    sampling: dict[str, Any]  # the fields of `SamplingParams` but `grammar` (`sampling_fields`)
    grammar: GrammarSpec | None = None  # compiled by the engine, cached
    priority: int = 0  # lower runs first


class Embed(msgspec.Struct, tag="embed", frozen=True, kw_only=True):
    """Pool each prompt's hidden states (`builtin_engine.pooling`); a stream of one
    `RequestOutput` per prompt, in order, its `embedding` set. At most a batch's worth of the
    prompts waits in the engine at once; ending the stream early aborts those."""

    request_id: str  # its prompts run as `<request_id>-<i>`
    prompts: list[list[int]]
    pooling: Literal["last", "mean", "cls"] = "last"
    normalize: bool = True
    dimensions: int | None = None  # keep the first `dimensions` components; None: all


class Abort(msgspec.Struct, tag="abort", frozen=True, kw_only=True):
    """End the stream of call `call_id` (its `Generate` or `Embed`) and free what it holds in the engine."""

    call_id: int
    requested_at: float  # the client's time.monotonic() (one clock per machine): abort latency


class Describe(msgspec.Struct, tag="describe", frozen=True):
    result: ClassVar[type] = EngineInfo


class Stats(msgspec.Struct, tag="stats", frozen=True):
    result: ClassVar[type] = EngineStats


Call = Generate | Embed | Abort | Describe | Stats


class Envelope(msgspec.Struct, frozen=True, array_like=True):
    id: int  # the client's number for the call, echoed by its replies
    call: Call


# ---- replies ---------------------------------------------------------------------------------------


class Output(msgspec.Struct, tag="output", frozen=True, array_like=True):
    id: int
    output: RequestOutput


class End(msgspec.Struct, tag="end", frozen=True, array_like=True):
    """A stream ended normally."""

    id: int


class Result(msgspec.Struct, tag="result", frozen=True, array_like=True):
    id: int
    value: msgspec.Raw  # msgpack of the call's `result` type, decoded by the caller


class Failure(msgspec.Struct, tag="failure", frozen=True, array_like=True, kw_only=True):
    """An `EngineError` on its way to the client, which raises it again (`error_of`)."""

    id: int
    kind: str  # "context_length" | "invalid_request" | "queue_full" | "dead" | "engine"
    message: str
    param: str | None = None
    numbers: dict[str, int | None] = {}  # the error's own fields (context length, queue size)


Reply = Output | End | Result | Failure


def failure_of(call_id: int, error: BaseException) -> Failure:
    if isinstance(error, ContextLengthExceeded):
        numbers = {"num_prompt_tokens": error.num_prompt_tokens, "max_tokens": error.max_tokens,
                   "max_model_len": error.max_model_len}
        return Failure(id=call_id, kind="context_length", message=str(error), param=error.param, numbers=numbers)
    if isinstance(error, InvalidRequestError):
        return Failure(id=call_id, kind="invalid_request", message=str(error), param=error.param)
    if isinstance(error, QueueFull):
        return Failure(id=call_id, kind="queue_full", message=str(error), numbers={"max_waiting": error.max_waiting})
    if isinstance(error, EngineDeadError):
        return Failure(id=call_id, kind="dead", message=str(error))
    return Failure(id=call_id, kind="engine", message=str(error) if isinstance(error, EngineError) else repr(error))


def error_of(failure: Failure) -> EngineError:
    """The engine error a `Failure` carries, as the engine raised it."""
    n = failure.numbers
    if failure.kind == "context_length":
        return ContextLengthExceeded(num_prompt_tokens=n["num_prompt_tokens"] or 0, max_tokens=n["max_tokens"],
                                     max_model_len=n["max_model_len"] or 0)
    if failure.kind == "invalid_request":
        return InvalidRequestError(failure.message, param=failure.param)
    if failure.kind == "queue_full":
        return QueueFull(n["max_waiting"] or 0)
    if failure.kind == "dead":
        return EngineDeadError(failure.message)
    return EngineError(failure.message)


# ---- sampling parameters on the wire ----------------------------------------------------------------

SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams)) - {"grammar"}


def sampling_params(fields: dict[str, Any], grammar: Any = None) -> SamplingParams:
    """`SamplingParams` from `Generate.sampling` (msgpack turned its tuples into lists)."""
    unknown = set(fields) - SAMPLING_FIELDS
    if unknown:
        raise InvalidRequestError(f"unknown sampling fields: {sorted(unknown)}")
    known = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    return SamplingParams(**known, grammar=grammar)


# ---- starting an engine process ----------------------------------------------------------------------


class ProcessLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """The first line an engine process reads on its stdin (JSON)."""

    engine: EngineLaunch
    address: str  # the ZeroMQ endpoint to bind, e.g. "ipc:///tmp/.../engine.sock"


class Started(msgspec.Struct, tag="started", frozen=True):
    """The line an engine process writes on its stdout once it serves."""

    pid: int


class LaunchFailed(msgspec.Struct, tag="failed", frozen=True, kw_only=True):
    """...or the line it writes when the engine cannot be built (then it exits 2)."""

    message: str
    param: str | None = None  # the backend option at fault, when known ("model")


LaunchReport = Started | LaunchFailed
