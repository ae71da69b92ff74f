#!/usr/bin/env python3
"""Counts the README's reading path: the lines a new reader reads to learn one default step.

The README's section "The reading path" names each stop as `path` lines A-B (several ranges may
follow one path, separated by commas or "and"; "line N" is one line). This script takes those
ranges from the README itself, counts the distinct lines they cover (comments and blank lines
included: they are read too) and, of those, the lines of C++ code (not blank, not a comment,
not a #pragma), adds the README's own lines, and prints a table. With --check it also fails
(exit 1) where the README's stated figures, "N lines in all", "M lines of C++ code" and "K of
them in functions", differ from the count or are missing.

    python3 dev/reading_path.py [--check]
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")


def reading_path_section(text):
    start = text.index("### The reading path")
    end = text.find("\n### ", start + 1)
    return text[start:end if end > 0 else len(text)]


def stops(section):
    """{path: set of 1-based line numbers}: each "lines A-B, C-D and E-F" (or "line N") belongs
    to the last `path` named before it"""
    out, path = {}, None
    token = r"`([\w./-]+\.(?:h|cuh|cpp|cu|py|md))`|\blines?\s+((?:\d+(?:-\d+)?(?:,\s*|\s+and\s+)?)+)"
    for m in re.finditer(token, section):
        if m.group(1):
            path = m.group(1)
            continue
        if path is None:
            continue
        lines = out.setdefault(path, set())
        for a, b in re.findall(r"(\d+)(?:-(\d+))?", m.group(2)):
            lines.update(range(int(a), int(b or a) + 1))
    return out


def is_cpp(path):
    return path.endswith((".h", ".cuh", ".cpp", ".cu"))


def function_lines(text):
    """the 1-based numbers of the lines that belong to a function definition, its header
    included: a top-level {...} whose statement has a "(" and is not a type or an initializer"""
    inside, depth, pending, kind, in_comment = set(), 0, [], None, False
    bare_lines = []
    for line in text:  # the code alone: no comments, strings or character literals
        bare = ""
        while line:
            if in_comment:
                end = line.find("*/")
                in_comment, line = end < 0, "" if end < 0 else line[end + 2:]
                continue
            m = re.match(r'([^"\'/]|/(?![/*]))*', line)
            bare, line = bare + m.group(0), line[m.end():]
            if line.startswith("//"):
                line = ""
            elif line.startswith("/*"):
                in_comment, line = True, line[2:]
            elif line:
                lit = re.match(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'', line) or re.match(r".", line)
                bare, line = bare + '""', line[lit.end():]
        bare_lines.append(bare)
    for i, bare in enumerate(bare_lines, start=1):
        if depth == 0 and not pending and (not bare.strip() or bare.lstrip().startswith("#")):
            continue
        pending.append(i)
        for ch in bare:
            if ch == "{":
                if depth == 0:
                    head = " ".join(bare_lines[j - 1] for j in pending).split("{")[0]
                    typ = re.match(r"\s*(typedef|struct|enum|union)\b", head) or "=" in head
                    kind = "function" if "(" in head and not typ else "other"
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == ";" and depth == 0:
                pending, kind = [], None
        if depth == 0 and kind is not None and "}" in bare:
            if kind == "function":
                inside.update(pending)
            pending, kind = [], None
    return inside


def code_lines(path, numbers):
    """how many of these lines of a C/C++ file are code, and how many of those are in functions
    (the rest: types, constants, declarations)"""
    text = open(os.path.join(ROOT, path)).read().split("\n")
    functions = function_lines(text)
    code, in_functions, in_block = 0, 0, False
    for i, line in enumerate(text, start=1):
        t = line.strip()
        was_block = in_block
        if in_block and "*/" in t:
            in_block = False
        elif not in_block and t.startswith("/*") and "*/" not in t:
            in_block = True
        is_code = not (was_block or t.startswith("/*") or not t or t.startswith("//") or t.startswith("#pragma"))
        if i in numbers and is_code:
            code += 1
            in_functions += i in functions
    return code, in_functions


def main():
    check = "--check" in sys.argv[1:]
    text = open(README).read()
    section = reading_path_section(text)
    paths = stops(section)
    if not paths:
        print("reading_path: FAIL: no `path` lines A-B in the README's reading path")
        return 1
    readme_lines = text.count("\n")
    total, cpp, funcs = readme_lines, 0, 0
    print(f"{'stop':28} {'lines':>6} {'C++ code':>9} {'in functions':>13}")
    print(f"{'README.md (all of it)':28} {readme_lines:6d} {'':>9} {'':>13}")
    for path, numbers in paths.items():
        size = len(open(os.path.join(ROOT, path)).read().split("\n"))
        if max(numbers) > size:
            print(f"reading_path: FAIL: {path} has {size} lines, the README reads up to line {max(numbers)}")
            return 1
        code, in_functions = code_lines(path, numbers) if is_cpp(path) else (0, 0)
        total += len(numbers)
        cpp += code
        funcs += in_functions
        print(f"{path:28} {len(numbers):6d} {code if is_cpp(path) else '':>9} {in_functions if is_cpp(path) else '':>13}")
    print(f"{'in all':28} {total:6d} {cpp:9d} {funcs:13d}")
    if not check:
        return 0
    stated_total = re.search(r"(\d[\d,]*) lines in all", section)
    stated_cpp = re.search(r"(\d[\d,]*) lines of C\+\+ code", section)
    stated_funcs = re.search(r"(\d[\d,]*) of them in functions", section)
    problems = []
    for name, m, value in (("lines in all", stated_total, total), ("lines of C++ code", stated_cpp, cpp),
                           ("of them in functions", stated_funcs, funcs)):
        if m is None:
            problems.append(f"the README does not state its '{name}'")
        elif int(m.group(1).replace(",", "")) != value:
            problems.append(f"the README says {m.group(1)} {name}, the count is {value}")
    for p in problems:
        print(f"reading_path: FAIL: {p}")
    if not problems:
        print(f"reading_path: the README's figures ({total} lines in all, {cpp} of C++ code, {funcs} of them "
              "in functions) match the count")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
