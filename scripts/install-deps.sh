#!/usr/bin/env bash
# Installs the Debian packages mmrt builds and tests against; a no-op when they are present.
# Run as root on Debian 12. Everything mmrt links is a Debian package: nothing is vendored.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config
  libinih-dev          # deploy.ini
  libcmocka-dev        # unit tests
  libjansson-dev       # config.json, tokenizer.json, safetensors headers, API bodies
  libpcre2-dev         # byte-level BPE pre-tokenizer regexes
  libutf8proc-dev      # Unicode normalization (NFC) for tokenizers
  libspng-dev zlib1g-dev libjpeg62-turbo-dev   # images
  libmicrohttpd-dev    # mmrt serve: HTTP (epoll thread pool, suspended connections)
  nettle-dev           # SHA-256: the vision-feature cache's image keys
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo   # OpenCL plugin (PoCL runs it on the CPU)
)
# Not installed here, since CI does not fuzz: `clang libclang-rt-14-dev` (the latter holds the
# libFuzzer runtime) build the fuzz targets of tests/fuzz with
# cmake -DCMAKE_C_COMPILER=clang -DMMRT_FUZZ=ON (see tests/fuzz/CMakeLists.txt).

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
