#!/usr/bin/env bash
# Usage: expect_error.sh REGEX COMMAND [ARGS...]
# Passes when COMMAND exits with status 1 (a reported error, not a crash) and its output matches REGEX.
regex=$1
shift
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [ "$status" -ne 1 ]; then
  echo "expect_error: exit status was $status, expected 1"
  exit 1
fi
if ! grep -Eq -- "$regex" <<<"$output"; then
  echo "expect_error: output does not match: $regex"
  exit 1
fi
