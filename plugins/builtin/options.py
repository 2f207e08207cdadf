"""`[backends.options]` of a `type = "builtin"` backend: every key, its default and its check.
Validated once, when the configuration is read (`switchyard check-config` too); a CUDA device
this machine's torch does not see is refused here, naming `device`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from plugins.contract.system_turns import SystemMessages


def _doc(description: str, **constraints: Any) -> Any:
    return msgspec.Meta(description=description, **constraints)


_AtLeast1 = Annotated[int, msgspec.Meta(ge=1)]
_AtLeast2 = Annotated[int, msgspec.Meta(ge=2)]


class EmbeddingOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """`[backends.options.embeddings]` of a builtin backend."""

    pooling: Annotated[Literal["last", "mean", "cls"], msgspec.Meta(
        description="Which hidden states make a vector: the last token's (as vLLM for decoder models), the "
                    "mean over the input, or the first token's.")] = "last"
    normalize: Annotated[bool, msgspec.Meta(description="L2-normalize each vector.")] = True
    matryoshka_dimensions: Annotated[list[Annotated[int, msgspec.Meta(ge=1)]] | None, msgspec.Meta(
        description="The `dimensions` clients may ask for; default: from the checkpoint's config.json.")] = None


class BuiltinOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """`[backends.options]` of a `type = "builtin"` backend. Every key is optional."""

    model: Annotated[str, _doc("A known model name (fetched and converted once) or the path of an HF "
                               "checkpoint directory of the Llama family.")] = "smollm2-135m-instruct"
    served_model_name: Annotated[str | None, _doc("The name clients and routes use for the model; default: "
                                                  "`model`, or the directory's name when `model` is a path.")] = None
    device: Annotated[str, _doc(
        "Where the engine runs: 'auto' (the first CUDA GPU torch sees, else the CPU), 'cpu', 'cuda' or 'cuda:N'. "
        "A CUDA device torch does not see is a start-up error.", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$")] = "auto"
    dtype: Annotated[Literal["auto", "float32", "bfloat16"], _doc(
        "Precision of the weights, activations, KV cache and lm_head: 'auto' is bfloat16 on CUDA and float32 on "
        "the CPU (token-exact against transformers); 'bfloat16' on the CPU is the fast path.")] = "auto"
    compile: Annotated[bool | None, _doc(
        "Run steps as a prepared graph: on the CPU every step through one graph compiled by torch.compile "
        "(inductor; needs a C++ compiler; compiled while the backend starts, cached under "
        "~/.cache/switchyard/compile), on CUDA the decode step captured in CUDA graphs (needs triton). Default: on "
        "for bfloat16 on the CPU and on CUDA, off for float32 on the CPU, the reference path, which then starts "
        "in seconds; `true` keeps float32's tokens (transformers') and decodes ~10% faster, after a compile of "
        "about a minute per machine and configuration and ~10 s at each later start.")] = None
    matmul_dtype: Annotated[Literal["float32", "bfloat16"] | None, _doc(
        "Precision of the decoder layers' projection matmuls (q/k/v, o, MLP); default: dtype. 'bfloat16' with "
        "dtype 'float32' stores those matrices in bfloat16 and rounds their inputs and outputs to it, keeping "
        "norms, attention, the residual stream, the KV cache and the logits in float32: on CPUs with AMX the "
        "projections run about 2x faster at one decoding stream and 5x at 32, not token-exact against a float32 "
        "reference.")] = None
    max_model_len: Annotated[_AtLeast2 | None, _doc("Longest prompt + completion in tokens; default: the model's "
                                                    "max_position_embeddings, capped by kv_cache_tokens.")] = None
    max_num_seqs: Annotated[int, _doc("Most sequences batched in one engine step.", ge=1)] = 64
    max_num_batched_tokens: Annotated[_AtLeast1 | None, _doc(
        "Most tokens per engine step; longer prompts are prefilled in chunks between decode steps. Default: 256 "
        "on the CPU, 8192 on CUDA.")] = None
    block_size: Annotated[int, _doc("Tokens per KV cache block (the prefix cache's unit).", ge=1)] = 16
    kv_cache_tokens: Annotated[int, _doc("KV cache capacity in tokens over all sequences; when full, the "
                                         "latest lowest-priority sequence is preempted and recomputed later. "
                                         "Memory: 2 x layers x kv_heads x head_dim x dtype size per token.",
                                         ge=1)] = 16384
    max_waiting: Annotated[int, _doc("Requests that may wait for a batch slot; more are refused as overloaded.",
                                     ge=1)] = 256
    enable_prefix_caching: Annotated[bool, _doc("Reuse the KV cache of shared prompt prefixes (full blocks).")] = True
    chat_template: Annotated[str | None, _doc("Override of the model's chat template: the template text, a "
                                              "path to a template file, or a named template of the model.")] = None
    num_threads: Annotated[_AtLeast1 | None, _doc("torch CPU threads for the engine; default: torch's own "
                                                  "choice.")] = None
    logprobs_mode: Annotated[Literal["raw", "processed"], _doc(
        "Which distribution logprobs come from: 'raw' (the model's, before penalties, temperature and "
        "truncation; vLLM's default) or 'processed' (after penalties and temperature).")] = "raw"
    tool_parser: Annotated[Literal["auto", "hermes", "llama3_json", "none"], _doc(
        "How tool calls are read from the model's output under tool_choice 'auto': 'hermes' "
        "(<tool_call>{json}</tool_call>), 'llama3_json' (Llama 3.1 JSON calls), 'auto' (from the chat "
        "template's text), 'none' (requests with tools are refused).")] = "auto"
    embeddings: Annotated[EmbeddingOptions, _doc("How /v1/embeddings pools the model's hidden states "
                                                 "(see plugins.builtin.embeddings).")] = EmbeddingOptions()
    engine_process: Annotated[bool | None, _doc(
        "Run the engine in a process of its own, so that its step thread never shares the gateway's interpreter "
        "lock; default: only when the server runs several workers ([server] workers), where one engine process "
        "serves them all. false: in the gateway's process (with several workers, one engine in each).")] = None
    engine_address: Annotated[str | None, _doc(
        "Use the engine process already serving at this ZeroMQ address (ipc:// or tcp://) instead of starting "
        "one; the server sets it for its workers.")] = None
    engine_start_timeout_s: Annotated[float, _doc("How long start-up waits for the engine process to load and "
                                                  "answer.", gt=0)] = 600.0
    system_messages: Annotated[SystemMessages, _doc(
        "System messages after the first one (Claude Code's environment turn, right after the first user turn): "
        "'in_place' renders them where they stand, folded into the first only where the chat template refuses "
        "them there; 'fold' always folds them into the first, before the conversation (small models trained "
        "with one leading system message answer the last user turn instead of rambling on).")] = "in_place"
    reasoning_parser: Annotated[Literal["auto", "deepseek_r1", "none"], _doc(
        "How the model's thinking is split from its answer: 'deepseek_r1' (everything up to </think> is "
        "reasoning), 'auto' (the <think> tags, when the chat template writes them), 'none'.")] = "auto"


    def __post_init__(self) -> None:
        """A CUDA device this machine's torch does not see is an error here, so `check-config` and
        `serve` stop before anything starts (torch is imported only for such a device)."""
        if self.device.startswith("cuda"):
            from builtin_engine.runner.device import DeviceError, resolve_device

            try:
                resolve_device(self.device)
            except DeviceError as exc:
                raise ValueError(str(exc)) from None


def served_name(options: BuiltinOptions) -> str:
    if options.served_model_name:
        return options.served_model_name
    path = Path(options.model).expanduser()
    return path.resolve().name if path.is_dir() or "/" in options.model else options.model
