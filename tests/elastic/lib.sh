# Sourced by the elastic test scripts after they set `work` (their work folder): an empty `work`,
# `fail MESSAGE` (prints it under the script's name, exits 1) and `run NAME EXPECTED_STATUS
# COMMAND...` (runs COMMAND with its output in $work/NAME.log; fails, showing the log, on another
# exit status).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fail() { echo "$(basename "$0" .sh): $*"; exit 1; }
rm -rf "$work"
mkdir -p "$work"
run() {
  local name=$1 expected=$2
  shift 2
  "$@" >"$work/$name.log" 2>&1
  local status=$?
  [ "$status" -eq "$expected" ] || { cat "$work/$name.log"; fail "$name exited with $status, expected $expected"; }
}
