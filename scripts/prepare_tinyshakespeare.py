"""
Tokenize tinyshakespeare with GPT-2's BPE into llm.c token shards, and write llm.c's
GPT-2 decode tokenizer file. Outputs (under --out, default <repo>/data):
    tinyshakespeare/tiny_shakespeare_val.bin     first 32,768 tokens
    tinyshakespeare/tiny_shakespeare_train.bin   the remaining 305,260 tokens
    gpt2_tokenizer.bin                           id -> bytes, for decoding samples in C

The split is the one of llm.c's dev/data/tinyshakespeare.py, so the shards are
byte-identical to llm.c's (dev/test/tokenizer_cases.json pins their sha256, computed
with tiktoken by dev/test/make_tokenizer_fixture.py). llm.c treats every paragraph of
the dialogue as a separate document:
    text = "<|endoftext|>" + text
    text = text.replace("\n\n", "\n\n<|endoftext|>")
and then encodes the whole text with <|endoftext|> allowed as a special token. As a BPE
never merges across a special token, that is the same as: split the text on "\n\n"; for
every section emit the eot id (50256), then the encoding of the section followed by the
"\n\n" it was split on (the last section has none). So the token stream starts with eot,
and each section's trailing "\n\n" sits before the next eot. The first 32,768 tokens
(about 10%) are the validation split, the rest the training split.

Inputs come from $DATA_MIRROR_DIR or are downloaded (see data_files.py), sha256-checked.
If all outputs are newer than these scripts and the inputs (those found without a download),
nothing is redone: the data, once prepared, needs neither the network nor the mirror again.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import bpe
import data_files

VAL_TOKENS = 32768


def tokenize_sections(enc, text):
    """The llm.c document split described above, as a list of token ids."""
    sections = text.split("\n\n")
    tokens = []
    for i, section in enumerate(sections):
        tokens.append(enc.eot)
        if i < len(sections) - 1:
            section += "\n\n"
        tokens.extend(enc.encode_ordinary(section))
    return tokens


def main():
    parser = argparse.ArgumentParser(
        description="Tokenize tinyshakespeare into llm.c token shards and write gpt2_tokenizer.bin.")
    parser.add_argument("--out", default=str(data_files.REPO_ROOT / "data"),
                        help="output directory (default: <repo>/data)")
    parser.add_argument("--data-dir", default=None,
                        help="take the inputs only from this directory (tinyshakespeare.txt, "
                             "gpt2/encoder.json, gpt2/vocab.bpe)")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args()

    out = Path(args.out)
    val_path = out / "tinyshakespeare" / "tiny_shakespeare_val.bin"
    train_path = out / "tinyshakespeare" / "tiny_shakespeare_train.bin"
    tok_path = out / "gpt2_tokenizer.bin"
    outputs = [val_path, train_path, tok_path]
    out_hint = "--out names the folder to write into, which must be one this user can write"
    with data_files.one_line_errors(out, "a folder", out_hint):  # before any work: --out can be written
        if out.exists() and not out.is_dir():
            raise NotADirectoryError(20, "not a folder", str(out))
        existing = val_path.parent  # the nearest folder that exists: nothing is created yet
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise NotADirectoryError(20, "not a folder", str(existing))
        if not os.access(existing, os.W_OK):
            raise PermissionError(13, "not writable", str(existing))

    # outputs depend on the code that produced them and on the inputs, of which those found
    # without a download count (one no longer here, e.g. from a mirror since unset, made them)
    here = Path(__file__).resolve().parent
    deps = [here / "prepare_tinyshakespeare.py", here / "bpe.py", here / "data_files.py"]
    deps += [p for p in (data_files.local_input(n, args.data_dir) for n in data_files.INPUTS) if p is not None]
    if not args.force and all(p.is_file() for p in outputs):
        oldest_output = min(p.stat().st_mtime for p in outputs)
        if oldest_output > max(p.stat().st_mtime for p in deps):
            print(f"up to date: {', '.join(str(p) for p in outputs)}")
            return

    with data_files.exit_on_input_error():  # missing / wrong input: one line, exit 1
        text_path = data_files.input_path("tinyshakespeare.txt", args.data_dir)
        encoder_path = data_files.input_path("gpt2/encoder.json", args.data_dir)
        vocab_path = data_files.input_path("gpt2/vocab.bpe", args.data_dir)

    t0 = time.time()
    enc = bpe.Tokenizer(encoder_path, vocab_path)
    # newline="" reads the bytes as they are (the file is plain ASCII with \n line ends)
    with open(text_path, "r", encoding="utf-8", newline="") as f:
        text = f.read()
    tokens = tokenize_sections(enc, text)
    val_tokens, train_tokens = tokens[:VAL_TOKENS], tokens[VAL_TOKENS:]

    with data_files.one_line_errors(out, "a folder", out_hint):
        val_path.parent.mkdir(parents=True, exist_ok=True)
        data_files.write_shard(val_path, val_tokens)
        print(f"wrote {len(val_tokens):,} tokens to {val_path}")
        data_files.write_shard(train_path, train_tokens)
        print(f"wrote {len(train_tokens):,} tokens to {train_path}")
        bpe.write_tokenizer_bin(enc, tok_path)
    print(f"wrote {enc.vocab_size:,} tokens (eot {enc.eot}) to {tok_path}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
