"""LoRA adapters for llama.cpp: a peft adapter (trained on transformers) written as the GGUF adapter file that
llama.cpp applies to its base GGUF at run time, so a tuned model decodes at llama.cpp's speed without a merged
copy of its weights.

llama.cpp reads an adapter as, for each adapted weight ``W`` (GGUF name ``blk.N.attn_q.weight`` …), the pair
``<name>.lora_a`` (peft's ``lora_A``, rank × inputs) and ``<name>.lora_b`` (``lora_B``, outputs × rank), and
adds ``alpha / rank · B·A·x``, as peft does. GGUF files of the llama architecture store the query and key
weights with their rows reordered for llama.cpp's rotary layout (transformers undoes that when it loads the
GGUF), so the rows of those ``lora_B`` are reordered the same way. Only that architecture is written (the
embedded SmolLM2 is one); another may lay its weights out otherwise, so it is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import BackendError, MissingDependency, UserError

#: the architectures whose adapters this module writes
ARCHITECTURES = ("llama",)
#: a tuned model's folder holds its record, the merged model (``model/``) and, for a GGUF base, this adapter
TUNED_RECORD = "tuning.json"
ADAPTER_FILE = "adapter.gguf"
GGUF_INSTALL = "pip install 'marginalia[hf]'"  # the gguf package comes with the hf extra


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError as exc:
        raise MissingDependency("writing a llama.cpp adapter (the gguf package)", GGUF_INSTALL) from exc
    return gguf


def base_layout(base: str | Path) -> dict[str, Any]:
    """The base GGUF's architecture, layer count and head counts (what naming and reordering need).

    Raises:
        UserError: the file is missing or not a GGUF model.
    """
    gguf = _import_gguf()
    path = Path(base).expanduser()
    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the base model {path} as GGUF: {exc}") from exc

    def field(key: str) -> Any:
        found = reader.fields.get(key)
        if found is None:
            raise UserError(f"{path} has no {key!r}: not a GGUF model llama.cpp can adapt")
        return found.contents()

    arch = str(field("general.architecture"))
    return {"arch": arch, "layers": int(field(f"{arch}.block_count")),
            "heads": int(field(f"{arch}.attention.head_count")),
            "kv_heads": int(field(f"{arch}.attention.head_count_kv"))}


def _rotary_rows(weight: Any, heads: int) -> Any:
    """``weight`` (outputs × rank) with its rows in llama.cpp's order: within each head, the first and second
    halves of the head's rows interleaved (the order llama.cpp's GGUF conversion gives the query and key)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_lora_gguf(adapter_dir: str | Path, base: str | Path, out: str | Path) -> Path:
    """Write the peft adapter in ``adapter_dir`` (``adapter_config.json``, ``adapter_model.safetensors``) as a
    llama.cpp adapter for the base GGUF ``base``, into ``out``.

    Raises:
        UserError: the adapter or base is missing or of a kind this does not write (an architecture other
            than llama's, adapters on layers other than the blocks' linear ones).
        MissingDependency: the gguf or safetensors package is missing.
    """
    gguf = _import_gguf()
    try:
        from safetensors.numpy import load_file
    except ImportError as exc:
        raise MissingDependency("reading a peft adapter (safetensors)", GGUF_INSTALL) from exc
    folder, out = Path(adapter_dir).expanduser(), Path(out).expanduser()
    try:
        config = json.loads((folder / "adapter_config.json").read_text("utf-8"))
        tensors = load_file(str(folder / "adapter_model.safetensors"))
    except (OSError, ValueError) as exc:
        raise UserError(f"no peft LoRA adapter in {folder}: {exc}") from exc
    layout = base_layout(base)
    if layout["arch"] not in ARCHITECTURES:
        raise UserError(f"llama.cpp adapters are written for {', '.join(ARCHITECTURES)} models; {base} is "
                        f"{layout['arch']!r}: run the tuned model on transformers (its merged folder)")
    arch = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}[layout["arch"]]
    names = gguf.get_tensor_name_map(arch, layout["layers"])
    writer = gguf.GGUFWriter(str(out), layout["arch"])
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(config.get("lora_alpha", config.get("r", 8))))
    pairs = 0
    for key in sorted(tensors):
        if ".lora_A." not in key:
            continue
        hf_name = key.replace("base_model.model.", "", 1).replace(".lora_A.weight", ".weight")
        name = names.get_name(hf_name, try_suffixes=(".weight",))
        b_key = key.replace(".lora_A.", ".lora_B.")
        if name is None or b_key not in tensors or not name.startswith("blk."):
            raise UserError(f"the adapter's {key!r} has no llama.cpp counterpart; adapt only the blocks' "
                            "linear layers (q_proj ... down_proj)")
        a, b = tensors[key].astype("float32"), tensors[b_key].astype("float32")
        if name.endswith("attn_q.weight"):
            b = _rotary_rows(b, layout["heads"])
        elif name.endswith("attn_k.weight"):
            b = _rotary_rows(b, layout["kv_heads"])
        writer.add_tensor(f"{name}.lora_a", a)
        writer.add_tensor(f"{name}.lora_b", b)
        pairs += 1
    if not pairs:
        raise UserError(f"the adapter in {folder} holds no LoRA weights")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    except OSError as exc:
        raise BackendError(f"could not write the llama.cpp adapter {out}: {exc}") from exc
    finally:
        writer.close()
    return out
