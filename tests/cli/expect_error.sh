#!/usr/bin/env bash
# Usage: expect_error.sh STATUS REGEX COMMAND [ARGS...]
# Passes when COMMAND exits with STATUS (a reported error, not a crash: 78 for a wrong configuration,
# 1 for other failures) and its output matches REGEX.
expected=$1 regex=$2
shift 2
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [ "$status" -ne "$expected" ]; then
  echo "expect_error: exit status was $status, expected $expected"
  exit 1
fi
if ! grep -Eq -- "$regex" <<<"$output"; then
  echo "expect_error: output does not match: $regex"
  exit 1
fi
