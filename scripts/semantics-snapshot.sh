#!/usr/bin/env bash
# Prints `onebit-pipe semantics` (text and --json, with the exit status and any refusal) for every
# fixture folder holding a config.json, in a fixed order. With --mutants it also prints every
# variant of each config with one key removed (top level or text_config), which walks each
# family's defaults and refusals. Two binaries' snapshots compared with `diff` show whether a
# change to the semantics moved any decision:
#
#   scripts/semantics-snapshot.sh --mutants OLD_BINARY > before.txt
#   scripts/semantics-snapshot.sh --mutants NEW_BINARY > after.txt
#   diff before.txt after.txt && echo identical
set -uo pipefail
mutants=0
if [ "${1:-}" = --mutants ]; then
  mutants=1
  shift
fi
bin=$(realpath "${1:?usage: semantics-snapshot.sh [--mutants] ONEBIT_PIPE_BINARY [FIXTURE_ROOT...]}")
shift
cd "$(dirname "$0")/.."
roots=("$@")
[ ${#roots[@]} -gt 0 ] || roots=(tests/fixtures)

show() {
  echo "== $1"
  out=$("$bin" semantics "$2" 2>&1)
  echo "exit $?"
  printf '%s\n' "$out" | sed "s#$2#<DIR>#g"
  echo "-- json"
  out=$("$bin" --json semantics "$2" 2>&1)
  echo "exit $?"
  printf '%s\n' "$out" | sed "s#$2#<DIR>#g"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/variants.py" <<'PY'
import json, os, shutil, sys
src, work = sys.argv[1], sys.argv[2]
cfg = json.load(open(os.path.join(src, "config.json")))
keys = [k for k in cfg] + [f"text_config.{k}" for k in (cfg.get("text_config") or {})]
os.makedirs(os.path.join(work, "variants"), exist_ok=True)
for i, key in enumerate(keys):
    c = json.loads(json.dumps(cfg))
    if key.startswith("text_config.") and key not in cfg:
        del c["text_config"][key.split(".", 1)[1]]
    else:
        del c[key]
    json.dump(c, open(os.path.join(work, "variants", f"{i}.json"), "w"))
    print(i, key)
PY
find "${roots[@]}" -name config.json -printf '%h\n' | LC_ALL=C sort -u | while read -r dir; do
  show "$dir" "$dir"
  [ "$mutants" = 1 ] || continue
  # One variant per removed key: the side files are copied, config.json loses the key.
  python3 "$work/variants.py" "$dir" "$work" | while read -r i key; do
    rm -rf "$work/m" && cp -r "$dir" "$work/m" && cp "$work/variants/$i.json" "$work/m/config.json"
    show "$dir -$key" "$work/m"
  done
done
