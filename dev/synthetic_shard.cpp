/*
synthetic_shard <path> <tokens> <seed>: a token shard (llm.c's format) of uniformly random
ids below GPT-2's 50257, for benchmarks on machines without the prepared data and without a
network (dev/gpu_check.sh, scripts/bench_zenflow.sh). Seeded: same arguments, same file.
*/
#include "../llmc/dataloader.h"
#include "../llmc/hashed_file.h"

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s <path> <tokens> <seed>\n", argv[0]);
        return 2;
    }
    int n = (int)parse_int("<tokens>", argv[2], 1, 1 << 30);
    uint64_t state = (uint64_t)parse_int("<seed>", argv[3], 0, 1L << 62) * 0x9E3779B97F4A7C15ull + 1;
    int header[256] = {SHARD_MAGIC, SHARD_VERSION, n};
    uint16_t* tokens = (uint16_t*)mallocCheck((size_t)n * sizeof(uint16_t));
    for (int i = 0; i < n; i++) { tokens[i] = (uint16_t)(random_u32(&state) % 50257); }
    HashedFile* out = hashed_create(argv[1]);  // (a temporary name, renamed; the checksum is not needed)
    fwriteCheck(header, sizeof(int), 256, out->fp, out->tmp);
    fwriteCheck(tokens, sizeof(uint16_t), (size_t)n, out->fp, out->tmp);
    hashed_commit(out);
    free(tokens);
    return 0;
}
