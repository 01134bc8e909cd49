#!/usr/bin/env bash
# Makes the virtual environment the server tests run in (.venv-test at the repository root)
# with the packages of tests/server/requirements.txt from PyPI; a no-op when it is there and
# current. Python is for tests and tools only: the runtime never needs it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv="$here/.venv-test"
req="$here/tests/server/requirements.txt"
stamp="$venv/.requirements"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  exit 0
fi
py=python3
if ! "$py" -m venv --help >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  py=/usr/bin/python3
fi
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
cp "$req" "$stamp"
echo "install-test-python: $venv ready"
