#!/usr/bin/env bash
# Installs what is missing, builds, and runs mmrt on the built-in default deployment.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bash "$here/scripts/install-deps.sh"
bash "$here/scripts/build.sh" "$here/build"
exec "$here/build/bin/mmrt" --conf "$here/conf/demo.ini" "$@"
