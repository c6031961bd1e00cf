// Traces llama.cpp's CPU forward: every f32/f16 graph node of every decode call, plus the logits,
// to one binary file that `hayai ggml-trace-compare` (crates/hayai-model, ggml module) reads to find
// the first operation where the ggml-exact CPU forward parts from llama.cpp.
//
// The prompt is fed as one batch, then greedy tokens one at a time — how the reference greedy
// ids in data/reference were produced (flash attention off, n_ctx 512).
//
// Build against a llama.cpp build tree (scripts/llama-cpp-build.sh does both):
//   g++ -O2 -std=c++17 scripts/llama_cpp_trace.cpp -I$SRC/include -I$SRC/ggml/include \
//       -L$BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$BUILD/bin -o llama_cpp_trace
// Usage: llama_cpp_trace MODEL.gguf OUT.bin N_GEN ID,ID,...
//
// Record layout (little endian; a string is u32 length + bytes): u32 magic 0x45444f4e ("NODE"),
// u32 call, name, op, u32 n_src, n_src source names, u32 type (ggml_type), 4 x i64 ne, u64 n_bytes,
// data (contiguous, as ggml stores it: ne[0] fastest). Logits of a call are a record named "result_logits" with op "LOGITS".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

static FILE *g_out = nullptr;
static uint32_t g_call = 0;

static void put_u32(uint32_t v) { fwrite(&v, 4, 1, g_out); }

static void put_str(const char *s) {
    put_u32((uint32_t)strlen(s));
    fwrite(s, 1, strlen(s), g_out);
}

static void put_record(const char *name, const char *op, const struct ggml_tensor *t, uint32_t type,
                       const int64_t ne[4], const void *data, uint64_t n_bytes) {
    put_u32(0x45444f4e);
    put_u32(g_call);
    put_str(name);
    put_str(op);
    uint32_t n_src = 0;
    while (t && n_src < GGML_MAX_SRC && t->src[n_src]) ++n_src;
    put_u32(n_src);
    for (uint32_t i = 0; i < n_src; ++i) put_str(t->src[i]->name);
    put_u32(type);
    fwrite(ne, 8, 4, g_out);
    fwrite(&n_bytes, 8, 1, g_out);
    fwrite(data, 1, n_bytes, g_out);
}

static bool observe(struct ggml_tensor *t, bool ask, void *) {
    const bool wanted = (t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16) && ggml_is_contiguous(t);
    if (ask) {
        return wanted;
    }
    if (!wanted) {
        return true;
    }
    const size_t n = ggml_nbytes(t);
    std::vector<uint8_t> buf(n);
    ggml_backend_tensor_get(t, buf.data(), 0, n);
    put_record(t->name, ggml_op_desc(t), t, (uint32_t)t->type, t->ne, buf.data(), n);
    return true;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.bin N_GEN ID,ID,...\n", argv[0]);
        return 2;
    }
    std::vector<llama_token> prompt;
    for (char *p = strtok(argv[4], ","); p; p = strtok(nullptr, ",")) {
        prompt.push_back((llama_token)atoi(p));
    }
    const int n_gen = atoi(argv[3]);
    g_out = fopen(argv[2], "wb");
    if (!g_out) {
        perror(argv[2]);
        return 1;
    }
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = observe;
    cp.cb_eval_user_data = nullptr;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::vector<llama_token> feed = prompt;
    for (int step = 0; step <= n_gen; ++step) {
        llama_batch batch = llama_batch_get_one(feed.data(), (int32_t)feed.size());
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "decode failed at call %u\n", g_call);
            return 1;
        }
        const float *logits = llama_get_logits_ith(ctx, -1);
        const int64_t ne[4] = {n_vocab, 1, 1, 1};
        put_record("result_logits", "LOGITS", nullptr, (uint32_t)GGML_TYPE_F32, ne, logits,
                   (uint64_t)n_vocab * 4);
        int best = 0;
        for (int i = 1; i < n_vocab; ++i) {
            if (logits[i] > logits[best]) best = i;
        }
        printf("%d%s", best, step == n_gen ? "\n" : ",");
        feed.assign(1, best);
        ++g_call;
    }
    fclose(g_out);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
