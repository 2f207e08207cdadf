"""What constrains the built-in backend's output: a request's tools (`ToolPlan`: how calls are
read from the output or forced by a grammar) and structured outputs (`output_grammar`), and the
events a choice's output makes once read through a tool parser (`tool_events`) and its
`Finish` (`finish_of`, which carries the stop string for Anthropic's `stop_sequence`).

The grammars are `GrammarSpec`s; the engine compiles them (`builtin_engine.process.service`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from plugins.contract.errors import InvalidRequest
from plugins.contract.protocol import Event, Finish, FinishReason, RequestSpec, TextDelta, TokenLogprob, ToolCallDelta

if TYPE_CHECKING:
    from builtin_engine.outputs import ChoiceOutput
    from builtin_engine.text.grammar import GrammarSpec
    from plugins.parsers.tools import ToolParser


def output_grammar(spec: RequestSpec, tools: ToolPlan | None) -> GrammarSpec | None:
    """What the request's output must follow (a tool plan's grammar, or structured outputs);
    None: unconstrained. The engine compiles it."""
    from builtin_engine.text.grammar import grammar_spec

    gspec = tools.grammar_spec() if tools is not None and tools.mode != "auto" else None
    return gspec if gspec is not None else grammar_spec(spec.structured_outputs, spec.response_format)


class ToolPlan:
    """How a chat request with tools is served: "auto" (the model may call; its output is read
    by the named parser), "required" (a grammar forces a list of calls), or "named" (a grammar
    forces the arguments of `function`). None when the request has no tools or tool_choice
    "none" (the tools still reach the template; the output is plain content)."""

    def __init__(self, mode: Literal["auto", "required", "named"], tools: list[dict[str, Any]], *,
                 parser: str = "hermes", function: str | None = None, parallel: bool = True) -> None:
        self.mode = mode
        self.tools = tools
        self.parser = parser
        self.function = function
        self.parallel = parallel

    @classmethod
    def of(cls, spec: RequestSpec, parser: str) -> ToolPlan | None:
        choice = spec.tool_choice
        if spec.kind != "chat" or not spec.tools or choice == "none":
            return None
        parallel = spec.parallel_tool_calls is not False
        if isinstance(choice, dict):
            return cls("named", spec.tools, function=(choice.get("function") or {}).get("name"), parallel=parallel)
        if choice == "required":
            return cls("required", spec.tools, parallel=parallel)
        if parser == "none":
            raise InvalidRequest("This backend reads no tool calls (`tool_parser = \"none\"`).", param="tools")
        return cls("auto", spec.tools, parser=parser, parallel=parallel)

    def grammar_spec(self) -> GrammarSpec | None:
        from builtin_engine.text.grammar import json_schema_spec
        from plugins.parsers.tools import required_calls_schema, tool_parameters

        if self.mode == "named":
            for i, tool in enumerate(self.tools):
                if (tool.get("function") or {}).get("name") == self.function:
                    return json_schema_spec(tool_parameters(tool), param=f"tools[{i}].function.parameters")
            raise InvalidRequest(f"`tool_choice` names function {self.function!r}, which is not in `tools`.",
                                 param="tool_choice")
        if self.mode == "required":
            return json_schema_spec(required_calls_schema(self.tools, parallel=self.parallel), param="tools")
        return None

    def new_parser(self) -> ToolParser:
        from plugins.parsers.tools import NamedCallParser, RequiredCallsParser, make_parser

        if self.mode == "named":
            assert self.function is not None
            return NamedCallParser(self.function)
        if self.mode == "required":
            return RequiredCallsParser()
        return make_parser(self.parser)


def tool_events(choice: ChoiceOutput, token_ids: list[int], logprobs: list[TokenLogprob] | None,
                parser: ToolParser) -> list[Event]:
    """The choice's news read through its tool parser: content as TextDeltas (with the
    token ids not sent yet, `token_ids`, which it empties, and the logprobs), calls as
    ToolCallDeltas, and its Finish."""
    from plugins.parsers.tools import ToolCallPiece

    pieces = parser.feed(choice.text) if choice.text else []
    if choice.finish_reason is not None:
        pieces += parser.finish()
    events: list[Event] = []
    content: list[str] = []

    def flush_content() -> None:
        nonlocal logprobs
        if content or logprobs:
            events.append(TextDelta(text="".join(content), index=choice.index, token_ids=tuple(token_ids),
                                    logprobs=logprobs))
            content.clear()
            token_ids.clear()
            logprobs = None

    for piece in pieces:
        if isinstance(piece, ToolCallPiece):
            flush_content()
            token_ids.clear()  # a call's tokens are no content
            events.append(ToolCallDelta(tool_index=piece.tool_index, arguments=piece.arguments, id=piece.id,
                                        name=piece.name, index=choice.index))
        else:
            content.append(piece)
    flush_content()
    if choice.finish_reason is not None:
        reason = choice.finish_reason
        if reason == "stop" and parser.num_calls and parser.calls_finish_as_tool_calls:
            reason = "tool_calls"
        events.append(finish_of(choice, reason))
    return events


def finish_of(choice: ChoiceOutput, reason: FinishReason) -> Finish:
    """The choice's Finish, with the stop string that ended it (a stop token id is none)."""
    stop = choice.stop_reason
    return Finish(reason=reason, index=choice.index, stop_sequence=stop if isinstance(stop, str) else None)
