#!/usr/bin/env bash
# Installs what the project's Python scripts need, from Debian's packages only, for
# /usr/bin/python3 (the interpreter the Makefile uses), and the one header the build needs beyond
# g++, xxhash.h (libxxhash-dev: the checkpoints' checksums, llmc/hashed_file.h):
#   bash scripts/install_deps.sh run   what `make run` needs: python3-numpy and python3-regex
#                                      (data preparation: GPT-2's tokenizer pattern)
#   bash scripts/install_deps.sh       everything (`make test`): also python3-torch (the
#                                      PyTorch references) and python3-matplotlib (the plots)
# Does nothing when everything is there; needs root (or sudo) only when it must install.
set -euo pipefail
PYTHON=${PYTHON:-/usr/bin/python3}
wanted="numpy:python3-numpy regex:python3-regex"
[ "${1:-all}" = run ] || wanted="$wanted torch:python3-torch matplotlib:python3-matplotlib"
missing=()
[ -f /usr/include/xxhash.h ] || missing+=(libxxhash-dev)
for pair in $wanted; do
    module=${pair%%:*}
    package=${pair#*:}
    if ! "$PYTHON" -c "import $module" >/dev/null 2>&1; then missing+=("$package"); fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=sudo
    else
        echo "error: missing ${missing[*]} and not root (hint: sudo apt-get install ${missing[*]})" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
for pair in $wanted; do
    pair=${pair%%:*}
    "$PYTHON" -c "import $pair" || { echo "error: $pair still not importable by $PYTHON after installing" >&2; exit 1; }
done
[ -f /usr/include/xxhash.h ] || { echo "error: /usr/include/xxhash.h still missing after installing libxxhash-dev" >&2; exit 1; }
