#!/usr/bin/env python3
"""Fails when a C++ file of dettrial (include/, tests/, examples/, bench/; not the generated
single_include/) differs from what clang-format 19 makes of it with the repository's .clang-format,
naming each file and how many lines differ. Without clang-format 19 (Debian: clang-format-19) the
check is skipped (exit 77): another version formats some constructs differently.

usage: check_format.py [--fix]   (--fix rewrites the files instead)"""
import difflib
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ["include", "tests", "examples", "bench"]
SUFFIXES = {".hpp", ".cpp", ".h", ".cc"}


def clang_format() -> str | None:
    for name in ("clang-format-19", "clang-format"):
        path = shutil.which(name)
        if path and "version 19." in subprocess.run([path, "--version"], capture_output=True, text=True).stdout:
            return path
    return None


def main() -> int:
    tool = clang_format()
    if not tool:
        print("skipped: no clang-format 19 (Debian: clang-format-19)")
        return 77
    files = sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*") if p.suffix in SUFFIXES and p.is_file())
    if "--fix" in sys.argv[1:]:
        subprocess.run([tool, "-i", "--style=file", *map(str, files)], check=True, cwd=ROOT)
        print(f"formatted {len(files)} files")
        return 0
    differing = []
    for path in files:
        original = path.read_text()
        formatted = subprocess.run([tool, "--style=file", f"--assume-filename={path}"], input=original, capture_output=True,
                                   text=True, check=True, cwd=ROOT).stdout
        if formatted != original:
            changed = sum(1 for line in difflib.ndiff(original.splitlines(), formatted.splitlines()) if line.startswith("+ "))
            differing.append(f"{path.relative_to(ROOT)}: {changed} line(s) differ from clang-format's")
    for line in differing:
        print(line, file=sys.stderr)
    if differing:
        print(f"{len(differing)} of {len(files)} files are not formatted; run: python3 tools/check_format.py --fix", file=sys.stderr)
        return 1
    print(f"ok: {len(files)} files follow .clang-format")
    return 0


if __name__ == "__main__":
    sys.exit(main())
