#!/usr/bin/env bash
# Builds llama.cpp once, from the `llama-cpp-python==0.3.36` sdist on PyPI (its vendored
# llama.cpp), and prints the folder of its binaries (llama-bench, llama-perplexity,
# llama-completion). The benchmark scripts share it.
#   native  the best build for this CPU (GGML_NATIVE=ON; on a CPU with AMX-INT8 its AMX path, with
#           the one-line compiler barrier gcc 12 needs before `_tile_loadconfig`,
#           ../shared/docs/baselines.md), in ~/.cache/onebit-models/llama.cpp-native
#   avx512  AVX-512 (F/BW/VL/VBMI/VNNI/BF16) without AMX, for comparing without AMX on both
#           sides on a CPU that has it (ours then runs with ONEBIT_KERNELS=avx512; baselines.md),
#           in ~/.cache/onebit-models/llama.cpp-avx512
#   avx2    AVX2 + FMA, no AVX-512 or AMX, in ~/.cache/onebit-models/llama.cpp
# usage: scripts/llama-cpp.sh native|avx512|avx2
set -euo pipefail
cache="$HOME/.cache/onebit-models"
case "${1:-}" in
  native) src="$cache/llama.cpp-native"
          flags=(-DGGML_NATIVE=ON) ;;
  avx512) src="$cache/llama.cpp-avx512"
          flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                 -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
                 -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF) ;;
  avx2)   src="$cache/llama.cpp"
          flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF) ;;
  *) echo "usage: $0 native|avx512|avx2" >&2; exit 2 ;;
esac
bin="$src/build/bin"
if [ ! -x "$bin/llama-bench" ]; then
  mkdir -p "$cache"
  python3 -m pip install -q cmake ninja >&2
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary llama-cpp-python -d "$tmp" "llama-cpp-python==0.3.36" >&2
  tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  rm -rf "$src" && mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$src"
  mmq="$src/ggml/src/ggml-cpu/amx/mmq.cpp"
  if [ "$1" = native ] && grep -qw amx_int8 /proc/cpuinfo &&
    ! grep -q '__asm__ __volatile__("" : : "m"(tc));' "$mmq"; then
    # gcc 12 drops the stores that fill the tile configuration (baselines.md).
    sed -i 's/^\(\s*\)_tile_loadconfig(&tc);/\1__asm__ __volatile__("" : : "m"(tc));\n\1_tile_loadconfig(\&tc);/' "$mmq"
  fi
  cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${flags[@]}" \
    -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
  cmake --build "$src/build" -j "$(nproc)" --target llama-bench llama-perplexity llama-completion >&2
fi
echo "$bin"
