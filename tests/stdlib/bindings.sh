#!/usr/bin/env bash
# Which library a program's C++ standard library symbols bind to at run time.
#
#   bindings.sh expect-none PROGRAM   passes when none of PROGRAM's std:: symbols that the C++
#                                     standard library (libstdc++.so.6) defines bind into LibTorch
#   bindings.sh expect-some PROGRAM   the control: passes when some do (the check can see them)
#
# PyPI's torch wheels export a statically linked copy of parts of libstdc++ (std::filesystem among
# them) from libtorch_cpu.so; a program that binds to those mixes two libstdc++ versions. Exits 77
# (a CTest skip) when this LibTorch exports none of libstdc++'s symbols: nothing can bind there.
set -uo pipefail
mode=$1 program=$(readlink -f "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

libs=$(ldd "$program") || { echo "ldd cannot read $program" >&2; exit 1; }
stdcxx=$(awk '/libstdc\+\+\.so/ {print $3; exit}' <<<"$libs")
torch_libs=$(awk '/lib(torch|c10)[a-z_]*\.so/ {print $3}' <<<"$libs")
if [ -z "$stdcxx" ] || [ -z "$torch_libs" ]; then
  echo "$program does not load both libstdc++ and LibTorch:" >&2; echo "$libs" >&2; exit 1
fi

# The std:: symbols (mangled _ZSt..., _ZNSt..., _ZNKSt...) libstdc++ defines, those LibTorch exports
# too, and those of them the program needs.
nm -D --defined-only "$stdcxx" | awk '{print $NF}' | grep -E '^_Z(N[KVRO]*)?St' | sed 's/@.*//' | sort -u >"$work/stdcxx"
for lib in $torch_libs; do nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//'; done | sort -u |
  comm -12 - "$work/stdcxx" >"$work/both"
nm -D --undefined-only "$program" | awk '{print $NF}' | sed 's/@.*//' | sort -u | comm -12 - "$work/both" >"$work/at_risk"
if [ ! -s "$work/both" ]; then
  echo "skipped: this LibTorch exports none of libstdc++'s std:: symbols; nothing can bind there"
  exit 77
fi
if [ ! -s "$work/at_risk" ]; then
  # A toolchain whose libstdc++ is a static archive only: the program carries its own std:: code.
  if [ "$mode" = expect-none ]; then
    echo "ok: $(basename "$program") leaves none of the $(wc -l <"$work/both") std:: symbols LibTorch exports to the dynamic linker (its libstdc++ is linked in)"
    exit 0
  fi
  echo "skipped: $(basename "$program") needs none of the $(wc -l <"$work/both") std:: symbols LibTorch exports; the control cannot show the hazard"
  exit 77
fi
echo "LibTorch exports $(wc -l <"$work/both") of libstdc++'s std:: symbols, $(wc -l <"$work/at_risk") of them used by $(basename "$program")"

# Every binding the dynamic linker makes for the program itself, resolved eagerly.
# The bindings are all made (and logged) before main runs, so the control is judged by them even
# when the hazard it shows crashes it (it does where LibTorch's copy and libstdc++ disagree).
LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT="$work/ld" "$program" "$work/run" >"$work/out" 2>&1
status=$?
if [ $status -ne 0 ] && [ "$mode" = expect-none ]; then
  echo "$program failed (status $status):" >&2; cat "$work/out" >&2; exit 1
fi
cat "$work"/ld.* | grep -F "binding file $program [0] to " |
  sed -nE 's/.* to ([^ ]+) \[[0-9]+\]: normal symbol `([^'"'"']+)'"'"'.*/\1 \2/p' |
  grep -E '/lib(torch|c10)[a-z_]*\.so[^ ]* ' | sort -u >"$work/into_torch" || true
awk '{print $2}' "$work/into_torch" | sort -u | comm -12 - "$work/stdcxx" >"$work/wrong"
wrong=$(wc -l <"$work/wrong")

case $mode in
  expect-none)
    if [ "$wrong" -gt 0 ]; then
      echo "FAIL: $wrong of $program's C++ standard library symbols bind into LibTorch instead of $stdcxx:"
      head -n 20 "$work/wrong" | c++filt | sed 's/^/  /'
      exit 1
    fi
    echo "ok: every std:: symbol of $(basename "$program") that libstdc++ defines binds to $stdcxx" ;;
  expect-some)
    if [ "$wrong" -eq 0 ]; then
      echo "FAIL: the control program bound none of its std:: symbols into LibTorch; the check cannot see the hazard"
      exit 1
    fi
    [ $status -ne 0 ] && echo "(the control program failed with status $status, as mixing the two copies can make it)"
    echo "ok: without dettrial's link order, $wrong std:: symbols bind into LibTorch, e.g.:"
    head -n 5 "$work/wrong" | c++filt | sed 's/^/  /' ;;
  *) echo "usage: bindings.sh expect-none|expect-some PROGRAM" >&2; exit 2 ;;
esac
