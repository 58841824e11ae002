#!/usr/bin/env python3
"""Generates single_include/dettrial/dettrial.hpp (the trial API), single_include/dettrial/search.hpp
(search spaces and searchers), single_include/dettrial/main.hpp
(the opt-in command line, which includes the first and inlines only what it adds), the same for
single_include/dettrial/vision.hpp (image data), single_include/dettrial/keras.hpp (Keras-style trials)
single_include/dettrial/samplers.hpp (the samplers' range-v3 views) and single_include/dettrial/tokens.hpp
(token data for language models), and
single_include/dettrial/src.hpp (separate-compilation mode's source, which includes main.hpp) from include/
(dettrial's headers inlined once each, system and third-party includes kept). `--check` fails when a
committed file is stale."""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "include"
ENTRY = INCLUDE / "dettrial" / "dettrial.hpp"
MAIN_ENTRY = INCLUDE / "dettrial" / "main.hpp"
OUTPUT = ROOT / "single_include" / "dettrial" / "dettrial.hpp"
MAIN_OUTPUT = ROOT / "single_include" / "dettrial" / "main.hpp"
SEARCH_ENTRY = INCLUDE / "dettrial" / "search.hpp"
SEARCH_OUTPUT = ROOT / "single_include" / "dettrial" / "search.hpp"
VISION_ENTRY = INCLUDE / "dettrial" / "vision.hpp"
VISION_OUTPUT = ROOT / "single_include" / "dettrial" / "vision.hpp"
KERAS_ENTRY = INCLUDE / "dettrial" / "keras.hpp"
KERAS_OUTPUT = ROOT / "single_include" / "dettrial" / "keras.hpp"
SAMPLERS_ENTRY = INCLUDE / "dettrial" / "samplers.hpp"
SAMPLERS_OUTPUT = ROOT / "single_include" / "dettrial" / "samplers.hpp"
TOKENS_ENTRY = INCLUDE / "dettrial" / "tokens.hpp"
TOKENS_OUTPUT = ROOT / "single_include" / "dettrial" / "tokens.hpp"
SRC_ENTRY = INCLUDE / "dettrial" / "src.hpp"
SRC_OUTPUT = ROOT / "single_include" / "dettrial" / "src.hpp"
BANNER = """// ==========================================================================================
// dettrial, single-header edition: DO NOT MODIFY THIS FILE BY HAND.
// It is generated from include/ by tools/amalgamate.py; edit the headers there and regenerate.
// ==========================================================================================
"""
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def resolve(current: pathlib.Path, kind: str, name: str):
    candidates = [current.parent / name] if kind == '"' else []
    candidates.append(INCLUDE / name)
    for c in candidates:
        c = c.resolve()
        if c.is_file() and INCLUDE in c.parents:
            return c
    return None


def inline(path: pathlib.Path, seen: set, out: list):
    if path in seen:
        return
    seen.add(path)
    rel = path.relative_to(INCLUDE).as_posix()
    out.append(f"// ---- begin {rel}\n")
    for line in path.read_text().splitlines(keepends=True):
        if line.strip() == "#pragma once" or "IWYU pragma: private" in line:
            continue
        m = INCLUDE_RE.match(line)
        if m:
            target = resolve(path, m.group(1), m.group(2))
            if target is not None:
                inline(target, seen, out)
                continue
        out.append(line)
    out.append(f"// ---- end {rel}\n")


def generate() -> dict:
    seen = set()
    out = [BANNER, "#pragma once\n"]
    inline(ENTRY.resolve(), seen, out)
    trial_api = set(seen)
    # search.hpp, main.hpp, vision.hpp, keras.hpp and samplers.hpp include dettrial.hpp: their single-header editions include
    # the file above instead, and inline only what they add to it (main.hpp: to search.hpp too, which
    # it includes, so that both can be included).
    search_out = [BANNER, "#pragma once\n", '#include "dettrial.hpp"\n']
    inline(SEARCH_ENTRY.resolve(), seen, search_out)
    main_out = [BANNER, "#pragma once\n", '#include "dettrial.hpp"\n', '#include "search.hpp"\n']
    inline(MAIN_ENTRY.resolve(), seen, main_out)
    vision_out = [BANNER, "#pragma once\n", '#include "dettrial.hpp"\n']
    inline(VISION_ENTRY.resolve(), set(trial_api), vision_out)
    keras_out = [BANNER, "#pragma once\n", '#include "dettrial.hpp"\n']
    inline(KERAS_ENTRY.resolve(), set(trial_api), keras_out)
    samplers_out = [BANNER, "#pragma once\n", '#include "dettrial.hpp"\n']
    inline(SAMPLERS_ENTRY.resolve(), set(trial_api), samplers_out)
    tokens_out = [BANNER, "#pragma once\n", '#include "dettrial.hpp"\n']
    inline(TOKENS_ENTRY.resolve(), set(trial_api), tokens_out)
    # src.hpp only includes main.hpp, vision.hpp, keras.hpp and tokens.hpp: copied as it is, it
    # includes their single-header editions beside it.
    src = SRC_ENTRY.read_text()
    assert re.findall(r'#\s*include\s*"([^"]+)"', src) == ["main.hpp", "vision.hpp", "keras.hpp", "tokens.hpp"], \
        "src.hpp must include main.hpp, vision.hpp, keras.hpp and tokens.hpp only"
    return {OUTPUT: "".join(out), SEARCH_OUTPUT: "".join(search_out), MAIN_OUTPUT: "".join(main_out), VISION_OUTPUT: "".join(vision_out), KERAS_OUTPUT: "".join(keras_out),
            SAMPLERS_OUTPUT: "".join(samplers_out), TOKENS_OUTPUT: "".join(tokens_out), SRC_OUTPUT: BANNER + src}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed single header is stale")
    args = parser.parse_args()
    files = generate()
    if args.check:
        stale = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date: run python3 tools/amalgamate.py", file=sys.stderr)
        if not stale:
            print("single_include/ is up to date")
        return 1 if stale else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, newline="\n")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
