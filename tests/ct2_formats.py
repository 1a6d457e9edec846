"""CTranslate2 model directories in the layouts its older releases wrote, made here from a
current one: what tests/test_importers.py imports and checks against CTranslate2 itself, which
still loads every one of them.

Binary version 1 stored no spec name or revision (a revision-1 model, OpenNMT-tf's variable
names, 8 heads), 2 added them, 3 aliases, 4 a type id per variable; before 6 the conventions
(tokens, source BOS/EOS, decoder start) were attributes in model.bin, not config.json. Spec
revisions before 3 stored no head count (the spec's name gave it), before 5 one flag for both
stacks.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np

from training.importers.ctranslate2 import GLOBAL_INT16_SCALE, ModelBin, read_model_bin

# Flags each stack stores since revision 5; before, one for both (from revision 3).
_STACK_FLAGS = ("num_heads", "pre_norm", "activation", "embeddings_merge", "alignment_layer",
                "alignment_heads")
_TYPE_IDS = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2,
             np.dtype(np.int32): 3, np.dtype(np.float16): 4}


def _tf_name(name: str) -> str:
    """A current variable name as revision 1 (OpenNMT-tf) spelled it."""
    decoder = name.startswith("decoder/")
    name = name.replace("embeddings_0/weight", "w_embs").replace("embeddings/weight", "w_embs")
    name = name.replace("projection", "dense").replace("layer_norm", "LayerNorm")
    if decoder:
        name = name.replace("self_attention", "masked_multi_head").replace(
            "/attention/", "/multi_head/")
    else:
        name = name.replace("self_attention", "multi_head")
    name = name.replace("linear_0", "conv1d").replace("linear_", "conv1d_")
    name = name.replace("weight", "kernel")
    return f"transformer/{name}:0"


def _attributes(config: dict) -> dict[str, np.ndarray]:
    """config.json's conventions as the attributes model.bin held before it."""
    def text(value: str) -> np.ndarray:
        return np.frombuffer(value.encode("utf-8"), np.int8)

    start = config.get("decoder_start_token")
    return {
        "unk_token": text(config.get("unk_token", "<unk>")),
        "bos_token": text(config.get("bos_token", "<s>")),
        "eos_token": text(config.get("eos_token", "</s>")),
        "with_source_bos": np.array(config.get("add_source_bos", False), np.int8),
        "with_source_eos": np.array(config.get("add_source_eos", False), np.int8),
        "with_target_bos": np.array(start == config.get("bos_token", "<s>"), np.int8),
    }


def write_model_bin(path: Path, model: ModelBin) -> None:
    """``model`` in its binary version's layout (the reverse of ``read_model_bin``)."""
    out = bytearray(struct.pack("<I", model.version))

    def string(value: str) -> None:
        out.extend(struct.pack("<H", len(value.encode()) + 1) + value.encode() + b"\0")

    if model.version >= 2:
        string(model.spec)
        out.extend(struct.pack("<I", model.revision))
    out.extend(struct.pack("<I", len(model.variables)))
    for name, value in model.variables.items():
        string(name)
        out.extend(struct.pack("<B", value.ndim))
        out.extend(struct.pack(f"<{value.ndim}I", *value.shape))
        if model.version >= 4:
            out.extend(struct.pack("<BI", _TYPE_IDS[value.dtype], value.nbytes))
        else:
            out.extend(struct.pack("<BI", value.itemsize, value.size))
        out.extend(value.tobytes())
    if model.version >= 3:
        out.extend(struct.pack("<I", len(model.aliases)))
        for alias, target in model.aliases.items():
            string(alias)
            string(target)
    path.write_bytes(bytes(out))


def older_layout(current: Path, out: Path, version: int, revision: int,
                 spec: str = "TransformerSpec", int16_without_scales: bool = False) -> Path:
    """The float32 model in ``current`` (a directory ``spec.save`` wrote) rewritten as binary
    ``version`` and spec ``revision`` store it; ``int16_without_scales`` stores its weights as
    the releases before per-layer scales did."""
    stored = read_model_bin(current / "model.bin")
    config = json.loads((current / "config.json").read_text())
    variables, aliases = dict(stored.variables), {}
    for alias, target in stored.aliases.items():
        # No aliases before version 3: each name holds its own copy. Scalars are copied in
        # every version, since the flags they may share a value with are moved below.
        if version < 3 or variables[target].ndim == 0:
            variables[alias] = variables[target]
        else:
            aliases[alias] = target
    if revision < 5:
        for scope in ("encoder", "decoder"):
            for flag in _STACK_FLAGS:
                value = variables.pop(f"{scope}/{flag}", None)
                aliases.pop(f"{scope}/{flag}", None)
                if revision >= 3 and value is not None:
                    variables.setdefault(flag, value)
    if revision < 3:  # the head count came from the spec's name
        variables.pop("num_heads", None)
        for name in [n for n in variables if n.endswith(("scale_embeddings",
                                                          "start_from_zero_embedding"))]:
            del variables[name]
    if revision == 1:
        variables = {_tf_name(name): value for name, value in variables.items()}
    if int16_without_scales:
        for name, value in list(variables.items()):
            if value.ndim == 2 and value.dtype == np.float32 and name.endswith(
                    ("weight", "kernel:0")):
                variables[name] = np.round(value * GLOBAL_INT16_SCALE).astype(np.int16)
    out.mkdir(parents=True)
    if version < 6:
        variables.update(_attributes(config))
    else:
        (out / "config.json").write_text(json.dumps(config))
    write_model_bin(out / "model.bin", ModelBin(version, spec, revision, variables, aliases))
    for file in current.iterdir():
        if file.name not in ("model.bin", "config.json"):
            shutil.copy(file, out / file.name)
    return out
