/*
Files checksummed as they are written or read, and written so that a crash never leaves a
half-written file under the real name. The checksum is XXH3 (64 bits) from xxhash.h (Debian's
libxxhash-dev, used header-only: nothing to link).

A HashedFile hands out an ordinary FILE* made with glibc's fopencookie: every byte that the
caller's fwrite or fread moves passes through hashed_write or hashed_read below, which update
the checksum on the way. So the readers and writers of the file formats (gpt2_file.h,
checkpoint.h, and the optimizer's state, which only ever sees a FILE*) need no change, and no
second pass over the data is made. A large fwrite or fread reaches these functions in one
piece (glibc skips the stream's buffer for it); they hash and copy it 1 MiB at a time, so the
bytes are still in the CPU's cache when the kernel copies them.

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
    char path[4096];    // the file's name; while writing, the data goes to tmp
    char tmp[4200];
} HashedFile;

#define HASHED_PIECE (1 << 20)

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
    size_t done = 0;
    while (done < size) {
        size_t piece = size - done < HASHED_PIECE ? size - done : HASHED_PIECE;
        ssize_t n = read(h->fd, buf + done, piece);
        if (n < 0 && errno == EINTR) { continue; }
        if (n < 0) { return done > 0 ? (ssize_t)done : -1; }
        if (n == 0) { break; }
        XXH3_64bits_update(h->xxh, buf + done, (size_t)n);
        h->bytes += (size_t)n;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

static int hashed_close_fd(void* cookie) { return close(((HashedFile*)cookie)->fd); }

static inline FILE* hashed_stream(HashedFile* h, const char* mode, const char* path) {
    cookie_io_functions_t io = {mode[0] == 'r' ? hashed_read : NULL, mode[0] == 'r' ? NULL : hashed_write,
                                NULL, hashed_close_fd};
    h->xxh = XXH3_createState();
    h->fp = h->xxh != NULL ? fopencookie(h, mode, io) : NULL;
    if (h->fp == NULL) { fatal("%s: cannot set up the checksummed stream: %s", path, strerror(errno)); }
    XXH3_64bits_reset(h->xxh);
    h->bytes = 0;
    if (mode[0] == 'w') { setvbuf(h->fp, NULL, _IOFBF, HASHED_PIECE); }  // a state file's many small writes
    return h->fp;
}

static inline FileDigest hashed_digest(const HashedFile* h) { return FileDigest{h->bytes, XXH3_64bits_digest(h->xxh)}; }

// opens path for reading; the checksum covers every byte read until hashed_close
static inline FILE* hashed_open(HashedFile* h, const char* path) {
    snprintf(h->path, sizeof(h->path), "%s", path);
    h->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (h->fd < 0) {
        fatal("%s: cannot open for reading: %s (hint: check the path)", path, strerror(errno));
    }
    return hashed_stream(h, "rb", path);
}

// reads whatever the reader left (so that the checksum covers the whole file), closes, and
// returns the digest
static inline FileDigest hashed_close(HashedFile* h) {
    char rest[4096];
    while (fread(rest, 1, sizeof(rest), h->fp) > 0) {}
    FileDigest d = hashed_digest(h);
    fclose(h->fp);
    XXH3_freeState(h->xxh);
    return d;
}

// opens "<path>.tmp" for writing
static inline FILE* hashed_create(HashedFile* h, const char* path) {
    int n = snprintf(h->path, sizeof(h->path), "%s", path);
    if (n < 0 || (size_t)n >= sizeof(h->path)) { fatal("%s: path too long", path); }
    snprintf(h->tmp, sizeof(h->tmp), "%s.tmp", path);
    h->fd = open(h->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (h->fd < 0) {
        fatal("%s: cannot open for writing: %s (hint: check the path)", h->tmp, strerror(errno));
    }
    fatal_unlink = h->tmp;
    return hashed_stream(h, "wb", h->tmp);
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

// flush, fsync, rename over path, fsync the directory; returns what was written
static inline FileDigest hashed_commit(HashedFile* h) {
    // the kill test (dev/test/test_resume.py): SIGKILL in the n-th write, before all of it has
    // reached the file (what a power cut or the OOM killer may do at that moment, made certain)
    static int writes = 0;
    if (debug_fail_at("DEBUG_KILL_IN_WRITE", ++writes)) { raise(SIGKILL); }
    if (fflush(h->fp) != 0 || ferror(h->fp) || fsync(h->fd) != 0) {
        fatal("%s: write failed: %s (hint: is the disk full?)", h->tmp, strerror(errno));
    }
    FileDigest d = hashed_digest(h);
    XXH3_freeState(h->xxh);
    if (fclose(h->fp) != 0) { fatal("%s: close failed: %s", h->tmp, strerror(errno)); }
    if (rename(h->tmp, h->path) != 0) {
        fatal("%s: rename to %s failed: %s", h->tmp, h->path, strerror(errno));
    }
    fatal_unlink = NULL;
    sync_parent_dir(h->path);
    return d;
}

#endif  // LLMC_HASHED_FILE_H
