"""fixture_cache.py CACHE SCRIPT OUT: runs `python SCRIPT OUT` (a fixture writer of tests/python),
or hands OUT the folder an earlier run of the same inputs wrote.

The writers compute what PIL, torch and torchvision make of fixed inputs (torchvision's ResNets
alone are 1.2 GB); both of scripts/test's builds ran them with the same Python, and every run
again. A folder is reused only when every input is the same: the script's bytes, this file's, the
Python (its path, its version) and the releases of the packages the writers import. OUT is then a
link to CACHE/<script>-<python>-<inputs>, and the script's own output is printed again, "ok: " line
included, with a note saying where it came from. Anything else (a failure, a skip with exit 77)
is not kept: OUT holds a copy of what the script wrote, and its status is this command's. An empty CACHE
runs the script into OUT as before. Each script and Python keeps its newest folder only.
"""
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
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


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
