"""What chat completions and legacy completions do with each request field (`gateway.http.fields`):
the fields not listed here are acted on (some only for some values: `check_chat` and
`check_completion` refuse those with a 400 naming them, e.g. `modalities` with "audio", `best_of`
other than `n`)."""

from __future__ import annotations

from gateway.chat_api.schemas import ChatCompletionRequest, CompletionRequest
from gateway.http.fields import FieldTable

CACHE_HINT = "a hint for OpenAI's own prompt cache; the engines here cache prefixes by themselves"
NO_STORE = "nothing is stored for chat completions here (the Responses API stores)"

CHAT_FIELDS = FieldTable(
    api="chat",
    struct=ChatCompletionRequest,
    ignored={
        "store": NO_STORE,
        "metadata": NO_STORE,
        "prediction": "a latency hint (predicted outputs); the answer is the same without it",
        "reasoning_effort": "OpenAI's reasoning models' knob; `chat_template_kwargs.enable_thinking` switches a model's thinking",
        "verbosity": "OpenAI's reasoning models' knob; the engines here take no such setting",
        "service_tier": "OpenAI's processing tiers; every request here is served the same way",
        "web_search_options": "no engine here can search the web",
        "prompt_cache_retention": CACHE_HINT,
        "prompt_cache_options": CACHE_HINT,
        "safety_identifier": "an abuse-monitoring id for OpenAI; nothing here monitors",
    },
    refused={
        "moderation": "no moderation model runs here: the input and output would go unscored and unblocked",
        "functions": "the deprecated function calling; send `tools`",
        "function_call": "the deprecated function calling; send `tool_choice`",
        "audio": "no engine here speaks: audio output is not produced",
    },
)

COMPLETIONS_FIELDS = FieldTable(
    api="completions",
    struct=CompletionRequest,
    refused={"suffix": "no engine here fills in the middle: the text after the insertion point would be dropped"},
)
