// libFuzzer target: the training-state reader of a checkpoint (llmc/checkpoint.h,
// read_checkpoint_state -> zenflow.h zf_load_state), for a fixed tiny model in zenflow mode
// (k 0.25, U 3, accumulation on the CPU: auto U's and -za gpu's parts of the state are not
// reached), then one batch read at the data position it restored; and the manifest reader
// (manifest_read) on the same bytes, twice: as they are (its checksum line rejects almost any
// change), and with a matching checksum line added, so that its parser sees them. The seed
// corpus holds a real state file and manifest of that model (written by dev/fuzz/run_fuzzers.sh).
#define TESTING
#include "../../train_gpt2.cpp"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static GPT2 model;
    static ZenFlow zf;
    static CpuDevice device;
    static DataLoader loader;
    static char dir[64];
    static int ready = 0;
    if (!ready) {  // the model, ZenFlow and a shard to position the loader in, built once
        gpt2_build(&model, "d1c8h2v97t32", 1);
        ZfConfig cfg = ZF_DEFAULTS;
        cfg.topk = 0.25;
        cfg.update_interval = 3;
        zf_cpu_init(&zf, &device, &model, cfg);
        snprintf(dir, sizeof(dir), "/tmp/zf_fuzz_ckpt_%d", (int)getpid());
        mkdir(dir, 0755);
        char shard[128];
        snprintf(shard, sizeof(shard), "%s/shard.bin", dir);
        FILE* fp = fopen(shard, "wb");
        int header[256] = {SHARD_MAGIC, SHARD_VERSION, 200};
        uint16_t tokens[200] = {0};
        fwrite(header, sizeof(int), 256, fp);
        fwrite(tokens, sizeof(uint16_t), 200, fp);
        fclose(fp);
        dataloader_init(&loader, shard, 4, 16, 97);
        ready = 1;
    }
    char path[128], manifest[128];
    snprintf(path, sizeof(path), "%s/state_00000006.bin", dir);
    snprintf(manifest, sizeof(manifest), "%s/manifest_00000006.txt", dir);
    for (const char* p : {path, manifest}) {
        FILE* out = fopen(p, "wb");
        if (size > 0) { fwrite(data, 1, size, out); }
        fclose(out);
    }
    Manifest m;
    char why[512];
    manifest_read(dir, 6, &m, why, sizeof(why));  // (never fatal: it says why it does not take a manifest)
    FILE* out = fopen(manifest, "wb");  // the same bytes past the checksum: a check line of their own
    if (size > 0) { fwrite(data, 1, size, out); }
    fprintf(out, "check %016llx\n", (unsigned long long)XXH3_64bits(data, size));
    fclose(out);
    manifest_read(dir, 6, &m, why, sizeof(why));
    FILE* fp = fopen(path, "rb");
    int floor = fuzz_fd_floor();
    jmp_buf jump;
    fatal_jump = &jump;
    uint64_t rng = 0, run_id = 0;
    if (setjmp(jump) == 0) {
        read_checkpoint_state(fp, path, 6, OptimizerState{&zf, zf_save_state, zf_load_state}, &loader, &rng, &run_id);
        dataloader_next_batch(&loader);  // the data position it took must be readable
    } else {
        fuzz_close_fds_from(floor);
    }
    fatal_jump = NULL;
    fclose(fp);
    return 0;
}
