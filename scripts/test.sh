#!/usr/bin/env bash
# The whole test suite. Installs what the cross-checks against independent implementations need
# (gguf-py, pyarrow, the openai and ollama clients, LangChain's OpenAI integration and Playwright from PyPI, s3s-fs from crates.io, the real Gemma 3 270M GGUF into the user cache), then runs every test,
# including the ones marked #[ignore] for needing them, and ends with one summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite builds everything once: incremental compilation's bookkeeping only costs here (it
# pays off on the edits of a working session, which cargo outside this script keeps).
export CARGO_INCREMENTAL=0
t_start=$SECONDS
# Each phase says what it does and how long it took (on stderr; the summary line is stdout's last).
step() { printf '== %s\n' "$1" >&2; t_step=$SECONDS; }
done_step() { printf '   done in %d s (%d s since the start)\n' $((SECONDS - t_step)) $((SECONDS - t_start)) >&2; }
step "installing the cross-checks' tools (PyPI, apt, crates.io) and the Gemma 3 270M GGUF"
python3 -m pip install -q --disable-pip-version-check numpy "gguf==0.19.0" huggingface_hub pyarrow "sentencepiece==0.2.3" protobuf "openai==3.57.0" "langchain-openai==1.8.1" "ollama==0.6.3" "playwright==1.65.3" >&2
# XRT (Debian's libxrt-dev) and libclang for the NPU feature (bindgen over the XRT shim) and for
# the check of our AXLF offsets against xclbin.h.
npu_deps="libxrt-dev uuid-dev libclang-dev"
if { [ ! -f /usr/include/xrt/xclbin.h ] || ! ls /usr/lib/llvm-*/lib/libclang*.so >/dev/null 2>&1; } &&
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q $npu_deps >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $npu_deps >&2; }; } ||
    echo "note: $npu_deps not installed: the NPU feature is not tested" >&2
fi
# Chromium (Debian's package) for the report's and the chat page's tests in a real headless
# browser (the chat page's through Playwright for Python, pointed at this Chromium).
if ! command -v chromium >/dev/null && [ -z "${ONEBIT_CHROMIUM:-}" ] &&
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >&2; }; } ||
    echo "note: chromium not installed: the report's browser test will fail" >&2
fi
# s3s-fs (crates.io): the S3-compatible server the shared-store tests start on 127.0.0.1. It
# builds in the background, beside the test build, and is waited for before the tests run. It is
# built unoptimized and without debug info: the tests move kilobytes through it, and that build
# takes 89 CPU-s against the release build's 209 (docs/benchmarks.md, "Building").
log=$(mktemp)
s3s_log=$(mktemp)
s3s_pid=
trap 'rm -f "$log" "$s3s_log"; [ -z "$s3s_pid" ] || kill "$s3s_pid" 2>/dev/null || true' EXIT
if ! command -v s3s-fs >/dev/null && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/s3s-fs" ]; then
  echo "   s3s-fs 0.14.1 building in the background" >&2
  CARGO_PROFILE_DEV_DEBUG=0 cargo install -q s3s-fs --version 0.14.1 --features binary --locked --debug \
    >"$s3s_log" 2>&1 &
  s3s_pid=$!
fi
ONEBIT_GEMMA_GGUF="$(scripts/fetch-gemma.sh)"
export ONEBIT_GEMMA_GGUF
done_step
# --lib --tests: unit and integration tests (the crates carry no doctests; the binary has no unit
# tests of its own, Cargo.toml).
#
# With XRT's headers installed, the build includes XRT's crate with its feature (xrt/: the C++
# shim compiled, bindgen's bindings, linked against libxrt_coreutil) and its tests run with the
# rest: the refusal without a device among them. Only that crate changes: the binary keeps its
# default features (its NPU code and every crate's lints with `--features npu` run in .ci/run).
# A phase of its own after the tests cost 34 s more on a fresh clone (docs/benchmarks.md).
features=()
if [ -f /usr/include/xrt/xrt/xrt_device.h ]; then
  features=(--features onebit-xrt/xrt)
fi
step "building the tests (a fresh clone compiles for about 14 minutes on 2 cores)"
cargo test --workspace --no-run --lib --tests "${features[@]}"
done_step
if [ -n "$s3s_pid" ]; then
  step "waiting for the s3s-fs build"
  wait "$s3s_pid" || { cat "$s3s_log" >&2; echo "error: cargo install s3s-fs failed" >&2; exit 1; }
  s3s_pid=
  done_step
fi
# cargo-nextest (on this project's machines; `cargo install cargo-nextest` elsewhere) schedules
# tests across all the test binaries at once instead of one binary after another: the same tests
# in 226 s against cargo test's 330 s (docs/benchmarks.md). Without it, cargo test runs them.
if cargo nextest --version >/dev/null 2>&1; then
  nextest=1
  run_tests() { cargo nextest run --no-fail-fast --run-ignored all "$@" 2>&1; }
else
  nextest=
  run_tests() { cargo test --no-fail-fast "$@" -- --include-ignored 2>&1; }
fi
step "running every test, the ones needing the tools above included"
run_tests --workspace --lib --tests "${features[@]}" | tee "$log"
done_step
# One line for both runners: cargo test's "test result: ok. 12 passed; 0 failed; ..." per binary,
# nextest's "Summary [ 226.1s] 315 tests run: 315 passed, 0 skipped" (", 2 failed" when some fail).
awk '/^test result:/ || /^ *Summary \[/ {
       for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "summary: %d passed, %d failed\n", p, f }' "$log"
