// llama.cpp's multimodal path (libmtmd) on one prompt with one image: the reference that
// scripts/mtmd-compare.py holds our image path against at a real model's shape.
//
// It tokenizes the prompt as mtmd does (the media marker `<__media__>` becomes the projector's
// image sequence: for Gemma 3 `<start_of_image>`, the image's embeddings, `<end_of_image>`),
// encodes the image once (timed by itself), decodes the chunks, and writes:
//   OUT/tokens.json    the prompt's text ids before and after the image, the image's token count,
//                      the encode time in ms, the greedy continuation and the thread count
//   OUT/features.f32   the image's embeddings as the projector gives them (n_tokens x n_embd, f32)
//   OUT/logits.f32     the logits after the whole prompt (n_vocab, f32)
//
// Build against a llama.cpp tree built with BUILD_SHARED_LIBS=OFF (scripts/mtmd-compare.py does):
//   g++ -O2 -std=c++17 mtmd_logits.cpp -I$LL/include -I$LL/ggml/include -I$LL/tools/mtmd \
//       -Wl,--start-group $LL/build/tools/mtmd/libmtmd.a $LL/build/src/libllama.a $LL/build/ggml/src/libggml*.a \
//       $LL/build/vendor/hash/libvendor-hash.a -Wl,--end-group -fopenmp -lpthread -ldl -o mtmd-logits
// usage: mtmd-logits MODEL.gguf MMPROJ.gguf IMAGE PROMPT N_PREDICT THREADS OUT_DIR [fa:on|off|auto]

#include "llama.h"
#include "mtmd-helper.h"
#include "mtmd.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static bool write_f32(const std::string & path, const float * data, size_t n) {
    FILE * f = std::fopen(path.c_str(), "wb");
    if (!f) {
        return false;
    }
    const bool ok = std::fwrite(data, sizeof(float), n, f) == n;
    return std::fclose(f) == 0 && ok;
}

static std::string ids_json(const std::vector<llama_token> & ids) {
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); i++) {
        s += (i ? "," : "") + std::to_string(ids[i]);
    }
    return s + "]";
}

int main(int argc, char ** argv) {
    if (argc < 8) {
        std::fprintf(stderr, "usage: %s MODEL MMPROJ IMAGE PROMPT N_PREDICT THREADS OUT_DIR [fa]\n", argv[0]);
        return 2;
    }
    const std::string model_path = argv[1], mmproj = argv[2], image = argv[3], prompt = argv[4];
    const int n_predict = std::atoi(argv[5]), threads = std::atoi(argv[6]);
    const std::string out = argv[7], fa = argc > 8 ? argv[8] : "auto";
    const llama_flash_attn_type fa_type = fa == "on"    ? LLAMA_FLASH_ATTN_TYPE_ENABLED :
                                          fa == "off"   ? LLAMA_FLASH_ATTN_TYPE_DISABLED :
                                                          LLAMA_FLASH_ATTN_TYPE_AUTO;

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        std::fprintf(stderr, "cannot load %s\n", model_path.c_str());
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = 512;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = fa_type;
    llama_context * lctx = llama_init_from_model(model, cp);

    mtmd_context_params mparams = mtmd_context_params_default();
    mparams.use_gpu = false;
    mparams.n_threads = threads;
    mparams.print_timings = true;
    mparams.flash_attn_type = fa_type;
    mparams.warmup = false;
    mtmd_context * mctx = mtmd_init_from_file(mmproj.c_str(), model, mparams);
    if (!mctx) {
        std::fprintf(stderr, "cannot load %s\n", mmproj.c_str());
        return 1;
    }
    mtmd_helper_bitmap_wrapper bw = mtmd_helper_bitmap_init_from_file(mctx, image.c_str(), false,
                                                                     mtmd_helper_init_opt_default());
    if (!bw.bitmap) {
        std::fprintf(stderr, "cannot read %s\n", image.c_str());
        return 1;
    }
    mtmd_input_text text = { prompt.c_str(), prompt.size(), true, true };
    mtmd_input_chunks * chunks = mtmd_input_chunks_init();
    const mtmd_bitmap * bitmaps[] = { bw.bitmap };
    if (mtmd_tokenize(mctx, chunks, &text, bitmaps, 1) != 0) {
        std::fprintf(stderr, "mtmd_tokenize failed\n");
        return 1;
    }

    const int n_embd = llama_model_n_embd(model);
    std::vector<llama_token> before, after;
    size_t image_tokens = 0;
    double encode_ms = 0;
    llama_pos n_past = 0;
    const size_t n_chunks = mtmd_input_chunks_size(chunks);
    for (size_t i = 0; i < n_chunks; i++) {
        const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks, i);
        const bool last = i + 1 == n_chunks;
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n = 0;
            const llama_token * t = mtmd_input_chunk_get_tokens_text(c, &n);
            (image_tokens ? after : before).insert((image_tokens ? after : before).end(), t, t + n);
            if (mtmd_helper_eval_chunk_single(mctx, lctx, c, n_past, 0, 512, last, &n_past) != 0) {
                std::fprintf(stderr, "decode failed\n");
                return 1;
            }
            continue;
        }
        image_tokens = mtmd_input_chunk_get_n_tokens(c);
        const auto t0 = std::chrono::steady_clock::now();
        if (mtmd_encode_chunk(mctx, c) != 0) {
            std::fprintf(stderr, "encode failed\n");
            return 1;
        }
        encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        float * embd = mtmd_get_output_embd(mctx);
        if (!write_f32(out + "/features.f32", embd, image_tokens * n_embd)) {
            std::fprintf(stderr, "cannot write %s/features.f32\n", out.c_str());
            return 1;
        }
        if (mtmd_helper_decode_image_chunk(mctx, lctx, c, embd, n_past, 0, 512, &n_past, nullptr, nullptr) != 0) {
            std::fprintf(stderr, "image decode failed\n");
            return 1;
        }
    }

    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const float * logits = llama_get_logits_ith(lctx, -1);
    if (!write_f32(out + "/logits.f32", logits, n_vocab)) {
        std::fprintf(stderr, "cannot write %s/logits.f32\n", out.c_str());
        return 1;
    }
    std::vector<llama_token> greedy;
    for (int k = 0; k < n_predict; k++) {
        const float * l = llama_get_logits_ith(lctx, -1);
        llama_token best = 0;
        for (int v = 1; v < n_vocab; v++) {
            if (l[v] > l[best]) {
                best = v;
            }
        }
        greedy.push_back(best);
        llama_batch b = llama_batch_get_one(&greedy.back(), 1);
        if (llama_decode(lctx, b) != 0) {
            std::fprintf(stderr, "decode failed\n");
            return 1;
        }
    }

    const std::string path = out + "/tokens.json";
    FILE * f = std::fopen(path.c_str(), "w");
    if (!f) {
        std::fprintf(stderr, "cannot write %s\n", path.c_str());
        return 1;
    }
    std::fprintf(f,
                 "{\"before\":%s,\"image_tokens\":%zu,\"after\":%s,\"encode_ms\":%.1f,\"greedy\":%s,"
                 "\"threads\":%d,\"n_embd\":%d,\"n_vocab\":%d,\"flash_attn\":\"%s\"}\n",
                 ids_json(before).c_str(), image_tokens, ids_json(after).c_str(), encode_ms,
                 ids_json(greedy).c_str(), threads, n_embd, n_vocab, fa.c_str());
    std::fclose(f);

    mtmd_bitmap_free(bw.bitmap);
    mtmd_input_chunks_free(chunks);
    mtmd_free(mctx);
    llama_free(lctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
