#!/usr/bin/env bash
# fuzz/seed.sh CORPUS — fills CORPUS/<target>/ with seed inputs: the
# project's examples/ and the shared fixtures ($FUZZ_FIXTURES, default
# ../shared/fixtures), plus the hand-made seeds of fuzz/seeds/<target>/.
# Files are copied under a name made of their content hash, so rerunning
# adds nothing twice and keeps what libFuzzer found before.
set -eu -o pipefail
corpus=$1
fixtures=${FUZZ_FIXTURES:-../shared/fixtures}
[ -d "$fixtures" ] || { echo "seed: no fixtures at $fixtures (set COZYGPU_FIXTURES); seeding from the tree only" >&2; fixtures=; }

add() { # add TARGET FILE...
  local t=$1 f h
  shift
  mkdir -p "$corpus/$t"
  for f in "$@"; do
    [ -f "$f" ] || continue
    # libFuzzer's default -max_len follows the corpus; keep seeds small
    [ "$(stat -c %s "$f")" -le 65536 ] || continue
    h=$(sha1sum "$f" | cut -c1-40)
    [ -e "$corpus/$t/$h" ] || cp "$f" "$corpus/$t/$h"
  done
}
files() { # files DIR... -name PATTERN...: regular files, sorted
  local dirs=() 
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do [ -n "$1" ] && [ -d "$1" ] && dirs+=("$1"); shift; done
  shift
  [ ${#dirs[@]} -gt 0 ] || return 0
  find "${dirs[@]}" -type f \( "$@" \) | LC_ALL=C sort
}

yaml=$(files examples deploy "$fixtures" -- -name '*.yaml' -o -name '*.yml' -o -name '*.json')
json=$(files examples "$fixtures" -- -name '*.json')
reviews=$(files examples/reviews examples/policy-tests "${fixtures:+$fixtures/admission}" -- -name '*.yaml' -o -name '*.json')
catalogs=$(files "${fixtures:+$fixtures/sysfs/creatable_vgpu_types}" -- -name '*.txt')

add fuzz_yaml $yaml
add fuzz_json_lua $json
add fuzz_jsonload $json
add fuzz_luadecode $json fuzz/seeds/fuzz_luadecode/*
add fuzz_review $reviews
add fuzz_config examples/config.yaml deploy/*config*.yaml $(files examples -- -name '*.yaml')
add fuzz_kubeconfig fuzz/seeds/fuzz_kubeconfig/*
add fuzz_inventory fuzz/seeds/fuzz_inventory/* $catalogs
add fuzz_pattern fuzz/seeds/fuzz_pattern/*
for t in fuzz_yaml fuzz_json_lua fuzz_jsonload fuzz_review fuzz_config; do
  [ -d fuzz/seeds/$t ] && add $t fuzz/seeds/$t/*
done
for t in "$corpus"/*/; do echo "seed: $(basename "$t"): $(ls "$t" | wc -l) inputs"; done
