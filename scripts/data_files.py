"""
Where the data-prep inputs come from, and how token shards are written.

Inputs (names relative to a data directory):
    tinyshakespeare.txt, gpt2/encoder.json, gpt2/vocab.bpe
Lookup for each input, first match wins:
    1. --data-dir DIR given: DIR/<name>, nothing else (no download), so a test can point
       the scripts at a fake directory;
    2. $DATA_MIRROR_DIR/<name>, where the environment variable DATA_MIRROR_DIR names a
       folder with copies of the data files, checked by sha256 like a download (for a
       machine without network);
    3. <repo>/data/downloads/<name>, downloaded from the public source if missing.
Every input is checked against the sha256 pinned below, wherever it came from. Problems
are reported as one line, `error: <path>: <what is wrong> (hint: ...)`, and exit code 1.

Token shards (docs/formats.md): header of 256 int32 (magic 20240520, version 1, number of
tokens N), then N uint16 token ids, all little-endian.
"""

import contextlib
import csv
import hashlib
import os
import sys
import urllib.request
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
DOWNLOAD_DIR = REPO_ROOT / "data" / "downloads"
MIRROR_VAR = "DATA_MIRROR_DIR"

# name -> (public source, sha256): the sha256 of the public originals
INPUTS = {
    "tinyshakespeare.txt": (
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
    "gpt2/encoder.json": (
        "https://openaipublic.blob.core.windows.net/gpt-2/models/124M/encoder.json",
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    "gpt2/vocab.bpe": (
        "https://openaipublic.blob.core.windows.net/gpt-2/models/124M/vocab.bpe",
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
}

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256


class InputError(Exception):
    """A missing or bad input file; str() is the one-line message for the user."""

    def __init__(self, path, what, hint):
        super().__init__(f"error: {path}: {what} (hint: {hint})")


@contextlib.contextmanager
def exit_on_input_error():
    """For scripts: turn an InputError into its one-line message on stderr and exit 1."""
    try:
        yield
    except InputError as e:
        print(e, file=sys.stderr)
        sys.exit(1)


def split_label(item, default):
    """A command line's "[label=]path": (label, path), the label `default` where none is given.
    A path that exists, or whose "=" comes after a "/" (runs/lr=1e-3/main.log), has no label."""
    label, sep, path = item.partition("=")
    if not sep or "/" in label or os.path.exists(item):
        return default, item
    return label, path


@contextlib.contextmanager
def one_line_errors(path, kind, hint="check the path"):
    """For scripts: a file that cannot be read or written, or that is not `kind` (a decode or
    parse error while reading it), ends in one line on stderr and exit 1, not a traceback."""
    try:
        yield
    except OSError as e:
        print(f"error: {e.filename or path}: {e.strerror or e} (hint: {hint})", file=sys.stderr)
        sys.exit(1)
    except (UnicodeDecodeError, ValueError, KeyError, IndexError, TypeError, csv.Error) as e:
        print(f"error: {path}: not {kind} ({type(e).__name__}: {e})", file=sys.stderr)
        sys.exit(1)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download(url, path):
    """Download url to path via path.tmp, so an interrupted download leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    print(f"downloading {url} to {path}")
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            data = resp.read()
    except OSError as e:  # URLError, HTTPError and timeouts are all OSErrors
        raise InputError(path, f"download from {url} failed: {e}",
                         f"without network, copy the file there by hand, or set {MIRROR_VAR} "
                         f"to a folder that holds {', '.join(INPUTS)}")
    write_atomic(tmp, data)  # the hash is checked before the final rename below
    return tmp


def mirror_dir():
    """The folder named by $DATA_MIRROR_DIR, or None when it is unset or empty."""
    d = os.environ.get(MIRROR_VAR)
    return Path(d) if d else None


def local_input(name, data_dir=None):
    """Where input_path would find `name` without a download, unchecked; None if nowhere."""
    places = [Path(data_dir)] if data_dir is not None else [d for d in (mirror_dir(), DOWNLOAD_DIR) if d]
    return next((d / name for d in places if (d / name).is_file()), None)


def input_path(name, data_dir=None):
    """Path of input `name` (a key of INPUTS), located as described above and sha256-checked."""
    url, expected = INPUTS[name]
    path, fresh = local_input(name, data_dir), None
    if path is None and data_dir is not None:
        raise InputError(Path(data_dir) / name, "missing input file",
                         f"--data-dir must hold {', '.join(INPUTS)}; leave --data-dir "
                         f"out to use the defaults")
    if path is None:
        path = DOWNLOAD_DIR / name
        fresh = _download(url, path)

    actual = sha256_of(fresh or path)
    if actual != expected:
        if fresh is not None:
            fresh.unlink()
            raise InputError(path, f"downloaded file has sha256 {actual}, expected {expected}",
                             f"the source {url} changed or the download was corrupted")
        hint = ("delete it and run again to download it again" if data_dir is None
                and path.is_relative_to(DOWNLOAD_DIR) else
                "the file is corrupt or a different version; restore the original")
        raise InputError(path, f"sha256 is {actual}, expected {expected}", hint)
    if fresh is not None:
        os.replace(fresh, path)
    return path


def write_atomic(path, data):
    """
    Write bytes to path atomically: write path.tmp, flush and fsync it, then rename over
    path. Readers (and make) never see a half-written file, even after a crash.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_shard(path, tokens):
    """Write a token shard (magic 20240520, version 1, N, then N uint16 ids)."""
    toks = np.asarray(tokens, dtype=np.int64)
    if toks.ndim != 1:
        raise ValueError(f"tokens must be a 1-D sequence, got shape {toks.shape}")
    if len(toks) >= 2**31:
        raise ValueError(f"{len(toks)} tokens do not fit the int32 count in the header")
    if len(toks) and (toks.min() < 0 or toks.max() >= 2**16):
        raise ValueError(f"token ids must be in [0, 65536) to fit uint16, got "
                         f"min {toks.min()} max {toks.max()}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0] = SHARD_MAGIC
    header[1] = SHARD_VERSION
    header[2] = len(toks)
    write_atomic(path, header.tobytes() + toks.astype("<u2").tobytes())


def read_shard(path):
    """Read a token shard back as a uint16 numpy array, checking its header and size."""
    data = Path(path).read_bytes()
    header = np.frombuffer(data[:HEADER_INTS * 4], dtype="<i4")
    if len(header) != HEADER_INTS or header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
        raise ValueError(f"{path}: not a version {SHARD_VERSION} token shard")
    n = int(header[2])
    if len(data) != HEADER_INTS * 4 + 2 * n:
        raise ValueError(f"{path}: header says {n} tokens but the file has "
                         f"{len(data)} bytes, expected {HEADER_INTS * 4 + 2 * n}")
    return np.frombuffer(data, dtype="<u2", offset=HEADER_INTS * 4)
