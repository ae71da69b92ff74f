#!/usr/bin/env python3
"""
Rewrites CUDA sources for the CPU emulator (dev/cuda/emu/cuda_runtime.h): every launch
    kernel<<<grid, block>>>(args)   ->   emu_launch(kernel, emu_config(grid, block))(args)
on the same line, so the line numbers stay. Nothing else changes; a `#line` directive
makes compiler messages name the original file.

    cu2cpp.py OUT_DIR FILE...   writes OUT_DIR/FILE for each FILE (a path relative to here)
"""
import os
import re
import sys

LAUNCH = re.compile(r"\b([A-Za-z_]\w*)\s*<<<(.*?)>>>\s*\(", re.S)


def rewrite(text):
    return LAUNCH.sub(lambda m: "emu_launch(%s, emu_config(%s))(" % (m.group(1), m.group(2)), text)


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: cu2cpp.py OUT_DIR FILE...")
    out_dir = sys.argv[1]
    for path in sys.argv[2:]:
        with open(path) as f:
            text = f.read()
        out = os.path.join(out_dir, path)
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        new = '#line 1 "%s"\n%s' % (path, rewrite(text))
        if "<<<" in rewrite(text):
            sys.exit("cu2cpp.py: %s: a launch it could not rewrite" % path)
        old = open(out).read() if os.path.exists(out) else None
        if new != old:  # keep the time stamp when nothing changed
            with open(out, "w") as f:
                f.write(new)


if __name__ == "__main__":
    main()
