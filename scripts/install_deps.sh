#!/usr/bin/env bash
# Installs what the project's Python scripts need, from Debian's packages (and three from
# PyPI, below), for /usr/bin/python3 (the interpreter the Makefile uses), and the one header the
# build needs beyond g++, xxhash.h (libxxhash-dev: the checkpoints' checksums, llmc/hashed_file.h):
#   bash scripts/install_deps.sh run   what `make run` needs: python3-numpy and python3-regex
#                                      (data preparation: GPT-2's tokenizer pattern)
#   bash scripts/install_deps.sh       everything (`make test`): also python3-torch (the
#                                      PyTorch references), python3-matplotlib (the plots), clang
#                                      with libFuzzer's runtime (the fuzzers), and python3-pip with
#                                      PyPI's transformers, safetensors and huggingface_hub
#                                      (scripts/convert_hf.py and its test), pinned below
# Does nothing when everything is there; needs root (or sudo) only when it must install.
set -euo pipefail
PYTHON=${PYTHON:-/usr/bin/python3}
wanted="numpy:python3-numpy regex:python3-regex"
[ "${1:-all}" = run ] || wanted="$wanted torch:python3-torch matplotlib:python3-matplotlib pip:python3-pip"
# Debian has no transformers; these versions run on Debian's torch 1.13 (newer transformers
# need torch 2)
PYPI_PINS="transformers==4.45.2 safetensors==0.8.0 huggingface_hub==0.36.2"
missing=()
[ -f /usr/include/xxhash.h ] || missing+=(libxxhash-dev)
if [ "${1:-all}" != run ]; then  # the fuzzers (make fuzz, part of make test): clang and libFuzzer
    command -v clang++ >/dev/null 2>&1 || missing+=(clang)
    ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || missing+=(libclang-rt-dev)
fi
for pair in $wanted; do
    module=${pair%%:*}
    package=${pair#*:}
    if ! "$PYTHON" -c "import $module" >/dev/null 2>&1; then missing+=("$package"); fi
done
SUDO=""
as_root() {  # as_root WHAT: root, or sudo, or stop with a hint
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "error: $1 missing and not root (hint: sudo bash $0 ${1:-})" >&2; exit 1; }
        SUDO=sudo
    fi
}
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || {
        echo "error: missing ${missing[*]}, and no apt-get to install them (hint: install their equivalents with this system's package manager)" >&2; exit 1; }
    as_root "${missing[*]}"
    echo "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
    [ -f /usr/include/xxhash.h ] || { echo "error: /usr/include/xxhash.h still missing after installing libxxhash-dev" >&2; exit 1; }
    for pair in $wanted; do
        pair=${pair%%:*}
        "$PYTHON" -c "import $pair" || { echo "error: $pair still not importable by $PYTHON after installing" >&2; exit 1; }
    done
fi
[ "${1:-all}" = run ] && exit 0
# the PyPI packages, each at its pinned version
pins=()
for pin in $PYPI_PINS; do
    have=$("$PYTHON" -c "import ${pin%%==*} as m; print(m.__version__)" 2>/dev/null || true)
    [ "$have" = "${pin#*==}" ] || pins+=("$pin")
done
[ ${#pins[@]} -eq 0 ] && exit 0
as_root "${pins[*]}"
echo "installing from PyPI: ${pins[*]}"
# Debian 12's pip refuses the system interpreter without this flag; a pip older than 23 lacks it
pip_flags=(-q)
"$PYTHON" -m pip install --help 2>/dev/null | grep -q -- --break-system-packages && pip_flags+=(--break-system-packages)
$SUDO "$PYTHON" -m pip install "${pip_flags[@]}" "${pins[@]}" || {
    echo "error: pip could not install ${pins[*]} for $PYTHON (hint: is PyPI reachable?)" >&2; exit 1; }
