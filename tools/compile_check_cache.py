#!/usr/bin/env python3
"""The outcomes of compilations that ccache cannot keep: a compile-fail case's compiler output (ccache
caches no failed compilation) and a header's syntax check (`-fsyntax-only` writes no object). Kept
in the folder DETTRIAL_COMPILE_CHECK_CACHE names (scripts/lib/deps.sh sets it beside ccache's).

An entry is keyed as ccache's direct mode keys: the compile command (paths under the source and build
folders made relative, so a clone at another path hits what this one wrote), the compiled file's text
and the compiler's version; it holds, with the outcome, every file the compilation read (the
list from -H during a parse check, else the compiler's -M, run when the entry is written) and a hash
of each, and is used only while every one of them is unchanged. So the same inputs give the same outcome, as a compilation would.

As a compiler launcher (CMake's CXX_COMPILER_LAUNCHER) for a syntax check (-fsyntax-only):
    compile_check_cache.py [--parse] COMPILER ARGS...
a known success is not compiled again; anything else runs the compiler, and a success is recorded.

A parse check (--parse) stops the compiler once the file is parsed. GCC instantiates the templates
a translation unit used at its end, and for <torch/torch.h> alone that takes 10 s whatever the file
does; a header's check, or a compile-fail case whose sentence comes from a class template, needs
none of it. So the file is compiled through a wrapper that includes it and then fails twice where
the parse ends (PARSED): with -fmax-errors=1 the compiler prints the first error and stops at the
second. The file parsed clean if its first error is the wrapper's; otherwise its own first error is
what a whole compilation would have printed first too (it was found while parsing, before the
templates at the end). A passed parse check writes the object the command names (empty) and its
dependency file (the files it read), so that a build runs it again only when one of them changes.
"""
import hashlib
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[1]
PARSED = "dettrial: the file parsed to its end"
FIRST_ERROR = re.compile(r"^.*\berror: .*$", re.MULTILINE)


def argument_after(command, flag):
    """The argument that follows `flag` in `command`, or None."""
    return command[command.index(flag) + 1] if flag in command else None


def without_outputs(command):
    """`command` without the object and dependency files it names: a compilation that writes none."""
    named = ("-o", "-MT", "-MF")
    return [w for i, w in enumerate(command) if w not in named + ("-MD",) and (i == 0 or command[i - 1] not in named)]


def parse_command(command, wrapper, cwd="."):
    """`command` (a compilation, run in `cwd`) made a parse check of the same file through `wrapper`
    (written here): the file, then the end of parsing twice (the second stops the compiler)."""
    at = command.index("-c") + 1
    source = pathlib.Path(cwd) / command[at]
    wrapper = pathlib.Path(wrapper)
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(f'#include "{source.resolve()}"\n'
                       f'static_assert(false, "{PARSED}");\n'
                       f'static_assert(false, "{PARSED} (the compiler stops here)");\n')
    stop_after_one = "-ferror-limit=1" if "clang" in pathlib.Path(command[0]).name else "-fmax-errors=1"
    return command[:at] + [str(wrapper.resolve())] + command[at + 1:] + [stop_after_one]


# -H: a file the compiler opens, one dot per level of inclusion, or a precompiled header it used ("!")
# or looked at and refused ("x"); at the end, a list of headers whose include guards could help.
INCLUDED = re.compile(r"^(\.+|!|x) (.+)$")
GUARDS = "Multiple include guards may be useful for:"


def split_included(output):
    """A compilation's output with -H: the files it read (opened headers, the precompiled header used)
    and what is left, the diagnostics."""
    files, rest = [], []
    lines = iter(output.splitlines(keepends=True))
    for line in lines:
        match = INCLUDED.match(line.rstrip("\n"))
        if match:
            if match.group(1) != "x":
                files.append(match.group(2))
        elif line.startswith(GUARDS):
            rest.extend(l for l in lines if not l.startswith("/"))
        else:
            rest.append(line)
    return files, "".join(rest)


def parsed_clean(output):
    """Whether a parse check's first error is the end of parsing (the file itself has none)."""
    first = FIRST_ERROR.search(output)
    return first is not None and PARSED in first.group(0)


# What a precompiled header's compilation writes: it is compiled whole, never parse-checked.
PRECOMPILED = (".gch", ".pch")

# Files at least this large (a precompiled header: 500-800 MB) have their digest kept beside them.
LARGE_FILE = 16 << 20


def digest_of(path):
    """The SHA-256 of the file at `path` (None if it cannot be read). Every check that uses the
    precompiled header reads it: hashing its 700 MB took 0.9 s of each check's second, so a large
    file's digest is kept beside it (`<file>.sha256`), used while its size, modification time and
    inode are those it was computed for (a header compiled again is a new file: the builds' launcher
    removes the old one first)."""
    try:
        stat = path.stat()
        if stat.st_size < LARGE_FILE:
            return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
    kept = path.with_name(path.name + ".sha256")
    stamp = f"{stat.st_size} {stat.st_mtime_ns} {stat.st_ino}"
    try:
        kept_stamp, kept_digest = kept.read_text().split("\n")[:2]
        if kept_stamp == stamp and kept_digest:
            return kept_digest
    except (OSError, ValueError):
        pass
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    temporary = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(f"{stamp}\n{digest.hexdigest()}\n")
        temporary.replace(kept)
    except OSError:
        pass  # a folder we cannot write to: computed each time
    return digest.hexdigest()


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
            self.file_hashes[path] = digest_of(pathlib.Path(path))
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
        return {"status": data.get("status", 1), "log": self.absolute(data["log"]),
                "files": [self.absolute(path) for path in data["files"]]}

    def store(self, command, status, log, files=None):
        """Records the outcome with every file the compilation read: `files`, when the compilation
        listed them (-H), or else the compiler's -M (a second run, of the preprocessor alone)."""
        if files is None:
            deps = [w for w in without_outputs(command) if w != "-fsyntax-only"]
            listed = subprocess.run(deps + ["-M", "-MF", "/dev/stdout"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    text=True, cwd=self.build_dir)
            files = listed.stdout.replace("\\\n", " ").split()[1:] if listed.returncode == 0 else []
        if not files:
            return  # stopped in the preprocessor: nothing to key on, compiled each time
        hashes = {self.relative(str((self.build_dir / f).resolve())): self.file_hash(str((self.build_dir / f).resolve()))
                  for f in files}
        if None in hashes.values():
            return
        entry = self.folder / (self.key(command) + ".json")
        temporary = entry.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"status": status, "files": hashes, "log": self.relative(log)}))
        temporary.replace(entry)


def check(command, parse):
    """Runs a syntax check (a parse check with `parse`): its exit status, what to print and, for a
    parse check, the files it read (None: not listed)."""
    output = argument_after(command, "-o") or argument_after(command, "-c")
    if not parse or output.endswith(PRECOMPILED):  # a precompiled header is compiled whole
        run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        return run.returncode, run.stdout, None
    # The wrapper beside the object the command names (its folder exists).
    status, printed, files = parse_check(command, output + ".parse.cpp")
    return (0, "", files) if parsed_clean(printed) else (status or 1, printed, files)


def parse_check(command, wrapper, cwd=None):
    """Runs `command` as a parse check through `wrapper`, in `cwd`: its exit status, its diagnostics
    and the files it read. Syntax only, so no object is written; -H lists the files read as it goes
    (GCC writes no dependency file for a compilation that fails, as a parse check always does)."""
    run = subprocess.run(parse_command(command + ["-fsyntax-only", "-H"], wrapper, cwd or "."), cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace")
    files, printed = split_included(run.stdout)
    return run.returncode, printed, files


def self_test(compiler) -> int:
    """A parse check passes a clean file and fails each kind of error found while parsing, with the
    compiler's own message and not the end-of-parsing sentinel; it lists the files each read."""
    import tempfile
    cases = {
        "clean": ("#include <vector>\ntemplate <class T> int f(T t) { return t.missing(); }\nint g() { return 1; }\n", None),
        "missing include": ("int h() { return std::vector<int>{}.size(); }\n", "vector"),
        "undeclared name": ("int h() { return undeclared_name; }\n", "undeclared_name"),
        "namespace-scope static_assert": ("static_assert(sizeof(int) == 3, \"int has 3 bytes\");\n", "int has 3 bytes"),
    }
    failures = []
    with tempfile.TemporaryDirectory() as folder:
        for name, (text, expected) in cases.items():
            source = pathlib.Path(folder) / (name.replace(" ", "_") + ".cpp")
            source.write_text(text)
            status, printed, files = check([compiler, "-std=c++20", "-c", str(source), "-o", str(source) + ".o"], parse=True)
            if expected is None and status != 0:
                failures.append(f"'{name}' failed: {printed}")
            elif expected is not None and (status == 0 or expected not in printed or PARSED in printed):
                failures.append(f"'{name}' gave status {status} and: {printed}")
            if str(source) not in files or (name == "clean" and not any(f.endswith("/vector") for f in files)):
                failures.append(f"'{name}' did not list the files it read: {files}")
            if re.search(r"^\.+ ", printed, re.MULTILINE):
                failures.append(f"'{name}' printed the list of files it read: {printed}")
        failures += outputs_self_test(compiler, pathlib.Path(folder), cases)
        failures += large_file_self_test(pathlib.Path(folder))
    for failure in failures:
        print(f"compile_check_cache self-test: {failure}", file=sys.stderr)
    return 1 if failures else 0


def large_file_self_test(folder):
    """A large file's kept digest is its SHA-256, and a file changed in place gets a new one."""
    failures = []
    large = folder / "large.gch"
    large.write_bytes(b"a" * LARGE_FILE)
    first, again = digest_of(large), digest_of(large)
    if first != hashlib.sha256(large.read_bytes()).hexdigest() or again != first or not (folder / "large.gch.sha256").exists():
        failures.append(f"a large file's digest was {first}, then {again}, kept: {(folder / 'large.gch.sha256').exists()}")
    with open(large, "r+b") as f:  # the same size, other bytes, in place
        f.write(b"b")
    os.utime(large, ns=(large.stat().st_atime_ns, large.stat().st_mtime_ns + 1_000_000))
    if digest_of(large) != hashlib.sha256(large.read_bytes()).hexdigest():
        failures.append("a large file changed in place kept its old digest")
    return failures


def outputs_self_test(compiler, folder, cases):
    """A passed parse check, run as the build runs it, leaves an empty object and a dependency file
    naming the files it read; the same check failing next (its source changed) leaves neither, so the
    build tool runs it again."""
    failures = []
    source = folder / "outputs.cpp"
    output, depfile = folder / "outputs.cpp.o", folder / "outputs.cpp.o.d"
    saved = os.environ.pop("DETTRIAL_COMPILE_CHECK_CACHE", None)
    try:
        for name in ("clean", "undeclared name"):
            source.write_text(cases[name][0])
            depfile.unlink(missing_ok=True)  # the build tool reads and removes it
            with open(os.devnull, "w") as quiet:
                saved_stdout, sys.stdout = sys.stdout, quiet
                try:
                    status = launch(["--parse", compiler, "-std=c++20", "-MD", "-MT", str(output), "-MF", str(depfile),
                                     "-c", str(source), "-o", str(output)])
                finally:
                    sys.stdout = saved_stdout
            listed = depfile.read_text() if depfile.exists() else ""
            if name == "clean" and (status != 0 or not output.exists() or output.stat().st_size != 0 or
                                    str(source) not in listed or "/vector" not in listed):
                failures.append(f"a passed check left status {status}, object {output.exists()}, dependencies '{listed[:200]}'")
            if name != "clean" and (status == 0 or output.exists() or depfile.exists()):
                failures.append(f"a failed check left status {status}, object {output.exists()}, dependencies {depfile.exists()}")
    finally:
        if saved is not None:
            os.environ["DETTRIAL_COMPILE_CHECK_CACHE"] = saved
    return failures


def launch(arguments) -> int:
    """A syntax check through the cache: a known success returns at once."""
    parse = arguments[:1] == ["--parse"]
    command = arguments[1:] if parse else arguments
    if "-c" not in command:
        return subprocess.run(command).returncode
    folder = os.environ.get("DETTRIAL_COMPILE_CHECK_CACHE")
    # A parse check proves less than a whole syntax check: its outcomes are kept apart.
    cache = Cache(os.path.join(folder, "parse") if parse else folder, os.getcwd()) if folder else None
    known = cache.lookup(command) if cache else None
    if known is not None and known["status"] == 0:
        status, files = 0, known["files"]
    else:
        status, printed, files = check(command, parse)
        sys.stdout.write(printed)
        if status == 0 and cache:
            cache.store(command, 0, printed, files)
    if parse:
        write_outputs(command, files if status == 0 else None)
    return status


def make_escaped(path):
    """A path as a Makefile rule names it (what the build tool reads from a dependency file)."""
    return str(path).replace("$", "$$").replace(" ", "\\ ").replace("#", "\\#")


def write_outputs(command, files):
    """After a parse check passed (`files`: those it read): the object the command names, empty, and
    its dependency file listing them; after one that failed (None), no object, as a compiler leaves
    none. A syntax check writes neither, so the build tool ran every check again in every build, each
    a second even when the cache knew it; with them it runs a check again only when a file it read
    has changed, as it does a compilation."""
    output = argument_after(command, "-o")
    if output is None or output.endswith(PRECOMPILED):  # compiled whole: the compiler wrote it
        return
    if files is None:
        pathlib.Path(output).unlink(missing_ok=True)
        return
    if depfile := argument_after(command, "-MF"):
        listed = " \\\n  ".join(make_escaped(f) for f in files)
        pathlib.Path(depfile).write_text(f"{make_escaped(argument_after(command, '-MT') or output)}: {listed}\n")
    pathlib.Path(output).write_bytes(b"")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--self-test"] and len(sys.argv) == 3:
        sys.exit(self_test(sys.argv[2]))
    sys.exit(launch(sys.argv[1:]))
