#!/usr/bin/env python3
"""Write a tensor-less GGUF holding only a model's tokenizer (tokenizer.* keys): a few MB that
`hayai serve --tokenizer FILE` can use next to a synthetic checkpoint with the same vocabulary.
Usage: extract-tokenizer-gguf.py MODEL.gguf OUT.gguf   (needs `pip install gguf`)"""
import sys

from gguf import GGUFReader, GGUFWriter, GGUFValueType

src, dst = sys.argv[1], sys.argv[2]
r = GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = GGUFWriter(dst, arch)
for name, f in r.fields.items():
    if not name.startswith("tokenizer."):
        continue
    t = f.types[0]
    if t == GGUFValueType.ARRAY:
        w.add_array(name, f.contents())
    elif t == GGUFValueType.STRING:
        w.add_string(name, f.contents())
    elif t == GGUFValueType.BOOL:
        w.add_bool(name, f.contents())
    elif t == GGUFValueType.UINT32:
        w.add_uint32(name, f.contents())
    elif t == GGUFValueType.INT32:
        w.add_int32(name, f.contents())
    elif t == GGUFValueType.FLOAT32:
        w.add_float32(name, f.contents())
    else:
        raise SystemExit(f"unhandled type {t} for {name}")
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
