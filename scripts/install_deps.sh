#!/usr/bin/env bash
# Installs what the project's Python scripts need, from Debian's packages only:
# python3-torch (the PyTorch reference), python3-numpy, python3-regex (GPT-2's tokenizer
# pattern), python3-matplotlib (the plots). They install for /usr/bin/python3, which is
# the interpreter the Makefile uses.
# Does nothing when everything is there; needs root (or sudo) only when it must install.
set -euo pipefail
PYTHON=${PYTHON:-/usr/bin/python3}
missing=()
for pair in torch:python3-torch numpy:python3-numpy regex:python3-regex matplotlib:python3-matplotlib; do
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
for pair in torch numpy regex matplotlib; do
    "$PYTHON" -c "import $pair" || { echo "error: $pair still not importable by $PYTHON after installing" >&2; exit 1; }
done
