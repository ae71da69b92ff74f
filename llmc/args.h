/*
The command line both trainers share: llm.c's flags where they mean what llm.c's mean (-i -j
-e -o -b -t -x -l -c -v -m -s -g -n -f; -k, -r, -h and -y mean other things here:
docs/usage.md) and the timeline's -t<letter> flags. One parser, so the CPU and CUDA trainers
can never drift apart; a flag that only one trainer implements is parsed here and refused by
the other with one clear line (train_args_refuse), except -f, which the CPU trainer ignores.
The -z<letter> flags belong to the optimizer: they are kept here as text, by letter, and the
optimizer parses them (zenflow.h, zf_parse_flags).
*/
#ifndef LLMC_ARGS_H
#define LLMC_ARGS_H

#include <ctype.h>

#include "utils.h"

typedef struct {
    const char* train_pattern;   // -i
    const char* val_pattern;     // -j
    const char* model_spec;      // -e: a model file, or d12 / d4c256h4 ... (random init)
    const char* tokenizer_path;  // -k
    const char* output_dir;      // -o: main.log and checkpoints
    int B, T;                    // -b -t
    int steps;                   // -x
    float lr, weight_decay;      // -l -c
    int val_every, val_batches;  // -v -m
    int sample_every, gen_tokens;        // -s -g
    int checkpoint_every, resume;        // -n -y (resume: 0 a new run, 1 continue the run in -o, 2 replace it)
    long seed;                   // -r
    int use_tf32;                // -f (CUDA trainer)
    const char* zflags[26];      // -z<letter> <value>, by letter (NULL: not given)
    const char* trace_path;      // -tr
    int trace_first, trace_steps;  // -tf -tn
    char given[128];             // given['l']: -l was on the command line
} TrainArgs;

#define RESUME_CONTINUE 1
#define RESUME_REPLACE 2

// the usage, then the optimizer's own flags (more_usage), on stdout
static inline void train_args_usage(const char* program, const char* more_usage) {
    printf(
            "Usage:   %s [options]\n"
            "Options:\n"
            "  -i <string> train data pattern (default data/tinyshakespeare/tiny_shakespeare_train.bin)\n"
            "  -j <string> val data pattern (default data/tinyshakespeare/tiny_shakespeare_val.bin)\n"
            "  -e <string> model: a .bin file, or a random init d12|d24|d36|d48|d<L>c<C>h<NH>\n"
            "              with optional v<V> t<maxT> (default d4c256h4)\n"
            "  -k <string> tokenizer file (default data/gpt2_tokenizer.bin)\n"
            "  -o <string> output directory for main.log and checkpoints (default none)\n"
            "  -b <int>    batch size B (default 4)\n"
            "  -t <int>    sequence length T (default 64)\n"
            "  -x <int>    number of training steps (default 20)\n"
            "  -l <float>  learning rate (default 3e-4)\n"
            "  -c <float>  weight decay, matrices only (default 0.0)\n"
            "  -v <int>    val loss every this many steps, 0 = never, -j unread (default 20)\n"
            "  -m <int>    val batches (default 20)\n"
            "  -s <int>    sample every this many steps, 0 = never (default 20)\n"
            "  -g <int>    tokens to generate (default 64)\n"
            "  -n <int>    write a checkpoint (model + state) into -o every this many steps, 0 = never\n"
            "              (with -o, a stop by SIGINT or SIGTERM writes one all the same, once a step has trained)\n"
            "  -y <0|1|2>  1: continue the run in -o from its newest checkpoint; 2: replace the run in -o\n"
            "              (deletes its main.log and checkpoints); 0: a new run, refused where -o holds one (default 0)\n"
            "  -r <int>    random seed for init and sampling, >= 1 (default 1337, llm.c's sampler seed)\n"
            "  -f <0|1>    TF32 tensor cores for the matmuls (CUDA trainer; default 1; the CPU trainer ignores it)\n"
            "  -h          this message\n"
            "Timeline (a Chrome trace-event file for Perfetto / chrome://tracing):\n"
            "  -tr <string> trace file (default none)\n"
            "  -tf <int>    first step to trace, 1-based (default 1)\n"
            "  -tn <int>    number of steps to trace (default 8)\n",
            program);
    printf("%s", more_usage);
}

// parses argv into *a; prints the usage (with more_usage) and exits 0 for -h, fails with one
// line otherwise
static inline void train_args_parse(TrainArgs* a, int argc, char* argv[], const char* more_usage) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // the trainer's lines one at a time, also into a log file or a pipe
    memset(a, 0, sizeof(*a));
    a->train_pattern = "data/tinyshakespeare/tiny_shakespeare_train.bin";
    a->val_pattern = "data/tinyshakespeare/tiny_shakespeare_val.bin";
    a->model_spec = "d4c256h4";
    a->tokenizer_path = "data/gpt2_tokenizer.bin";
    a->B = 4, a->T = 64, a->steps = 20;
    a->lr = 3e-4f, a->weight_decay = 0.0f;
    a->val_every = 20, a->val_batches = 20, a->sample_every = 20, a->gen_tokens = 64;
    a->seed = 1337;
    a->use_tf32 = 1;
    a->trace_first = 1, a->trace_steps = 8;
    for (int i = 1; i < argc; i += 2) {
        const char* flag = argv[i];
        if (strcmp(flag, "-h") == 0) {
            train_args_usage(argv[0], more_usage);
            exit(0);
        }
        size_t len = strlen(flag);
        // -<letter> (the letter also indexes `given`), -z<letter> or -t<letter>
        if (flag[0] != '-' || len < 2 || len > 3 || !islower((unsigned char)flag[1]) ||
            (len == 3 && flag[1] != 'z' && flag[1] != 't')) {
            fatal("unknown argument '%s' (hint: -h lists the flags)", flag);
        }
        if (i + 1 >= argc) { fatal("flag %s needs a value", flag); }
        const char* val = argv[i + 1];
        if (len == 2) { a->given[(unsigned char)flag[1]] = 1; }
        if (len == 3 && flag[1] == 't') {  // the timeline trace, -t<letter>
            switch (flag[2]) {
                case 'r': a->trace_path = val; break;
                case 'f': a->trace_first = (int)parse_int(flag, val, 1, 1 << 30); break;
                case 'n': a->trace_steps = (int)parse_int(flag, val, 1, 1 << 20); break;
                default: fatal("unknown flag %s (hint: -h lists the flags)", flag);
            }
            continue;
        }
        if (len == 3) {  // the optimizer's flags, -z<letter>: kept as text
            if (flag[2] < 'a' || flag[2] > 'z') { fatal("unknown flag %s (hint: -h lists the flags)", flag); }
            a->zflags[flag[2] - 'a'] = val;
            continue;
        }
        switch (flag[1]) {
            case 'i': a->train_pattern = val; break;
            case 'j': a->val_pattern = val; break;
            case 'e': a->model_spec = val; break;
            case 'k': a->tokenizer_path = val; break;
            case 'o': a->output_dir = val; break;
            case 'b': a->B = (int)parse_int(flag, val, 1, 1 << 16); break;
            case 't': a->T = (int)parse_int(flag, val, 1, 1 << 20); break;
            case 'x': a->steps = (int)parse_int(flag, val, 0, 99999999); break;  // checkpoint names have 8 digits
            case 'l': a->lr = parse_float(flag, val, 0.0, 10.0); break;
            case 'c': a->weight_decay = parse_float(flag, val, 0.0, 10.0); break;
            case 'v': a->val_every = (int)parse_int(flag, val, 0, 1 << 30); break;
            case 'm': a->val_batches = (int)parse_int(flag, val, 1, 1 << 20); break;
            case 's': a->sample_every = (int)parse_int(flag, val, 0, 1 << 30); break;
            case 'g': a->gen_tokens = (int)parse_int(flag, val, 1, 1 << 20); break;
            case 'n': a->checkpoint_every = (int)parse_int(flag, val, 0, 1 << 30); break;
            case 'y': a->resume = (int)parse_int(flag, val, 0, 2); break;
            case 'r': a->seed = parse_int(flag, val, 1, 1L << 62); break;  // (a xorshift state of 0 stays 0)
            case 'f': a->use_tf32 = (int)parse_int(flag, val, 0, 1); break;
            default: fatal("unknown flag %s (hint: -h lists the flags)", flag);
        }
    }
    if (a->checkpoint_every > 0 && a->output_dir == NULL) {
        fatal("flag -n: checkpoints need an output directory (hint: add -o <dir>)");
    }
    if (a->resume && a->output_dir == NULL) {
        fatal("flag -y: %s needs the output directory of the run (hint: add -o <dir>)",
                a->resume == RESUME_CONTINUE ? "resuming" : "replacing a run");
    }
    if ((long long)a->B * a->T > (1LL << 30)) {
        fatal("flags -b, -t: B*T=%lld is too large (at most 2^30 = 1073741824)", (long long)a->B * a->T);
    }
    if (a->trace_path != NULL) { check_output_file("-tr", a->trace_path, a->output_dir); }
}

// The settings a checkpoint records (its manifest, llmc/checkpoint.h), one "<flag> <value>" a
// line, so that a resume can name what it was told differently. Not -e (a resume's model is the
// checkpoint's), -o -y, or the trace's flags.
static inline void train_args_settings(const TrainArgs* a, char* out, size_t size) {
    int n = snprintf(out, size,
                     "-i %s\n-j %s\n-k %s\n-b %d\n-t %d\n-x %d\n-l %g\n-c %g\n-v %d\n-m %d\n-s %d\n-g %d\n"
                     "-n %d\n-r %ld\n-f %d\n",
                     a->train_pattern, a->val_pattern, a->tokenizer_path, a->B, a->T, a->steps, a->lr,
                     a->weight_decay, a->val_every, a->val_batches, a->sample_every, a->gen_tokens,
                     a->checkpoint_every, a->seed, a->use_tf32);
    for (int i = 0; i < 26 && n >= 0 && (size_t)n < size; i++) {
        if (a->zflags[i] != NULL) { n += snprintf(out + n, size - n, "-z%c %s\n", 'a' + i, a->zflags[i]); }
    }
    if (n < 0 || (size_t)n >= size) {
        fatal("the command line's settings are too long to record (-i, -j, -k or a -z value; %zu bytes in all)", size);
    }
}

// a note where a flag asks for more than there is: -g beyond the model's maxT, -m beyond the
// val data (val_batches: how many batches one pass over it gives)
static inline void train_args_notes(const TrainArgs* a, int max_seq_len, size_t val_batches) {
    if (a->sample_every > 0 && a->gen_tokens > max_seq_len - 1) {
        printf("note: -g %d: the model's maxT %d allows %d tokens a sample, generating %d\n", a->gen_tokens,
               max_seq_len, max_seq_len - 1, max_seq_len - 1);
    }
    if (a->val_every > 0 && (size_t)a->val_batches > val_batches) {
        printf("note: -m %d: the val data holds %zu batches of B=%d T=%d, so the val loss reads %zu of them more "
               "than once\n", a->val_batches, val_batches, a->B, a->T, a->val_batches - val_batches < val_batches
               ? (size_t)a->val_batches - val_batches : val_batches);
    }
}

// the value of -z<letter>, or NULL
static inline const char* train_args_zflag(const TrainArgs* a, char letter) { return a->zflags[letter - 'a']; }

// a flag this trainer parses but does not implement: one line, naming the one that does
static inline void train_args_refuse(int given, const char* flag, const char* hint) {
    if (given) { fatal("flag %s is not implemented in this trainer (hint: %s)", flag, hint); }
}

#endif  // LLMC_ARGS_H
