"""
Your own text as training data: text files, or JSONL files of documents, to llm.c token
shards with GPT-2's BPE (scripts/bpe.py, the project's own; the same ids as tiktoken's GPT-2
encoding, dev/test/test_prepare_text.py checks it).

    python3 scripts/prepare_text.py [--out DIR] [--name NAME] [--val-tokens N]
                                    [--shard-tokens N] [--field FIELD] [--data-dir DIR] INPUT...

Documents: every text file is one document; a file whose name ends in .jsonl holds one per
line, a JSON object whose FIELD (default "text") is the document. Each document is encoded
on its own and preceded by <|endoftext|> (id 50256), as llm.c's data scripts do, so the
stream starts with it and the model learns where one document ends and the next begins.
<|endoftext|> written in a document is ordinary text, not that token. Text is read as
UTF-8 bytes, exactly: no newline translation, nothing stripped (half of a UTF-16 pair
escaped in JSON, which UTF-8 cannot hold, becomes U+FFFD, as in tiktoken).
Outputs, in DIR (default data/NAME), NAME (default "text"):
    NAME_val_000000.bin     the first N tokens of the stream (--val-tokens, default 32768)
    NAME_train_000000.bin   the rest, in shards of --shard-tokens (default 100 M, llm.c's
    NAME_train_000001.bin   size), ...; a split's last shard holds the rest, or, if the rest is
                            under half a shard, the shard before it takes it in (a trainer
                            needs B*T+1 tokens in every shard)
and the trainers read them with -i "DIR/NAME_train_*.bin" -j "DIR/NAME_val_*.bin". The shards
are written to DIR/.NAME_new/ and moved into DIR once all are written, replacing every NAME_
shard an earlier run left there (a pattern must not pick up shards of other text); until then,
and on any error, DIR's shards stay as they were.
A progress bar (bytes read, MB/s, tokens/s) goes to stderr, redrawn on a terminal and a line
every 10% elsewhere; a summary line (documents, tokens, shards) to stdout. Bad input is one
line, `error: FILE: line N: what (hint: ...)`, exit code 1, and no new shard is left behind.
"""

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

import bpe
import data_files


class InputError(Exception):
    """str() is the one line printed"""


def bad(path, line, what, hint):
    where = f"{path}: line {line}" if line else f"{path}"
    return InputError(f"error: {where}: {what} (hint: {hint})")


def decode_utf8(path, data, first_line=1):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise bad(path, line, f"not UTF-8 (byte 0x{data[e.start]:02x} at column {column})",
                  f"convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8 {path}")


def documents(path, field):
    """(document text, bytes read so far of this file) for each document of an input"""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise bad(path, 0, f"cannot read it ({e.strerror})", "check the path")
    if not data.strip():
        raise bad(path, 0, "empty", "leave it out, or give it some text")
    if path.suffix != ".jsonl":
        yield decode_utf8(path, data), len(data)
        return
    at = 0
    for number, raw in enumerate(data.splitlines(keepends=True), 1):
        at += len(raw)
        if not raw.strip():
            raise bad(path, number, "empty line, not a JSON object", "one JSON object per line, no blank lines")
        try:
            record = json.loads(decode_utf8(path, raw, number))
        except json.JSONDecodeError as e:
            msg = e.msg[:-3] if e.msg.endswith(" at") else e.msg  # "Invalid control character at"
            raise bad(path, number, f"not JSON ({msg} at column {e.colno})", "one JSON object per line")
        if not isinstance(record, dict):
            raise bad(path, number, f"a JSON {type(record).__name__}, not an object", f'{{"{field}": "..."}} per line')
        if field not in record:
            raise bad(path, number, f"no field {field!r} (it has: {', '.join(record) or 'none'})",
                      "--field names the field that holds the text")
        text = record[field]
        if not isinstance(text, str):
            raise bad(path, number, f"field {field!r} is {json.dumps(text)[:40]}, not a string",
                      "--field names the field that holds the text")
        if not text:
            raise bad(path, number, f"field {field!r} is empty", "leave the empty document out")
        yield without_lone_surrogates(text), at


def without_lone_surrogates(text):
    """JSON may escape half a UTF-16 pair ("\\ud83d" of a cut emoji), which UTF-8 cannot
    encode: it becomes U+FFFD, as tiktoken's encode does"""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class Progress:
    """bytes read of all inputs, as a bar; a terminal redraws it, a log gets a line per 10%"""

    def __init__(self, total_bytes):
        self.total, self.start, self.last, self.tenth = total_bytes, time.time(), 0.0, -1
        self.tty = sys.stderr.isatty()

    def show(self, done_bytes, tokens, final=False):
        now = time.time()
        fraction = done_bytes / self.total if self.total else 1.0
        tenth = int(fraction * 10)
        if not final and (now - self.last < 0.1 if self.tty else tenth == self.tenth):
            return
        self.last, self.tenth = now, tenth
        secs = max(now - self.start, 1e-9)
        bar = "#" * int(fraction * 30)
        line = (f"prepare_text: [{bar:30}] {fraction:4.0%}  {done_bytes / 1e6:.1f} of {self.total / 1e6:.1f} MB"
                f"  {done_bytes / 1e6 / secs:.2f} MB/s  {tokens / secs:,.0f} tok/s")
        print(f"\r{line}" if self.tty else line, end="\n" if final or not self.tty else "", file=sys.stderr,
              flush=True)


class Shards:
    """the stream of tokens into NAME_val_* (the first val_tokens) and NAME_train_* shards, written
    to out/.NAME_new/ until commit() moves them into out"""

    def __init__(self, out, name, val_tokens, shard_tokens):
        self.out, self.name, self.val_tokens, self.shard_tokens = out, name, val_tokens, shard_tokens
        self.buffer, self.count, self.written, self.index = [], 0, [], {"val": 0, "train": 0}
        self.stage = out / f".{name}_new"
        try:
            shutil.rmtree(self.stage, ignore_errors=True)  # (what a killed run left)
            self.stage.mkdir(parents=True)
        except OSError as e:
            raise InputError(f"error: --out {out}: cannot create {self.stage} ({e.strerror}) (hint: check the path)")

    def split(self):
        return "val" if self.count < self.val_tokens else "train"

    def add(self, ids):
        at = 0
        while at < len(ids):
            split = self.split()
            room = self.shard_tokens - len(self.buffer)
            if split == "val":
                room = min(room, self.val_tokens - self.count)
            take = ids[at:at + room]
            self.buffer.extend(take)
            self.count += len(take)
            at += len(take)
            if len(self.buffer) == self.shard_tokens:
                self.flush(split)
            elif split == "val" and self.count == self.val_tokens:
                self.flush(split, last=True)

    def flush(self, split, last=False):
        """writes the buffer as the split's next shard. The last shard of a split, if under half
        a shard, joins the one before it: a trainer needs B*T+1 tokens in every shard."""
        if not self.buffer:
            return
        if last and self.index[split] > 0 and len(self.buffer) < self.shard_tokens // 2:
            self.index[split] -= 1
            before = self.written.pop()
            self.buffer = np.concatenate([data_files.read_shard(before), np.asarray(self.buffer, dtype=np.uint16)])
        path = self.stage / f"{self.name}_{split}_{self.index[split]:06d}.bin"
        data_files.write_shard(path, self.buffer)
        self.written.append(path)
        self.index[split] += 1
        self.buffer = []

    def remove(self):
        shutil.rmtree(self.stage, ignore_errors=True)

    def commit(self):
        """replaces out's NAME_ shards with the new ones; returns how many were there before"""
        mine = re.compile(rf"{re.escape(self.name)}_(val|train)_\d{{6}}\.bin")
        old = [p for p in self.out.iterdir() if mine.fullmatch(p.name)]
        for path in old:
            path.unlink()
        for i, path in enumerate(self.written):
            self.written[i] = path.rename(self.out / path.name)
        self.stage.rmdir()
        return len(old)


def prepare(enc, inputs, shards, field):
    """tokenize every document of the inputs into the shards; (documents, tokens)"""
    total = 0
    for path in inputs:
        try:
            total += Path(path).stat().st_size
        except OSError as e:
            raise bad(path, 0, f"cannot read it ({e.strerror})", "check the path")
    progress = Progress(total)
    done = docs = 0
    for path in inputs:
        file_done = 0
        for text, read in documents(path, field):
            shards.add([enc.eot])
            size = read - file_done
            for number, match in enumerate(enc.pattern.finditer(text)):
                shards.add(enc.encode_word(match.group()))
                if number % 4096 == 0:
                    progress.show(done + file_done + size * match.end() // max(len(text), 1), shards.count)
            file_done = read
            docs += 1
        done += file_done
    shards.flush(shards.split(), last=True)
    progress.show(done, shards.count, final=True)
    return docs, shards.count


def main():
    parser = argparse.ArgumentParser(description="Text or JSONL files to llm.c token shards (GPT-2 BPE).")
    parser.add_argument("inputs", nargs="+", help="text files (one document each) and .jsonl files (one per line)")
    parser.add_argument("--out", default=None, help="output folder (default: <repo>/data/NAME)")
    parser.add_argument("--name", default="text", help="the shards' name: NAME_val_*.bin, NAME_train_*.bin")
    parser.add_argument("--field", default="text", help="the JSONL field that holds the text (default: text)")
    parser.add_argument("--val-tokens", type=int, default=32768, help="tokens of the val split (default 32768)")
    parser.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (a split's last may hold up to half more)")
    parser.add_argument("--data-dir", default=None, help="take GPT-2's encoder.json and vocab.bpe from here")
    args = parser.parse_args()
    if args.val_tokens < 1 or args.shard_tokens < 1:
        parser.error("--val-tokens and --shard-tokens must be at least 1")
    if not args.name or "/" in args.name:
        parser.error(f"--name {args.name!r}: the shards' file name prefix, not empty, without '/'")
    out = Path(args.out) if args.out else data_files.REPO_ROOT / "data" / args.name
    with data_files.exit_on_input_error():  # the BPE files: missing or wrong, one line
        enc = bpe.load_gpt2_tokenizer(args.data_dir)
    shards = None
    try:
        shards = Shards(out, args.name, args.val_tokens, args.shard_tokens)
        docs, tokens = prepare(enc, args.inputs, shards, args.field)
        if tokens <= args.val_tokens:
            raise InputError(f"error: {', '.join(args.inputs)}: {tokens:,} tokens in all, not more than "
                             f"--val-tokens {args.val_tokens:,}: nothing left to train on (hint: more text, or a "
                             f"smaller --val-tokens)")
        replaced = shards.commit()
    except (InputError, OSError) as e:
        if shards is not None:
            shards.remove()
        if isinstance(e, OSError):  # a write that failed (a full disk)
            e = f"error: {e.filename or out}: cannot write ({e.strerror}) (hint: check the space and the path)"
        print(f"\n{e}" if sys.stderr.isatty() else e, file=sys.stderr)
        sys.exit(1)
    before = f"; the {replaced} {args.name}_ shards there before are gone" if replaced else ""
    print(f"prepare_text: {docs:,} documents, {tokens:,} tokens (val {args.val_tokens:,}, train "
          f"{tokens - args.val_tokens:,}), {len(shards.written)} shards ({shards.index['val']} val, "
          f"{shards.index['train']} train) in {out}/{args.name}_*.bin{before}")


if __name__ == "__main__":
    main()
