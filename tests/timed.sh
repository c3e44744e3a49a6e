#!/usr/bin/env bash
# One stream of make test or .ci/run, timed for tests/suite_time.py: its name, start, end and exit status
# appended to test-artifacts/streams.tsv, and TEST_STREAM=NAME in its environment (conftest tags its tests).
#   tests/timed.sh NAME COMMAND...             run COMMAND; exit with its status
#   tests/timed.sh --record NAME START STATUS  record a stream that began at START (date +%s.%N) and ends now
set -uo pipefail
streams="$(cd "$(dirname "$0")/.." && pwd)/test-artifacts/streams.tsv"
mkdir -p "$(dirname "$streams")"
if [ "${1:-}" = "--record" ]; then
    printf '%s\t%s\t%s\t%s\n' "$2" "$3" "$(date +%s.%N)" "$4" >>"$streams"
    exit 0
fi
name=$1; shift
start=$(date +%s.%N)
TEST_STREAM=$name "$@"
status=$?
printf '%s\t%s\t%s\t%s\n' "$name" "$start" "$(date +%s.%N)" "$status" >>"$streams"
exit "$status"
