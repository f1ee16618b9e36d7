#!/usr/bin/env bash
# The host runtime against llama.cpp's best build on this machine, side by side on the same GGUF:
# prefill and decode tokens/s at each thread count, decode at the same depth on both sides, the
# rounds alternated, and each side's decode as a fraction of the machine's read bandwidth.
#
# Models: the Gemma 3 270M demo pack (its Q4_K_M GGUF as llama.cpp's side), the Hunyuan-1.8B
# shape (Q40_4608 tiles) and the Qwen3-1.7B shape (Q41_5120 tiles), both random Q4_0 weights from
# scripts/random-gguf.py converted by `onebit-pipe convert`.
#
# llama.cpp's best build for this CPU (../shared/docs/baselines.md), by `scripts/llama-cpp.sh
# native`: GGML_NATIVE=ON; on a CPU with AMX-INT8 its AMX path, with the one-line compiler barrier
# gcc 12 needs before `_tile_loadconfig`. Built once into ~/.cache/onebit-models/llama.cpp-native.
# ONEBIT_BENCH_LLAMA=avx512 compares without AMX on both sides on a CPU that has it: llama.cpp's
# AVX-512 build without AMX (`scripts/llama-cpp.sh avx512`) against ours with
# ONEBIT_KERNELS=avx512.
#
# Each round is a row; at the end one table of medians for this CPU kind, headed by the CPU, both
# sides' paths and the measured read bandwidth; ONEBIT_BENCH_DOC=1 appends that table to
# docs/benchmarks.md ("Host speed per CPU kind").
#
# usage: scripts/bench-host.sh [ROUNDS] [THREADS...]     (defaults: 3 rounds, threads 1 2)
# env:   ONEBIT_BENCH_MODELS="gemma hunyuan qwen3"   ONEBIT_BENCH_LLAMA=native|avx512
#        ONEBIT_BENCH_PROMPTS="128 300 1024 4096" (prompt lengths, each model's own default when
#        unset)   ONEBIT_KERNELS=avx2 (our path, to compare paths)   ONEBIT_BENCH_DOC=1
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
threads=("$@")
[ ${#threads[@]} -gt 0 ] || threads=(1 2)
models=${ONEBIT_BENCH_MODELS:-gemma hunyuan qwen3}
build=${ONEBIT_BENCH_LLAMA:-native}
cache="$HOME/.cache/onebit-models"
mkdir -p "$cache"

cargo build --release --quiet --bin onebit-pipe
bin=target/release/onebit-pipe

flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n')
has() { grep -qx "$1" <<<"$flags"; }
cpu_features=$(for f in avx2 fma avx_vnni avx512f avx512bw avx512_vnni avx512vbmi avx512_bf16 amx_tile amx_int8; do has "$f" && printf '%s ' "$f"; done)
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; features: $cpu_features"

# llama.cpp's best build, or its AVX-512 build without AMX beside our AVX-512 path.
case $build in
  native) ll_src="$cache/llama.cpp-native"; ll_features="GGML_NATIVE=ON, -march=native" ;;
  avx512) ll_src="$cache/llama.cpp-avx512"; ll_features="AVX-512 F/BW/VL/VBMI/VNNI/BF16, no AMX"
          export ONEBIT_KERNELS=avx512 ;;
  *) echo "ONEBIT_BENCH_LLAMA: native or avx512" >&2; exit 2 ;;
esac
ll=$(scripts/llama-cpp.sh "$build")
echo "llama.cpp: $ll_src ($ll_features)"

bw=$(cargo bench -q -p onebit-kernels --bench bandwidth 2>/dev/null | grep read_bandwidth || true)
echo "$bw"
bw_at() { sed -n "s/^read_bandwidth threads=$1 gb_per_s=//p" <<<"$bw"; }

# The models: name, our source arguments, GGUF, prompt.
declare -A src gguf tokens
# Prompt lengths as the issue measured them: 300 tokens on Gemma, 128 on the Hunyuan shape. Both
# sides get exactly that many tokens (ours through `generate --ids`; llama-bench's prompt is
# random tokens): llama.cpp's AMX prefill is much faster at a multiple of 32 tokens (Hunyuan:
# 135 tok/s at 128 tokens, 74 at 135).
tokens=([gemma]=${ONEBIT_BENCH_GEMMA_TOKENS:-300} [hunyuan]=${ONEBIT_BENCH_HUNYUAN_TOKENS:-128} [qwen3]=128)
for m in $models; do
  case $m in
    gemma)
      gguf[gemma]=$(scripts/fetch-gemma.sh)
      mirror="${ONEBIT_DEMO_MIRROR:-$cache/mirror}"
      [ -f "$mirror/FastFlowLM/Gemma3-270M-NPU2/model.q4nx" ] || scripts/demo.sh >&2
      src[gemma]="--repo FastFlowLM/Gemma3-270M-NPU2 --endpoint $mirror --reference ${gguf[gemma]}"
      ;;
    hunyuan | qwen3)
      case $m in
        hunyuan) name=Hunyuan-1.8B; config=hunyuan/Hunyuan-1.8B-Instruct ;;
        qwen3) name=Qwen3-1.7B; config=qwen/Qwen3-1.7B ;;
      esac
      g="$cache/real-size/$name-q4_0.gguf"
      repo="$cache/real-size/$name"
      mkdir -p "$cache/real-size"
      [ -f "$g" ] || python3 scripts/random-gguf.py "tests/fixtures/configs/$config/config.json" --out "$g" >&2
      [ -f "$repo/model.q4nx" ] || "$bin" -q convert --gguf "$g" --out "$repo" >&2
      gguf[$m]=$g
      src[$m]="--path $repo --reference $g"
      ;;
    *) echo "unknown model $m (gemma, hunyuan, qwen3)" >&2; exit 2 ;;
  esac
  # shellcheck disable=SC2086
  "$bin" -q run ${src[$m]} >&2
  amx=$("$ll/llama-bench" -m "${gguf[$m]}" -p 16 -n 0 -r 1 -v 2>&1 | sed -n 's/.*AMX model buffer size = *//p' | head -1)
  echo "llama.cpp on $m: ${amx:+AMX tiles for $amx of weights, }the rest on its AVX-512/AVX2 kernels"
done

ours() { # model threads prompt_tokens → one JSON line
  ids=$(python3 -c "import sys; n=int(sys.argv[1]); print([2] + [1000 + (i * 7919) % 20000 for i in range(n - 1)])" "$3")
  # shellcheck disable=SC2086
  "$bin" -q --json generate ${src[$1]} --ids "$ids" --max-tokens 64 --temperature 0 \
    --ctx-size $(($3 + 128)) -t "$2" | tail -1
}
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
theirs() { # model threads prompt_tokens → "prefill decode"
  "$ll/llama-bench" -m "${gguf[$1]}" -t "$2" -p "$3" -n 0 -r 1 -o json 2>/dev/null |
    python3 -c "import json,sys; print(f\"{json.load(sys.stdin)[0]['avg_ts']:.1f}\")"
}
theirs_decode() { # model threads depth
  "$ll/llama-bench" -m "${gguf[$1]}" -t "$2" -p 0 -n 64 -d "$3" -r 1 -o json 2>/dev/null |
    python3 -c "import json,sys; print(f\"{json.load(sys.stdin)[0]['avg_ts']:.1f}\")"
}
gguf_bytes() { # bytes llama.cpp reads per decoded token: every tensor but the token embedding,
  # which it reads whole only as the head of a tied model (one row otherwise)
  python3 - "$1" <<'EOF'
import sys
import gguf
ts = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(sys.argv[1]).tensors}
emb = ts.pop("token_embd.weight", 0)
print(sum(ts.values()) + (emb if "output.weight" not in ts else 0))
EOF
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
echo
echo "| model | threads | round | ours prefill tok/s | llama.cpp prefill tok/s | ours decode tok/s | llama.cpp decode tok/s (same depth) | ours GB/token | llama.cpp GB/token | ours % of bandwidth | llama.cpp % of bandwidth |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for m in $models; do
  ll_bytes=$(gguf_bytes "${gguf[$m]}")
  for t in "${threads[@]}"; do
    b=$(bw_at "$t"); b=${b:-0}
    for p in ${ONEBIT_BENCH_PROMPTS:-${tokens[$m]}}; do
    for r in $(seq 1 "$rounds"); do
      j=$(ours "$m" "$t" "$p")
      n=$(field "$j" prompt_tokens)
      op=$(field "$j" prefill_tokens_per_s); od=$(field "$j" decode_tokens_per_s)
      ob=$(field "$j" decode_weight_bytes_per_token); path=$(field "$j" kernel)
      lp=$(theirs "$m" "$t" "$n")
      ld=$(theirs_decode "$m" "$t" "$n")
      python3 - "$m" "$t" "$r" "$op" "$lp" "$od" "$ld" "$ob" "$ll_bytes" "$b" "$path" "$n" "$results" <<'EOF'
import json, sys
m, t, r, op, lp, od, ld, ob, lb, bw, path, n, results = sys.argv[1:]
op, lp, od, ld, ob, lb, bw = map(float, (op, lp, od, ld, ob, lb, bw))
with open(results, "a") as f:
    f.write(json.dumps(dict(m=m, t=int(t), n=int(n), path=path, op=op, lp=lp, od=od, ld=ld, ob=ob, lb=lb, bw=bw)) + "\n")
frac = lambda tps, b: f"{100 * tps * b / 1e9 / bw:.0f} %" if bw else "?"
print(f"| {m} ({n}-token prompt; ours {path}) | {t} | {r} | {op:.1f} | {lp:.1f} ({op / lp:.2f}×) | {od:.1f} | {ld:.1f} ({od / ld:.2f}×) "
      f"| {ob / 1e9:.3f} | {lb / 1e9:.3f} | {frac(od, ob)} | {frac(ld, lb)} |")
EOF
    done
    done
  done
done

# One table of medians for this CPU kind.
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores ($cpu_features)"
table=$(python3 - "$results" "$cpu" "$ll_features" "$rounds" "$bw" <<'EOF'
import json, statistics, sys
results, cpu, ll, rounds, bw = sys.argv[1:]
rows = [json.loads(l) for l in open(results)]
bws = [l.split() for l in bw.splitlines() if l.startswith("read_bandwidth")]
bws = ", ".join(f"{w[2].split('=')[1]} GB/s at {w[1].split('=')[1]} thread(s)" for w in bws)
ours = sorted({r["path"] for r in rows})
print(f"#### {cpu}\n")
print(f"Ours: {', '.join(ours)}; llama.cpp: {ll}. Read bandwidth: {bws or 'not measured'}. "
      f"Medians of {rounds} alternated rounds, `scripts/bench-host.sh`.\n")
print("| model | prompt tokens | threads | prefill tok/s: ours / llama.cpp | ratio | decode tok/s at that depth: ours / llama.cpp | ratio | decode, % of read bandwidth: ours / llama.cpp |")
print("|---|---|---|---|---|---|---|---|")
keys = []
for r in rows:
    k = (r["m"], r["n"], r["t"])
    if k not in keys:
        keys.append(k)
for k in keys:
    g = [r for r in rows if (r["m"], r["n"], r["t"]) == k]
    med = lambda f: statistics.median(r[f] for r in g)
    op, lp, od, ld = med("op"), med("lp"), med("od"), med("ld")
    b = g[0]["bw"]
    frac = lambda tps, by: f"{100 * tps * by / 1e9 / b:.0f} %" if b else "?"
    print(f"| {k[0]} | {k[1]} | {k[2]} | {op:.1f} / {lp:.1f} | {op / lp:.2f}× | {od:.1f} / {ld:.1f} | {od / ld:.2f}× "
          f"| {frac(od, g[0]['ob'])} / {frac(ld, g[0]['lb'])} |")
EOF
)
echo
echo "$table"
if [ "${ONEBIT_BENCH_DOC:-0}" = 1 ]; then
  doc=docs/benchmarks.md
  grep -q '^### Host speed per CPU kind' "$doc" ||
    printf '\n### Host speed per CPU kind (`scripts/bench-host.sh`, `ONEBIT_BENCH_DOC=1`)\n' >> "$doc"
  printf '\n%s\n' "$table" >> "$doc"
  echo "appended to $doc" >&2
fi
