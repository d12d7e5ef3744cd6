#!/usr/bin/env bash
# Installs the Debian packages that tests use for real, when they are missing:
#   prometheus  the dashboard test (tests/observability) runs Prometheus and queries every panel;
#               its promtool checks the scrape configs and unit-tests the alert rules (test_alerts.py)
#   chromium    the report test (tests/report) renders the HTML run report headless
#   g++         torch.compile's CPU backend builds its kernels with it (train.compile_blocks:
#               tests/models/test_regional_compile.py and the bench's compiled-update probe)
# Idempotent and quiet: nothing happens when every binary is already on PATH. Needs root and
# apt-get (Debian/Ubuntu); otherwise it says what to install and exits 0, and those tests skip
# with a message naming the missing binary.
set -euo pipefail

declare -A package_of=([prometheus]=prometheus [promtool]=prometheus [chromium]=chromium [g++]=g++)
missing=()
for binary in prometheus promtool chromium g++; do
  package=${package_of[$binary]}
  command -v "$binary" >/dev/null 2>&1 || [[ " ${missing[*]} " == *" $package "* ]] || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-system: not root or no apt-get; install ${missing[*]} yourself (their tests skip until then)" >&2
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# The package lists may be absent (slim images) or stale; one update before installing.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
# Debian's prometheus package starts a system service where an init system runs; the tests start
# their own instance on another port and never use it.
echo "setup-system: installed ${missing[*]}"
