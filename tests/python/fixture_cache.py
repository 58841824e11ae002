"""fixture_cache.py CACHE SCRIPT OUT: runs `python SCRIPT OUT` (a fixture writer of tests/python),
or hands OUT the folder an earlier run of the same inputs wrote.

The writers compute what PIL, torch and torchvision make of fixed inputs (torchvision's ResNets
alone are 1.2 GB); both of scripts/test's builds ran them with the same Python, and every run
again. A folder is reused only when every input is the same: the script's bytes, this file's, the
Python (its path, its version) and the releases of the packages the writers import. OUT is then a
link to CACHE/<script>-<python>-<inputs>, and the script's own output is printed again, "ok: " line
included, with a note saying where it came from. Anything else (a failure, a skip with exit 77)
is not kept: OUT holds a copy of what the script wrote, and its status is this command's. An empty
CACHE runs the script into OUT as before. Each script and Python keeps its newest folder only.

fixture_cache.py --self-test: each of those promises, with small writers in a scratch folder.
"""
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata

# The packages a writer's output depends on (the releases installed, or their absence).
PACKAGES = ("torch", "torchvision", "numpy", "pillow")


def release(package):
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def digest(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def inputs_key(script):
    h = hashlib.sha256()
    for path in (script, __file__):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(sys.version.encode())
    for package in PACKAGES:
        h.update(f"{package}={release(package)};".encode())
    return h.hexdigest()[:16]


def remove(path):
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def run(script, out):
    """The script into OUT; its exit status and what it printed."""
    done = subprocess.run([sys.executable, script, out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.returncode, done.stdout


def main(cache, script, out):
    script = os.path.abspath(script)
    remove(out)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if not cache:
        status, printed = run(script, out)
        print(printed, end="")
        return status
    stem = os.path.splitext(os.path.basename(script))[0]
    prefix = f"{stem}-{digest(os.path.realpath(sys.executable))}-"
    kept = os.path.join(cache, prefix + inputs_key(script))
    # Written where it is kept, not moved there: a writer may record its own paths (absolute links,
    # file lists). The output file, written last, says the folder is whole; a lock keeps two builds
    # from writing one folder at once.
    printed_file = os.path.join(kept, "fixture_cache.output")
    os.makedirs(cache, exist_ok=True)
    with open(kept + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(printed_file):
            note = "written by an earlier run of the same inputs"
        else:
            remove(kept)  # a writer that did not finish
            status, printed = run(script, kept)
            if status != 0:  # a failure or a skip: OUT holds what the script wrote, as without a cache
                print(printed, end="")
                if os.path.lexists(kept):
                    shutil.copytree(kept, out, symlinks=True)
                    remove(kept)
                return status
            with open(printed_file, "w") as f:
                f.write(printed)
            for name in os.listdir(cache):  # this script's and Python's older folders
                if name.startswith(prefix) and not name.startswith(os.path.basename(kept)):
                    remove(os.path.join(cache, name))
            note = "written now"
    os.symlink(kept, out)
    with open(printed_file) as f:
        print(f.read(), end="")
    print(f"note: {out} is {kept} ({note}: the same script, Python and {', '.join(PACKAGES)} releases)")
    return 0


WRITERS = {  # for --self-test: each writes into sys.argv[1]
    "writes": 'import os, sys\nos.makedirs(sys.argv[1] + "/d")\nopen(sys.argv[1] + "/d/f", "w").write("x")\n'
              'os.symlink(os.path.abspath(sys.argv[1] + "/d"), sys.argv[1] + "/link")\nprint("note: a note")\nprint("ok: wrote")\n',
    "skips": 'import os, sys\nos.makedirs(sys.argv[1])\nopen(sys.argv[1] + "/manifest.json", "w").write("{}")\n'
             'print("skipped: no such package")\nsys.exit(77)\n',
    "fails": 'raise SystemExit("the writer broke")\n',
}


def self_test():
    import contextlib
    import io
    failures = []

    def check(what, condition):
        if not condition:
            failures.append(what)

    def call(cache, name, out):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            status = main(cache, os.path.join(scratch, name + ".py"), out)
        return status, printed.getvalue()

    with tempfile.TemporaryDirectory() as scratch:
        for name, text in WRITERS.items():
            with open(os.path.join(scratch, name + ".py"), "w") as f:
                f.write(text)
        cache, out = os.path.join(scratch, "cache"), os.path.join(scratch, "out")
        status, printed = call(cache, "writes", out)
        check("a writer's first run passes and prints its lines", status == 0 and "note: a note\nok: wrote\n" in printed)
        check("OUT links the kept folder", os.path.islink(out) and os.path.isfile(os.path.join(out, "d", "f")))
        check("a link the writer made into its folder still resolves", os.path.isfile(os.path.join(out, "link", "f")))
        os.unlink(os.path.join(os.path.realpath(out), "d", "f"))  # so that a second write would show
        status, printed = call(cache, "writes", out)
        check("the same inputs are not written again", status == 0 and "ok: wrote" in printed and "earlier run" in printed
              and not os.path.exists(os.path.join(out, "d", "f")))
        for name, want in (("skips", 77), ("fails", 1)):
            status, printed = call(cache, name, out)
            check(f"a writer that {name} keeps its status ({status})", status == want)
            check(f"a writer that {name} is not kept", not any(n.startswith(name + "-") and not n.endswith(".lock") for n in os.listdir(cache)))
        check("a skip's files are in OUT", call(cache, "skips", out)[0] == 77 and os.path.isfile(os.path.join(out, "manifest.json")))
        check("a failure's message is printed", "the writer broke" in call(cache, "fails", out)[1])
        status, _ = call("", "writes", out)
        check("without a cache, OUT is the writer's own folder", status == 0 and os.path.isdir(out) and not os.path.islink(out))
    for what in failures:
        print(f"fixture_cache.py --self-test: {what}: not so")
    if not failures:
        print("ok: fixture_cache.py keeps whole folders by their inputs, and never a failed or skipped one")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
