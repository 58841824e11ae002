"""Writes image files with PIL and records what PIL and torchvision make of them, for dettrial's
vision tests: the real decoders' and transforms' outputs that dettrial's must match.

  OUT/images/*.png|*.jpg        files in every colour type PIL writes (gray, gray+alpha, RGB, RGBA,
                                palette, palette with transparency, 1-bit; baseline, 4:4:4 and
                                progressive JPEG, gray JPEG, CMYK JPEG by PIL, YCCK JPEG by
                                libjpeg-turbo; lossy and lossless WebP, with and without alpha)
  OUT/pil/<file>.<mode>.raw     PIL's Image.open(file).convert(mode) pixels (H x W x C bytes)
  OUT/tv/<file>.<path>.raw      torchvision's Resize(20), CenterCrop(16), ToDtype/ToTensor, Normalize
                                output (float32, C x H x W) on the tensor path (v2 on
                                pil_to_tensor) and on the PIL path (v1 on the PIL image)
  OUT/windows/*.jpg|*.png       larger files of ImageNet's sizes, to decode windows of
  OUT/folder/                   an ImageFolder tree with nested folders, links and odd names
  OUT/manifest.json             the list, the shapes, torchvision's ImageFolder samples of the tree,
                                or why torchvision is absent
Usage: vision_fixtures.py OUT
"""
import json
import os
import shutil
import sys

try:
    import numpy as np
    from PIL import Image
except ImportError as missing:  # reported as skipped (77), with the reason
    print(f"skipped: this Python has no {missing.name} (Debian: python3-pil, python3-numpy)")
    sys.exit(77)

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def pattern(height, width, channels, seed):
    """Smooth gradients with noise: a JPEG of it has real detail, a PNG every byte value."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    planes = [((x * (3 + c) + y * (5 - c)) * 255 // (height + width) + rng.integers(0, 40, (height, width))) % 256 for c in range(channels)]
    return np.stack(planes, -1).astype(np.uint8)


def write_images(out):
    os.makedirs(out, exist_ok=True)
    files = {}
    rgb = pattern(29, 37, 3, 1)
    rgba = np.concatenate([rgb, pattern(29, 37, 1, 2)], -1)
    gray = pattern(31, 23, 1, 3)[..., 0]
    Image.fromarray(gray, "L").save(f"{out}/gray.png"); files["gray.png"] = "L"
    Image.fromarray(np.stack([gray, gray[::-1]], -1), "LA").save(f"{out}/gray_alpha.png")
    Image.fromarray(rgb, "RGB").save(f"{out}/rgb.png")
    Image.fromarray(rgba, "RGBA").save(f"{out}/rgba.png")
    Image.fromarray(rgb, "RGB").quantize(37).save(f"{out}/palette.png")
    with_trns = Image.fromarray(rgb, "RGB").quantize(16)
    with_trns.info["transparency"] = 3
    with_trns.save(f"{out}/palette_trns.png", transparency=3)
    Image.fromarray(gray, "L").convert("1").save(f"{out}/bits1.png")
    Image.fromarray(rgb, "RGB").save(f"{out}/rgb.jpg", quality=85)
    Image.fromarray(rgb, "RGB").save(f"{out}/rgb444.jpg", quality=92, subsampling=0)
    Image.fromarray(pattern(40, 52, 3, 4), "RGB").save(f"{out}/progressive.jpg", quality=80, progressive=True)
    Image.fromarray(gray, "L").save(f"{out}/gray.jpg", quality=90)
    # CMYK as ImageNet holds it: PIL writes Adobe's inverted samples; libjpeg-turbo's encoder a YCCK file.
    cmyk = pattern(33, 41, 4, 5)
    Image.fromarray(cmyk, "CMYK").save(f"{out}/cmyk.jpg", quality=90)
    write_ycck(f"{out}/ycck.jpg", pattern(26, 35, 4, 6))
    # WebP as libwebp writes it: lossy and lossless, with and without alpha.
    Image.fromarray(rgb, "RGB").save(f"{out}/lossy.webp", quality=80)
    Image.fromarray(rgba, "RGBA").save(f"{out}/lossy_alpha.webp", quality=75)
    Image.fromarray(rgb, "RGB").save(f"{out}/lossless.webp", lossless=True)
    Image.fromarray(rgba, "RGBA").save(f"{out}/lossless_alpha.webp", lossless=True)
    return sorted(os.listdir(out))


def write_ycck(path, cmyk):
    """A YCCK JPEG, as Photoshop saves CMYK, by libjpeg-turbo's TurboJPEG (PIL writes none): its
    compressor turns CMYK samples into YCCK. Left out where no libturbojpeg loads."""
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
    try:
        tj = ctypes.CDLL(name)
    except OSError:
        print(f"note: no libturbojpeg ({name}) here: no YCCK file written")
        return
    tj.tjInitCompress.restype = ctypes.c_void_p
    handle = tj.tjInitCompress()
    height, width = cmyk.shape[:2]
    data = np.ascontiguousarray(cmyk)
    buffer, size = ctypes.POINTER(ctypes.c_ubyte)(), ctypes.c_ulong(0)
    TJPF_CMYK, TJSAMP_420 = 11, 2
    status = tj.tjCompress2(ctypes.c_void_p(handle), data.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)), width, 0, height, TJPF_CMYK,
                            ctypes.byref(buffer), ctypes.byref(size), TJSAMP_420, 90, 0)
    if status != 0:
        raise RuntimeError("libturbojpeg could not write the YCCK file")
    with open(path, "wb") as f:
        f.write(ctypes.string_at(buffer, size.value))
    tj.tjFree(buffer)
    tj.tjDestroy(ctypes.c_void_p(handle))


def write_window_files(out):
    """JPEGs of ImageNet's sizes and kinds, for decoding a window alone: 4:2:0, 4:2:2 and 4:4:4
    chroma, progressive, gray, CMYK and YCCK, odd sizes; and a PNG (decoded whole, then cropped)."""
    os.makedirs(out, exist_ok=True)
    Image.fromarray(pattern(375, 500, 3, 11), "RGB").save(f"{out}/imagenet420.jpg", quality=90)
    Image.fromarray(pattern(500, 333, 3, 12), "RGB").save(f"{out}/tall422.jpg", quality=90, subsampling=1)
    Image.fromarray(pattern(257, 301, 3, 13), "RGB").save(f"{out}/odd444.jpg", quality=92, subsampling=0)
    Image.fromarray(pattern(299, 401, 3, 14), "RGB").save(f"{out}/progressive420.jpg", quality=85, progressive=True)
    Image.fromarray(pattern(301, 257, 1, 15)[..., 0], "L").save(f"{out}/gray.jpg", quality=90)
    Image.fromarray(pattern(211, 307, 4, 16), "CMYK").save(f"{out}/cmyk.jpg", quality=90)
    write_ycck(f"{out}/ycck.jpg", pattern(203, 177, 4, 17))
    Image.fromarray(pattern(97, 131, 3, 18), "RGB").save(f"{out}/whole.png")
    return sorted(os.listdir(out))


def write_folder(root):
    """A tree that exercises ImageFolder's listing: sorting, nesting, links, endings, empty folders."""
    shutil.rmtree(root, ignore_errors=True)
    for d in ["b_class/nested/deeper", "a_class/sub", "a_class/sub-x", "c_link_target", "C_upper"]:
        os.makedirs(f"{root}/{d}")
    names = ["a_class/z.png", "a_class/A.PNG", "a_class/sub/x.jpg", "a_class/sub-x/y.jpeg", "a_class/notes.txt",
             "b_class/nested/deeper/1.png", "b_class/nested/2.png", "b_class/0.webp", "C_upper/k.png", "c_link_target/m.png"]
    for n in names:
        with open(f"{root}/{n}", "wb") as f:
            f.write(b"not decoded by the listing test")
    os.symlink(os.path.abspath(f"{root}/c_link_target"), f"{root}/d_linked_class")
    os.symlink(os.path.abspath(f"{root}/c_link_target"), f"{root}/b_class/linked_folder")


def main():
    out = sys.argv[1]
    shutil.rmtree(out, ignore_errors=True)
    files = write_images(f"{out}/images")
    os.makedirs(f"{out}/pil")
    manifest = {"pil": [], "tv": [], "folder_samples": None, "torchvision": None}
    for name in files:
        image = Image.open(f"{out}/images/{name}")
        for mode in ("RGB", "L"):
            pixels = np.asarray(image.convert(mode))
            pixels.tofile(f"{out}/pil/{name}.{mode}.raw")
            h, w = pixels.shape[:2]
            manifest["pil"].append({"file": name, "mode": mode, "height": h, "width": w, "source_mode": image.mode})
    manifest["window_files"] = write_window_files(f"{out}/windows")
    write_folder(f"{out}/folder")
    try:
        import torch
        import torchvision
        from torchvision import datasets, transforms
        from torchvision.transforms import v2
    except Exception as e:  # noqa: BLE001 - any failure to import means no torchvision here
        manifest["torchvision"] = {"missing": f"torchvision cannot be imported: {e}"}
    else:
        manifest["torchvision"] = {"version": torchvision.__version__, "torch": torch.__version__,
                                   "cpu_capability": torch.backends.cpu.get_cpu_capability()}
        os.makedirs(f"{out}/tv")
        tensor_path = v2.Compose([v2.Resize(20, antialias=True), v2.CenterCrop(16), v2.ToDtype(torch.float32, scale=True),
                                  v2.Normalize(MEAN, STD)])
        pil_path = transforms.Compose([transforms.Resize(20), transforms.CenterCrop(16), transforms.ToTensor(),
                                       transforms.Normalize(MEAN, STD)])
        for name in files:
            image = Image.open(f"{out}/images/{name}").convert("RGB")
            a = tensor_path(v2.functional.pil_to_tensor(image)).contiguous().numpy()
            b = pil_path(image).contiguous().numpy()
            a.astype(np.float32).tofile(f"{out}/tv/{name}.tensor.raw")
            b.astype(np.float32).tofile(f"{out}/tv/{name}.pil.raw")
            manifest["tv"].append({"file": name, "shape": list(a.shape), "pil_shape": list(b.shape)})
        folder = datasets.ImageFolder(f"{out}/folder", allow_empty=True)
        manifest["folder_samples"] = [[os.path.relpath(p, f"{out}/folder"), label] for p, label in folder.samples]
        manifest["folder_classes"] = folder.classes
    with open(f"{out}/manifest.json", "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"ok: {len(files)} images, torchvision {manifest['torchvision']}")


if __name__ == "__main__":
    main()
