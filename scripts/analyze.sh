#!/usr/bin/env bash
# Runs the clang static analyzer (scan-build) over a Debug build of everything but the CUDA
# plugin (nvcc's sources are not C the analyzer reads) and compares its reports with the
# reviewed ones in scripts/analyze-reviewed.txt. Prints each report as
# "file|function|bug type" and exits 1 when one is not in that list: a new report is read
# (the HTML report's path says how the analyzer got there) and either fixed or, when the
# path is impossible, added to the list with the reason.
#
#   bash scripts/analyze.sh [BUILD_DIR]      (default build-analyze; about 6 minutes on 2 cores)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$here/build-analyze}
out="$dir/reports"
# Installs what is missing first, as scripts/install-deps.sh does for the build.
if ! command -v scan-build > /dev/null || ! command -v clang > /dev/null; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang clang-tools
fi
bash "$here/scripts/install-deps.sh"
mkdir -p "$dir"
rm -rf "$out"
# scan-build's configure records its own compiler wrapper (which runs the analyzer, then
# --use-cc); a CMAKE_C_COMPILER given here would bypass it and find nothing.
scan-build -o "$out" cmake -S "$here" -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DMMRT_WITH_CUDA=OFF \
  > "$dir/analyze-configure.log" 2>&1 || { cat "$dir/analyze-configure.log" >&2; exit 2; }
scan-build -o "$out" --use-cc=clang cmake --build "$dir" --clean-first -j "$(nproc)" \
  > "$dir/analyze-build.log" 2>&1 || { tail -30 "$dir/analyze-build.log" >&2; exit 2; }

field() { sed -n "s|^<!-- $1 \(.*\) -->\$|\1|p" "$2" | head -1; }
found=$(mktemp)
trap 'rm -f "$found"' EXIT
for f in "$out"/*/report-*.html; do
  [ -e "$f" ] || continue
  file=$(field BUGFILE "$f")
  echo "${file#"$here"/}|$(field FUNCTIONNAME "$f")|$(field BUGTYPE "$f")|$f"
done | sort > "$found"

new=0
while IFS='|' read -r file fn type html; do
  if grep -qxF "$file|$fn|$type" <(grep -v '^#' "$here/scripts/analyze-reviewed.txt" | cut -d'|' -f1-3); then
    echo "reviewed  $file|$fn|$type"
  else
    echo "NEW       $file|$fn|$type  ($html)"
    new=$((new + 1))
  fi
done < "$found"
echo "analyze: $(wc -l < "$found") report(s), $new not reviewed"
[ "$new" -eq 0 ]
