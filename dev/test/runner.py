"""
The runner of the Python self-checks (test_reference.py, test_zenflow_reference.py): every
function of a test module whose name starts with test_, in order; an assert that fails, or
any exception, fails that one test, prints its traceback, and the others still run. And for the
trainer tests (test_failures.py, test_output_dir.py): their command line and their check lines.
And nan_first, for every test's largest error.
"""
import math
import os
import shutil
import sys
import traceback


def nan_first(d):
    """max(..., key=nan_first): a nan is the largest (plain max keeps whichever comes first)"""
    return (math.isnan(d), d)


def trainer_case_steps(doc, steps):
    """`<trainer> <case dir> [--steps N]` from the command line: (trainer, case dir, steps), both
    paths absolute; when the arguments are not that, prints doc and exits 2"""
    args = sys.argv[1:]
    if "--steps" in args:
        i = args.index("--steps")
        steps = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        print(doc)
        sys.exit(2)
    return os.path.abspath(args[0]), os.path.abspath(args[1]), steps


def one_line_error(result, needles):
    """(problems, stderr lines) of a finished run that should have exited 1 with one stderr line
    holding every needle"""
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    problems = [] if result.returncode == 1 else [f"exit code {result.returncode} (want 1)"]
    if len(lines) != 1 or any(n not in lines[0] for n in needles):
        problems.append(f"stderr {lines[-3:]} (want one line with {needles})")
    return problems, lines


class Checks:
    """check(name, problems, detail): one line, "ok" with the detail or "FAIL" with the problems;
    summary(label): "<label>: N passed, M failed", and the exit code"""

    def __init__(self):
        self.results = []

    def __call__(self, name, problems, detail):
        self.results.append(not problems)
        print(f"{'ok   ' if not problems else 'FAIL '} {name}: {'; '.join(problems) if problems else detail}")

    def summary(self, label):
        passed = sum(self.results)
        print(f"{label}: {passed} passed, {len(self.results) - passed} failed")
        if not self.results:
            print(f"FAIL {label}: no check ran")
        return 0 if self.results and passed == len(self.results) else 1


def run_test_functions(label, namespace, tmp):
    """Runs the test_* functions of `namespace` (a module's globals()): "ok" or "FAIL" a line,
    then "<label>: N passed, M failed". The scratch folder `tmp` is removed when all passed,
    kept (and named) otherwise. Returns the exit code: 1 if any failed."""
    passed = failed = 0
    for name, fn in [(name, fn) for name, fn in namespace.items() if name.startswith("test_")]:
        try:
            fn()
            print(f"ok   {name}")
            passed += 1
        except Exception:
            print(f"FAIL {name}")
            traceback.print_exc()
            failed += 1
    if failed:
        print(f"(files of the failed checks kept in {tmp})")
    else:
        shutil.rmtree(tmp)
    print(f"{label}: {passed} passed, {failed} failed")
    if passed + failed == 0:
        print(f"FAIL {label}: no check ran")
    return 1 if failed or passed == 0 else 0
