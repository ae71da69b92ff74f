"""
Tests scripts/prepare_text.py: your own text to token shards.

    /usr/bin/python3 dev/test/test_prepare_text.py

  - tiktoken agreement: the files of dev/test/tokenizer_cases.json's "prepare_text" (two
    text files and a JSONL file, made there by dev/test/make_tokenizer_fixture.py with
    tiktoken) give, val shards then train shards, exactly the ids tiktoken gives (eot, then
    each document's ordinary encoding); with small --val-tokens and --shard-tokens, so that
    both splits span several shards: every shard full but the last of its split, which holds
    the rest (the val split's, 12 of 16) or, where the rest is under half a shard (the train
    split's, 5), the shard before it takes it in;
  - tinyshakespeare.txt as one document: the stream's token count and sha256 as tiktoken's;
  - the progress output (not a terminal: a line every 10%, to stderr) and the summary line;
  - --field: a JSONL file whose text is in another field;
  - half of a UTF-16 pair escaped in a JSONL document: U+FFFD in its place, as in tiktoken;
  - bad input, each one line `error: FILE: line N: ... (hint: ...)` (no line for a whole
    file), exit code 1, and no shard left behind: not UTF-8 (a text file and a JSONL line),
    an empty file, a missing field, not JSON, a blank line, a number for the text, a
    missing file, too little text for the val split, an --out that cannot be created;
  - a second run into the same --out: its shards replace the first's (none left for a
    pattern to pick up); one that fails leaves the first's unchanged.
Prints PASS / FAIL per check and `prepare_text: N passed, M failed`; exit code 1 on a failure.
"""

import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import data_files  # noqa: E402

PREPARE = ROOT / "scripts" / "prepare_text.py"
FIXTURE = ROOT / "dev" / "test" / "tokenizer_cases.json"
PROGRESS = re.compile(r"^prepare_text: \[[# ]{30}\] +(\d+)%  [0-9.]+ of [0-9.]+ MB  [0-9.]+ MB/s  [0-9,]+ tok/s$")
results = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(f"{'PASS' if ok else 'FAIL'} {name}" + ("" if ok or not detail else f": {detail}"))
    return ok


def prepare(*args):
    return subprocess.run([sys.executable, str(PREPARE), *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def write_inputs(fixture, tmp):
    paths = []
    for f in fixture["files"]:
        path = tmp / f["name"]
        if path.suffix == ".jsonl":
            lines = [json.dumps({"id": i, "text": doc}, ensure_ascii=False) for i, doc in enumerate(f["documents"])]
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        else:
            path.write_bytes(f["documents"][0].encode("utf-8"))
        paths.append(path)
    return paths


def shards(out, split):
    return sorted(out.glob(f"text_{split}_*.bin"))


def stream(out):
    parts = [data_files.read_shard(p) for p in shards(out, "val") + shards(out, "train")]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def test_tiktoken(fixture, tmp):
    paths = write_inputs(fixture, tmp)
    want = fixture["ids"]
    out, val, size = tmp / "out", 28, 16  # 129 ids: val 16 + 12, train 5 x 16 + (16 + 5)
    p = prepare("--out", out, "--val-tokens", val, "--shard-tokens", size, *paths)
    if not check("prepare_text.py runs on the fixture's files", p.returncode == 0, p.stderr.strip()):
        return
    got = stream(out)
    check(f"{len(want)} ids, val then train, equal to tiktoken's", got.tolist() == want,
          f"got {len(got)} ids, first difference at {next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)}")
    ndocs = sum(len(f["documents"]) for f in fixture["files"])
    check(f"{ndocs} documents: each starts with eot 50256", int((got == 50256).sum()) == ndocs and got[0] == 50256)
    for split, n in (("val", val), ("train", len(want) - val)):
        sizes = [len(data_files.read_shard(s)) for s in shards(out, split)]
        full = [size] * (n // size) + ([n % size] if n % size else [])
        if len(full) > 1 and full[-1] < size // 2:
            full[-2:] = [full[-2] + full[-1]]
        check(f"{split} shards of {size} tokens, the last the rest (a rest under {size // 2} joins the one "
              f"before): {sizes}", sizes == full, f"want {full}")
    names = [s.name for s in shards(out, "val") + shards(out, "train")]
    check("names NAME_val_000000.bin ... NAME_train_000000.bin ...",
          names[:2] == ["text_val_000000.bin", "text_val_000001.bin"] and names[2] == "text_train_000000.bin",
          str(names[:3]))
    summary = p.stdout.strip().splitlines()
    nshards = len(shards(out, "val")) + len(shards(out, "train"))
    check("summary line: documents, tokens, shards",
          len(summary) == 1 and f"{ndocs} documents, {len(want)} tokens (val {val}, train {len(want) - val}), "
          f"{nshards} shards" in summary[0], f"stdout {p.stdout!r}")

    # the same documents in another field
    moved = tmp / "moved.jsonl"
    moved.write_text("".join(json.dumps({"content": d}) + "\n" for d in fixture["files"][1]["documents"]))
    p = prepare("--out", tmp / "moved", "--val-tokens", 4, "--field", "content", moved)
    first = want.index(50256, 1)  # the JSONL documents' ids: after notes.txt's, before numbers.txt's
    last = len(want) - want[::-1].index(50256) - 1
    want_docs = want[first:last]
    check("--field content reads the text from that field", p.returncode == 0 and stream(tmp / "moved").tolist() == want_docs,
          p.stderr.strip())

    # half of a UTF-16 pair escaped in JSON (a cut emoji): U+FFFD in its place, as tiktoken encodes it
    cut, whole = tmp / "cut.jsonl", tmp / "replaced.jsonl"
    cut.write_text('{"text": "a cut emoji \\ud83d here"}\n', encoding="utf-8")
    whole.write_text('{"text": "a cut emoji \\ufffd here"}\n', encoding="utf-8")
    p = prepare("--out", tmp / "cut", "--val-tokens", 2, cut)
    q = prepare("--out", tmp / "replaced", "--val-tokens", 2, whole)
    check("a lone surrogate in JSONL is encoded as U+FFFD", p.returncode == 0 and q.returncode == 0
          and stream(tmp / "cut").tolist() == stream(tmp / "replaced").tolist(), p.stderr.strip())


def test_tinyshakespeare(fixture, tmp):
    text = data_files.input_path("tinyshakespeare.txt")
    out = tmp / "shakespeare"
    p = prepare("--out", out, text)
    if not check("prepare_text.py runs on tinyshakespeare.txt", p.returncode == 0, p.stderr.strip()):
        return
    got = stream(out)
    check(f"tinyshakespeare as one document: {fixture['tinyshakespeare_tokens']:,} tokens, the sha256 of tiktoken's",
          len(got) == fixture["tinyshakespeare_tokens"] and
          hashlib.sha256(got.astype("<u2").tobytes()).hexdigest() == fixture["tinyshakespeare_sha256"],
          f"got {len(got)} tokens")
    lines = p.stderr.strip().splitlines()
    percents = [int(m.group(1)) for m in map(PROGRESS.match, lines) if m]
    check(f"progress: a line per 10% with MB/s and tok/s, ending at 100% ({len(lines)} lines)",
          len(percents) == len(lines) >= 6 and percents == sorted(percents) and percents[-1] == 100,
          f"stderr {p.stderr[-300:]!r}")
    check("summary: 1 document", p.stdout.startswith(f"prepare_text: 1 documents, {len(got):,} tokens"), p.stdout)


def error_lines(p):
    """stderr without the progress lines before the error; the error must be the last line"""
    lines = [line for line in p.stderr.strip().splitlines() if not PROGRESS.match(line)]
    return lines if lines and lines[-1] == p.stderr.strip().splitlines()[-1] else lines + ["(not the last line)"]


def test_bad_inputs(tmp):
    good = tmp / "good.txt"
    good.write_text("A good document, long enough to fill the val split and write a shard. " * 20)
    cases = [  # (what, file name, bytes, line or None, words the line must hold)
        ("not UTF-8 in a text file", "latin1.txt", b"line one\nline two\ncaf\xe9 au lait\n", 3,
         ["not UTF-8", "0xe9", "column 4", "iconv"]),
        ("not UTF-8 in a JSONL line", "bytes.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n', 2, ["not UTF-8"]),
        ("an empty text file", "empty.txt", b"", None, ["empty"]),
        ("an empty JSONL file", "empty.jsonl", b"\n", None, ["empty"]),
        ("a missing field", "nofield.jsonl", b'{"text": "ok"}\n{"id": 2, "body": "x"}\n', 2,
         ["no field 'text'", "id, body", "--field"]),
        ("not JSON", "broken.jsonl", b'{"text": "ok"}\n{"text": "unterminated}\n', 2, ["not JSON"]),
        ("a blank line", "blank.jsonl", b'{"text": "ok"}\n\n{"text": "x"}\n', 2, ["empty line"]),
        ("a number for the text", "number.jsonl", b'{"text": 42}\n', 1, ["is 42, not a string"]),
        ("an empty document", "emptydoc.jsonl", b'{"text": "ok"}\n{"text": ""}\n', 2, ["is empty"]),
    ]
    for what, name, data, line, words in cases:
        path = tmp / name
        path.write_bytes(data)
        out = tmp / f"out_{name}"
        p = prepare("--out", out, "--val-tokens", 8, "--shard-tokens", 8, good, path)
        errors = error_lines(p)
        where = f"error: {path}: line {line}: " if line else f"error: {path}: "
        ok = (p.returncode == 1 and len(errors) == 1 and errors[0].startswith(where) and "(hint: " in errors[0]
              and errors[0].endswith(")") and all(w in errors[0] for w in words))
        check(f"bad input ({what}): one line '{where}...' with {words}, exit 1", ok,
              f"exit {p.returncode}, stderr {p.stderr.strip()!r}")
        check(f"bad input ({what}): no shard left behind", not list(out.glob("*.bin")),
              f"found {[s.name for s in out.glob('*.bin')]}")
    p = prepare("--out", tmp / "x", tmp / "missing.txt")
    check("bad input (a missing file): one line naming it, exit 1",
          p.returncode == 1 and error_lines(p) == [f"error: {tmp / 'missing.txt'}: cannot read it (No such file or "
                                                   f"directory) (hint: check the path)"],
          p.stderr.strip())
    # 342 tokens: <|endoftext|>, then the 341 ids Hugging Face's GPT2Tokenizer gives this text on
    # the same BPE files
    p = prepare("--out", tmp / "few", "--val-tokens", 100000, good)
    check("too little text for --val-tokens: one line with the count, exit 1, no shard",
          p.returncode == 1 and len(error_lines(p)) == 1 and "342 tokens in all" in error_lines(p)[0]
          and "nothing left to train on" in error_lines(p)[0]
          and not list((tmp / "few").glob("*.bin")), p.stderr.strip())
    for name in ("a/b", ""):
        p = prepare("--out", tmp / "named", "--name", name, good)
        check(f"--name {name!r}: refused before anything is written, exit 2",
              p.returncode == 2 and f"--name {name!r}:" in p.stderr and not (tmp / "named").exists(), p.stderr.strip())
    p = prepare("--out", good / "sub", good)
    check("an --out that cannot be created: one line naming it, exit 1",
          p.returncode == 1 and len(error_lines(p)) == 1 and error_lines(p)[0].startswith(f"error: --out {good / 'sub'}: ")
          and "Traceback" not in p.stderr, p.stderr.strip())


def test_rerun(tmp):
    """a second run into the same --out: its shards replace the first's, none of which is left for
    a pattern to pick up; a second run that fails leaves the first's as they were"""
    long, short, bad = tmp / "long.txt", tmp / "short.txt", tmp / "bad.txt"
    long.write_text("The first text, long enough for several shards of the train split. " * 40)
    short.write_text("A second, shorter text. " * 12)
    bad.write_bytes(b"caf\xe9\n")
    out = tmp / "rerun"
    first = prepare("--out", out, "--val-tokens", 50, "--shard-tokens", 100, long)
    before = {p.name: p.read_bytes() for p in out.glob("*.bin")}
    failed = prepare("--out", out, "--val-tokens", 50, "--shard-tokens", 100, short, bad)
    check("a failed run into a prepared --out: exit 1, the shards there unchanged, nothing added",
          first.returncode == 0 and len(before) > 3 and failed.returncode == 1
          and {p.name: p.read_bytes() for p in out.glob("*.bin")} == before and sorted(p.name for p in out.iterdir())
          == sorted(before), f"{first.stderr.strip()} {failed.stderr.strip()} {sorted(p.name for p in out.iterdir())}")
    second = prepare("--out", out, "--val-tokens", 50, "--shard-tokens", 100, short)
    alone = tmp / "alone"
    prepare("--out", alone, "--val-tokens", 50, "--shard-tokens", 100, short)
    want = {p.name: p.read_bytes() for p in alone.glob("*.bin")}
    check("a second run into the same --out: exactly its own shards there, the first's gone, said so",
          second.returncode == 0 and {p.name: p.read_bytes() for p in out.iterdir()} == want
          and f"the {len(before)} text_ shards there before are gone" in second.stdout,
          f"{second.stdout.strip()} {sorted(p.name for p in out.iterdir())} want {sorted(want)}")


def main():
    try:
        fixture = json.loads(FIXTURE.read_text(encoding="utf-8"))["prepare_text"]
    except Exception as e:  # a bug here must be a FAIL line, not a bare traceback
        check("load dev/test/tokenizer_cases.json's prepare_text", False, f"{type(e).__name__}: {e}")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for test in (test_tiktoken, test_tinyshakespeare):
                try:
                    test(fixture, Path(tmp))
                except Exception as e:
                    check(f"{test.__name__}: no unexpected exception", False, f"{type(e).__name__}: {e}")
            for test in (test_bad_inputs, test_rerun):
                try:
                    test(Path(tmp))
                except Exception as e:
                    check(f"{test.__name__}: no unexpected exception", False, f"{type(e).__name__}: {e}")
    print(f"prepare_text: {results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
