#!/usr/bin/env bash
# tests/install_test.sh BUILD_DIR SOURCE_DIR — mmrt installs like a library.
#
# Installs BUILD_DIR into a fresh temporary prefix (not the one it was configured for, so
# everything found must be found relative to the installed files), then:
#   1. the installed mmrt runs from there and lists the installed cpu plugin (RPATH and the
#      plugin folder relative to bin/, with no MMRT_PLUGIN_PATH);
#   2. examples/plugin builds from the installed headers alone with pkg-config, and again
#      with find_package(mmrt); neither build may link libmmrt;
#   3. the installed mmrt --list-devices loads the example plugin;
#   4. a program embedding libmmrt builds with pkg-config --libs and runs.
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d /tmp/mmrt-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
unset MMRT_PLUGIN_PATH
libdir=$(ls -d "$prefix"/lib*/pkgconfig | head -1)
libdir=${libdir%/pkgconfig}
for f in "$prefix/bin/mmrt" "$libdir/libmmrt.so" "$libdir/mmrt/libmmrt_cpu.so" \
         "$prefix/include/mmrt/mmrt.h" "$prefix/include/mmrt/plugin.h" \
         "$prefix/include/mmrt/common.h" "$prefix/include/mmrt/plugin_views.h" \
         "$prefix/include/mmrt/op_contract.h" \
         "$libdir/pkgconfig/mmrt.pc" "$libdir/cmake/mmrt/mmrtConfig.cmake"; do
  [ -e "$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done

# 1. the installed CLI and its plugins, from a prefix it was not configured for
out=$("$prefix/bin/mmrt" --list-devices 2>&1)
echo "$out" | grep -q "cpu" || { echo "FAIL: installed mmrt does not list cpu:"; echo "$out"; exit 1; }

# 2. the example plugin from the installed headers: pkg-config, then CMake
export PKG_CONFIG_PATH=$libdir/pkgconfig
cflags=$(pkg-config --cflags mmrt)
mkdir -p "$tmp/pc"
cc -std=c11 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden $cflags \
   "$src/examples/plugin/example_plugin.c" -o "$tmp/pc/libmmrt_example.so"
if readelf -d "$tmp/pc/libmmrt_example.so" | grep -q "libmmrt\.so"; then
  echo "FAIL: the example plugin links libmmrt"; exit 1
fi
# the shared checks a vendor plugin is advised to use compile from the installed tree alone
printf '#include "mmrt/op_contract.h"\nint main(void) { return mmrt_op_check(-1, 0, 0, 0, 0, 0, 0, 0) == MMRT_OK; }\n' \
  > "$tmp/contract.c"
cc -std=c11 -Wall -Wextra -Werror $cflags "$tmp/contract.c" -o "$tmp/contract" -lm ||
  { echo "FAIL: mmrt/op_contract.h does not compile from the installed headers"; exit 1; }
cmake -S "$src/examples/plugin" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >/dev/null
cmake --build "$tmp/cm" >/dev/null
[ -f "$tmp/cm/libmmrt_example.so" ] || { echo "FAIL: find_package(mmrt) build"; exit 1; }

# 3. loaded by the installed mmrt
for d in "$tmp/pc" "$tmp/cm"; do
  out=$(MMRT_PLUGIN_PATH=$d "$prefix/bin/mmrt" --list-devices 2>&1)
  echo "$out" | grep -q "example" || { echo "FAIL: example plugin from $d not listed:"; echo "$out"; exit 1; }
done

# 4. an embedder, linked with pkg-config --libs against the installed libmmrt
cat > "$tmp/embed.c" <<'C'
#include <stdio.h>
#include "mmrt/mmrt.h"
int main(void)
{
    printf("mmrt %s\n", mmrt_version());
    return 0;
}
C
cc -std=c11 -Wall -Wextra -Werror $cflags "$tmp/embed.c" -o "$tmp/embed" $(pkg-config --libs mmrt) \
   -Wl,-rpath,"$libdir"
"$tmp/embed" | grep -q "^mmrt " || { echo "FAIL: the embedding program"; exit 1; }
echo "install test: prefix $prefix, example plugin built with pkg-config and find_package, listed"
