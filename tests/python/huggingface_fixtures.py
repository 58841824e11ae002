"""Hugging Face's files for dettrial's readers, written by Hugging Face's own code.

  huggingface_fixtures.py OUT           writes the fixtures into OUT (a CTest fixture)
  huggingface_fixtures.py --check FILE  reads FILE with safetensors.torch.load_file and checks the
                                        tensors and metadata dettrial's test wrote it with

OUT/dtypes.safetensors: one tensor per dtype this torch and safetensors share, each
torch.arange(n) of its shape cast to the dtype (booleans: odd elements), with metadata; the same
list in OUT/manifest.json (name, safetensors dtype, shape, the values as numbers, the metadata).
OUT/common.safetensors: the same with only the dtypes every LibTorch dettrial builds with has
(not U16, U32, U64 and the 8-bit floats, which LibTorch 1.13 lacks). Complex values are compared
by their real parts (arange's imaginary parts are zero).
OUT/empty.safetensors: no tensors. OUT/python.txt: this Python, for the --check half.
OUT/gpt2/: transformers' GPT2LMHeadModel of a small GPT2Config, randomly initialised after
torch.manual_seed(0) (nothing is downloaded), as save_pretrained writes it (config.json,
model.safetensors); OUT/gpt2-bin/: the same config with pytorch_model.bin, torch.save of its
state_dict as transformers 4's save_pretrained wrote it (transformers 5 writes safetensors only);
OUT/gpt2-logits.safetensors: token ids and the logits the model computes on them (eval mode).

  huggingface_fixtures.py --check-gpt2 DIR LOGITS   GPT2LMHeadModel.from_pretrained(DIR) computes
                                                    LOGITS's logits on its ids
Exits 77 (skipped) without safetensors or torch.
"""
import json
import sys

try:
    import torch
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"skipped: {e} (PyPI's safetensors and torch: scripts/test installs them)")
    sys.exit(77)

# safetensors' names of the torch dtypes, where this torch has them.
DTYPES = [("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"), ("I16", "int16"), ("U16", "uint16"),
          ("F16", "float16"), ("BF16", "bfloat16"), ("I32", "int32"), ("U32", "uint32"),
          ("F32", "float32"), ("F64", "float64"), ("I64", "int64"), ("U64", "uint64"),
          ("F8_E5M2", "float8_e5m2"), ("F8_E4M3", "float8_e4m3fn"), ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
          ("F8_E5M2FNUZ", "float8_e5m2fnuz"), ("C64", "complex64")]
SHAPES = [[2, 3], [5], [1, 2, 2], [], [0, 4], [3, 1]]
METADATA = {"format": "pt", "written by": "huggingface_fixtures.py", "text": "Grüße, 世界"}


NEWER = {"U16", "U32", "U64", "F8_E5M2", "F8_E4M3", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}


def expected_tensors(common_only=False):
    tensors, manifest = {}, []
    for i, (st_name, torch_name) in enumerate(DTYPES):
        dtype = getattr(torch, torch_name, None)
        if dtype is None or (common_only and st_name in NEWER):
            continue
        shape = SHAPES[i % len(SHAPES)]
        count = 1
        for s in shape:
            count *= s
        values = torch.arange(count, dtype=torch.float64).reshape(shape)
        t = (values.long() % 2 == 1) if dtype == torch.bool else values.to(dtype)
        name = f"layer.{i}.{torch_name}"
        tensors[name] = t
        manifest.append({"name": name, "dtype": st_name, "shape": shape,
                         "values": [float(v) for v in (t.real if t.is_complex() else t).to(torch.float64).flatten().tolist()]})
    return tensors, manifest


def write(out):
    import os
    os.makedirs(out, exist_ok=True)
    tensors, manifest = expected_tensors()
    save_file(tensors, os.path.join(out, "dtypes.safetensors"), metadata=METADATA)
    common, common_manifest = expected_tensors(common_only=True)
    save_file(common, os.path.join(out, "common.safetensors"), metadata=METADATA)
    save_file({}, os.path.join(out, "empty.safetensors"))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"tensors": manifest, "common": [t["name"] for t in common_manifest], "metadata": METADATA}, f)
    with open(os.path.join(out, "python.txt"), "w") as f:
        f.write(sys.executable)
    write_gpt2(out)
    print(f"ok: safetensors {__import__('safetensors').__version__} wrote {len(manifest)} dtypes with torch {torch.__version__}")


def write_gpt2(out):
    import os
    import shutil
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        print("note: no transformers: the GPT-2 fixtures are not written")
        return
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=84, bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(os.path.join(out, "gpt2"))
    os.makedirs(os.path.join(out, "gpt2-bin"), exist_ok=True)
    shutil.copy(os.path.join(out, "gpt2", "config.json"), os.path.join(out, "gpt2-bin", "config.json"))
    torch.save(model.state_dict(), os.path.join(out, "gpt2-bin", "pytorch_model.bin"))
    ids = torch.randint(0, 84, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits
    save_file({"ids": ids, "logits": logits.contiguous()}, os.path.join(out, "gpt2-logits.safetensors"))


def check_gpt2(directory, logits_path):
    """What dettrial wrote as a transformers directory: from_pretrained loads it, and computes
    dettrial's logits on the same ids."""
    from transformers import GPT2LMHeadModel
    expected = load_file(logits_path)
    model = GPT2LMHeadModel.from_pretrained(directory).eval()
    with torch.no_grad():
        logits = model(expected["ids"]).logits
    difference = (logits - expected["logits"]).abs().max().item()
    scale = expected["logits"].abs().max().item()
    if not torch.allclose(logits, expected["logits"], rtol=1e-4, atol=1e-5):
        print(f"GPT2LMHeadModel.from_pretrained({directory}) computes other logits: largest difference {difference} of {scale}")
        sys.exit(1)
    print(f"ok: transformers loads dettrial's GPT-2 directory and computes its logits (largest difference {difference:.2e} of {scale:.2f})")


def check(path, manifest_path):
    """What dettrial wrote: the manifest's tensors and metadata, read by Hugging Face's reader."""
    from safetensors import safe_open
    with open(manifest_path) as f:
        manifest = json.load(f)
    tensors = load_file(path)
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
    problems = []
    if metadata != manifest["metadata"]:
        problems.append(f"metadata {metadata} != {manifest['metadata']}")
    names = {t["name"] for t in manifest["tensors"]}
    if set(tensors) != names:
        problems.append(f"names {sorted(tensors)} != {sorted(names)}")
    by_name = dict(DTYPES)
    for t in manifest["tensors"]:
        got = tensors.get(t["name"])
        if got is None:
            continue
        if str(got.dtype) != "torch." + by_name[t["dtype"]] or list(got.shape) != t["shape"]:
            problems.append(f"{t['name']}: {got.dtype} {list(got.shape)}, expected {t['dtype']} {t['shape']}")
        elif [float(v) for v in (got.real if got.is_complex() else got).to(torch.float64).flatten().tolist()] != t["values"]:
            problems.append(f"{t['name']}: values differ")
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(f"ok: safetensors.torch.load_file read {len(tensors)} tensors and the metadata dettrial wrote")


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        check(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "--check-gpt2":
        check_gpt2(sys.argv[2], sys.argv[3])
    else:
        write(sys.argv[1])
