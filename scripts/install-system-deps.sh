#!/usr/bin/env bash
# Installs the Debian packages the test suite needs (PostgreSQL, Chromium and its driver),
# when they are missing.
set -euo pipefail

missing=()
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
# The dashboard's browser test drives Chromium through its WebDriver.
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-system-deps: missing ${missing[*]}; run 'sudo apt-get install ${missing[*]}' (tests that need them are skipped)" >&2
    exit 0
fi
echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
