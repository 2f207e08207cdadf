"""Claude Code's billing line out of the system prompt: the recorded requests lose exactly that
line, two prompts that differ only in it become one, the rest stays byte for byte."""

from __future__ import annotations

from typing import Any

from gateway.http.billing_header import strip_billing_header, strip_billing_lines, without_billing_lines
from plugins.contract.protocol import RequestSpec, Sampling
from tests.support import agent_recordings

LINE_2_1_332 = "x-anthropic-billing-header: cc_version=2.1.332.b81; cc_entrypoint=sdk-cli;"
LINE_CCH = "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli; cch=36ee5;"


def test_the_recorded_first_system_block_is_the_billing_line_and_goes() -> None:
    requests = agent_recordings.api_requests("claude")
    assert requests
    for request in requests:
        first, *rest = request.body["system"]
        assert first["text"].startswith("x-anthropic-billing-header: cc_version=2.1.332.")
        joined = "\n".join(block["text"] for block in request.body["system"])  # as the Messages front-end joins them
        assert strip_billing_header(joined) == "\n".join(block["text"] for block in rest)
        assert strip_billing_header(first["text"]) == ""


def test_two_system_prompts_differing_only_in_the_line_become_one() -> None:
    system = "You are a Claude agent.\n\nBe terse."
    a = strip_billing_header(f"{LINE_2_1_332}\n{system}")
    b = strip_billing_header(f"{LINE_CCH}\n{system}")
    c = strip_billing_header(f"{LINE_CCH.replace('36ee5', '0aaa9')}\n{system}")
    assert a == b == c == system


def test_only_whole_lines_that_start_with_the_header_go() -> None:
    text = f"Keep this.\n{LINE_CCH}\nAnd this: mention x-anthropic-billing-header: inline.\n  {LINE_CCH}\n"
    assert strip_billing_header(text) == f"Keep this.\nAnd this: mention x-anthropic-billing-header: inline.\n  {LINE_CCH}\n"
    assert strip_billing_header("no header at all") == "no header at all"
    assert strip_billing_header("X-Anthropic-Billing-Header: other case") == "X-Anthropic-Billing-Header: other case"


def messages() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": f"{LINE_CCH}\nYou are a Claude agent."},
        {"role": "user", "content": f"{LINE_CCH}\nA user's text is theirs."},
        {"role": "system", "content": [{"type": "text", "text": LINE_CCH}, {"type": "text", "text": "Environment: linux"}]},
        {"role": "developer", "content": LINE_CCH},
        {"role": "assistant", "content": ""},
    ]


def test_system_and_developer_messages_lose_it_user_text_keeps_it() -> None:
    original = messages()
    stripped = strip_billing_lines(original)
    assert stripped == [
        {"role": "system", "content": "You are a Claude agent."},
        {"role": "user", "content": f"{LINE_CCH}\nA user's text is theirs."},
        {"role": "system", "content": [{"type": "text", "text": "Environment: linux"}]},
        # the developer message held nothing else: gone; the assistant's empty content stays
        {"role": "assistant", "content": ""},
    ]
    assert original == messages()  # the request's own messages are not changed
    assert strip_billing_lines([{"role": "system", "content": "plain"}, {"role": "user", "content": "hi"}]) is None


def test_a_spec_without_the_line_is_not_copied() -> None:
    plain = RequestSpec(request_id="r", kind="chat", model="m", upstream_model="m", sampling=Sampling(),
                        messages=[{"role": "system", "content": "plain"}])
    assert without_billing_lines(plain) is plain
    prompt = RequestSpec(request_id="r", kind="completion", model="m", upstream_model="m", sampling=Sampling(), prompt=LINE_CCH)
    assert without_billing_lines(prompt) is prompt  # a raw completion prompt is the client's own text
