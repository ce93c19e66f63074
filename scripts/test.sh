#!/usr/bin/env bash
# The README's test command: installs what is missing (scripts/setup.sh), builds the wasm filter,
# then runs every suite in scripts/test.d/ in name order. Each suite prints its own runner summary.
# Usage: scripts/test.sh [SUITE-NAME-SUBSTRING...]   (no argument: all suites)
set -euo pipefail
cd "$(dirname "$0")/.."
suites=$(for f in scripts/test.d/*.sh; do basename "$f" .sh; done)
case "${1:-}" in
  -h|--help)
    sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'
    echo "suites:" $suites
    exit 0 ;;
esac
# A name that matches no suite is a mistake, not a pass: say so before installing anything.
for want in "$@"; do
  case "$want" in -*) echo "unknown option: $want (see scripts/test.sh --help)" >&2; exit 2 ;; esac
  found=0; for name in $suites; do case "$name" in *"$want"*) found=1 ;; esac; done
  if [ $found = 0 ]; then
    echo "no suite matches '$want'; suites:" $suites >&2
    exit 2
  fi
done
export WARMPATH_TOOLS="${WARMPATH_TOOLS:-$HOME/.cache/warmpath/tools}"
export PATH="$WARMPATH_TOOLS/bin:$PWD/.venv/bin:$PATH"
scripts/setup.sh
failed=()
for suite in scripts/test.d/*.sh; do
  name=$(basename "$suite" .sh)
  if [ $# -gt 0 ]; then
    match=0; for want in "$@"; do case "$name" in *"$want"*) match=1 ;; esac; done
    [ $match = 1 ] || continue
  fi
  echo "=== suite $name ===" >&2
  start=$(date +%s)
  if bash "$suite"; then
    echo "=== suite $name passed in $(( $(date +%s) - start )) s ===" >&2
  else
    echo "=== suite $name FAILED in $(( $(date +%s) - start )) s ===" >&2
    failed+=("$name")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed suites: ${failed[*]}" >&2
  exit 1
fi
echo "all suites passed" >&2
