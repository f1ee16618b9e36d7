# Sourced by the serve benchmarks: the Gemma 3 270M demo pack imported (built by scripts/demo.sh
# when missing), and servers of it started on free ports and waited for.
#   serve_demo NAME [SERVE ARGS...]   starts a server in the background (its log in $demo_logs)
#   demo_addr NAME                    prints its HOST:PORT once /health says ready
# Sets: bin (the release binary), src (the pack's source arguments). Servers stop on exit.
cargo build --release --quiet
bin=target/release/onebit-pipe
demo_gguf=$(scripts/fetch-gemma.sh)
demo_mirror="${ONEBIT_DEMO_MIRROR:-$HOME/.cache/onebit-models/mirror}"
demo_repo=FastFlowLM/Gemma3-270M-NPU2
[ -f "$demo_mirror/$demo_repo/model.q4nx" ] || scripts/demo.sh >&2
src=(--repo "$demo_repo" --endpoint "$demo_mirror" --reference "$demo_gguf")
"$bin" -q run "${src[@]}" >&2
demo_logs=$(mktemp -d)
demo_pids=()
trap 'kill "${demo_pids[@]}" 2>/dev/null || true; rm -rf "$demo_logs"' EXIT
serve_demo() {
  local name=$1
  shift
  "$bin" serve "${src[@]}" --port 0 "$@" 2>"$demo_logs/$name.log" &
  demo_pids+=($!)
}
demo_addr() {
  local a
  for _ in $(seq 600); do
    a=$(grep -o 'listening on http://[^ ]*' "$demo_logs/$1.log" | sed 's|listening on http://||') || true
    if [ -n "$a" ] && curl -sf "http://$a/health" >/dev/null; then
      echo "$a"
      return
    fi
    sleep 0.2
  done
  echo "the $1 server did not come up: $(cat "$demo_logs/$1.log")" >&2
  exit 2
}
