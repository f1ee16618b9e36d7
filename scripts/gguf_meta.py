"""GGUF metadata read and copied with gguf-py, shared by the scripts that write GGUFs derived from
another one (`random-gguf.py`, `oracle/pad_vocab.py`)."""

from __future__ import annotations

from typing import Callable

import gguf


def field_value(f):
    """A reader field's value: a string, a number, or a list of either."""
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


def copy_metadata(
    reader: gguf.GGUFReader,
    writer: gguf.GGUFWriter,
    edit: Callable[[str, object], object] = lambda name, value: value,
) -> set[str]:
    """Copies every key of `reader` but the header's and `general.architecture` (the writer's
    own) into `writer`, each with its own type, its value passed through `edit(name, value)`.
    Returns the names copied."""
    copied = set()
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vtype = f.types[0]
        value = edit(f.name, field_value(f))
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(f.name, value, vtype, sub_type=f.types[1])
        elif isinstance(value, list):
            raise ValueError(f"{f.name}: a list for a {vtype.name} key")
        else:
            writer.add_key_value(f.name, value, vtype)
        copied.add(f.name)
    return copied
