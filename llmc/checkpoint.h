/*
The output directory (-o) and its checkpoints (-n, -y), shared by both trainers. What -o
guarantees: one run at a time per directory, and no run loses or mixes another's work.

- A checkpoint is committed or it does not exist. Checkpoint N is model_N.bin (llm.c's model
  file: the working copy of the parameters), state_N.bin (everything else a run needs to
  continue bit for bit: the step, the data position, the sampling RNG and the optimizer's
  state) and manifest_N.txt, written last, once both are synced: their sizes and XXH3
  checksums, the run's id, the model's shape and the run's settings. Every file is written to
  a temporary name, synced and renamed, and its directory synced (hashed_file.h).
- A resume (-y 1) takes the newest checkpoint whose manifest verifies. The cheap checks (the
  manifest's own checksum, the files' sizes, the model's header) come first; the checksums of
  the files are taken while the trainer loads them, so nothing is read twice, and a file that
  does not match sends the resume back to the next older checkpoint. One line names each
  newer checkpoint skipped, and why. The resume then checks what it is told (the model's
  shape, -x, -b, -t) against the checkpoint it continues, names the settings that changed,
  and cuts main.log back to its step.
- An exclusive flock on <dir>/lock keeps a second run out; the kernel drops it when the
  process dies, so a kill -9 leaves no stale lock.
- A new run into a directory that holds one is refused (-y 1 continues it, -y 2 replaces it).
- SIGINT and SIGTERM stop at the next step boundary (the validation and the sampling look
  too) with a checkpoint once a step has trained (at the step a run resumed at, the one it
  resumed from stays), and exit with 128 + the signal's number.

Call order in main: run_dir_begin (before the model is built: it names the model file),
run_dir_open (once the checks before it have passed), run_dir_resume (once the optimizer
exists; a -y 1 its own checks refuse has taken the lock and removed stale .tmp files).
*/
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <dirent.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>

#include <algorithm>
#include <string>
#include <vector>

#include "args.h"
#include "dataloader.h"
#include "gpt2_file.h"
#include "trace.h"

#define STATE_MAGIC 20241130
#define STATE_VERSION 2  // 2: the run's id in header[6..7]
#define MANIFEST_FIRST_LINE "zenflow-gpt2 checkpoint manifest 1\n"

// the optimizer's part of the state file, written after the header and read back in order
typedef struct {
    void* ctx;
    void (*save)(void* ctx, FILE* fp, const char* path);
    void (*load)(void* ctx, FILE* fp, const char* path);
} OptimizerState;

// puts parameters read on the host into the trainer's model: for a resume that falls back
// to an older checkpoint after the model was built from a damaged one
typedef struct {
    void* ctx;
    void (*set)(void* ctx, const float* params);
} ParamsSetter;

typedef struct {
    int step;
    int evaluated;  // 0: a stop came before the step's evaluation and sample, which a resume redoes
    uint64_t run_id;
    FileDigest model, state;
    GPT2Config config;
    char settings[4096];  // train_args_settings of the run that wrote it
} Manifest;

typedef struct {
    const char* dir;  // -o, or NULL
    int lock_fd;
    int argc;
    char** argv;
    const TrainArgs* args;  // what the run is told: -y (resume), and what a resume checks
    uint64_t run_id;
    char settings[4096];
    std::vector<int> steps;  // the steps with a checkpoint file (-y 1), newest first
    size_t next;             // steps[next] is the next one to try
    Manifest chosen;         // chosen.step = -1: a new run
    char skipped[2048];      // "30 (why), 29 (why)"
    FILE* log;               // main.log
} RunDir;

static inline void ckpt_path(char* out, size_t size, const char* dir, const char* kind, int step) {
    snprintf(out, size, "%s/%s_%08d.%s", dir, kind, step, strcmp(kind, "manifest") == 0 ? "txt" : "bin");
}

// the step of a checkpoint file's name (model_00000030.bin, state_..., manifest_....txt; with
// tmp = 1, the same with ".tmp" after it), else -1
static inline int ckpt_name_step(const char* name, int tmp) {
    static const char* const kinds[3][2] = {{"model_", ".bin"}, {"state_", ".bin"}, {"manifest_", ".txt"}};
    for (const auto& kind : kinds) {
        size_t n = strlen(kind[0]);
        if (strncmp(name, kind[0], n) != 0) { continue; }
        int step = 0;
        for (size_t i = n; i < n + 8; i++) {
            if (name[i] < '0' || name[i] > '9') { return -1; }
            step = step * 10 + (name[i] - '0');
        }
        const char* rest = name + n + 8;
        return strncmp(rest, kind[1], 4) == 0 && strcmp(rest + 4, tmp ? ".tmp" : "") == 0 ? step : -1;
    }
    return -1;
}

// a name the run writes in its -o: main.log, lock, a checkpoint file or its .tmp
static inline int run_dir_owns(const char* name) {
    return strcmp(name, "main.log") == 0 || strcmp(name, "lock") == 0 || ckpt_name_step(name, 0) >= 0 ||
           ckpt_name_step(name, 1) >= 0;
}

// ----------------------------------------------------------------------------
// the manifest: a small text file whose last line is the checksum of the lines above it

static inline void manifest_write(const char* dir, const Manifest* m) {
    char text[8192], path[4096];
    int n = snprintf(text, sizeof(text),
                     MANIFEST_FIRST_LINE "step %d\nevaluated %d\nrun %016llx\nshape %d %d %d %d %d %d\n"
                     "model model_%08d.bin %llu %016llx\nstate state_%08d.bin %llu %016llx\n%s",
                     m->step, m->evaluated, (unsigned long long)m->run_id, m->config.max_seq_len,
                     m->config.vocab_size, m->config.padded_vocab_size, m->config.num_layers, m->config.num_heads,
                     m->config.channels, m->step, (unsigned long long)m->model.size,
                     (unsigned long long)m->model.hash, m->step, (unsigned long long)m->state.size,
                     (unsigned long long)m->state.hash, m->settings);
    n += snprintf(text + n, sizeof(text) - n, "check %016llx\n", (unsigned long long)XXH3_64bits(text, n));
    ckpt_path(path, sizeof(path), dir, "manifest", m->step);
    HashedFile* file = hashed_create(path);
    fwriteCheck(text, 1, (size_t)n, file->fp, file->tmp);
    hashed_commit(file);
}

// reads manifest_<step>.txt; 0 and the reason in why if it is missing or not sound
static inline int manifest_read(const char* dir, int step, Manifest* m, char* why, size_t why_size) {
    char path[4096], text[8192];
    ckpt_path(path, sizeof(path), dir, "manifest", step);
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) {
        snprintf(why, why_size, "no manifest: its write did not finish");
        return 0;
    }
    size_t n = fread(text, 1, sizeof(text) - 1, fp);
    fclose(fp);
    text[n] = '\0';
    char* check = n > 1 ? (char*)memrchr(text, '\n', n - 1) : NULL;  // the last line
    check = check != NULL ? check + 1 : NULL;
    unsigned long long want = 0, model_size, model_hash, state_size, state_hash, run;
    int model_step, state_step, used = 0;
    GPT2Config* c = &m->config;
    memset(m, 0, sizeof(*m));
    if (check == NULL || sscanf(check, "check %16llx\n%n", &want, &used) != 1 || check + used != text + n ||
        XXH3_64bits(text, (size_t)(check - text)) != want) {
        snprintf(why, why_size, "its manifest is damaged");
        return 0;
    }
    *check = '\0';
    const char* at = text + strlen(MANIFEST_FIRST_LINE);
    if (strncmp(text, MANIFEST_FIRST_LINE, strlen(MANIFEST_FIRST_LINE)) != 0 ||
        sscanf(at, "step %d\nevaluated %d\nrun %llx\nshape %d %d %d %d %d %d\nmodel model_%8d.bin %llu %llx\n"
               "state state_%8d.bin %llu %llx\n%n", &m->step, &m->evaluated, &run, &c->max_seq_len,
               &c->vocab_size, &c->padded_vocab_size, &c->num_layers, &c->num_heads, &c->channels, &model_step,
               &model_size, &model_hash, &state_step, &state_size, &state_hash, &used) != 15 ||
        m->step != step || model_step != step || state_step != step) {
        snprintf(why, why_size, "its manifest is of another format or another step");
        return 0;
    }
    m->run_id = run;
    m->model = FileDigest{model_size, model_hash};
    m->state = FileDigest{state_size, state_hash};
    snprintf(m->settings, sizeof(m->settings), "%s", at + used);
    return 1;
}

// the cheap part of verifying checkpoint <step>: its manifest, both files' sizes, and the model's
// header against the manifest's shape (so that building the model from it cannot fail)
static inline int ckpt_check(const char* dir, int step, Manifest* m, char* why, size_t why_size) {
    if (!manifest_read(dir, step, m, why, why_size)) { return 0; }
    char path[4096];
    const char* kinds[2] = {"model", "state"};
    const FileDigest* digests[2] = {&m->model, &m->state};
    for (int i = 0; i < 2; i++) {
        ckpt_path(path, sizeof(path), dir, kinds[i], step);
        long long size = file_size_bytes(path);
        if (size != (long long)digests[i]->size) {
            snprintf(why, why_size, "%s_%08d.bin %s", kinds[i], step, size < 0 ? "is missing" : "has another size than its manifest says");
            return 0;
        }
    }
    int header[256] = {0};
    ckpt_path(path, sizeof(path), dir, "model", step);
    FILE* fp = fopen(path, "rb");
    size_t got = fp != NULL ? fread(header, sizeof(int), 256, fp) : 0;
    if (fp != NULL) { fclose(fp); }
    const GPT2Config* c = &m->config;
    if (got != 256 || header[0] != GPT2_MODEL_MAGIC || header[1] != GPT2_MODEL_VERSION_FP32 || header[2] != c->max_seq_len ||
        header[3] != c->vocab_size || header[4] != c->num_layers || header[5] != c->num_heads ||
        header[6] != c->channels || header[7] != c->padded_vocab_size) {
        snprintf(why, why_size, "model_%08d.bin's header does not match its manifest", step);
        return 0;
    }
    return 1;
}

// ----------------------------------------------------------------------------
// writing a checkpoint

static inline void write_checkpoint(const RunDir* run, int step, int evaluated, const GPT2Config* config,
                                    const float* params, OptimizerState opt, const DataLoader* loader, uint64_t rng) {
    const char* bad = gpt2_first_nonfinite_tensor(config, params);
    if (bad != NULL) {  // (a checkpoint that no run could train on must not become the newest)
        fatal("step %d: tensor %s holds a nan or an inf: no checkpoint written (hint: lower the learning rate -l)",
                step, bad);
    }
    const char* dir = run->dir;
    char path[4096];
    ckpt_path(path, sizeof(path), dir, "manifest", step);
    if (unlink(path) == 0) { sync_parent_dir(path); }  // an earlier checkpoint of this step no longer counts
    Manifest m;
    memset(&m, 0, sizeof(m));
    m.step = step;
    m.evaluated = evaluated;
    m.run_id = run->run_id;
    m.config = *config;
    snprintf(m.settings, sizeof(m.settings), "%s", run->settings);
    ckpt_path(path, sizeof(path), dir, "model", step);
    m.model = gpt2_write_model(path, config, params);
    ckpt_path(path, sizeof(path), dir, "state", step);
    HashedFile* file = hashed_create(path);
    FILE* fp = file->fp;
    int header[256] = {0};
    header[0] = STATE_MAGIC;
    header[1] = STATE_VERSION;
    header[2] = step;
    header[3] = loader->B;
    header[4] = loader->T;
    header[5] = (int)loader->shard_index;
    header[6] = (int)(uint32_t)run->run_id;
    header[7] = (int)(uint32_t)(run->run_id >> 32);
    fwriteCheck(header, sizeof(int), 256, fp, file->tmp);
    uint64_t words[2] = {(uint64_t)loader->position, rng};
    fwriteCheck(words, sizeof(uint64_t), 2, fp, file->tmp);
    opt.save(opt.ctx, fp, file->tmp);
    m.state = hashed_commit(file);
    if (run->log != NULL && (fflush(run->log) != 0 || fsync(fileno(run->log)) != 0)) {  // its lines up to here, too
        fatal("%s/main.log: cannot write: %s (hint: check the disk)", dir, strerror(errno));
    }
    manifest_write(dir, &m);  // last: from now on the checkpoint exists
    printf("wrote checkpoint %s/{model,state,manifest}_%08d\n", dir, step);
}

// restores what write_checkpoint wrote into the state file, read from fp (the model was built
// from its model file); *run_id: the run that wrote it
static inline void read_checkpoint_state(FILE* fp, const char* path, int step, OptimizerState opt,
                                         DataLoader* loader, uint64_t* rng, uint64_t* run_id) {
    int header[256];
    freadCheck(header, sizeof(int), 256, fp, path);
    if (header[0] != STATE_MAGIC || header[1] != STATE_VERSION) {
        fatal("%s: not a training state file (magic %d version %d)", path, header[0], header[1]);
    }
    if (header[2] != step) { fatal("%s: holds the state of step %d, not %d (corrupt file?)", path, header[2], step); }
    if (header[3] != loader->B || header[4] != loader->T) {
        fatal("%s: written with B=%d T=%d, this run has B=%d T=%d (hint: resume with the same "
                "-b and -t)", path, header[3], header[4], loader->B, loader->T);
    }
    *run_id = (uint64_t)(uint32_t)header[6] | (uint64_t)(uint32_t)header[7] << 32;
    uint64_t words[2];
    freadCheck(words, sizeof(uint64_t), 2, fp, path);
    if (header[5] < 0 || (size_t)header[5] >= loader->glob_result.gl_pathc) {
        fatal("%s: data position refers to shard %d, but -i matches %zu shards", path,
                header[5], loader->glob_result.gl_pathc);
    }
    dataloader_load_shard(loader, (size_t)header[5]);
    // (a subtraction: words[0] + B*T + 1 could wrap around; the shard holds at least B*T + 1)
    if (words[0] > loader->num_tokens - ((size_t)loader->B * loader->T + 1)) {
        fatal("%s: data position %llu is past the shard's end", path, (unsigned long long)words[0]);
    }
    loader->position = (size_t)words[0];
    *rng = words[1];
    opt.load(opt.ctx, fp, path);
    if (fgetc(fp) != EOF) { fatal("%s: trailing bytes (corrupt file?)", path); }
}

// ----------------------------------------------------------------------------
// the run directory: the lock, what a directory holds, its stale temporary files

// takes <dir>/lock, or fails with the pid of the run holding it; create = 0: only if it exists
static inline void run_dir_lock(RunDir* run, int create) {
    if (run->lock_fd >= 0) { return; }
    char path[4096];
    snprintf(path, sizeof(path), "%s/lock", run->dir);
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
    if (fd < 0 && !create && errno == ENOENT) { return; }
    if (fd < 0) { fatal("%s: cannot open the run's lock file: %s", path, strerror(errno)); }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) {
            fatal("%s: cannot lock the run's lock file: %s (hint: a file system without flock, such as some "
                  "network mounts? choose a local -o)", path, strerror(errno));
        }
        // the holder writes its pid just after taking the lock: wait up to a second for it
        char pid[32] = {0};
        ssize_t n = 0;
        for (int tries = 0; tries < 100 && (n = pread(fd, pid, sizeof(pid) - 1, 0)) <= 0; tries++) {
            usleep(10000);
        }
        if (n > 0 && pid[n - 1] == '\n') { pid[n - 1] = '\0'; }
        fatal("-o %s: another run is using this directory (pid %s, from %s) (hint: wait for it to end, "
                "stop it, or choose another -o)", run->dir, n > 0 ? pid : "not yet written", path);
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        fatal("%s: cannot write the lock file: %s", path, strerror(errno));
    }
    run->lock_fd = fd;  // held until the process ends
}

// the checkpoint files' steps in dir (tmp = 1: of their ".tmp" files), newest first
static inline std::vector<int> ckpt_list(const char* dir, int tmp, std::vector<std::string>* names) {
    std::vector<int> steps;
    DIR* d = opendir(dir);
    if (d == NULL && errno == ENOENT) { return steps; }  // no -o yet: no checkpoint
    if (d == NULL) {
        fatal("-o %s: cannot list it: %s (hint: check the path and its permissions)", dir, strerror(errno));
    }
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        int step = ckpt_name_step(e->d_name, tmp);
        if (step < 0) { continue; }
        steps.push_back(step);
        if (names != NULL) { names->push_back(e->d_name); }
    }
    closedir(d);
    std::sort(steps.begin(), steps.end(), [](int a, int b) { return a > b; });
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    return steps;
}

// the last step main.log names as the step line counts them (its train loss s:t is step t + 1's,
// its val loss s:t comes after step t), -1 if none
static inline int log_last_step(const char* dir) {
    char path[4096], line[256], kind[4];
    snprintf(path, sizeof(path), "%s/main.log", dir);
    FILE* fp = fopen(path, "r");
    int last = -1, step;
    while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
        if (sscanf(line, "s:%d %3s", &step, kind) == 2) { last = step + (strcmp(kind, "trl") == 0); }
    }
    if (fp != NULL) { fclose(fp); }
    return last;
}

// removes dir/name, naming it in list
static inline void run_dir_remove(const char* dir, const char* name, std::string* list) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (unlink(path) != 0 && errno != ENOENT) { fatal("%s: cannot remove: %s", path, strerror(errno)); }
    *list += (list->empty() ? "" : ", ") + std::string(name);
}

// ----------------------------------------------------------------------------
// stopping: SIGINT (Ctrl-C) and SIGTERM (timeout, docker stop, a cluster's scheduler). The
// handler only records the signal; the training loop looks at each step boundary, and the
// validation and sampling loops at each batch and token, then calls run_dir_stop. A second
// signal exits at once (_exit: a checkpoint being written gets no manifest, so it does not count;
// its files already renamed stay, the one in progress stays a .tmp; the trace is left unclosed).

static volatile sig_atomic_t g_stop_signal = 0;

static void on_stop_signal(int sig) {
    if (g_stop_signal != 0) {
        static const char msg[] = "error: a second signal: exiting at once, without a checkpoint\n";
        ssize_t ignored = write(2, msg, sizeof(msg) - 1);
        (void)ignored;
        _exit(128 + sig);
    }
    g_stop_signal = sig;
}

static inline void catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static inline int stop_requested(void) { return g_stop_signal != 0; }
static inline const char* stop_signal_name(void) { return g_stop_signal == SIGTERM ? "SIGTERM" : "SIGINT"; }

// ----------------------------------------------------------------------------
// starting a run: run_dir_begin, run_dir_open, run_dir_resume

// the checks of a resume against what it is told: the model's shape and -x (the state file's
// reader checks -b and -t)
static inline void run_dir_check_resume(const RunDir* run) {
    const TrainArgs* args = run->args;
    const Manifest* m = &run->chosen;
    const GPT2Config* c = &m->config;
    if (args->given['e']) {
        GPT2Config e;
        if (!gpt2_parse_model_spec(args->model_spec, &e)) {
            FILE* fp = fopenCheck(args->model_spec, "rb");
            e = gpt2_read_model_header(fp, args->model_spec);
            fclose(fp);
        }
        if (e.num_layers != c->num_layers || e.channels != c->channels || e.num_heads != c->num_heads ||
            e.vocab_size != c->vocab_size || e.max_seq_len != c->max_seq_len) {
            fatal("-e %s is L=%d C=%d NH=%d V=%d maxT=%d, but the checkpoint of step %d in %s holds L=%d C=%d NH=%d "
                    "V=%d maxT=%d (hint: resume without -e, or start the other model in another -o)", args->model_spec,
                    e.num_layers, e.channels, e.num_heads, e.vocab_size, e.max_seq_len, m->step, run->dir,
                    c->num_layers, c->channels, c->num_heads, c->vocab_size, c->max_seq_len);
        }
    }
    // -x at the checkpoint's step only finishes a run that ended there, stopped in its last
    // evaluation: a checkpoint taken on the way has an optimizer that a last step would drain
    const char* x = strstr(m->settings, "\n-x ");
    int was_steps = -1;
    if (x != NULL) { sscanf(x + 4, "%d", &was_steps); }
    if (args->steps < m->step || (args->steps == m->step && (m->evaluated || was_steps != m->step))) {
        fatal("-x %d: the checkpoint of step %d in %s is already there (hint: give -x above %d to train on; the "
                "model is %s/model_%08d.bin)", args->steps, m->step, run->dir, m->step, run->dir, m->step);
    }
}

// tries the cheap checks on steps[next...] until one passes: then it is run->chosen; the
// others are named in run->skipped
static inline int run_dir_next_candidate(RunDir* run) {
    char why[512];
    for (; run->next < run->steps.size(); run->next++) {
        int step = run->steps[run->next];
        if (ckpt_check(run->dir, step, &run->chosen, why, sizeof(why))) { return 1; }
        size_t n = strlen(run->skipped);
        snprintf(run->skipped + n, sizeof(run->skipped) - n, "%s%d (%s)", n ? ", " : "", step, why);
    }
    run->chosen.step = -1;
    return 0;
}

// 1 if a checkpoint of `steps` in dir has its manifest: its write finished (a kill before that
// leaves files that are not a checkpoint)
static inline int ckpt_any_manifest(const char* dir, const std::vector<int>& steps) {
    char path[4096];
    for (int step : steps) {
        ckpt_path(path, sizeof(path), dir, "manifest", step);
        if (access(path, F_OK) == 0) { return 1; }
    }
    return 0;
}

// Before anything is built: SIGINT and SIGTERM are caught, a run already in the directory is
// refused at once (if it has left its lock file), and with -y 1 the newest checkpoint that
// passes the cheap checks is chosen. Returns the model to build: that checkpoint's model file,
// or -e.
static inline const char* run_dir_begin(RunDir* run, const TrainArgs* args, int argc, char** argv) {
    run->dir = args->output_dir;
    run->lock_fd = -1;
    run->argc = argc;
    run->argv = argv;
    run->args = args;
    run->chosen.step = -1;
    run->skipped[0] = '\0';
    run->log = NULL;
    train_args_settings(args, run->settings, sizeof(run->settings));
    catch_stop_signals();  // from here on a signal is honoured at the first step boundary
    if (run->dir == NULL) { return args->model_spec; }
    run_dir_lock(run, 0);
    if (args->resume != RESUME_CONTINUE) { return args->model_spec; }
    run->steps = ckpt_list(run->dir, 0, NULL);
    run->next = 0;
    if (!run_dir_next_candidate(run)) {
        if (ckpt_any_manifest(run->dir, run->steps)) {  // a checkpoint was written whole, and is damaged now
            fatal("-y 1: no checkpoint in %s verifies: %s (hint: start a new run with another -o, or -y 2 to "
                    "replace this one)", run->dir, run->skipped);
        }
        // none, or only the files of a first checkpoint whose write did not finish
        printf("no checkpoint in %s yet%s%s: starting from scratch (a main.log there is replaced)\n", run->dir,
               run->steps.empty() ? "" : "; not finished: ", run->skipped);
        return args->model_spec;
    }
    static char path[4096];
    ckpt_path(path, sizeof(path), run->dir, "model", run->chosen.step);
    snprintf(gpt2_model_read.expect_path, sizeof(gpt2_model_read.expect_path), "%s", path);
    gpt2_model_read.expected = run->chosen.model;
    return path;
}

// Once the checks before it have passed (nothing is written before): creates the directory, takes
// the lock, refuses a new run where one is (or with -y 2 removes it), removes the temporary files
// of a write that did not finish, and draws a new run's id.
static inline void run_dir_open(RunDir* run) {
    if (run->dir == NULL) { return; }
    if (mkdir(run->dir, 0755) != 0 && errno != EEXIST) {
        fatal("flag -o: cannot create directory %s: %s", run->dir, strerror(errno));
    }
    run_dir_lock(run, 1);
    std::vector<std::string> names, tmps;
    std::vector<int> steps = ckpt_list(run->dir, 0, &names);
    if (run->args->resume == RESUME_CONTINUE && steps != run->steps) {  // a run came and went since run_dir_begin
        fatal("-o %s: its checkpoints changed while this run started (another run wrote there) (hint: run the "
                "same command again)", run->dir);
    }
    int logged = log_last_step(run->dir);
    if (run->args->resume == 0 && (!steps.empty() || logged >= 0)) {
        char what[256] = "";
        if (logged >= 0) { snprintf(what, sizeof(what), "main.log up to step %d", logged); }
        if (!steps.empty()) {
            size_t n = strlen(what);
            snprintf(what + n, sizeof(what) - n, "%scheckpoint files up to step %d", n ? ", " : "", steps[0]);
        }
        // -y 1 continues only from a checkpoint whose write finished
        const char* ways = "continue it with -y 1, replace it with -y 2";
        if (steps.empty()) {
            ways = "it has no checkpoint to continue from: replace it with -y 2";
        } else if (!ckpt_any_manifest(run->dir, steps)) {
            ways = "its checkpoint files are of a write that did not finish: -y 1 starts it again from scratch, "
                   "-y 2 replaces it";
        }
        fatal("-o %s holds a run (%s) (hint: %s, or choose another -o)", run->dir, what, ways);
    }
    std::string removed;
    ckpt_list(run->dir, 1, &tmps);
    for (const std::string& name : tmps) { run_dir_remove(run->dir, name.c_str(), &removed); }
    if (!removed.empty()) { printf("removed the temporary files of a write that did not finish: %s\n", removed.c_str()); }
    if (run->args->resume == RESUME_REPLACE && (!steps.empty() || logged >= 0)) {
        if (stop_requested()) {  // a stop while the run started: the removal could not be undone
            fprintf(stderr, "error: interrupted (%s) before -y 2 replaced the run in %s: it is kept\n",
                    stop_signal_name(), run->dir);
            exit(128 + g_stop_signal);
        }
        removed.clear();
        // the manifests first: once they are gone no checkpoint counts, so a stop halfway cannot
        // leave one of the replaced run's checkpoints for a later -y 1 to continue
        const auto is_manifest = [](const std::string& name) { return name.rfind("manifest_", 0) == 0; };
        for (const std::string& name : names) {
            if (is_manifest(name)) { run_dir_remove(run->dir, name.c_str(), &removed); }
        }
        char log_path[4096];
        snprintf(log_path, sizeof(log_path), "%s/main.log", run->dir);
        sync_parent_dir(log_path);
        if (logged >= 0) { run_dir_remove(run->dir, "main.log", &removed); }
        for (const std::string& name : names) {
            if (!is_manifest(name)) { run_dir_remove(run->dir, name.c_str(), &removed); }
        }
        printf("-y 2: replaced the run in %s, removed %s\n", run->dir, removed.c_str());
    }
    if (getrandom(&run->run_id, sizeof(run->run_id), 0) != (ssize_t)sizeof(run->run_id)) {
        fatal("cannot draw a run id: %s", strerror(errno));
    }
}

// main.log, cut back to the resumed step (keeping each step's lines once), or emptied for a new run.
// As llm.c's, its s: counts the updates before the loss: a checkpoint of step S keeps the train
// losses s:0 to s:S-1, and s:S's val loss if it was evaluated before the checkpoint was written.
static inline void run_dir_open_log(RunDir* run) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/main.log", run->dir);
    const Manifest* m = &run->chosen;
    if (m->step >= 0) {
        FILE* fp = fopen(path, "r");
        char line[256];
        long keep = 0, dropped = 0;
        int step, cut = 0;
        char kind[4];
        while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
            size_t n = strlen(line);
            cut = cut || n == 0 || line[n - 1] != '\n' || sscanf(line, "s:%d %3s", &step, kind) != 2 ||
                  step > m->step || (step == m->step && (!m->evaluated || strcmp(kind, "tel") != 0));
            if (cut) {
                dropped++;
            } else {
                keep += (long)n;
            }
        }
        if (fp != NULL) { fclose(fp); }
        if (dropped > 0) {
            if (truncate(path, keep) != 0) { fatal("%s: cannot cut back: %s", path, strerror(errno)); }
            printf("main.log: cut back to step %d (%ld lines of the steps after it removed)\n", m->step, dropped);
        }
    }
    run->log = fopenCheck(path, m->step >= 0 ? "a" : "w");
}

// the settings that differ from the checkpoint's, as "-l 0.001 (was 0.0003), ..."
static inline std::string run_dir_changed_settings(const char* now, const char* was) {
    auto lines = [](const char* text) {
        std::vector<std::pair<std::string, std::string>> out;
        for (const char* at = text; *at;) {
            const char* end = strchr(at, '\n');
            std::string line(at, end ? end : at + strlen(at));
            size_t space = line.find(' ');
            if (space != std::string::npos) { out.push_back({line.substr(0, space), line.substr(space + 1)}); }
            at = end ? end + 1 : at + strlen(at);
        }
        return out;
    };
    auto find = [](const std::vector<std::pair<std::string, std::string>>& v, const std::string& flag) {
        for (const auto& p : v) { if (p.first == flag) { return p.second; } }
        return std::string();
    };
    auto a = lines(now), b = lines(was);
    std::string changed;
    for (const auto& p : a) {
        std::string old = find(b, p.first);
        if (old != p.second) {
            changed += (changed.empty() ? "" : ", ") + p.first + " " + p.second + " (was " + (old.empty() ? "not given" : old) + ")";
        }
    }
    for (const auto& p : b) {
        if (find(a, p.first).empty()) { changed += (changed.empty() ? "" : ", ") + p.first + " not given (was " + p.second + ")"; }
    }
    return changed;
}

// tries run->chosen's state file: 1 if it loaded and matches its manifest; 0 with why if it is
// damaged (a parse error in a file that matches its checksum is a real one: it stops the run)
static inline int run_dir_try_state(RunDir* run, OptimizerState opt, DataLoader* loader, uint64_t* rng, char* why,
                                    size_t why_size) {
    const Manifest* m = &run->chosen;
    char path[4096];
    ckpt_path(path, sizeof(path), run->dir, "state", m->step);
    HashedFile* file = hashed_open(path);
    int loaded = 0;
    uint64_t run_id = 0;
    fatal_throws = 1;  // (a damaged file may fail the reader part-way: that is a skip, not an error)
    try {
        read_checkpoint_state(file->fp, path, m->step, opt, loader, rng, &run_id);
        loaded = 1;
    } catch (const FatalError&) {
    }
    fatal_throws = 0;
    FileDigest got = hashed_close(file);
    if (!file_digest_equal(got, m->state)) {
        snprintf(why, why_size, "state_%08d.bin does not match its checksum", m->step);
        return 0;
    }
    if (!loaded) {
        std::string message = fatal_message;
        fatal("%s", message.c_str());
    }
    if (run_id != m->run_id) {
        snprintf(why, why_size, "state_%08d.bin is another run's", m->step);
        return 0;
    }
    return 1;
}

// With -y 1, loads the chosen checkpoint's state, checking both files' checksums (the model's
// was taken while the trainer built the model from it); a damaged checkpoint is skipped for the
// next older one, whose parameters go to the model through `params`. Prints what was skipped and
// what changed, and opens main.log. Returns the step to start at (-1: from scratch).
static inline int run_dir_resume(RunDir* run, OptimizerState opt, DataLoader* loader, uint64_t* rng,
                                 ParamsSetter params, const GPT2Config* config) {
    if (run->dir == NULL) { return -1; }
    int first = 1;
    char why[512];
    while (run->chosen.step >= 0) {
        const Manifest* m = &run->chosen;
        if (!first) {  // the model of an older checkpoint, in place of the one the trainer built
            GPT2Config c;
            ckpt_path(gpt2_model_read.expect_path, sizeof(gpt2_model_read.expect_path), run->dir, "model", m->step);
            gpt2_model_read.expected = m->model;
            float* p = gpt2_read_model(gpt2_model_read.expect_path, &c);
            if (!gpt2_model_read.damaged && memcmp(&c, config, sizeof(c)) == 0) { params.set(params.ctx, p); }
            if (!gpt2_model_read.damaged && memcmp(&c, config, sizeof(c)) != 0) { gpt2_model_read.damaged = 2; }
            free(p);
        }
        first = 0;
        int ok = 0;
        if (gpt2_model_read.damaged) {
            snprintf(why, sizeof(why), "model_%08d.bin %s", m->step,
                     gpt2_model_read.damaged == 2 ? "is another model" : "does not match its checksum");
        } else {
            ok = run_dir_try_state(run, opt, loader, rng, why, sizeof(why));
        }
        if (ok) { break; }
        size_t n = strlen(run->skipped);
        snprintf(run->skipped + n, sizeof(run->skipped) - n, "%s%d (%s)", n ? ", " : "", m->step, why);
        run->next++;
        if (!run_dir_next_candidate(run)) {
            fatal("-y 1: no checkpoint in %s verifies: %s (hint: start a new run with another -o, or -y 2 to replace "
                    "this one)", run->dir, run->skipped);
        }
    }
    gpt2_model_read.expect_path[0] = '\0';
    if (run->skipped[0] != '\0') { printf("skipped newer checkpoints: %s\n", run->skipped); }
    if (run->chosen.step >= 0) {
        run_dir_check_resume(run);  // against the one it continues, not a damaged newer one
        run->run_id = run->chosen.run_id;  // the run goes on
        std::string changed = run_dir_changed_settings(run->settings, run->chosen.settings);
        if (!changed.empty()) { printf("resuming with changed settings: %s\n", changed.c_str()); }
        printf("resumed from the checkpoint of step %d in %s\n", run->chosen.step, run->dir);
    }
    run_dir_open_log(run);
    return run->chosen.step;
}

// the steps whose evaluation and sample this run does: all but the one it resumed at, unless a
// stop came before that step's evaluation (its checkpoint is never rewritten: run_dir_writes_at)
static inline int run_dir_fresh(const RunDir* run, int step) {
    return step != run->chosen.step || !run->chosen.evaluated;
}

// a's text for inside '...': each ' closes the quote, adds an escaped one and opens it again
static inline std::string run_dir_shell_quoted(const std::string& a) {
    std::string out;
    for (char ch : a) { out += ch == '\'' ? std::string("'\\''") : std::string(1, ch); }
    return out;
}

// the command line again, with -y 1 (shell-quoted where needed), without -e: the model comes
// from the checkpoint, and the -e file need not outlive it
static inline std::string run_dir_resume_command(const RunDir* run) {
    std::string cmd;
    for (int i = 0; i < run->argc; i++) {
        if ((strcmp(run->argv[i], "-y") == 0 || strcmp(run->argv[i], "-e") == 0) && i + 1 < run->argc) {
            i++;
            continue;
        }
        std::string a = run->argv[i];
        cmd += (i ? " " : "") + (a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./=:,+-") ==
                                          std::string::npos && !a.empty()
                                      ? a
                                      : "'" + run_dir_shell_quoted(a) + "'");
    }
    return cmd + " -y 1";
}

// whether a checkpoint of `step` may be written: with -o, after step 0 (nothing was trained
// before), and not at the step this run resumed from. That one is on disk already, and
// rewriting it would uncommit it for the length of the write (a kill then could lose it).
static inline int run_dir_writes_at(const RunDir* run, int step) {
    return run->dir != NULL && step > 0 && step != run->chosen.step;
}

// At a step boundary after a signal: writes checkpoint <step> into -o (its evaluation still to do;
// rng as it was before the evaluation; none where run_dir_writes_at says no), closes the log and
// the trace, and exits 128 + signal.
[[noreturn]] static inline void run_dir_stop(RunDir* run, int step, const GPT2Config* config, const float* params,
                                             OptimizerState opt, const DataLoader* loader, uint64_t rng) {
    const char* name = stop_signal_name();
    if (run_dir_writes_at(run, step)) {
        write_checkpoint(run, step, 0, config, params, opt, loader, rng);
    }
    if (run->log != NULL) { fcloseCheck(run->log, "main.log"); }
    trace_close();
    if (run->dir != NULL && step > 0) {
        fprintf(stderr, "error: interrupted (%s) before step %d: checkpoint %d is in %s; resume with: %s\n", name,
                step + 1, step, run->dir, run_dir_resume_command(run).c_str());
    } else {
        fprintf(stderr, "error: interrupted (%s) before step %d: nothing %s\n", name, step + 1,
                run->dir != NULL ? "trained yet, nothing saved" : "saved (hint: with -o a stop writes a checkpoint)");
    }
    exit(128 + g_stop_signal);
}

#endif  // LLMC_CHECKPOINT_H
