#!/usr/bin/env python3
"""Fails when a relative link in dettrial's markdown (README.md, CONTRIBUTING.md, docs/) points to a
file that does not exist, or to an anchor that no heading of the target makes (GitHub's rule: the
heading in lower case, punctuation but '-' and '_' dropped, spaces as '-', a '-N' suffix for
repeats). Links to other sites are not fetched. Also fails when a docs/ page is linked from nowhere."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK_RE = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE_RE = re.compile(r"^\s*(```|~~~)")


def markdown_files():
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"] + sorted((ROOT / "docs").glob("*.md"))
    return [f for f in files if f.exists()]


def prose_lines(path: pathlib.Path, blank_code=True):
    """The lines outside fenced code blocks, with inline code spans blanked unless asked not to."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE_RE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line) if blank_code else line


def slug(heading: str) -> str:
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: pathlib.Path, cache={}):
    if path not in cache:
        seen = {}
        found = set()
        for _, line in prose_lines(path, blank_code=False):
            match = HEADING_RE.match(line)
            if not match:
                continue
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        text = path.read_text(encoding="utf-8")
        found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
        cache[path] = found
    return cache[path]


def main() -> int:
    problems = []
    linked = set()
    files = markdown_files()
    for md in files:
        for number, line in prose_lines(md):
            for target in LINK_RE.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                    continue
                file_part, _, anchor = target.partition("#")
                resolved = (md.parent / file_part).resolve() if file_part else md
                where = f"{md.relative_to(ROOT)}:{number}"
                if not resolved.exists():
                    problems.append(f"{where}: '{target}' points to {file_part}, which does not exist")
                    continue
                linked.add(resolved)
                if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                    problems.append(f"{where}: '{target}': {resolved.relative_to(ROOT)} has no heading that makes #{anchor}")
    for page in (ROOT / "docs").glob("*.md"):
        if page.resolve() not in linked:
            problems.append(f"docs/{page.name} is linked from no page: add it to the README's table")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"ok: every relative link and anchor in {len(files)} markdown files resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
