#!/usr/bin/env bash
# Fetches the baseline that the CUDA trainer's speed target names, llm.c's fp32 CUDA trainer
# (train_gpt2_fp32.cu: "tok/s at least llm.c's fp32 trainer's on the same GPU and config"),
# into build/llmc_ref, where scripts/bench_llmc.sh builds and runs it next to ours; and
# llm.c's CPU programs train_gpt2.c and test_gpt2.c, which dev/test/test_llmc_cpu.py runs on
# our files.
#
#   bash scripts/get_llmc.sh [GIT_DIR]
#
# GIT_DIR: a clone or mirror of llm.c already on this machine (a machine without network);
# without it, llm.c is cloned from GitHub. Always the commit pinned below, so that every
# comparison runs the same baseline. The files are llm.c's own (MIT, its LICENSE comes
# along) and are never committed here: build/ is ignored.
set -u
CALLER=$PWD  # paths on the command line are relative to where the script was started
in_caller() { case $1 in /*) echo "$1" ;; *) echo "$CALLER/$1" ;; esac; }
cd "$(dirname "$0")/.." || exit 2
URL=https://github.com/karpathy/llm.c
COMMIT=f1e2ace651495b74ae22d45d1723443fd00ecd3a  # a commit of llm.c's master branch
DEST=build/llmc_ref
FILES="train_gpt2_fp32.cu train_gpt2.c test_gpt2.c llmc LICENSE"

fail() { echo "get_llmc.sh: $*" >&2; exit 1; }

if [ $# -gt 1 ]; then
    echo "usage: $0 [GIT_DIR]" >&2
    exit 2
fi
tmp=""
if [ $# -eq 1 ]; then
    GIT_DIR_SRC=$(in_caller "$1")
    git --git-dir="$GIT_DIR_SRC" rev-parse --git-dir >/dev/null 2>&1 \
        || GIT_DIR_SRC="$GIT_DIR_SRC/.git"  # a work tree rather than a bare mirror
    git --git-dir="$GIT_DIR_SRC" rev-parse --git-dir >/dev/null 2>&1 \
        || fail "$1 is not a git repository (hint: a clone of $URL)"
else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    git clone --quiet --no-checkout "$URL" "$tmp/llm.c" \
        || fail "could not clone $URL (hint: no network? pass a local clone of llm.c as GIT_DIR)"
    GIT_DIR_SRC="$tmp/llm.c/.git"
fi
git --git-dir="$GIT_DIR_SRC" cat-file -e "$COMMIT^{commit}" 2>/dev/null \
    || fail "commit $COMMIT is not in $GIT_DIR_SRC (hint: fetch llm.c's master there)"

rm -rf "$DEST.tmp" && mkdir -p "$DEST.tmp" || exit 1
# shellcheck disable=SC2086
git --git-dir="$GIT_DIR_SRC" archive "$COMMIT" $FILES | tar -x -C "$DEST.tmp" \
    || fail "could not extract $FILES at $COMMIT"
echo "$COMMIT" >"$DEST.tmp/COMMIT"
rm -rf "$DEST" && mv "$DEST.tmp" "$DEST" || exit 1
echo "llm.c $COMMIT: $FILES in $DEST ($(du -sk "$DEST" | cut -f1) KiB)"
