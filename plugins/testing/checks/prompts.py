"""The prompts the checks send, and the one reference answer several checks compare with."""

from __future__ import annotations

import string

from plugins.testing.probe import Probe
from plugins.testing.trace import Trace

STORY = "Write a short story about a train that crosses the mountains at night."
SHORT = "Is the sky blue? Answer with one word."
REFERENCE_TOKENS = 24

# one topic per concurrent request, so that each answer is its own
TOPICS = (
    "apple", "river", "train", "violin", "desert", "rocket", "garden", "castle", "penguin", "volcano", "library",
    "bicycle", "ocean", "mountain", "coffee", "dragon", "winter", "robot", "island", "forest", "camera", "pirate",
    "thunder", "honey", "glacier", "lantern", "tiger", "satellite", "bakery", "compass", "harbor", "meadow",
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


async def reference(probe: Probe) -> Trace:
    """STORY at temperature 0, streamed, `REFERENCE_TOKENS` tokens: the text the stop-string,
    stream and top_k checks compare with (sent once)."""

    async def send() -> Trace:
        spec = probe.chat(STORY, max_tokens=REFERENCE_TOKENS, stream=True)
        return (await probe.run(spec, "reference: chat, temperature 0, stream")).ok()

    return await probe.memo("reference", send)


def pick_stop(text: str) -> str | None:
    """A word of `text` that first occurs a third of the way in or later (so the text before it
    is not empty), whole and without punctuation; None when the text is too short."""
    for word in text.split():
        word = word.strip(string.punctuation + "“”‘’")
        at = text.find(word)
        if len(word) >= 3 and at >= max(1, len(text) // 3):
            return word
    return None
