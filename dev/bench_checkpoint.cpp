/*
bench_checkpoint [dir] [model]: what the checkpoints' checksums cost (llmc/hashed_file.h), as a
ratio to the same I/O without them, for a model file and a state file of the given model's size
(default d12), written and read as the trainers do. `make bench_checkpoint` runs it in build/.

Plain: fopen, fwrite, fflush, fsync, fclose, rename (the writes as they were before checksums);
fopen, fread. Checksummed: the same through a HashedFile (fopencookie, XXH3 as the bytes pass,
and the directory's fsync after the rename); the model's parameters are read as gpt2_read_model
reads them, straight into place (hashed_read_direct). The state file is written as zenflow.h writes it
in zenflow mode (k = 0.1): a few small pieces, then the moments, the master and the window sum.
Each case runs 5 times, plain and checksummed in turn (which goes first alternates), and the
median is shown. Reads are timed from the disk (the
file's pages dropped first: a resume after a reboot) and from the page cache (just written: where
the checksummed stream costs the most, since there the I/O itself is a memory copy).
*/
#include <algorithm>
#include <vector>

#include "../llmc/gpt2_file.h"

#define REPS 5

typedef struct {
    const char* name;
    std::vector<size_t> pieces;  // bytes of each fwrite, in order
    int direct;                  // read as gpt2_read_model does: the header, then the rest direct
} FileShape;

static double write_file(const char* path, const FileShape* f, const char* data, int hashed) {
    double t0 = now_ms();
    HashedFile* h = hashed ? hashed_create(path) : NULL;
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* fp = hashed ? h->fp : fopenCheck(tmp, "wb");
    for (size_t bytes : f->pieces) { fwriteCheck(data, 1, bytes, fp, path); }
    if (hashed) {
        hashed_commit(h);
    } else {
        if (fflush(fp) != 0 || fsync(fileno(fp)) != 0 || fclose(fp) != 0 || rename(tmp, path) != 0) {
            fatal("%s: write failed: %s", path, strerror(errno));
        }
    }
    return now_ms() - t0;
}

// cold = 1: from the disk (the file's pages dropped from the page cache first, as after a reboot)
static double read_file(const char* path, const FileShape* f, char* data, int hashed, int cold) {
    if (cold) {
        int fd = open(path, O_RDONLY);
        if (fd < 0) { fatal("%s: cannot open: %s", path, strerror(errno)); }
        int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // (returns the error, sets no errno)
        if (rc != 0) { fatal("%s: cannot drop its pages from the page cache: %s", path, strerror(rc)); }
        close(fd);
    }
    double t0 = now_ms();
    HashedFile* h = hashed ? hashed_open(path, f->direct ? f->pieces[0] : HASHED_PIECE) : NULL;
    FILE* fp = hashed ? h->fp : fopenCheck(path, "rb");
    for (size_t i = 0; i < f->pieces.size(); i++) {
        if (hashed && f->direct && i > 0) {
            hashed_read_direct(h, data, f->pieces[i]);
        } else {
            freadCheck(data, 1, f->pieces[i], fp, path);
        }
    }
    if (hashed) {
        hashed_close(h);
    } else {
        fclose(fp);
    }
    return now_ms() - t0;
}

int main(int argc, char** argv) {
    const char* dir = argc > 1 ? argv[1] : ".";
    GPT2Config c;
    if (!gpt2_parse_model_spec(argc > 2 ? argv[2] : "d12", &c)) { fatal("%s: not a model shape", argv[2]); }
    size_t n = gpt2_num_params(&c);
    FileShape model = {"model", {1024, n * 4}, 1};
    // the state: its header, the ownership (a column list per matrix), then with k = 0.1 the
    // GPU side's moments (g each: the vectors and a tenth of each matrix) and the CPU side's
    // master, m, v and window sum (c each)
    FileShape state = {"state", {1024 + 16, 8 + 32 + 12}, 0};
    size_t g = 0, cpu = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        GPT2TensorShape s = gpt2_tensor_shape(&c, i);
        if (!s.is_matrix) {
            g += s.count * s.rows * s.cols;
            continue;
        }
        for (size_t m = 0; m < s.count; m++) {
            size_t sel = (size_t)(0.1 * s.cols + 0.5);
            state.pieces.push_back(4);
            state.pieces.push_back(4 * s.cols);
            g += s.rows * sel;
            cpu += s.rows * (s.cols - sel);
        }
    }
    for (size_t bytes : {4 * g, 4 * g, 4 * cpu, 4 * cpu, 4 * cpu, 4 * cpu}) { state.pieces.push_back(bytes); }
    size_t largest = *std::max_element(state.pieces.begin(), state.pieces.end());
    largest = std::max(largest, n * 4);
    char* data = (char*)mallocCheck(largest);
    for (size_t i = 0; i < largest; i++) { data[i] = (char)(i * 2654435761u >> 24); }  // (not all zeros)

    printf("checksums (XXH3) against plain I/O, model L=%d C=%d (%.1f M parameters), in %s; ms, median of %d\n\n",
           c.num_layers, c.channels, n / 1e6, dir, REPS);
    printf("| file | MB | write: plain | checksummed | ratio | read from disk: plain | checksummed | ratio | "
           "read from the page cache: plain | checksummed | ratio |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (const FileShape* f : {&model, &state}) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/bench_%s.bin", dir, f->name);
        size_t bytes = 0;
        for (size_t b : f->pieces) { bytes += b; }
        double t[6][REPS];  // plain and checksummed: write, read from disk, read from the page cache
        for (int rep = 0; rep < REPS; rep++) {
            for (int k = 0; k < 2; k++) {
                int hashed = (k + rep) % 2;  // which goes first alternates
                t[hashed][rep] = write_file(path, f, data, hashed);
                t[2 + hashed][rep] = read_file(path, f, data, hashed, 1);
                t[4 + hashed][rep] = read_file(path, f, data, hashed, 0);
            }
        }
        double med[6];
        for (int k = 0; k < 6; k++) {
            std::sort(t[k], t[k] + REPS);
            med[k] = t[k][REPS / 2];
        }
        printf("| %s | %.0f | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f |\n", f->name, bytes / 1e6,
               med[0], med[1], med[1] / med[0], med[2], med[3], med[3] / med[2], med[4], med[5], med[5] / med[4]);
        unlink(path);
    }
    free(data);
    return 0;
}
