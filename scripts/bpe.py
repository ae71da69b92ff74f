"""
GPT-2's byte-level BPE tokenizer, written from scratch (no tiktoken / transformers needed).

How GPT-2 turns text into token ids:
1. Pre-tokenise: a regex cuts the text into "words" (letters, digits, punctuation runs,
   whitespace runs, English contractions). BPE merges never cross these boundaries.
2. Each word is turned into UTF-8 bytes, and every byte is mapped to a printable unicode
   character (bytes_to_unicode below), because the vocabulary files store tokens as strings.
3. BPE: starting from single characters, repeatedly merge the adjacent pair with the lowest
   rank in vocab.bpe, until no pair in the word has a rank.
4. Look each resulting piece up in encoder.json.
Decoding is just the reverse lookup: id -> bytes, concatenated, then UTF-8 decoded.

Also writes llm.c's decode-only tokenizer file (see docs/formats.md):
header of 256 int32 (magic 20240328, version 2, vocab size, eot id), then for each id a
uint8 length followed by the token's raw bytes.

Usage as a script (handy for poking at the tokenizer):
    python3 scripts/bpe.py "Hello world"          # prints the ids
    python3 scripts/bpe.py --decode 15496 995     # prints the text
(Here a typed <|endoftext|> becomes its one id, 50256; scripts/prepare_text.py reads it as
ordinary text and puts 50256 between documents itself.)
"""

import json
import struct
import sys

import regex  # not `re`: we need \p{L} / \p{N} unicode classes

EOT_TEXT = "<|endoftext|>"
TOKENIZER_MAGIC = 20240328
TOKENIZER_VERSION = 2

# GPT-2's pre-tokenisation pattern. Note it is case-sensitive: "WE'RE" splits as
# "WE", "'", "RE" because only the lower-case contractions are listed.
# `\s+(?!\S)` takes a whitespace run but leaves its last character for the next word,
# so " world" keeps its leading space; the final `\s+` picks up what is left.
GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode():
    """
    GPT-2's reversible map from the 256 byte values to printable unicode characters.
    Bytes that are already printable (and not space) map to themselves; the others
    (control characters, space, 0x7f-0xa0, 0xad) are shifted to 256, 257, ... in order.
    This is why a leading space shows up as 'Ġ' (256 + 32 = U+0120) in encoder.json.
    """
    printable = (list(range(ord("!"), ord("~") + 1))
                 + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    byte_to_char = {}
    n = 0
    for b in range(256):
        if b in printable:
            byte_to_char[b] = chr(b)
        else:
            byte_to_char[b] = chr(256 + n)
            n += 1
    return byte_to_char


class Tokenizer:

    def __init__(self, encoder_json_path, vocab_bpe_path):
        with open(encoder_json_path, "r", encoding="utf-8") as f:
            self.encoder = json.load(f)  # token string (byte-mapped) -> id
        with open(vocab_bpe_path, "r", encoding="utf-8") as f:
            lines = f.read().split("\n")
        # first line is a "#version: 0.2" comment; the rest are "a b" merges in priority order
        merges = [tuple(line.split(" ")) for line in lines[1:] if line]
        self.bpe_ranks = {pair: rank for rank, pair in enumerate(merges)}

        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        # id -> raw bytes of the token (what the llm.c tokenizer file stores)
        self.id_to_bytes = {i: bytes(self.byte_decoder[c] for c in s)
                            for s, i in self.encoder.items()}
        self.vocab_size = len(self.encoder)  # 50257
        self.eot = self.encoder[EOT_TEXT]    # 50256
        self.special_tokens = {EOT_TEXT: self.eot}
        self.pattern = regex.compile(GPT2_SPLIT_PATTERN)
        # pre-token -> list of ids. Text is very repetitive at the word level, so this cache
        # makes the slow pure-Python merge loop below run only once per distinct word.
        self.cache = {}

    def _bpe(self, word):
        """Merge the characters of one byte-mapped word into BPE pieces (list of str)."""
        parts = list(word)
        while len(parts) > 1:
            # the adjacent pair that was learned earliest (lowest rank) is merged first
            pairs = set(zip(parts, parts[1:]))
            best = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if best not in self.bpe_ranks:
                break  # nothing left to merge
            # replace every occurrence of the pair, scanning left to right
            merged = []
            i = 0
            while i < len(parts):
                if i < len(parts) - 1 and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def encode_word(self, word):
        """The ids of one pre-token (a match of the split pattern)."""
        cached = self.cache.get(word)
        if cached is None:
            mapped = "".join(self.byte_encoder[b] for b in word.encode("utf-8"))
            cached = [self.encoder[piece] for piece in self._bpe(mapped)]
            self.cache[word] = cached
        return cached

    def encode_ordinary(self, text):
        """Encode text with no special tokens: "<|endoftext|>" is just 7 ordinary tokens."""
        ids = []
        for word in self.pattern.findall(text):
            ids.extend(self.encode_word(word))
        return ids

    def encode(self, text, allowed_special=frozenset()):
        """
        Encode text to a list of ids. Special tokens listed in allowed_special (or all of
        them with allowed_special="all") become their single id; the text between them is
        encoded separately, so no merge or regex match crosses a special token. Special
        token strings that are not allowed are encoded as ordinary text (like GPT-2's own
        encoder; tiktoken would raise an error instead).
        """
        if allowed_special == "all":
            allowed_special = set(self.special_tokens)
        allowed = [s for s in self.special_tokens if s in allowed_special]
        if not allowed:
            return self.encode_ordinary(text)
        special_re = "(" + "|".join(regex.escape(s) for s in allowed) + ")"
        ids = []
        # with a capture group, split() keeps the separators at the odd positions
        for i, chunk in enumerate(regex.split(special_re, text)):
            if i % 2 == 1:
                ids.append(self.special_tokens[chunk])
            elif chunk:
                ids.extend(self.encode_ordinary(chunk))
        return ids

    def decode_bytes(self, ids):
        return b"".join(self.id_to_bytes[int(i)] for i in ids)

    def decode(self, ids, errors="replace"):
        # a single token can be part of a multi-byte UTF-8 character, hence errors="replace"
        return self.decode_bytes(ids).decode("utf-8", errors=errors)


def write_tokenizer_bin(tok, path):
    """Write llm.c's decode tokenizer file (atomically: a crash leaves no half file)."""
    from data_files import write_atomic  # local import: bpe.py stays usable on its own
    header = [0] * 256
    header[0] = TOKENIZER_MAGIC
    header[1] = TOKENIZER_VERSION
    header[2] = tok.vocab_size
    header[3] = tok.eot
    chunks = [struct.pack("<256i", *header)]
    for i in range(tok.vocab_size):
        b = tok.id_to_bytes[i]
        assert len(b) < 256, f"token {i} is {len(b)} bytes, does not fit the uint8 length"
        chunks.append(struct.pack("<B", len(b)))
        chunks.append(b)
    write_atomic(path, b"".join(chunks))


def read_tokenizer_bin(path):
    """Read llm.c's tokenizer file back: returns (eot id, list of token bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    if header[0] != TOKENIZER_MAGIC or header[1] != TOKENIZER_VERSION:
        raise ValueError(f"{path}: bad magic/version {header[0]}/{header[1]}")
    vocab_size, eot = header[2], header[3]
    tokens = []
    pos = 1024
    for _ in range(vocab_size):
        n = data[pos]
        tokens.append(data[pos + 1:pos + 1 + n])
        pos += 1 + n
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} trailing bytes after {vocab_size} tokens")
    return eot, tokens


def load_gpt2_tokenizer(data_dir=None):
    """The GPT-2 tokenizer from the (sha256-checked) encoder.json and vocab.bpe."""
    import data_files
    return Tokenizer(data_files.input_path("gpt2/encoder.json", data_dir),
                     data_files.input_path("gpt2/vocab.bpe", data_dir))


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="GPT-2 BPE: encode text or decode ids")
    parser.add_argument("items", nargs="+", help="text to encode, or ids with --decode")
    parser.add_argument("--decode", action="store_true", help="decode ids to text")
    parser.add_argument("--data-dir", default=None, help="directory with gpt2/encoder.json, gpt2/vocab.bpe")
    args = parser.parse_args()
    import data_files
    with data_files.exit_on_input_error():
        enc = load_gpt2_tokenizer(args.data_dir)
    if args.decode:
        bad = [x for x in args.items if not x.isdigit() or int(x) >= len(enc.id_to_bytes)]
        if bad:
            sys.exit(f"error: --decode {bad[0]}: not a token id (hint: 0 to {len(enc.id_to_bytes) - 1})")
        print(enc.decode([int(x) for x in args.items]))
    else:
        print(" ".join(map(str, enc.encode(" ".join(args.items), allowed_special={EOT_TEXT}))))
