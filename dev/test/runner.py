"""
The runner of the Python self-checks (test_reference.py, test_zenflow_reference.py): every
function of a test module whose name starts with test_, in order; an assert that fails, or
any exception, fails that one test, prints its traceback, and the others still run.
"""
import shutil
import traceback


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
    return 1 if failed else 0
