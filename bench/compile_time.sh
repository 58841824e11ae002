#!/usr/bin/env bash
# Compile time of a trial: the same network (the MNIST example's) as a hand-written LibTorch loop,
# as a dettrial trial TU without the command line, as the MNIST example's main (trial and command
# line), both again in separate-compilation mode (DETTRIAL_SEPARATE_COMPILATION: dettrial's
# non-template code declared only), that main with <dettrial/main.hpp> precompiled (the README's
# recipe), and the one source file that compiles dettrial's non-template code (once per build). Each
# command is the build's own compile command at -O2 with nothing precompiled unless said, rounds
# rotated; one JSON line per compile (the compiler's CPU seconds, and its wall time), table.py prints
# the median ratios.
#   bench/compile_time.sh BUILD_DIR [ROUNDS] [--pair]     (BUILD_DIR: a bench build, e.g. build/bench-pip)
# --pair times only the two compiles the target compares (the plain loop and the separate-compilation
# trial TU), alternating which goes first: five rounds of the pair take minutes, not half an hour.
set -euo pipefail
dir=$1 rounds=${2:-3} only_pair=${3:-}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The compile command ninja would run for TARGET's one source, without a precompiled header or the
# builds' compiler launcher (ccache, scripts/lib/ccache-launcher), at -O2,
# header-only (the examples link dettrial::compiled; separate() below adds its definition back).
command_of() {
  ninja -C "$dir" -t commands "$1" | grep -E -- " -o [^ ]*CMakeFiles/$1\.dir/[^ ]+\.cpp\.o -c " | tail -n 1 |
    sed -E 's/ -Xclang -include-pch -Xclang [^ ]+//g; s/ -include [^ ]*cmake_pch[^ ]*//g; s/ -Winvalid-pch//g;
            s#(^|&& )[^ ]*ccache(-launcher)? #\1#; s/ -O[0-3s]( |$)/ -O2 /g; s/ -o [^ ]+/ -o \/dev\/null/; s/ -DDETTRIAL_SEPARATE_COMPILATION( |$)/ /g'
}
plain=$(command_of compile_plain_loop)
trial=$(command_of compile_trial_only)
example=$(command_of mnist)
for c in "$plain" "$trial" "$example"; do [ -n "$c" ] || { echo "compile_time.sh: no compile command found in $dir" >&2; exit 1; }; done
# The recipe: precompile <dettrial/main.hpp> once with the example's flags, then include it first.
pch_flags=$(echo "$example" | sed -E 's/ -c [^ ]+\.cpp//; s/ -o [^ ]+//; s/^cd [^&]+&& //')
echo '#include <dettrial/main.hpp>' > "$scratch/dettrial_pch.hpp"
(cd "$dir" && eval "${pch_flags#*&& } -x c++-header $scratch/dettrial_pch.hpp -o $scratch/dettrial_pch.hpp.gch")
with_pch=$(echo "$example" | sed -E "s| -c | -include $scratch/dettrial_pch.hpp -c |")
separate() { echo "$1" | sed -E "s| -c | -DDETTRIAL_SEPARATE_COMPILATION -c |"; }
echo '#include <dettrial/src.hpp>' > "$scratch/compiled.cpp"
compiled=$(separate "$example" | sed -E "s| -c [^ ]+\.cpp| -c $scratch/compiled.cpp|")
timed() {  # name, command: one JSON line with the compiler's CPU seconds (user + system) and wall time
  # CPU time, not wall time, is the value: on a shared or virtual machine the wall clock of one
  # compile varies far more than the work it does.
  if ! python3 - "$1" "$dir" "$2" "$scratch/out" <<'PY'
import json, resource, subprocess, sys, time
name, where, command, log = sys.argv[1:]
start = time.monotonic()
with open(log, "w") as out:
    status = subprocess.run(command, shell=True, cwd=where, stdout=out, stderr=subprocess.STDOUT).returncode
wall = time.monotonic() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
if status != 0:
    sys.exit(1)
print(json.dumps({"name": "compile time at -O2: " + name, "value": usage.ru_utime + usage.ru_stime, "unit": "cpu s",
                  "spread": 1.0, "wall_s": round(wall, 1)}))
PY
  then
    echo "compile_time.sh: the $1 did not compile:" >&2
    tail -n 20 "$scratch/out" >&2
    exit 1
  fi
}
names=("plain LibTorch loop" "dettrial trial TU, no command line" "dettrial trial TU, separate compilation"
       "dettrial MNIST example main" "dettrial MNIST example main, separate compilation"
       "dettrial MNIST example main, main.hpp precompiled" "dettrial's compiled part (once per build, separate compilation)")
commands=("$plain" "$trial" "$(separate "$trial")" "$example" "$(separate "$example")" "$with_pch" "$compiled")
if [ "$only_pair" = "--pair" ]; then
  names=("${names[0]}" "${names[2]}") commands=("${commands[0]}" "${commands[2]}")
fi
n=${#names[@]}
for ((round = 0; round < rounds; ++round)); do
  for ((k = 0; k < n; ++k)); do
    i=$(((k + round) % n))
    timed "${names[$i]}" "${commands[$i]}"
  done
done
