"""
Tests for the GPT-2 tokenizer (bpe.py) and the tinyshakespeare data prep.

    /usr/bin/python3 dev/test/test_tokenizer.py

Prints one line per check (PASS / FAIL / SKIP) and finally
`tokenizer: N passed, M failed`; the exit code is 1 if anything failed.
Expected ids come from dev/test/tokenizer_cases.json, generated with tiktoken (an
independent implementation) by dev/test/make_tokenizer_fixture.py. This test itself needs
only regex, numpy and the standard library. It runs the prep into a temp directory
(a few seconds) rather than trusting whatever is in data/.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import bpe  # noqa: E402
import data_files  # noqa: E402

FIXTURE = data_files.REPO_ROOT / "dev" / "test" / "tokenizer_cases.json"
PREPARE = SCRIPTS / "prepare_tinyshakespeare.py"
EOT_TEXT = "<|endoftext|>"
results = {"passed": 0, "failed": 0, "skipped": 0}


def check(name, ok, detail=""):
    if ok:
        results["passed"] += 1
        print(f"PASS {name}")
    else:
        results["failed"] += 1
        print(f"FAIL {name}" + (f": {detail}" if detail else ""))
    return ok


def skip(name, reason):
    results["skipped"] += 1
    print(f"SKIP {name}: {reason}")


def show(ids, n=12):
    ids = list(ids)
    return str(ids[:n])[:-1] + (", ...]" if len(ids) > n else "]")


def sha256_file(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_prepare(*args):
    t0 = time.time()
    p = subprocess.run([sys.executable, str(PREPARE), *args],
                       capture_output=True, text=True, timeout=600)
    return p, time.time() - t0


# -----------------------------------------------------------------------------
# the encoder itself

def test_known_ids(enc):
    ids = enc.encode("Hello world, this is GPT-2.")
    want = [15496, 995, 11, 428, 318, 402, 11571, 12, 17, 13]  # Hugging Face's GPT2Tokenizer, on the same BPE files
    check("known ids: 'Hello world, this is GPT-2.'", ids == want, f"got {ids}, want {want}")
    ids = enc.encode(EOT_TEXT, allowed_special={EOT_TEXT})
    check("known ids: <|endoftext|> as special -> 50256", ids == [50256] and enc.eot == 50256,
          f"got {ids}, eot {enc.eot}")
    ids = enc.encode(EOT_TEXT)
    check("<|endoftext|> not allowed -> ordinary text", len(ids) > 1 and 50256 not in ids,
          f"got {ids}")


def test_fixture_cases(enc, fixture):
    for case in fixture["cases"]:
        text, want = case["text"], case["ids"]
        ids = enc.encode(text, allowed_special=set(case["allowed_special"]))
        check(f"ids match tiktoken: {case['name']}", ids == want,
              f"got {show(ids)}, want {show(want)}")
        # decode must give back the exact text (eot decodes to its literal string)
        back = enc.decode(ids)
        check(f"decode(encode(s)) == s: {case['name']}", back == text, f"got {back!r}")


def test_shakespeare_roundtrip(enc, text):
    ids = enc.encode(text)
    check("decode(encode(tinyshakespeare)) == tinyshakespeare", enc.decode(ids) == text)


def test_write_shard(tmp):
    path = Path(tmp) / "shard.bin"
    toks = [50256, 0, 1, 65535, 198]
    data_files.write_shard(path, toks)
    back = data_files.read_shard(path)
    check("write_shard/read_shard round trip", list(back) == toks, f"got {list(back)}")
    check("write_shard leaves no .tmp file", not Path(str(path) + ".tmp").exists())
    for bad in ([1, 65536], [-1]):
        try:
            data_files.write_shard(Path(tmp) / "bad.bin", bad)
            check(f"write_shard refuses {bad}", False, "no error raised")
        except ValueError:
            check(f"write_shard refuses {bad}", not (Path(tmp) / "bad.bin").exists(),
                  "raised, but wrote a file")


# -----------------------------------------------------------------------------
# the data prep

def test_prepare(enc, text, fixture, out):
    ref = fixture["tinyshakespeare_llmc"]
    p, secs = run_prepare("--out", str(out))
    if not check(f"prepare_tinyshakespeare.py runs ({secs:.1f}s)", p.returncode == 0,
                 f"exit {p.returncode}: {p.stderr.strip()}"):
        return
    val_path = out / "tinyshakespeare" / "tiny_shakespeare_val.bin"
    train_path = out / "tinyshakespeare" / "tiny_shakespeare_train.bin"
    tok_path = out / "gpt2_tokenizer.bin"

    shards = {}
    for name, path in (("val", val_path), ("train", train_path)):
        raw = path.read_bytes()
        header = [int.from_bytes(raw[4 * i:4 * i + 4], "little", signed=True) for i in range(4)]
        check(f"{name} shard header magic/version 20240520/1", header[:2] == [20240520, 1],
              f"got {header[:2]}")
        try:
            toks = data_files.read_shard(path)  # also checks N against the file size
        except ValueError as e:
            check(f"{name} shard size matches header", False, str(e))
            return
        shards[name] = toks
        check(f"{name} shard has {ref[name + '_tokens']:,} tokens (as llm.c)",
              len(toks) == ref[name + "_tokens"], f"got {len(toks)}")
        check(f"{name} shard: all ids < 50257", int(toks.max()) < 50257, f"max {toks.max()}")
        check(f"{name} shard byte-identical to llm.c's (sha256)",
              sha256_file(path) == ref[name + "_sha256"])
    val, train = shards["val"], shards["train"]
    check("val shard has exactly 32768 tokens", len(val) == 32768, f"got {len(val)}")
    check("first val token is eot 50256", int(val[0]) == 50256, f"got {val[0]}")
    check("val starts with llm.c's first 64 tokens", list(val[:64]) == ref["val_first_64"],
          f"got {show(val)}")

    # decoding everything gives back the text, with an eot marker before each section
    marked = EOT_TEXT + text.replace("\n\n", "\n\n" + EOT_TEXT)
    val_text = enc.decode(val)
    check("decoded val shard == beginning of tinyshakespeare with eot markers",
          marked.startswith(val_text) and val_text.startswith(EOT_TEXT + "First Citizen:\n"),
          f"val decodes to {val_text[:60]!r}...")
    check("decoded val + train == all of tinyshakespeare with eot markers",
          enc.decode(list(val) + list(train)) == marked)

    # the tokenizer file: header, llm.c identity, and decoding with it alone
    raw = tok_path.read_bytes()
    header = [int.from_bytes(raw[4 * i:4 * i + 4], "little", signed=True) for i in range(4)]
    check("gpt2_tokenizer.bin header 20240328/2/50257/50256",
          header == [20240328, 2, 50257, 50256], f"got {header}")
    check("gpt2_tokenizer.bin byte-identical to llm.c's (sha256)",
          sha256_file(tok_path) == ref["tokenizer_bin_sha256"])
    eot, table = bpe.read_tokenizer_bin(tok_path)
    ok = all(b"".join(table[i] for i in c["ids"]) == c["text"].encode("utf-8")
             for c in fixture["cases"])
    check("gpt2_tokenizer.bin decodes every fixture case to its bytes", ok)
    check("gpt2_tokenizer.bin decodes the val shard to the same bytes",
          b"".join(table[i] for i in val) == val_text.encode("utf-8"))

    # a second run has nothing to do
    p, secs = run_prepare("--out", str(out))
    check("second run says 'up to date'", p.returncode == 0 and "up to date" in p.stdout,
          f"exit {p.returncode}, stdout {p.stdout.strip()!r}")
    with tempfile.TemporaryDirectory() as empty:  # ... and needs no input for that
        p, secs = run_prepare("--out", str(out), "--data-dir", empty)
    check("... also where the inputs are gone (--data-dir of an empty folder)",
          p.returncode == 0 and "up to date" in p.stdout, f"exit {p.returncode}, stderr {p.stderr.strip()!r}")


def test_repo_data(fixture):
    """The prep outputs in <repo>/data, if someone made them, must match llm.c too."""
    ref = fixture["tinyshakespeare_llmc"]
    out = data_files.REPO_ROOT / "data"
    files = {"val": out / "tinyshakespeare" / "tiny_shakespeare_val.bin",
             "train": out / "tinyshakespeare" / "tiny_shakespeare_train.bin",
             "tokenizer_bin": out / "gpt2_tokenizer.bin"}
    for name, path in files.items():
        if not path.exists():
            skip(f"data/ {path.name} matches llm.c", "not prepared yet (run the prep)")
        else:
            check(f"data/ {path.name} matches llm.c (sha256)",
                  sha256_file(path) == ref[name + "_sha256"], "stale? rerun the prep with --force")


def test_bad_inputs(tmp):
    """A missing input and a corrupted input: one `error:` line on stderr, exit code 1."""
    real = {name: data_files.input_path(name) for name in data_files.INPUTS}

    def fake_dir(name, skip_file=None, corrupt_file=None):
        d = Path(tmp) / name
        for n, src in real.items():
            if n == skip_file:
                continue
            dst = d / n
            dst.parent.mkdir(parents=True, exist_ok=True)
            data = src.read_bytes()
            dst.write_bytes(data + b"x" if n == corrupt_file else data)
        return d

    for label, d, bad, what in (
            ("missing vocab.bpe", fake_dir("missing", skip_file="gpt2/vocab.bpe"),
             "gpt2/vocab.bpe", "missing"),
            ("wrong sha256 of tinyshakespeare.txt",
             fake_dir("corrupt", corrupt_file="tinyshakespeare.txt"),
             "tinyshakespeare.txt", "sha256")):
        out = Path(tmp) / ("out-" + d.name)
        p, _ = run_prepare("--data-dir", str(d), "--out", str(out))
        lines = p.stderr.strip().splitlines()
        line = lines[0] if lines else ""
        check(f"bad input ({label}): exit code 1", p.returncode == 1, f"got {p.returncode}")
        check(f"bad input ({label}): one 'error: <path>: ... (hint: ...)' line",
              len(lines) == 1 and line.startswith(f"error: {d / bad}: ") and what in line
              and "(hint: " in line and line.endswith(")"), f"stderr {p.stderr!r}")
        check(f"bad input ({label}): no outputs written", not out.exists())


def main():
    # a bug here must show up as a FAIL line and exit code 1, not as a bare traceback
    try:
        with open(FIXTURE, encoding="utf-8") as f:
            fixture = json.load(f)
        enc = bpe.load_gpt2_tokenizer()
        text = data_files.input_path("tinyshakespeare.txt").read_text(encoding="utf-8")
    except Exception as e:
        check("load fixture, tokenizer and tinyshakespeare", False, f"{type(e).__name__}: {e}")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            tests = [
                lambda: test_known_ids(enc),
                lambda: test_fixture_cases(enc, fixture),
                lambda: test_shakespeare_roundtrip(enc, text),
                lambda: test_write_shard(tmp),
                lambda: test_prepare(enc, text, fixture, Path(tmp) / "prep"),
                lambda: test_repo_data(fixture),
                lambda: test_bad_inputs(tmp),
            ]
            for t in tests:
                try:
                    t()
                except Exception:
                    check("no unexpected exception", False, traceback.format_exc().strip())
    skipped = f", {results['skipped']} not run (SKIP above)" if results["skipped"] else ""
    print(f"tokenizer: {results['passed']} passed, {results['failed']} failed{skipped}")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
