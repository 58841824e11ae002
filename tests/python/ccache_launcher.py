"""ccache_launcher.py COMPILER: the builds' compiler launcher (scripts/lib/ccache-launcher) hands a
checkout a precompiled header only when the header's input files are the ones it was compiled from.

Two checkouts at different paths (as CI's clone and the last one are) hold a header that differs only
inside a section the preprocessor drops. Each compiles a precompiled header through the launcher into
one cache, as CMake does; the second then compiles a unit that uses it and includes the header again
by its absolute path, which GCC tells from the header's `#pragma once` record. A header handed out
from the first checkout's text fails that unit with "multiple definition". A third checkout with the
first one's files must be handed the cached header (the cache still works across paths). The same
two checkouts again with commands that ask for no dependency list (which the launcher's key needs):
the second must not be handed the first one's header either.

Exits 77 (skipped) without ccache.
"""
import os
import shutil
import subprocess
import sys
import tempfile

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "lib", "ccache-launcher")

HEADER = """#pragma once
enum class Policy { each, every };
#if DEFINITIONS
inline int answer() { return %d; }
#endif
"""


def checkout(root, name, answer):
    folder = os.path.join(root, name)
    os.makedirs(os.path.join(folder, "include"))
    os.makedirs(os.path.join(folder, "build"))
    with open(os.path.join(folder, "include", "library.hpp"), "w") as file:
        file.write(HEADER % answer)
    with open(os.path.join(folder, "build", "pch.hxx"), "w") as file:
        file.write('#include "library.hpp"\n')
    with open(os.path.join(folder, "unit.cpp"), "w") as file:
        file.write('#include "%s/include/library.hpp"\nint main() { return static_cast<int>(Policy::each); }\n' % folder)
    return folder


def hits(environment):
    stats = subprocess.run(["ccache", "--print-stats"], env=environment, capture_output=True, text=True, check=True).stdout
    counters = dict(line.split("\t") for line in stats.splitlines() if "\t" in line)
    return int(counters.get("direct_cache_hit", 0)) + int(counters.get("preprocessed_cache_hit", 0))


def compile_header(compiler, folder, environment, dependency_list=True):
    # CMake's command for a precompiled header, with the dependency file the launcher's key needs.
    command = [LAUNCHER, compiler, "-std=c++20", "-Iinclude", "-x", "c++-header", "build/pch.hxx", "-o", "build/pch.hxx.gch"]
    if dependency_list:
        command += ["-MD", "-MT", "build/pch.hxx.gch", "-MF", "build/pch.hxx.d"]
    subprocess.run(command, cwd=folder, env=dict(environment, CCACHE_BASEDIR=folder), check=True)


def second_checkout_compiles(compiler, root, environment, dependency_list):
    """Two checkouts, one cache: whether the second's unit compiles on the header it was handed."""
    suffix = "" if dependency_list else "-without-list"
    compile_header(compiler, checkout(root, "first" + suffix, 1), environment, dependency_list)
    second = checkout(root, "second" + suffix, 2)
    compile_header(compiler, second, environment, dependency_list)
    unit = subprocess.run([compiler, "-std=c++20", "-Iinclude", "-include", "build/pch.hxx", "-Winvalid-pch", "-c", "unit.cpp",
                           "-o", "unit.o"], cwd=second, capture_output=True, text=True)
    return unit.returncode == 0, unit.stderr


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ccache_launcher.py COMPILER")
    compiler = sys.argv[1]
    if shutil.which("ccache") is None:
        print("skipped: ccache is absent")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as root:
        environment = dict(os.environ, CCACHE_DIR=os.path.join(root, "cache"), CCACHE_NOHASHDIR="1",
                           CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime")
        environment.pop("CCACHE_DEPEND", None)
        environment.pop("CCACHE_DISABLE", None)
        compiled, errors = second_checkout_compiles(compiler, root, environment, dependency_list=True)
        if not compiled:
            sys.exit("FAIL: the second checkout was handed the first one's precompiled header:\n" + errors)
        before = hits(environment)
        compile_header(compiler, checkout(root, "third", 1), environment)
        if hits(environment) != before + 1:
            sys.exit("FAIL: a checkout with the first one's files at another path was not handed its precompiled header")
        compiled, errors = second_checkout_compiles(compiler, root, environment, dependency_list=False)
        if not compiled:
            sys.exit("FAIL: without a dependency list, the second checkout was handed the first one's precompiled header:\n" + errors)
    print("ok: a precompiled header is handed out only for the same input files (never without their list), and is at another path")


if __name__ == "__main__":
    main()
