/*
Files checksummed as they are written or read, and written so that a crash never leaves a
half-written file under the real name. The checksum is XXH3 (64 bits) from xxhash.h (Debian's
libxxhash-dev, used header-only: nothing to link).

A HashedFile (allocated by hashed_open or hashed_create, freed by hashed_close or hashed_commit)
hands out an ordinary FILE* made with glibc's fopencookie: every byte that the
caller's fwrite or fread moves passes through hashed_write or hashed_read below, which update
the checksum on the way. So the readers and writers of the file formats (gpt2_file.h,
checkpoint.h, and the optimizer's state, which only ever sees a FILE*) need no change, and no
second pass over the data is made. The stream's buffer is 1 MiB (a reader may ask for another
size), so each piece is hashed while it is in the CPU's cache (a large fwrite skips the buffer:
it is hashed and written in pieces of 1 MiB too).

Writing: hashed_create opens "<path>.tmp"; hashed_commit flushes, fsyncs, renames it to path
and fsyncs the directory, so that the rename itself survives a power cut. If the write fails
(a full disk), fatal removes the .tmp (fatal_unlink, utils.h): a failed write leaves nothing.
*/
#ifndef LLMC_HASHED_FILE_H
#define LLMC_HASHED_FILE_H

#include <fcntl.h>

#define XXH_INLINE_ALL
#if defined(__AVX512F__)
#define XXH_VECTOR XXH_AVX2  // fast enough, and gcc 12 warns (wrongly) inside its AVX-512 intrinsics
#endif
#include <xxhash.h>

#include "utils.h"

typedef struct {
    uint64_t size;  // bytes
    uint64_t hash;  // XXH3-64 of the bytes
} FileDigest;

static inline int file_digest_equal(FileDigest a, FileDigest b) { return a.size == b.size && a.hash == b.hash; }

typedef struct {
    int fd;
    FILE* fp;           // the stream the caller reads or writes
    XXH3_state_t* xxh;  // (XXH3_createState: the state needs 64-byte alignment)
    uint64_t bytes;
    char* buffer;       // the stream's: glibc hands a cookie stream's reads through its buffer
    char path[4096];    // the file's name; while writing, the data goes to tmp
    char tmp[4200];
} HashedFile;

#define HASHED_PIECE (1 << 20)
#define HASHED_MAX_OPEN 8
// the open ones, so that a fuzzer whose reader jumped out of fatal can free them (hashed_abandon_all)
static HashedFile* hashed_open_files[HASHED_MAX_OPEN];

static ssize_t hashed_write(void* cookie, const char* buf, size_t size) {
    HashedFile* h = (HashedFile*)cookie;
    size_t done = 0;
    while (done < size) {
        size_t piece = size - done < HASHED_PIECE ? size - done : HASHED_PIECE;
        XXH3_64bits_update(h->xxh, buf + done, piece);
        for (size_t put = 0; put < piece;) {
            ssize_t n = write(h->fd, buf + done + put, piece - put);
            if (n < 0 && errno == EINTR) { continue; }
            if (n <= 0) { return (ssize_t)(done + put); }  // short: the stream records the error (errno kept)
            put += (size_t)n;
        }
        done += piece;
        h->bytes += piece;
    }
    return (ssize_t)size;
}

static ssize_t hashed_read(void* cookie, char* buf, size_t size) {
    HashedFile* h = (HashedFile*)cookie;
    ssize_t n;
    do { n = read(h->fd, buf, size); } while (n < 0 && errno == EINTR);
    if (n > 0) {
        XXH3_64bits_update(h->xxh, buf, (size_t)n);
        h->bytes += (size_t)n;
    }
    return n;
}

static int hashed_close_fd(void* cookie) { return close(((HashedFile*)cookie)->fd); }

static inline HashedFile* hashed_new(int fd, const char* mode, const char* path, size_t buffer) {
    HashedFile* h = (HashedFile*)calloc(1, sizeof(HashedFile));
    cookie_io_functions_t io = {mode[0] == 'r' ? hashed_read : NULL, mode[0] == 'r' ? NULL : hashed_write,
                                NULL, hashed_close_fd};
    if (h != NULL) {
        h->fd = fd;
        h->xxh = XXH3_createState();
        h->buffer = (char*)malloc(buffer);
    }
    if (h != NULL && h->xxh != NULL && h->buffer != NULL) { h->fp = fopencookie(h, mode, io); }
    if (h == NULL || h->fp == NULL) { fatal("%s: cannot set up the checksummed stream: %s", path, strerror(errno)); }
    XXH3_64bits_reset(h->xxh);
    setvbuf(h->fp, h->buffer, _IOFBF, buffer);  // a buffer a call, and a state file's small writes gathered
    snprintf(h->path, sizeof(h->path), "%s", path);
    for (int i = 0; i < HASHED_MAX_OPEN; i++) {
        if (hashed_open_files[i] == NULL) {
            hashed_open_files[i] = h;
            return h;
        }
    }
    fatal("%s: more than %d checksummed files open at once (a bug)", path, HASHED_MAX_OPEN);
}

static inline FileDigest hashed_digest(const HashedFile* h) { return FileDigest{h->bytes, XXH3_64bits_digest(h->xxh)}; }

// closes the stream (fclose's result) and frees h
static inline int hashed_free(HashedFile* h) {
    int rc = fclose(h->fp);
    for (int i = 0; i < HASHED_MAX_OPEN; i++) {
        if (hashed_open_files[i] == h) { hashed_open_files[i] = NULL; }
    }
    XXH3_freeState(h->xxh);
    free(h->buffer);
    free(h);
    return rc;
}

// for fuzzers: frees what a reader that jumped out of fatal left open
static inline void hashed_abandon_all(void) {
    for (int i = 0; i < HASHED_MAX_OPEN; i++) {
        if (hashed_open_files[i] != NULL) { hashed_free(hashed_open_files[i]); }
    }
}

// opens path for reading; the checksum covers every byte read until hashed_close
static inline HashedFile* hashed_open(const char* path, size_t buffer = HASHED_PIECE) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fatal("%s: cannot open for reading: %s (hint: check the path)", path, strerror(errno));
    }
    check_not_directory(fd, path);
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // a larger read-ahead: the reads come in pieces
    return hashed_new(fd, "rb", path, buffer);
}

// Reads `bytes` straight into dst, hashing each piece as it lands: no copy through the stream's
// buffer, which must be empty (nothing read yet, or exactly a buffer's worth). For a model
// file's parameters; the optimizer's state, read by zenflow.h through the FILE*, takes the copy.
static inline void hashed_read_direct(HashedFile* h, void* dst, size_t bytes) {
    for (size_t done = 0; done < bytes;) {
        size_t piece = bytes - done < HASHED_PIECE ? bytes - done : HASHED_PIECE;
        ssize_t n = read(h->fd, (char*)dst + done, piece);
        if (n < 0 && errno == EINTR) { continue; }
        if (n < 0) { fatal("%s: cannot read at byte %zu: %s", h->path, (size_t)h->bytes, strerror(errno)); }
        if (n == 0) {
            fatal("%s: file ends at byte %zu, %zu bytes short (hint: did something shorten it while it "
                    "was read?)", h->path, (size_t)h->bytes, bytes - done);
        }
        XXH3_64bits_update(h->xxh, (char*)dst + done, (size_t)n);
        h->bytes += (size_t)n;
        done += (size_t)n;
    }
}

// reads whatever the reader left (so that the checksum covers the whole file), closes, frees,
// and returns the digest
static inline FileDigest hashed_close(HashedFile* h) {
    char rest[4096];
    while (fread(rest, 1, sizeof(rest), h->fp) > 0) {}
    FileDigest d = hashed_digest(h);
    hashed_free(h);
    return d;
}

// opens "<path>.tmp" for writing
static inline HashedFile* hashed_create(const char* path) {
    char tmp[4200];
    int n = snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (n < 0 || (size_t)n >= 4096) { fatal("%s: path too long (at most 4091 characters, for \".tmp\")", path); }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { fatal("%s: cannot open for writing: %s (hint: check the path)", tmp, strerror(errno)); }
    HashedFile* h = hashed_new(fd, "wb", path, HASHED_PIECE);
    snprintf(h->tmp, sizeof(h->tmp), "%s", tmp);
    fatal_unlink = h->tmp;
    return h;
}

// fsync of the directory holding path: makes a rename (or unlink) in it durable
static inline void sync_parent_dir(const char* path) {
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    char* slash = strrchr(dir, '/');
    if (slash == dir) {
        slash[1] = '\0';
    } else if (slash != NULL) {
        *slash = '\0';
    } else {
        snprintf(dir, sizeof(dir), ".");
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) { fatal("%s: cannot sync the directory: %s", dir, strerror(errno)); }
    close(fd);
}

// flush, fsync, rename over path, fsync the directory; frees h and returns what was written
static inline FileDigest hashed_commit(HashedFile* h) {
    // the kill test (dev/test/test_resume.py): SIGKILL in the n-th write, before all of it has
    // reached the file (what a power cut or the OOM killer may do at that moment, made certain)
    static int writes = 0;
    if (debug_fail_at("DEBUG_KILL_IN_WRITE", ++writes)) { raise(SIGKILL); }
    if (fflush(h->fp) != 0 || ferror(h->fp) || fsync(h->fd) != 0) {
        fatal("%s: write failed: %s (hint: is the disk full?)", h->tmp, strerror(errno));
    }
    FileDigest d = hashed_digest(h);
    char tmp[4200], path[4096];
    snprintf(tmp, sizeof(tmp), "%s", h->tmp);
    snprintf(path, sizeof(path), "%s", h->path);
    fatal_unlink = NULL;  // (it points into h, freed now: a failure below unlinks tmp itself)
    if (hashed_free(h) != 0) {
        unlink(tmp);
        fatal("%s: close failed: %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        fatal("%s: rename to %s failed: %s", tmp, path, strerror(errno));
    }
    sync_parent_dir(path);
    return d;
}

#endif  // LLMC_HASHED_FILE_H
