#!/usr/bin/env python3
"""The outcomes of compilations that ccache cannot keep: a compile-fail case's compiler output (ccache
caches no failed compilation) and a header's syntax check (`-fsyntax-only` writes no object). Kept
in the folder DETTRIAL_COMPILE_CHECK_CACHE names (scripts/lib/deps.sh sets it beside ccache's).

An entry is keyed as ccache's direct mode keys: the compile command (paths under the source and build
folders made relative, so a clone at another path hits what this one wrote), the compiled file's text
and the compiler's version; it holds, with the outcome, every file the compilation read (the
compiler's own -M list, made when the entry is written) and a hash of each, and is used only while
every one of them is unchanged. So the same inputs give the same outcome, as a compilation would.

As a compiler launcher (CMake's CXX_COMPILER_LAUNCHER) for a syntax check:
    compile_check_cache.py COMPILER ARGS...
a known success is not compiled again; anything else runs the compiler, and a success is recorded.
"""
import hashlib
import json
import os
import pathlib
import shlex
import subprocess
import sys

SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[1]


class Cache:
    """Compilation outcomes, each valid while the files it read are unchanged."""

    def __init__(self, folder, build_dir):
        self.folder = pathlib.Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.build_dir = pathlib.Path(build_dir).resolve()
        self.file_hashes: dict = {}
        self._compiler = {}

    def compiler_version(self, compiler):
        if compiler not in self._compiler:
            self._compiler[compiler] = subprocess.run([compiler, "--version"], stdout=subprocess.PIPE, text=True).stdout
        return self._compiler[compiler]

    def relative(self, text):
        # The build folder first: it may lie inside the source folder.
        return text.replace(str(self.build_dir), "@BUILD@").replace(str(SOURCE_ROOT), "@SOURCE@")

    def absolute(self, text):
        return text.replace("@BUILD@", str(self.build_dir)).replace("@SOURCE@", str(SOURCE_ROOT))

    def file_hash(self, path):
        if path not in self.file_hashes:
            try:
                self.file_hashes[path] = hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
            except OSError:
                self.file_hashes[path] = None
        return self.file_hashes[path]

    def key(self, command):
        source = pathlib.Path(command[command.index("-c") + 1])
        if not source.is_absolute():
            source = self.build_dir / source
        text = "\0".join([self.compiler_version(command[0]), self.relative(shlex.join(command)),
                          source.read_text(errors="replace")])
        return hashlib.sha256(text.encode()).hexdigest()

    def lookup(self, command):
        """The recorded outcome (a dict: status, log) while every file it read is unchanged, or None."""
        entry = self.folder / (self.key(command) + ".json")
        try:
            data = json.loads(entry.read_text())
        except (OSError, ValueError):
            return None
        for path, digest in data["files"].items():
            if self.file_hash(self.absolute(path)) != digest:
                return None
        return {"status": data.get("status", 1), "log": self.absolute(data["log"])}

    def store(self, command, status, log):
        """Records the outcome with every file the compilation reads (the compiler's -M, no output)."""
        deps = [w for i, w in enumerate(command)
                if w not in ("-MD", "-MT", "-MF", "-o", "-fsyntax-only") and command[i - 1] not in ("-MT", "-MF", "-o")]
        listed = subprocess.run(deps + ["-M", "-MF", "/dev/stdout"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, cwd=self.build_dir)
        files = listed.stdout.replace("\\\n", " ").split()[1:]
        if listed.returncode != 0 or not files:
            return  # stopped in the preprocessor: nothing to key on, compiled each time
        hashes = {self.relative(str((self.build_dir / f).resolve())): self.file_hash(str((self.build_dir / f).resolve()))
                  for f in files}
        if None in hashes.values():
            return
        entry = self.folder / (self.key(command) + ".json")
        temporary = entry.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"status": status, "files": hashes, "log": self.relative(log)}))
        temporary.replace(entry)


def launch(command) -> int:
    """A syntax check through the cache: a known success returns at once."""
    folder = os.environ.get("DETTRIAL_COMPILE_CHECK_CACHE")
    if not folder or "-c" not in command:
        return subprocess.run(command).returncode
    cache = Cache(folder, os.getcwd())
    known = cache.lookup(command)
    if known is not None and known["status"] == 0:
        return 0
    run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    sys.stdout.write(run.stdout)
    if run.returncode == 0:
        cache.store(command, 0, run.stdout)
    return run.returncode


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
