#!/usr/bin/env bash
# requires.sh PATH WHAT -- COMMAND...
# Runs COMMAND when PATH exists; otherwise says what is missing and exits 77, which the tests that
# use it declare as CTest's SKIP_RETURN_CODE: a test without its data is reported skipped, not passed.
set -u
path=$1 what=$2
shift 2
[ "${1:-}" = "--" ] && shift
if [ ! -e "$path" ]; then
  echo "skipped: $what is absent ($path)"
  exit 77
fi
exec "$@"
