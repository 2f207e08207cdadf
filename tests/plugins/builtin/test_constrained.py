"""Constrained decoding in the built-in engine with the tiny random-weight model: whatever the
model writes must follow the grammar. Bulk runs are in process (one request with n=50 is 50
sequences batched together, each with its own seed and matcher);
tests/e2e/test_structured_builtin.py repeats a subset through the HTTP server with the `openai`
client."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

from builtin_engine.text.structured import GrammarCompiler, choice_ebnf, grammar_spec
from plugins.builtin.backend import BuiltinBackend
from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import Finish, Sampling, TextDelta
from tests.plugins.builtin.conftest import chat_spec, collect, run

N = 50
CHOICES = ["Paris", "Rome", "Hà Nội", 'say "hi"', "no\nway"]
REGEX = r"[A-Z][a-z]{2,8}-[0-9]{2,4}( (red|green|blue))?"

# Bounded where a random model would otherwise write forever (string lengths, list sizes,
# integer ranges); the grammar itself makes every one of these close.
PERSON = {  # nested objects, required and optional fields, integer range, boolean
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "geo": {"type": "object", "properties": {"lat": {"type": "integer", "minimum": -90, "maximum": 90}},
                        "required": ["lat"]},
            },
            "required": ["city", "zip", "geo"],
        },
        "verified": {"type": "boolean"},
    },
    "required": ["name", "age", "address"],
}
ORDER = {  # arrays of objects, enums, array bounds
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^ord-[0-9a-f]{6}$"},
        "items": {
            "type": "array", "minItems": 1, "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {"sku": {"enum": ["A-1", "B-2", "C-3"]},
                               "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                "required": ["sku", "qty"],
            },
        },
        "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 6}},
    },
    "required": ["id", "items"],
}
EVENT = {  # enums of mixed types, const, nullable, nested arrays
    "type": "object",
    "properties": {
        "kind": {"enum": ["click", "view", 3, None]},
        "version": {"const": 2},
        "user": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]},
        "matrix": {"type": "array", "maxItems": 2,
                   "items": {"type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}},
        "level": {"type": "string", "enum": ["debug", "info", "warn"]},
    },
    "required": ["kind", "version", "user", "level"],
}
SCHEMAS = {"person": PERSON, "order": ORDER, "event": EVENT}


def texts_and_finishes(backend: BuiltinBackend, n: int = N, max_tokens: int = 160, **fields: Any) -> list[tuple[str, str]]:
    spec = chat_spec(sampling=Sampling(n=n, temperature=1.0, seed=11, max_tokens=max_tokens), **fields)
    events = run(collect(backend, spec))
    texts = [""] * n
    finishes = [""] * n
    for e in events:
        if isinstance(e, TextDelta):
            texts[e.index] += e.text
        elif isinstance(e, Finish):
            finishes[e.index] = e.reason
    return list(zip(texts, finishes))


def test_choice(backend: BuiltinBackend) -> None:
    results = texts_and_finishes(backend, structured_outputs={"choice": CHOICES})
    assert all(text in CHOICES and reason == "stop" for text, reason in results), results
    assert len({text for text, _ in results}) > 1  # sampled, not stuck on one


def test_regex(backend: BuiltinBackend) -> None:
    results = texts_and_finishes(backend, structured_outputs={"regex": REGEX})
    assert all(re.fullmatch(REGEX, text) and reason == "stop" for text, reason in results), results


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema(backend: BuiltinBackend, name: str) -> None:
    schema = SCHEMAS[name]
    results = texts_and_finishes(backend, structured_outputs={"json": schema}, max_tokens=200)
    for text, reason in results:
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), schema)


def test_response_format_json_schema(backend: BuiltinBackend) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER, "strict": True}}
    for text, reason in texts_and_finishes(backend, n=20, max_tokens=200, response_format=rf):
        assert reason == "stop"
        jsonschema.validate(json.loads(text), ORDER)


def test_response_format_json_object(backend: BuiltinBackend) -> None:
    """Any JSON object: a random model may not close it within max_tokens, but what closes is
    an object, and what does not is cut where the budget ran out."""
    results = texts_and_finishes(backend, n=20, max_tokens=100, response_format={"type": "json_object"})
    closed = [text for text, reason in results if reason == "stop"]
    assert closed, results
    for text in closed:
        assert isinstance(json.loads(text), dict)
    assert all(text.startswith("{") for text, _ in results)


@pytest.mark.parametrize("grammar", [
    # GBNF (llama.cpp's dialect): rules, classes, repetition ranges
    'root ::= greeting " " name "!"\ngreeting ::= "Hello" | "Hi"\nname ::= [A-Z] [a-z]{1,6}',
    # EBNF with grouping and optional parts
    'root ::= ("yes" | "no") (", " reason)?\nreason ::= "because " word (" " word)? "."\nword ::= [a-z]{1,8}',
], ids=["gbnf", "ebnf"])
def test_grammar(backend: BuiltinBackend, grammar: str) -> None:
    pattern = {
        0: r"(Hello|Hi) [A-Z][a-z]{1,6}!",
        1: r"(yes|no)(, because [a-z]{1,8}( [a-z]{1,8})?\.)?",
    }["Hello" not in grammar]
    results = texts_and_finishes(backend, n=20, max_tokens=60, structured_outputs={"grammar": grammar})
    assert all(re.fullmatch(pattern, text) and reason == "stop" for text, reason in results), results


def test_completions_are_constrained_too(backend: BuiltinBackend) -> None:
    spec = chat_spec(kind="completion", messages=None, prompt="Answer:", structured_outputs={"choice": ["A", "B"]},
                     sampling=Sampling(n=8, temperature=1.0, seed=2, max_tokens=5))
    events = run(collect(backend, spec))
    texts = [""] * 8
    for e in events:
        if isinstance(e, TextDelta):
            texts[e.index] += e.text
    assert set(texts) <= {"A", "B"}


def test_min_tokens_and_stop_token_ids_with_a_grammar(backend: BuiltinBackend) -> None:
    # min_tokens longer than any choice: once the grammar may only end, it wins over the EOS ban
    spec = chat_spec(structured_outputs={"choice": ["ok", "fine"]},
                     sampling=Sampling(n=8, temperature=1.0, seed=5, max_tokens=20, min_tokens=10))
    events = run(collect(backend, spec))
    texts = [""] * 8
    for e in events:
        if isinstance(e, TextDelta):
            texts[e.index] += e.text
    assert set(texts) <= {"ok", "fine"}, texts
    assert {e.reason for e in events if isinstance(e, Finish)} == {"stop"}
    # a stop token id of the request ends the grammar too (it joins the model's EOS ids)
    spec = chat_spec(structured_outputs={"regex": "[a-z]{1,3}"}, sampling=Sampling(
        n=4, temperature=1.0, seed=5, max_tokens=20, stop_token_ids=(3,)))
    events = run(collect(backend, spec))
    assert {e.reason for e in events if isinstance(e, Finish)} == {"stop"}


def test_invalid_inputs_are_400_before_generation(backend: BuiltinBackend) -> None:
    cases = [
        ({"structured_outputs": {"json": {"type": "nonsense"}}}, "structured_outputs.json", 'Unsupported type "nonsense"'),
        ({"structured_outputs": {"json": {"type": "object", "properties": "oops"}}}, "structured_outputs.json",
         "properties must be an object"),
        ({"structured_outputs": {"json": '{"type": '}}, "structured_outputs.json", "not valid JSON"),
        ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex", "parenthesis is not closed"),
        ({"structured_outputs": {"regex": "(?=a)b"}}, "structured_outputs.regex", "Lookahead"),
        ({"structured_outputs": {"grammar": 'root ::= "a" |'}}, "structured_outputs.grammar", "line 1"),
        ({"structured_outputs": {"grammar": 'start ::= "a"'}}, "structured_outputs.grammar", '"root" is not found'),
        ({"structured_outputs": {"choice": ["a", "b"], "whitespace_pattern": " *"}},
         "structured_outputs.whitespace_pattern", "disable_any_whitespace"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                                                                            "required": "a"}}}},
         "response_format.json_schema.schema", "required must be an array"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strange"}}}],
          "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools[0].function.parameters", "strange"),
    ]
    before = backend.engine.llm_engine.num_steps if backend.engine is not None else 0
    for fields, param, words in cases:
        with pytest.raises(InvalidRequest) as info:
            run(collect(backend, chat_spec(**fields)))
        assert info.value.param == param, (fields, info.value.param)
        assert words in info.value.message, (fields, info.value.message)
    assert backend.engine is not None and backend.engine.llm_engine.num_steps == before  # nothing was scheduled


def test_compiled_grammars_are_cached(backend: BuiltinBackend) -> None:
    schema = {"type": "object", "properties": {"cached": {"type": "boolean"}}, "required": ["cached"]}
    run(collect(backend, chat_spec(structured_outputs={"json": schema})))
    compiler = backend.engine.grammar_compiler
    assert compiler is not None
    count = compiler.num_compiled
    for seed in range(3):
        spec = chat_spec(structured_outputs={"json": dict(schema)}, sampling=Sampling(seed=seed, max_tokens=20))
        run(collect(backend, spec))
    assert compiler.num_compiled == count


def test_lru_cache_and_spec_mapping(tiny_model_dir: Any) -> None:
    from builtin_engine.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    compiler = GrammarCompiler(tokenizer, vocab_size=tokenizer.vocab_size, stop_token_ids=tokenizer.eos_token_ids,
                               cache_size=2)
    specs = [grammar_spec({"choice": [str(i)]}, None) for i in range(3)]
    for spec in specs:
        compiler.compile(spec)
    assert compiler.cached(specs[0]) is None and compiler.cached(specs[2]) is not None
    grammar = compiler.compile(specs[2], stop_token_ids=[7])
    assert 7 in grammar.stop_token_ids and set(compiler.stop_token_ids) <= set(grammar.stop_token_ids)
    # response_format maps onto the same kinds as structured_outputs
    assert grammar_spec(None, {"type": "json_object"}).kind == "json_object"
    assert grammar_spec(None, {"type": "json_schema", "json_schema": {"name": "x"}}).kind == "json_object"
    assert grammar_spec(None, {"type": "text"}) is None
    assert grammar_spec({"json": {"a": 1}, "disable_any_whitespace": False}, None).any_whitespace
    assert choice_ebnf(['a"b', "c\\d"]) == 'root ::= "a\\"b" | "c\\\\d"'
