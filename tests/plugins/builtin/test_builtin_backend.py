"""The `builtin` backend plugin over the engine: options, events order, usage, cancellation,
errors before scheduling, tokenize/detokenize, models, health."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from plugins.builtin.backend import BuiltinBackend, BuiltinOptions, switchyard_backend_types
from plugins.contract.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound, Overloaded
from plugins.contract.protocol import Backend, Finish, RequestSpec, Sampling, TextDelta, TokenizeRequest, Usage

MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def make_backend(model_dir: Path, **options: object) -> BuiltinBackend:
    opts = {"model": str(model_dir), "num_threads": 1, "kv_cache_tokens": 4096, **options}
    backend = BuiltinBackend("local", msgspec.convert(opts, BuiltinOptions))
    run(backend.start())
    return backend


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path):  # noqa: ANN201
    backend = make_backend(tiny_model_dir, served_model_name="tiny")
    yield backend
    run(backend.close())


def spec(**fields: object) -> RequestSpec:
    sampling = fields.pop("sampling", Sampling(temperature=0.0, max_tokens=8))
    base = {"request_id": "req", "kind": "chat", "model": "tiny", "upstream_model": "tiny", "messages": MESSAGES}
    base.update(fields)
    return RequestSpec(sampling=sampling, **base)  # type: ignore[arg-type]


async def events_of(backend: BuiltinBackend, request: RequestSpec) -> list:
    return [event async for event in backend.generate(request)]


def test_hook_options_and_lazy_imports(tmp_path: Path) -> None:
    (backend_type,) = switchyard_backend_types()
    assert backend_type.name == "builtin" and backend_type.options is BuiltinOptions
    with pytest.raises(msgspec.ValidationError, match="unknown_key"):
        msgspec.convert({"unknown_key": 1}, BuiltinOptions)
    with pytest.raises(msgspec.ValidationError, match="dtype"):
        msgspec.convert({"dtype": "float16"}, BuiltinOptions)
    assert BuiltinOptions().model == "smollm2-135m-instruct"
    assert BuiltinBackend("b", BuiltinOptions()).served_model_name == "smollm2-135m-instruct"
    assert BuiltinBackend("b", BuiltinOptions(model=str(tmp_path))).served_model_name == tmp_path.name
    code = "import sys, plugins.builtin.backend; sys.exit('torch' in sys.modules or 'builtin_engine.engine' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[3]).returncode == 0


def test_engine_knows_every_protocol_sampling_field() -> None:
    import dataclasses

    from builtin_engine.scheduling.sampling_params import SamplingParams as EngineParams

    protocol = {f.name: f.default for f in msgspec.structs.fields(Sampling)}
    engine = {f.name: f.default for f in dataclasses.fields(EngineParams) if f.name != "grammar"}  # engine-only
    assert protocol == engine


def test_protocol_models_health_capabilities(backend: BuiltinBackend) -> None:
    assert isinstance(backend, Backend)
    assert run(backend.health())
    (info,) = run(backend.models())
    assert info.id == "tiny" and info.max_model_len == 2048
    caps = backend.capabilities()
    assert caps.reports_cached_tokens and caps.supports_logprobs and caps.max_model_len == 2048
    assert {"top_k", "min_p", "priority", "chat_template_kwargs", "stop_token_ids"} <= caps.extensions
    assert "structured_outputs" in caps.extensions and caps.supports_response_format and caps.supports_tools


def test_events_order_and_usage(backend: BuiltinBackend) -> None:
    request = spec(sampling=Sampling(n=2, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True))
    events = run(events_of(backend, request))
    assert isinstance(events[-1], Usage) and sum(isinstance(e, Usage) for e in events) == 1
    finishes = [e for e in events if isinstance(e, Finish)]
    assert sorted(f.index for f in finishes) == [0, 1] and all(f.reason == "length" for f in finishes)
    for index in (0, 1):
        mine = [e for e in events if getattr(e, "index", None) == index and not isinstance(e, Usage)]
        assert isinstance(mine[-1], Finish)  # nothing for a choice after its Finish
        deltas = [e for e in mine if isinstance(e, TextDelta)]
        assert deltas and all(d.text for d in deltas)
    usage = events[-1]
    tokenized = run(backend.tokenize(TokenizeRequest(upstream_model="tiny", messages=MESSAGES)))
    assert usage.prompt_tokens == len(tokenized.tokens)
    assert usage.completion_tokens == 12


def test_logprobs_ride_with_every_token(backend: BuiltinBackend) -> None:
    request = spec(sampling=Sampling(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=True,
                                           top_logprobs=2))
    events = run(events_of(backend, request))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    logprobs = [lp for d in deltas for lp in d.logprobs]
    assert len(logprobs) == 5 and all(len(lp.top_logprobs) == 2 for lp in logprobs)
    assert [t for d in deltas for t in d.token_ids] == [backend.tokenizer.token_to_id(lp.token) or t for d in deltas
                                                       for lp, t in zip(d.logprobs, d.token_ids)]
    assert all(lp.bytes is not None and lp.logprob <= 0 for lp in logprobs)
    greedy_top = [lp.top_logprobs[0].logprob for lp in logprobs]
    assert [lp.logprob for lp in logprobs] == pytest.approx(greedy_top)


def test_completion_prompt_echo_and_token_ids(backend: BuiltinBackend) -> None:
    request = spec(kind="completion", messages=None, prompt="Hello, world", echo=True,
                   sampling=Sampling(temperature=0.0, max_tokens=4, ignore_eos=True))
    events = run(events_of(backend, request))
    assert events[0] == TextDelta(text="Hello, world", index=0)
    usage = events[-1]
    assert usage.prompt_tokens == len(backend.tokenizer.encode("Hello, world", add_special_tokens=True))
    as_ids = spec(kind="completion", messages=None, prompt=backend.tokenizer.encode("Hello", add_special_tokens=True),
                  sampling=Sampling(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert run(events_of(backend, as_ids))[-1].completion_tokens == 3


def test_cancellation_frees_blocks(backend: BuiltinBackend) -> None:
    engine = backend.engine.llm_engine

    async def main() -> None:
        stream = backend.generate(spec(sampling=Sampling(temperature=0.0, max_tokens=1000, ignore_eos=True)))
        first = await stream.__anext__()
        assert isinstance(first, TextDelta)
        assert engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
        await stream.aclose()
        for _ in range(100):
            if engine.num_unfinished_requests == 0:
                break
            await asyncio.sleep(0.01)

    run(main())
    assert engine.num_unfinished_requests == 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_errors_before_scheduling(backend: BuiltinBackend) -> None:
    with pytest.raises(ContextLengthExceeded, match="2048") as info:
        run(events_of(backend, spec(sampling=Sampling(max_tokens=5000))))
    assert info.value.param == "max_tokens" and info.value.code == "context_length_exceeded"
    prompt = len(run(backend.tokenize(TokenizeRequest(upstream_model=spec().upstream_model, messages=MESSAGES))).tokens)
    assert (info.value.prompt_tokens, info.value.max_model_len, info.value.max_tokens) == (prompt, 2048, 5000)
    with pytest.raises(InvalidRequest) as info:
        run(events_of(backend, spec(chat_template="{% if %}")))
    assert info.value.param == "chat_template"
    with pytest.raises(InvalidRequest):
        run(events_of(backend, spec(chat_template="{{ raise_exception('no system messages') }}")))
    with pytest.raises(InvalidRequest):
        run(events_of(backend, spec(add_generation_prompt=True, continue_final_message=True)))
    with pytest.raises(ModelNotFound):
        run(events_of(backend, spec(upstream_model="other")))
    assert backend.engine.llm_engine.num_unfinished_requests == 0


def test_overloaded_when_the_queue_is_full(tiny_model_dir: Path) -> None:
    backend = make_backend(tiny_model_dir, served_model_name="tiny", max_num_seqs=1, max_waiting=1)
    try:
        async def main() -> None:
            long = Sampling(temperature=0.0, max_tokens=200, ignore_eos=True)
            running = backend.generate(spec(sampling=long))
            await running.__anext__()  # scheduled: it left the queue
            waiting = backend.generate(spec(sampling=long))
            waiting_task = asyncio.ensure_future(waiting.__anext__())
            await asyncio.sleep(0.05)
            with pytest.raises(Overloaded):
                await events_of(backend, spec())
            waiting_task.cancel()
            await running.aclose()
            await asyncio.gather(waiting_task, return_exceptions=True)
            await waiting.aclose()

        run(main())
    finally:
        run(backend.close())


def test_template_options_and_kwargs(backend: BuiltinBackend) -> None:
    template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}{% if shout %}!{% endif %}"
    a = run(backend.tokenize(TokenizeRequest(upstream_model="tiny", messages=MESSAGES, chat_template=template)))
    b = run(backend.tokenize(TokenizeRequest(upstream_model="tiny", messages=MESSAGES, chat_template=template,
                                             chat_template_kwargs={"shout": True}, return_token_strs=True)))
    text_a = run(backend.detokenize("tiny", a.tokens))
    assert text_a == "You are a concise assistant.|What is the capital of France?|"
    assert run(backend.detokenize("tiny", b.tokens)) == text_a + "!"
    assert b.token_strs is not None and len(b.token_strs) == len(b.tokens) and b.max_model_len == 2048
    plain = run(backend.tokenize(TokenizeRequest(upstream_model="tiny", prompt="Hello")))
    assert plain.tokens[0] == backend.tokenizer.bos_token_id
    no_special = run(backend.tokenize(TokenizeRequest(upstream_model="tiny", prompt="Hello", add_special_tokens=False)))
    assert no_special.tokens == plain.tokens[1:]
    # continue_final_message: the text ends right after the final message's content
    cont = run(backend.tokenize(TokenizeRequest(
        upstream_model="tiny", messages=[*MESSAGES, {"role": "assistant", "content": "The capital"}],
        add_generation_prompt=False, continue_final_message=True)))
    assert run(backend.detokenize("tiny", cont.tokens)).endswith("The capital")


@pytest.mark.slow
def test_default_model_answers_the_france_question(default_model_dir: Path) -> None:
    backend = make_backend(default_model_dir, served_model_name="smol")
    try:
        request = spec(model="smol", upstream_model="smol", sampling=Sampling(temperature=0.0, max_tokens=20))
        events = run(events_of(backend, request))
    finally:
        run(backend.close())
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "The capital of France is Paris."
    assert events[-2] == Finish(reason="stop", index=0)
    assert events[-1].prompt_tokens == 27 and events[-1].completion_tokens == 8
