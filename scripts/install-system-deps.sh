#!/usr/bin/env bash
# Installs the Debian packages the test suite needs, when they are missing.
set -euo pipefail

missing=()
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)

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
