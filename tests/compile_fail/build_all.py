#!/usr/bin/env python3
"""Builds every compile-fail target in one `cmake --build` (two compile jobs, keep going) and leaves
each target's compiler output in LOG_DIR/<target>.log, which the compile-fail tests then match
against their expected sentence. A target that builds leaves no log (its test fails: no sentence).

usage: build_all.py BUILD_DIR LOG_DIR TARGET...

With DETTRIAL_COMPILE_FAIL_CACHE set to a folder, a case whose compiler output is known is not
compiled again. ccache cannot do this (it caches no failed compilation), so this does what its
direct mode does: an entry is keyed by the case's compile command and source text, and holds, with
the output, every file the compilation read (from the compiler's own -M, made when the entry is
written) and a hash of each; it is used only while every one of those files is unchanged. So the
same inputs give the same output, as a compilation would. Paths under the source and build folders
are kept relative, so a clone at another path hits what this one wrote.
"""
import concurrent.futures
import hashlib
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

TARGET_RE = re.compile(r"CMakeFiles/(compile_fail_[A-Za-z0-9_]+)\.dir/")
SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[2]


def build(build_dir, targets):
    """Builds `targets`; returns each failed one's compiler output."""
    if not targets:
        return {}
    run = subprocess.run(["cmake", "--build", build_dir, "-j", "2", "--target", *targets, "--", "-k", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    # Ninja prints a failed step as "FAILED: <outputs>", its command and its output, together.
    blocks: dict = {}
    current = None
    for line in run.stdout.splitlines(keepends=True):
        if line.startswith("FAILED: "):
            match = TARGET_RE.search(line)
            current = match.group(1) if match else None
        elif line.startswith("[") or line.startswith("ninja: "):
            current = None
        if current is not None:
            blocks.setdefault(current, []).append(line)
    return {target: "".join(lines) for target, lines in blocks.items()}


class Cache:
    """Compiler outputs of compile-fail cases, each valid while the files it read are unchanged."""

    def __init__(self, folder, build_dir):
        self.folder = pathlib.Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.build_dir = pathlib.Path(build_dir).resolve()
        self.file_hashes: dict = {}
        compiler = subprocess.run(["c++", "--version"], stdout=subprocess.PIPE, text=True).stdout
        self.compiler = compiler

    def relative(self, text):
        # The build folder first: it may lie inside the source folder.
        return text.replace(str(self.build_dir), "@BUILD@").replace(str(SOURCE_ROOT), "@SOURCE@")

    def absolute(self, text):
        return text.replace("@BUILD@", str(self.build_dir)).replace("@SOURCE@", str(SOURCE_ROOT))

    def command(self, target):
        """The case's compile command (no launcher), from ninja."""
        commands = subprocess.run(["ninja", "-C", str(self.build_dir), "-t", "commands", target],
                                  stdout=subprocess.PIPE, text=True, check=True).stdout.splitlines()
        mine = [c for c in commands if f"CMakeFiles/{target}.dir/" in c and " -c " in c]
        if len(mine) != 1:
            return None
        words = shlex.split(mine[0])
        return words[1:] if words[0].endswith("ccache") else words

    def file_hash(self, path):
        if path not in self.file_hashes:
            try:
                self.file_hashes[path] = hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
            except OSError:
                self.file_hashes[path] = None
        return self.file_hashes[path]

    def key(self, command):
        source = pathlib.Path(command[command.index("-c") + 1])
        text = self.compiler + "\0" + self.relative(shlex.join(command)) + "\0" + source.read_text(errors="replace")
        return hashlib.sha256(text.encode()).hexdigest()

    def lookup(self, command):
        entry = self.folder / (self.key(command) + ".json")
        try:
            data = json.loads(entry.read_text())
        except (OSError, ValueError):
            return None
        for path, digest in data["files"].items():
            if self.file_hash(self.absolute(path)) != digest:
                return None
        return self.absolute(data["log"])

    def store(self, command, log):
        """Records `log` with every file the compilation reads (the compiler's -M, no output file)."""
        deps = [w for i, w in enumerate(command)
                if w not in ("-MD", "-MT", "-MF", "-o") and command[i - 1] not in ("-MT", "-MF", "-o")]
        listed = subprocess.run(deps + ["-M", "-MF", "/dev/stdout"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, cwd=self.build_dir)
        files = [w for w in listed.stdout.replace("\\\n", " ").split()[1:]]
        if listed.returncode != 0 or not files:
            return
        hashes = {self.relative(str((self.build_dir / f).resolve())): self.file_hash(str((self.build_dir / f).resolve()))
                  for f in files}
        if None in hashes.values():
            return
        entry = self.folder / (self.key(command) + ".json")
        temporary = entry.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"files": hashes, "log": self.relative(log)}))
        temporary.replace(entry)


def main() -> int:
    build_dir, log_dir, targets = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3:]
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    cache = Cache(os.environ["DETTRIAL_COMPILE_FAIL_CACHE"], build_dir) if os.environ.get("DETTRIAL_COMPILE_FAIL_CACHE") else None
    logs: dict = {}
    commands: dict = {}
    if cache:
        for target in targets:
            commands[target] = cache.command(target)
            known = cache.lookup(commands[target]) if commands[target] else None
            if known is not None:
                logs[target] = known
    to_build = [t for t in targets if t not in logs]
    built_logs = build(build_dir, to_build)
    if cache:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda t: cache.store(commands[t], built_logs[t]),
                          [t for t in built_logs if commands.get(t)]))
    logs.update(built_logs)
    for target, text in logs.items():
        (log_dir / f"{target}.log").write_text(text)
    built = [t for t in targets if t not in logs]
    print(f"{len(logs)} of {len(targets)} compile-fail targets failed to build, as they must "
          f"({len(targets) - len(to_build)} known from the cache, unchanged inputs)")
    for target in built:
        print(f"built, but must not: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
