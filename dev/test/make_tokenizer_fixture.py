"""
Generate dev/test/tokenizer_cases.json, the expected outputs that dev/test/test_tokenizer.py
and dev/test/test_prepare_text.py check our own BPE (scripts/bpe.py) against. The expectations come from an independent
implementation, OpenAI's tiktoken, so that a bug in bpe.py cannot hide in its own fixture.

tiktoken cannot download its BPE files on offline machines, so we build its GPT-2 encoding
from the local encoder.json / vocab.bpe with tiktoken's own converter and its own copy of
GPT-2's split pattern; nothing here comes from bpe.py. Only data_files.py is used, to find
the (sha256-checked) input files.

Also recorded: the tinyshakespeare shards and gpt2_tokenizer.bin exactly as llm.c's
dev/data/tinyshakespeare.py and train_gpt2.py produce them with tiktoken (their token
counts and sha256), so the test can check that our prep is byte-identical to llm.c's; and
the token stream scripts/prepare_text.py must write for a few small files and for
tinyshakespeare.txt as one document.

Needs tiktoken, which is NOT a project dependency; only for regenerating the fixture:
    python3 -m pip install tiktoken       # e.g. into a venv or the pyenv python
    python3 dev/test/make_tokenizer_fixture.py
"""

import hashlib
import json
import re
import struct
import sys
from array import array
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str  # tiktoken's GPT-2 split pattern

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import data_files  # noqa: E402

OUT_PATH = data_files.REPO_ROOT / "dev" / "test" / "tokenizer_cases.json"

# (name, text). Each aims at one corner of the regex split or the byte-level BPE.
CASES = [
    ("known GPT-2 ids of a sentence", "Hello world, this is GPT-2."),
    ("accents", "Café naïve résumé, déjà vu à Zürich"),
    ("CJK", "日本語のテキストと中文字符"),
    ("emoji incl. ZWJ sequence and flag", "I ❤️ 🦙 and 👩‍👩‍👧 🇫🇷!"),
    ("digits long run", "1234567"),
    ("decimal number", "3.14159"),
    ("digits mixed with letters", "abc123def 42x 2024-05-20"),
    ("contractions", "I'm sure they'll say we don't, she's, you've, I'd, we're, 'tis"),
    # no upper-case 'RE etc. is a token, so only a following letter shows the case-sensitivity
    ("upper-case contractions (pattern is case-sensitive)", "WE'RE DON'T I'M THEY'LL ALFRED'RED"),
    ("curly apostrophe is not a contraction", "don\u2019t it\u2019s"),
    ("runs of spaces", "a  b   c    d"),
    ("runs of newlines", "line one\n\nline two\n\n\n\nline three\n"),
    ("tabs", "\tindented\t\tcode\t"),
    ("leading and trailing spaces", "   leading and trailing   "),
    ("only whitespace", " \n \t\n  "),
    ("punctuation runs", "Wait... what?!?! (yes) -- [no] {maybe}; @#$%^&*"),
    ("code-like", "def f(x):\n    return x**2  # square\n"),
    ("mixed scripts and accents on space", " Ελληνικά русский עברית العربية"),
    ("unusual unicode whitespace", "a\u00a0b\u3000c\u2028d\x0be\x0cf\x85g"),
    ("combining marks (NFD e + acute)", "e\u0301te\u0301"),
    ("eot as special token", "<|endoftext|>"),
    ("eot between documents", "First doc.<|endoftext|>Second doc.\n\n<|endoftext|>"),
    ("empty string", ""),
]

# scripts/prepare_text.py's test input (dev/test/test_prepare_text.py): the files, in the order
# given to it, each with its documents (a .jsonl file has one a line, as {"id": i, "text": doc})
PREPARE_TEXT_FILES = [
    ("notes.txt", ["Café naïve résumé, déjà vu — I'm sure they'll say we don't.\r\nWindows line ends\r\n"
                   "  and <|endoftext|> written out is ordinary text.\n\n\n日本語のテキスト 🦙 👩‍👩‍👧\n"]),
    ("docs.jsonl", ["First document.", "def f(x):\n    return x**2  # square\n",
                    "   spaces, tabs\t\tand a\u00a0no-break space  "]),
    ("numbers.txt", ["1234567 and 3.14159, 8675-309-42\n\n"]),
]


def prepare_text_reference(enc, eot, text_path):
    """what prepare_text.py must write: for each document eot, then its ordinary encoding"""
    ids = []
    for _, docs in PREPARE_TEXT_FILES:
        for doc in docs:
            ids += [eot] + enc.encode_ordinary(doc)
    with open(text_path, "rb") as f:  # tinyshakespeare.txt as one document
        stream = [eot] + enc.encode_ordinary(f.read().decode("utf-8"))
    stream = array("H", stream)
    if sys.byteorder == "big":
        stream.byteswap()  # the shards' ids are little-endian
    return {"files": [{"name": name, "documents": docs} for name, docs in PREPARE_TEXT_FILES], "ids": ids,
            "tinyshakespeare_tokens": len(stream), "tinyshakespeare_sha256": hashlib.sha256(stream.tobytes()).hexdigest()}


def llmc_shard_bytes(tokens):
    """A token shard as llm.c's write_datafile writes it (header + uint16 ids)."""
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    toks = array("H", tokens)
    if sys.byteorder == "big":
        toks.byteswap()
    return struct.pack("<256i", *header) + toks.tobytes()


def llmc_tokenizer_bytes(enc):
    """gpt2_tokenizer.bin as llm.c's write_tokenizer writes it."""
    n = enc.max_token_value + 1
    header = [0] * 256
    header[0], header[1], header[2], header[3] = 20240328, 2, n, enc.eot_token
    parts = [struct.pack("<256i", *header)]
    for i in range(n):
        b = enc.decode_bytes([i])
        parts.append(struct.pack("<B", len(b)) + b)
    return b"".join(parts)


def main():
    encoder_path = data_files.input_path("gpt2/encoder.json")
    vocab_path = data_files.input_path("gpt2/vocab.bpe")
    text_path = data_files.input_path("tinyshakespeare.txt")
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=str(vocab_path),
                                            encoder_json_file=str(encoder_path))
    enc = tiktoken.Encoding(name="gpt2_local", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    eot = {"<|endoftext|>"}

    cases = []
    for name, text in CASES:
        special = "<|endoftext|>" in text
        ids = enc.encode(text, allowed_special=eot) if special else enc.encode_ordinary(text)
        cases.append({"name": name, "text": text, "allowed_special": sorted(eot) if special else [],
                      "ids": ids})

    # llm.c's dev/data/tinyshakespeare.py, step by step
    text = open(text_path, "r").read()
    text = "<|endoftext|>" + text
    text = text.replace("\n\n", "\n\n<|endoftext|>")
    tokens = enc.encode(text, allowed_special=eot)
    val, train = tokens[:32768], tokens[32768:]
    sha = lambda b: hashlib.sha256(b).hexdigest()
    reference = {
        "val_tokens": len(val),
        "train_tokens": len(train),
        "val_first_64": val[:64],
        "val_sha256": sha(llmc_shard_bytes(val)),
        "train_sha256": sha(llmc_shard_bytes(train)),
        "tokenizer_bin_sha256": sha(llmc_tokenizer_bytes(enc)),
    }

    fixture = {
        "note": ("Generated by dev/test/make_tokenizer_fixture.py with tiktoken "
                 f"{tiktoken.__version__} (an independent GPT-2 BPE), built from the local "
                 "gpt2/encoder.json and gpt2/vocab.bpe with tiktoken's data_gym converter and "
                 "its r50k split pattern. Do not edit by hand; rerun the script."),
        "cases": cases,
        "tinyshakespeare_llmc": reference,
        "prepare_text": prepare_text_reference(enc, enc.eot_token, text_path),
    }
    OUT_PATH.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(fixture, ensure_ascii=True, indent=1)
    # keep each list of ids on one line, so one case is a few lines in a diff
    text = re.sub(r"\[[\d,\s]*\]", lambda m: json.dumps(json.loads(m.group(0))), text)
    with open(OUT_PATH, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(f"wrote {len(cases)} cases and the tinyshakespeare reference to {OUT_PATH}")


if __name__ == "__main__":
    main()
