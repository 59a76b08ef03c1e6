#!/usr/bin/env bash
# Self-test of tests/check_layering.py: runs it on small fake trees, one with
# planted layering violations and one without, and checks what it reports.
# Usage: check_layering_selftest.sh [PYTHON]   (default: python3)
set -u

python=${1:-python3}
checker="$(cd "$(dirname "$0")" && pwd)/check_layering.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# put FILE CONTENT: writes CONTENT to $tmp/FILE, making its folders.
put() {
  mkdir -p "$(dirname "$tmp/$1")"
  printf '%s\n' "$2" >"$tmp/$1"
}

# run_checker TREE: runs the checker; sets $out and $rc.
run_checker() {
  out=$("$python" "$checker" "$1" 2>&1)
  rc=$?
}

expect_line() {
  if ! grep -qxF -- "$2" <<<"$out"; then
    fail "$1: expected the line: $2"
  fi
}

expect_no() {
  if grep -qF -- "$2" <<<"$out"; then
    fail "$1: did not expect: $2"
  fi
}

# ---- A clean tree: every dependency points down, plus the allowed
# same-level exception rewards -> data.
clean=$tmp/clean
put clean/src/common/a.cc '#include "roll/common/a.h"
#include <vector>
#include "absl/strings/str_cat.h"'
put clean/include/roll/common/a.h '#pragma once'
put clean/src/common/CMakeLists.txt 'roll_library(NAME common SOURCES a.cc DEPS roll_torch absl::strings)'
put clean/src/rpc/CMakeLists.txt 'roll_proto_library(NAME roll_rpc_proto PROTOS worker.proto)
roll_library(NAME rpc SOURCES r.cc DEPS roll::common roll_rpc_proto)'
put clean/src/data/d.cc '#include "roll/data/d.h"'
put clean/include/roll/data/d.h '#include "roll/common/a.h"'
put clean/src/rewards/r.cc '#include "roll/data/d.h"  // allowed same-level exception'
put clean/src/rewards/CMakeLists.txt 'roll_library(NAME rewards SOURCES r.cc DEPS roll::common roll::data)'
put clean/src/controller/b.cc '#include "roll/controller/controller.h"
#include "controller/agent.h"
#include "worker.grpc.pb.h"
#include "roll/worker/worker.h"'
put clean/include/roll/controller/controller.h '#include "roll/common/a.h"'
put clean/include/roll/worker/worker.h '#include "roll/common/a.h"'
put clean/src/workers/rl/worker_setup.h '#include "roll/worker/worker.h"'
put clean/src/workers/CMakeLists.txt 'roll_library(NAME workers SOURCES w.cc DEPS roll::common roll::rpc)
roll_library(NAME rl_workers SOURCES rl/a.cc DEPS roll::workers roll::rewards)'
put clean/src/controller/CMakeLists.txt 'set(_deps roll::common roll::rpc
    roll::workers)
roll_library(NAME controller SOURCES b.cc DEPS ${_deps})'
put clean/src/cli/CMakeLists.txt 'add_executable(roll main.cc)
target_link_libraries(roll PRIVATE roll::controller roll::rl_workers roll::pipeline)'
put clean/src/pipeline/rlvr/p.cc '#include "roll/controller/controller.h"'

run_checker "$clean"
[ "$rc" -eq 0 ] || fail "clean tree: exit $rc, expected 0; output: $out"
grep -q '^check_layering: OK: ' <<<"$out" || fail "clean tree: no OK summary; output: $out"

# ---- A tree with planted violations.
bad=$tmp/bad
cp -r "$clean" "$bad"
put bad/src/common/a.cc '#include "roll/common/a.h"
// #include "roll/pipeline/commented_out.h"
/* #include "roll/pipeline/block_commented.h" */
#include "roll/controller/controller.h"'
put bad/src/rpc/CMakeLists.txt '# A comment naming roll::pipeline is not a link.
roll_proto_library(NAME roll_rpc_proto PROTOS worker.proto)
set(_deps roll::common
    roll::workers)
roll_library(NAME rpc
  SOURCES r.cc
  DEPS ${_deps} roll_rpc_proto)'
put bad/src/data/CMakeLists.txt 'roll_library(NAME data SOURCES d.cc DEPS roll::common)
target_link_libraries(roll_data PRIVATE
  roll::rewards)'
put bad/include/roll/worker/worker.h '#include "roll/common/a.h"
#include "controller/agent.h"'
put bad/src/cli/c.cc '#include "workers/rl/worker_setup.h"'
mkdir -p "$bad/src/newthing"

run_checker "$bad"
[ "$rc" -eq 1 ] || fail "bad tree: exit $rc, expected 1"
expect_line "planted include" \
  'src/common/a.cc:4: includes "roll/controller/controller.h": common (level 0) may not depend on controller (level 5)'
expect_line "planted link (through a variable)" \
  'src/rpc/CMakeLists.txt:4: links roll::workers (target roll_rpc): rpc (level 1) may not depend on workers (level 4)'
expect_line "planted same-level link" \
  'src/data/CMakeLists.txt:3: links roll::rewards (target roll_data): data (level 2) may not depend on rewards (level 2) (same level; not in the exception list)'
expect_line "planted private include from include/roll/worker" \
  'include/roll/worker/worker.h:2: includes "controller/agent.h": workers (level 4) may not depend on controller (level 5)'
expect_line "private folder from above" \
  'src/cli/c.cc:1: includes "workers/rl/worker_setup.h": private to workers (the RL workers'"'"' internals (use roll/strategies/weight_sync.h, roll/worker/batch_keys.h))'
expect_line "unknown folder" \
  'src/newthing: src/newthing/ is not a known module: give it a level in tests/check_layering.py'
expect_no "commented-out include" 'commented_out.h'
expect_no "block-commented include" 'block_commented.h'
expect_no "comment in CMakeLists" 'roll::pipeline'
count=$(grep -c ': ' <<<"$(grep -v '^check_layering: ' <<<"$out")")
[ "$count" -eq 6 ] || fail "bad tree: $count offences reported, expected 6"

if [ "$failures" -ne 0 ]; then
  echo "--- checker output on the bad tree:"
  echo "$out"
  echo "check_layering_selftest: $failures failure(s)"
  exit 1
fi
echo "check_layering_selftest: OK"
