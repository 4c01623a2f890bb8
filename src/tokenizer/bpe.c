/*
 * bpe.c - the byte-level BPE encoder of "gpt2" vocabularies (Llama 3,
 * Qwen2, GPT-2 and the many models converted like them), matching
 * llama.cpp's llm_tokenizer_bpe.
 *
 * A run of plain text (special tokens are already cut out by vocab.c) goes
 * through three stages:
 *
 *   1. Pre-tokenization: the regexes of tokenizer.ggml.pre split the text
 *      into pre-tokens. With several regexes, each splits every piece the
 *      previous one left, and text between two matches is a piece of its
 *      own. The patterns are llama.cpp's, run by PCRE2 (UTF, UCP, JIT) with
 *      llama.cpp's character classes spelled out: \s is its fixed list of
 *      Unicode white space (no U+200B, no U+FEFF), \p{L}/\p{N}/\p{P} are
 *      general categories, `$` is the end of the piece.
 *   2. Byte encoding: each byte of a pre-token becomes one character of
 *      GPT-2's bytes_to_unicode alphabet, the alphabet of the vocabulary
 *      strings and merges.
 *   3. Merging: from single characters, the adjacent pair whose merge has
 *      the lowest rank (index in tokenizer.ggml.merges) is merged, leftmost
 *      first on ties, until no pair has a merge; stale queue entries are
 *      recognised by their recorded length, as in spm.c. With ignore_merges
 *      (llama-bpe) a pre-token that is itself a token skips merging.
 *      A final symbol that is not a token falls back to its single-byte
 *      tokens, silently dropping bytes without one (llama.cpp does the same;
 *      it cannot happen with a complete byte-level vocabulary).
 *
 * Invalid UTF-8 is decoded as llama.cpp decodes it: a bad byte becomes
 * U+FFFD, an overlong form becomes its code point, a surrogate stays as it
 * is (and counts as "other" for the regexes); code points above U+10FFFF,
 * where llama.cpp throws, also become U+FFFD.
 *
 * A cache kept for one sb_vocab_tokenize call (across its special-token
 * separated runs) maps pre-tokens already seen to their ids, so long texts,
 * where words repeat, skip the encoding and merging of repeats. Everything
 * mutable lives in that call's session, so one vocabulary serves many
 * threads.
 *
 * Non-goals: the pre-tokenizers whose regexes need more than \p{L}, \p{N},
 * \p{P} and \s (llama.cpp's collapsed-category tricks for \p{S}/\p{M}, and
 * its custom splitters for Kimi-K2, AFMoE, ...), and SPM-style BPE (Gemma 4).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/heap.h"
#include "tokenizer/vocab.h"

/* ---- pre-tokenizer table ------------------------------------------------ */

/* llama.cpp's \s (unicode_cpt_flags is_whitespace), for use inside [...]. */
#define WS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define SPACE "[" WS "]"
#define NOT_SPACE "[^" WS "]"

/* Llama 3's pattern with the case-insensitive contractions spelled out, and
 * Qwen2's, which differs only in taking digits one at a time. */
#define LLAMA3_LIKE(digits)                                                                                            \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" digits            \
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|" SPACE "*[\\r\\n]+|" SPACE "+(?!" NOT_SPACE ")|" SPACE "+"
#define RE_LLAMA3 LLAMA3_LIKE("{1,3}")
#define RE_QWEN2 LLAMA3_LIKE("")
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|" SPACE "+(?!" NOT_SPACE ")"

/* DeepSeek LLM's letters: the cased letters (Lu, Ll, Lt) of its tokenizer.json. */
#define DEEPSEEK_LETTERS                                                                                               \
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}"   \
    "\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}"     \
    "\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"        \
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"                  \
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}"                  \
    "\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}"          \
    "\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"        \
    "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"         \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"                   \
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}"         \
    "\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"                  \
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"                 \
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}"         \
    "\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}"
#define CJK_HANGUL "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

enum { MAX_REGEXES = 6 };

/* One pre-tokenizer of llama.cpp (an LLAMA_VOCAB_PRE_TYPE_* with the flags
 * its tokenizer.ggml.pre names set). */
typedef struct pre_type {
    const char *const names[12]; /* tokenizer.ggml.pre values, NULL-terminated */
    const char *const regexes[MAX_REGEXES + 1];
    bool ignore_merges; /* a pre-token that is a token is emitted as it is */
    bool add_bos;       /* default of tokenizer.ggml.add_bos_token */
    bool clean_spaces;  /* clean_up_tokenization_spaces when detokenizing */
} pre_type;

static const pre_type pre_types[] = {
    {{"default"}, /* also when tokenizer.ggml.pre is missing */
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"},
     false, false, true},
    {{"llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"},
     {RE_LLAMA3},
     true, true, true},
    {{"dbrx", "smaug-bpe"}, {RE_LLAMA3}, false, false, true},
    {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"}, {RE_QWEN2}, false, false, false},
    {{"stablelm2", "megrez"}, {RE_QWEN2}, false, false, true},
    /* "gpt2" is not a llama.cpp name (its converter writes "gpt-2"); accepted as an alias. */
    {{"gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "gigachat", "a.x-4.0", "mellum",
      "mpt", "olmo"},
     {RE_GPT2},
     false, false, true},
    {{"jais", "exaone4", "modern-bert"}, {RE_GPT2}, false, false, true},
    {{"trillion", "granite-docling"}, {RE_GPT2}, false, false, false},
    {{"starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"}, {"\\p{N}", RE_GPT2}, false, false, true},
    {{"command-r", "smollm"}, {"\\p{N}", RE_GPT2}, false, false, false},
    {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false, true},
    {{"deepseek-llm"},
     {"[\\r\\n]", SPACE "?[" DEEPSEEK_LETTERS "]+",
      SPACE "?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+", SPACE "+\\z",
      CJK_HANGUL, "\\p{N}+"},
     false, false, false},
    {{"deepseek-coder"}, {"[\\r\\n]", SPACE "?\\p{L}+", SPACE "?\\p{P}+", CJK_HANGUL, "\\p{N}"}, false, false, false},
};

/* ---- the tokenizer state kept in the vocabulary ------------------------- */

/* A merge "left right": the two strings back to back in the blob. */
typedef struct merge {
    uint32_t off;      /* bytes of left+right at blob + off */
    uint32_t len;      /* bytes of left+right */
    uint32_t left_len; /* bytes of left */
} merge;

struct sb__bpe {
    const pre_type *pre;
    pcre2_general_context *gctx; /* routes PCRE2's allocations through sb_malloc */
    pcre2_code *re[MAX_REGEXES];
    bool jit[MAX_REGEXES]; /* re[i] has JIT code */
    int n_re;

    merge *merges; /* [n_merges], index = rank */
    char *blob;
    int32_t n_merges;
    uint32_t *merge_hash; /* open addressing: merge index, or UINT32_MAX; mask + 1 slots */
    uint32_t merge_mask;

    uint8_t enc[256][2]; /* byte -> its character of the GPT-2 alphabet, UTF-8 */
    uint8_t enc_len[256];
};

/* ---- GPT-2's byte alphabet ---------------------------------------------- */

/* bytes_to_unicode: printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC,
 * U+00AE..U+00FF) stand for themselves; the other 68 bytes map, in
 * increasing order, to U+0100..U+0143. */
static uint32_t byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
        return b;
    if (b <= 0x20)
        return 0x100u + b;
    if (b <= 0xA0)
        return 0x121u + (b - 0x7Fu);
    return 0x143; /* 0xAD */
}

/* The inverse; -1 for code points outside the alphabet. */
static int cp_to_byte(uint32_t cp) {
    if (cp < 0x100)
        return byte_to_cp((uint8_t)cp) == cp ? (int)cp : -1;
    if (cp <= 0x120)
        return (int)(cp - 0x100);
    if (cp <= 0x142)
        return (int)(cp - 0x121 + 0x7F);
    return cp == 0x143 ? 0xAD : -1;
}

/* ---- UTF-8 as llama.cpp reads it ---------------------------------------- */

static bool is_cont(uint8_t c) { return (c & 0xC0) == 0x80; }

/* Decodes the character at p[0..r) as unicode_cpt_from_utf8 does (lead byte
 * decides the length, continuation bytes are checked, overlong forms and
 * surrogates pass); false for an invalid sequence, which is one byte long. */
static bool llama_decode(const uint8_t *p, size_t r, uint32_t *cp, size_t *n) {
    uint8_t c = p[0];
    *n = 1;
    if (c < 0x80) {
        *cp = c;
        return true;
    }
    size_t need = !(c & 0x40) ? 0 : !(c & 0x20) ? 1 : !(c & 0x10) ? 2 : !(c & 0x08) ? 3 : 0;
    if (need == 0 || r <= need)
        return false;
    uint32_t v = c & (0x7Fu >> (need + 1));
    for (size_t k = 1; k <= need; k++) {
        if (!is_cont(p[k]))
            return false;
        v = v << 6 | (p[k] & 0x3Fu);
    }
    *cp = v;
    *n = need + 1;
    return true;
}

static size_t put_utf8(uint32_t cp, uint8_t *dst) {
    if (cp < 0x80) {
        dst[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (uint8_t)(0xC0 | cp >> 6);
        dst[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (uint8_t)(0xE0 | cp >> 12);
        dst[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        dst[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    dst[0] = (uint8_t)(0xF0 | cp >> 18);
    dst[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    dst[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    dst[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Whether s[0..n) is well-formed UTF-8 (shortest forms, no surrogates, at
 * most U+10FFFF), i.e. what PCRE2 accepts and what llama.cpp leaves alone. */
static bool utf8_well_formed(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t k;
        if (!llama_decode(s + i, n - i, &cp, &k))
            return false;
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k;
    }
    return true;
}

/* Rewrites ill-formed text the way llama.cpp sees it: into *bpe_text the
 * bytes that get byte-encoded, into *re_text (same length; NULL when equal
 * to *bpe_text) the same with each surrogate replaced by U+E000, which PCRE2
 * accepts and which every pattern treats alike (neither \s, \p{L}, \p{N}
 * nor \p{P}). Both are owned by the caller. */
static bool normalize_text(const uint8_t *s, size_t n, uint8_t **bpe_text, uint8_t **re_text, size_t *out_len) {
    uint8_t *b = sb_malloc(3 * n + 1), *r = NULL; /* U+FFFD for each byte at worst */
    if (!b)
        return false;
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k;
        if (!llama_decode(s + i, n - i, &cp, &k) || cp > 0x10FFFF)
            cp = 0xFFFD;
        i += k;
        if (cp >= 0xD800 && cp <= 0xDFFF && !r) {
            r = sb_malloc(3 * n + 1);
            if (!r) {
                sb_free(b);
                return false;
            }
            memcpy(r, b, w);
        }
        size_t m = put_utf8(cp, b + w);
        if (r) {
            if (cp >= 0xD800 && cp <= 0xDFFF)
                put_utf8(0xE000, r + w);
            else
                memcpy(r + w, b + w, m);
        }
        w += m;
    }
    *bpe_text = b;
    *re_text = r;
    *out_len = w;
    return true;
}

/* ---- loading ------------------------------------------------------------ */

static void *pcre_alloc(PCRE2_SIZE size, void *data) {
    (void)data;
    return sb_malloc(size);
}

static void pcre_release(void *ptr, void *data) {
    (void)data;
    sb_free(ptr);
}

static uint32_t hash_bytes(const char *s, size_t len, uint32_t h) {
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u; /* FNV-1a */
    return h;
}

static uint32_t merge_key_hash(const char *s, uint32_t len, uint32_t left_len) {
    return hash_bytes(s, len, 2166136261u ^ (left_len * 0x9E3779B9u));
}

/* Rank of the merge of s[0..left_len) with s[left_len..len), or -1. */
static int32_t find_merge(const sb__bpe *b, const char *s, uint32_t len, uint32_t left_len) {
    for (uint32_t i = merge_key_hash(s, len, left_len) & b->merge_mask;; i = (i + 1) & b->merge_mask) {
        uint32_t m = b->merge_hash[i];
        if (m == UINT32_MAX)
            return -1;
        const merge *e = &b->merges[m];
        if (e->len == len && e->left_len == left_len && memcmp(b->blob + e->off, s, len) == 0)
            return (int32_t)m;
    }
}

static sb_status read_pre(sb__bpe *b, const sb_gguf *g, sb_error *err) {
    const char *key = "tokenizer.ggml.pre";
    sb_gguf_str pre = {"default", 7};
    if (sb_gguf_find(g, key)) { /* absent: llama.cpp warns and uses "default" */
        sb_status st = sb_gguf_get_str(g, key, &pre, err);
        if (st != SB_OK)
            return st;
    }
    for (size_t t = 0; t < SB_ARRAY_LEN(pre_types); t++)
        for (const char *const *name = pre_types[t].names; *name; name++)
            if (strlen(*name) == pre.len && memcmp(*name, pre.ptr, pre.len) == 0) {
                b->pre = &pre_types[t];
                return SB_OK;
            }
    int shown = pre.len > 64 ? 64 : (int)pre.len;
    return sb_fail(err, SB_ERR_UNSUPPORTED,
                   "%s '%.*s' is not a supported pre-tokenizer (supported: 'default', 'llama-bpe', 'qwen2', "
                   "'gpt-2', 'deepseek-llm', 'deepseek-coder', 'falcon', 'starcoder' and their aliases)",
                   key, shown, pre.ptr);
}

static sb_status compile_regexes(sb__bpe *b, sb_error *err) {
    b->gctx = pcre2_general_context_create(pcre_alloc, pcre_release, NULL);
    pcre2_compile_context *cctx = b->gctx ? pcre2_compile_context_create(b->gctx) : NULL;
    if (!cctx)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for the pre-tokenizer");
    sb_status st = SB_OK;
    for (b->n_re = 0; b->n_re < MAX_REGEXES && b->pre->regexes[b->n_re]; b->n_re++) {
        const char *pattern = b->pre->regexes[b->n_re];
        int code;
        PCRE2_SIZE at;
        b->re[b->n_re] = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &at,
                                       cctx);
        if (!b->re[b->n_re]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(code, msg, sizeof(msg));
            st = sb_fail(err, SB_ERR_UNSUPPORTED, "pre-tokenizer regex %d of '%s' does not compile at %zu: %s",
                         b->n_re, b->pre->names[0], (size_t)at, (const char *)msg);
            break;
        }
        /* Without JIT (unsupported CPU, or no memory for it) the interpreter runs. */
        b->jit[b->n_re] = pcre2_jit_compile(b->re[b->n_re], PCRE2_JIT_COMPLETE) == 0;
    }
    pcre2_compile_context_free(cctx);
    return st;
}

/* Indexes "left right" strings by (left, right); the first of duplicates wins. */
static sb_status read_merges(sb__bpe *b, const sb_gguf *g, sb_error *err) {
    const char *key = "tokenizer.ggml.merges";
    const sb_gguf_kv *kv;
    if (!sb_gguf_find(g, key))
        return sb_fail(err, SB_ERR_FORMAT, "%s is missing (a 'gpt2' tokenizer needs its merges)", key);
    sb_status st = sb_gguf_get_arr(g, key, SB_GGUF_STRING, &kv, err);
    if (st != SB_OK)
        return st;
    if (kv->arr_n > INT32_MAX / 4)
        return sb_fail(err, SB_ERR_FORMAT, "%s has %llu entries, more than %d", key, (unsigned long long)kv->arr_n,
                       INT32_MAX / 4);
    int32_t n = (int32_t)kv->arr_n;
    sb_gguf_str *strs = sb_calloc((size_t)n + 1, sizeof(*strs));
    if (!strs)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for %d merges", (int)n);
    sb_gguf_arr_strings(kv, strs);
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++)
        total += strs[i].len;
    uint32_t slots = 16;
    while (slots < 2u * (uint32_t)n)
        slots <<= 1;
    b->merges = sb_calloc((size_t)n + 1, sizeof(*b->merges));
    b->blob = total < UINT32_MAX ? sb_malloc((size_t)total + 1) : NULL;
    b->merge_hash = sb_malloc(slots * sizeof(*b->merge_hash));
    if (!b->merges || !b->blob || !b->merge_hash) {
        sb_free(strs);
        return total < UINT32_MAX ? sb_fail(err, SB_ERR_NOMEM, "out of memory for %d merges", (int)n)
                                  : sb_fail(err, SB_ERR_FORMAT, "%s holds more than 4 GiB of text", key);
    }
    memset(b->merge_hash, 0xff, slots * sizeof(*b->merge_hash));
    b->merge_mask = slots - 1;
    b->n_merges = n;
    uint32_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        merge *m = &b->merges[i];
        const char *s = strs[i].ptr;
        size_t len = (size_t)strs[i].len;
        /* Split at the first space after position 0, as llama.cpp does; a
         * line without one can never match (llama.cpp keys it ("", "")). */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) {
            *m = (merge){off, 0, 0};
            continue;
        }
        uint32_t left = (uint32_t)(sp - s), right = (uint32_t)(len - left - 1);
        memcpy(b->blob + off, s, left);
        memcpy(b->blob + off + left, sp + 1, right);
        *m = (merge){off, left + right, left};
        off += left + right;
        if (left == 0 || right == 0)
            continue;
        uint32_t h = merge_key_hash(b->blob + m->off, m->len, m->left_len) & b->merge_mask;
        for (;; h = (h + 1) & b->merge_mask) {
            uint32_t o = b->merge_hash[h];
            if (o == UINT32_MAX) {
                b->merge_hash[h] = (uint32_t)i;
                break;
            }
            const merge *e = &b->merges[o];
            if (e->len == m->len && e->left_len == m->left_len && memcmp(b->blob + e->off, b->blob + m->off, m->len) == 0)
                break; /* duplicate: keep the lower rank */
        }
    }
    sb_free(strs);
    return SB_OK;
}

sb_status sb__bpe_load(sb_vocab *v, const sb_gguf *g, bool *add_bos_default, sb_error *err) {
    sb__bpe *b = sb_calloc(1, sizeof(*b));
    if (!b)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for the BPE tokenizer");
    v->bpe = b; /* freed with the vocabulary, also on failure */
    sb_status st;
    if ((st = read_pre(b, g, err)) != SB_OK || (st = compile_regexes(b, err)) != SB_OK ||
        (st = read_merges(b, g, err)) != SB_OK)
        return st;
    for (int c = 0; c < 256; c++) {
        uint8_t u[4];
        b->enc_len[c] = (uint8_t)put_utf8(byte_to_cp((uint8_t)c), u);
        memcpy(b->enc[c], u, b->enc_len[c]);
    }
    *add_bos_default = b->pre->add_bos;
    v->clean_spaces = b->pre->clean_spaces;
    return SB_OK;
}

void sb__bpe_free(sb__bpe *b) {
    if (!b)
        return;
    for (int i = 0; i < b->n_re; i++)
        pcre2_code_free(b->re[i]);
    pcre2_general_context_free(b->gctx);
    sb_free(b->merges);
    sb_free(b->blob);
    sb_free(b->merge_hash);
    sb_free(b);
}

/* ---- encoding ----------------------------------------------------------- */

/* A run of the byte-encoded pre-token; merged-away symbols have n == 0. */
typedef struct symbol {
    int32_t prev, next; /* neighbours in the live chain, -1 at the ends */
    uint32_t off, n;    /* bytes [off, off+n) of the encoded word */
} symbol;

typedef struct pair {
    int32_t rank;        /* of the merge; lower first */
    int32_t left, right; /* symbol indices */
    uint32_t size;       /* bytes of the pair when queued */
} pair;

/* A pre-token encoded earlier in the same tokenize call. */
typedef struct cache_entry {
    uint32_t hash;
    uint32_t key_off, key_len; /* its bytes at keys + key_off */
    uint32_t ids_off, n_ids;   /* its ids at ids + ids_off */
} cache_entry;

/* Longer pre-tokens are not cached; after CACHE_MAX_ENTRIES new ones are not
 * either (lookups go on), which bounds the cache at a few MB. */
enum { CACHE_MAX_KEY = 128, CACHE_MAX_ENTRIES = 1 << 15, CACHE_MIN_SLOTS = 1 << 10 };

struct sb__bpe_session {
    const sb_vocab *v;
    const sb__bpe *b;
    pcre2_match_data *md;
    /* the current run */
    const char *text;    /* what gets byte-encoded */
    const char *re_text; /* what the regexes see (same length) */
    sb__tok_out *out;
    /* scratch for one pre-token, grown on demand */
    char *word; /* the byte-encoded pre-token */
    size_t cap_word;
    symbol *sym;
    size_t cap_sym;
    pair *heap; /* min-heap by (rank, left) */
    size_t n_heap, cap_heap;
    /* the cache: open addressing over entries; slots hold an entry index or
     * UINT32_MAX; NULL until a run long enough to need it */
    uint32_t *slots;
    uint32_t mask;
    cache_entry *entries;
    uint32_t n_entries, cap_entries;
    char *keys;
    size_t n_keys, cap_keys;
    int32_t *ids; /* ids of cached pre-tokens, then those of the current one */
    size_t n_ids, cap_ids;
};

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return true;
    size_t cap2 = SB_MAX(need, 2 * *cap);
    void *q = sb_realloc(*p, cap2 * elem);
    if (!q)
        return false;
    *p = q;
    *cap = cap2;
    return true;
}

static bool add_id(sb__bpe_session *ss, int32_t id) {
    if (!grow((void **)&ss->ids, &ss->cap_ids, ss->n_ids + 1, sizeof(*ss->ids)))
        return false;
    ss->ids[ss->n_ids++] = id;
    return true;
}

static bool comes_first(const pair *a, const pair *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

SB__HEAP(pair_heap, pair, comes_first)

/* Queues the pair if a merge joins it; false only when out of memory. */
static bool try_pair(sb__bpe_session *ss, int32_t left, int32_t right) {
    if (left < 0 || right < 0)
        return true;
    const symbol *l = &ss->sym[left], *r = &ss->sym[right];
    int32_t rank = find_merge(ss->b, ss->word + l->off, l->n + r->n, l->n);
    return rank < 0 || pair_heap_push(&ss->heap, &ss->n_heap, &ss->cap_heap, (pair){rank, left, right, l->n + r->n});
}

/* Merges the byte-encoded pre-token in ss->word (one symbol per byte of
 * raw[0..n)) and appends the resulting ids to ss->ids. */
static bool merge_word(sb__bpe_session *ss, const uint8_t *raw, size_t n) {
    if (!grow((void **)&ss->sym, &ss->cap_sym, n, sizeof(*ss->sym)))
        return false;
    uint32_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t k = ss->b->enc_len[raw[i]];
        ss->sym[i] = (symbol){(int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, off, k};
        off += k;
    }
    ss->n_heap = 0;
    bool ok = true;
    for (size_t i = 1; ok && i < n; i++)
        ok = try_pair(ss, (int32_t)i - 1, (int32_t)i);
    while (ok && ss->n_heap > 0) {
        pair p = pair_heap_pop(ss->heap, &ss->n_heap);
        symbol *l = &ss->sym[p.left], *r = &ss->sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size)
            continue; /* one side was merged since this pair was queued */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            ss->sym[r->next].prev = p.left;
        ok = try_pair(ss, l->prev, p.left) && try_pair(ss, p.left, l->next);
    }
    for (int32_t i = 0; ok && i >= 0; i = ss->sym[i].next) { /* symbol 0 always survives */
        const symbol *s = &ss->sym[i];
        int32_t id = sb__vocab_find(ss->v, ss->word + s->off, s->n);
        if (id >= 0) {
            ok = add_id(ss, id);
            continue;
        }
        for (uint32_t k = 0; ok && k < s->n; k++) /* llama.cpp's fallback: single-byte tokens, if any */
            if ((id = sb__vocab_find(ss->v, ss->word + s->off + k, 1)) >= 0)
                ok = add_id(ss, id);
    }
    return ok;
}

static const cache_entry *cache_find(const sb__bpe_session *ss, const char *key, uint32_t len, uint32_t hash) {
    for (uint32_t i = hash & ss->mask;; i = (i + 1) & ss->mask) {
        uint32_t e = ss->slots[i];
        if (e == UINT32_MAX)
            return NULL;
        const cache_entry *c = &ss->entries[e];
        if (c->hash == hash && c->key_len == len && memcmp(ss->keys + c->key_off, key, len) == 0)
            return c;
    }
}

static void cache_link(sb__bpe_session *ss, uint32_t e) {
    uint32_t i = ss->entries[e].hash & ss->mask;
    while (ss->slots[i] != UINT32_MAX)
        i = (i + 1) & ss->mask;
    ss->slots[i] = e;
}

/* Remembers key -> ss->ids[ids_off..n_ids); false if it was not kept (the
 * cache is full or memory is short, which is no error). */
static bool cache_add(sb__bpe_session *ss, const char *key, uint32_t len, uint32_t hash, size_t ids_off) {
    if (ss->n_entries >= CACHE_MAX_ENTRIES)
        return false;
    if (2 * (ss->n_entries + 1) > ss->mask + 1) { /* keep the table at most half full */
        uint32_t slots = 2 * (ss->mask + 1);
        uint32_t *t = sb_malloc(slots * sizeof(*t));
        if (!t)
            return false;
        sb_free(ss->slots);
        ss->slots = t;
        ss->mask = slots - 1;
        memset(t, 0xff, slots * sizeof(*t));
        for (uint32_t e = 0; e < ss->n_entries; e++)
            cache_link(ss, e);
    }
    size_t n_entries = ss->n_entries, cap_entries = ss->cap_entries;
    if (!grow((void **)&ss->entries, &cap_entries, n_entries + 1, sizeof(*ss->entries)) ||
        !grow((void **)&ss->keys, &ss->cap_keys, ss->n_keys + len, 1))
        return false;
    ss->cap_entries = (uint32_t)cap_entries;
    memcpy(ss->keys + ss->n_keys, key, len);
    ss->entries[n_entries] =
        (cache_entry){hash, (uint32_t)ss->n_keys, len, (uint32_t)ids_off, (uint32_t)(ss->n_ids - ids_off)};
    ss->n_keys += len;
    cache_link(ss, ss->n_entries++);
    return true;
}

/* Encodes the pre-token text[off, off+len) and emits its ids. */
static bool encode_word(sb__bpe_session *ss, size_t off, size_t len) {
    const char *key = ss->text + off;
    bool cacheable = ss->slots && len <= CACHE_MAX_KEY;
    uint32_t hash = 0;
    if (cacheable) {
        hash = hash_bytes(key, len, 2166136261u);
        const cache_entry *c = cache_find(ss, key, (uint32_t)len, hash);
        if (c) {
            for (uint32_t i = 0; i < c->n_ids; i++)
                sb__tok_emit(ss->out, ss->ids[c->ids_off + i]);
            return true;
        }
    }

    size_t start = ss->n_ids;
    const uint8_t *raw = (const uint8_t *)key;
    if (!grow((void **)&ss->word, &ss->cap_word, 2 * len, 1))
        return false;
    size_t wlen = 0;
    for (size_t i = 0; i < len; i++) { /* 2 bytes always fit: the buffer has 2 per input byte */
        memcpy(ss->word + wlen, ss->b->enc[raw[i]], 2);
        wlen += ss->b->enc_len[raw[i]];
    }
    int32_t whole = ss->b->pre->ignore_merges ? sb__vocab_find(ss->v, ss->word, wlen) : -1;
    if (whole >= 0 ? !add_id(ss, whole) : !merge_word(ss, raw, len))
        return false;
    for (size_t i = start; i < ss->n_ids; i++)
        sb__tok_emit(ss->out, ss->ids[i]);
    if (!cacheable || !cache_add(ss, key, (uint32_t)len, hash, start))
        ss->n_ids = start; /* not kept: the space is reused */
    return true;
}

/* Runs regex `level` over [start, end) of the run and hands every match and
 * every stretch between matches to the next level; past the last level the
 * pieces are pre-tokens. Returns false on failure, with err set. */
static bool split(sb__bpe_session *ss, int level, size_t start, size_t end, sb_error *err) {
    if (level == ss->b->n_re) {
        if (!encode_word(ss, start, end - start)) {
            sb_fail(err, SB_ERR_NOMEM, "out of memory encoding a pre-token of %zu bytes", end - start);
            return false;
        }
        return true;
    }
    const pcre2_code *re = ss->b->re[level];
    PCRE2_SPTR subject = (PCRE2_SPTR)(ss->re_text + start);
    size_t n = end - start, done = 0, from = 0;
    while (from < n) {
        int rc = ss->b->jit[level] ? pcre2_jit_match(re, subject, n, from, 0, ss->md, NULL)
                                   : pcre2_match(re, subject, n, from, PCRE2_NO_UTF_CHECK, ss->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            sb_fail(err, rc == PCRE2_ERROR_NOMEMORY ? SB_ERR_NOMEM : SB_ERR_INVALID_ARG,
                    "pre-tokenizer regex %d failed at byte %zu: %s", level, start + from, (const char *)msg);
            return false;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ss->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* an empty match (none of the patterns makes one): search on */
            from = ms + 1;
            while (from < n && is_cont(subject[from]))
                from++;
            continue;
        }
        if (ms > done && !split(ss, level + 1, start + done, start + ms, err))
            return false;
        if (!split(ss, level + 1, start + ms, start + me, err))
            return false;
        done = from = me;
    }
    return done >= n || split(ss, level + 1, start + done, end, err);
}

static sb__bpe_session *session_create(const sb_vocab *v) {
    sb__bpe_session *ss = sb_calloc(1, sizeof(*ss));
    if (!ss)
        return NULL;
    ss->v = v;
    ss->b = v->bpe;
    ss->md = pcre2_match_data_create(1, v->bpe->gctx);
    if (!ss->md) {
        sb_free(ss);
        return NULL;
    }
    return ss;
}

void sb__bpe_session_free(sb__bpe_session *ss) {
    if (!ss)
        return;
    pcre2_match_data_free(ss->md);
    sb_free(ss->word);
    sb_free(ss->sym);
    sb_free(ss->heap);
    sb_free(ss->slots);
    sb_free(ss->entries);
    sb_free(ss->keys);
    sb_free(ss->ids);
    sb_free(ss);
}

sb_status sb__bpe_encode(const sb_vocab *v, sb__bpe_session **session, const char *text, size_t len,
                         sb__tok_out *out, sb_error *err) {
    if (len == 0)
        return SB_OK;
    if (len > INT32_MAX / 4)
        return sb_fail(err, SB_ERR_INVALID_ARG, "text of %zu bytes is too long to tokenize in one piece", len);
    if (!*session && !(*session = session_create(v)))
        return sb_fail(err, SB_ERR_NOMEM, "out of memory tokenizing %zu bytes", len);
    sb__bpe_session *ss = *session;
    if (!ss->slots && len >= 64) { /* short texts have few repeats to find */
        ss->slots = sb_malloc(CACHE_MIN_SLOTS * sizeof(*ss->slots));
        if (ss->slots) { /* else: no cache */
            memset(ss->slots, 0xff, CACHE_MIN_SLOTS * sizeof(*ss->slots));
            ss->mask = CACHE_MIN_SLOTS - 1;
        }
    }
    uint8_t *fixed = NULL, *fixed_re = NULL;
    if (!utf8_well_formed((const uint8_t *)text, len)) {
        if (!normalize_text((const uint8_t *)text, len, &fixed, &fixed_re, &len))
            return sb_fail(err, SB_ERR_NOMEM, "out of memory tokenizing %zu bytes", len);
        text = (const char *)fixed;
    }
    ss->text = text;
    ss->re_text = fixed_re ? (const char *)fixed_re : text;
    ss->out = out;
    sb_status st = SB_OK;
    if (!split(ss, 0, 0, len, err))
        st = err ? err->status : SB_ERR_NOMEM;
    ss->text = ss->re_text = NULL;
    sb_free(fixed);
    sb_free(fixed_re);
    return st;
}

/* ---- decoding ----------------------------------------------------------- */

uint32_t sb__bpe_decode_piece(const char *s, uint32_t n, char *dst) {
    const uint8_t *p = (const uint8_t *)s;
    uint32_t w = 0;
    for (uint32_t i = 0; i < n;) {
        uint32_t cp;
        size_t k;
        if (!llama_decode(p + i, n - i, &cp, &k))
            cp = 0xFFFD;
        i += (uint32_t)k;
        int byte = cp_to_byte(cp);
        if (byte >= 0) {
            if (dst)
                dst[w] = (char)byte;
            w++;
            continue;
        }
        /* llama_decode_text: "[UNK_BYTE_0x" + the character's UTF-8 in hex + the whole string + "]" */
        uint8_t u[4];
        size_t m = put_utf8(cp <= 0x10FFFF ? cp : 0xFFFD, u);
        char hex[9];
        for (size_t j = 0; j < m; j++)
            snprintf(hex + 2 * j, 3, "%02x", u[j]);
        const char *parts[] = {"[UNK_BYTE_0x", hex, NULL, "]"};
        size_t lens[] = {12, 2 * m, n, 1};
        for (size_t j = 0; j < 4; j++) {
            if (dst)
                memcpy(dst + w, parts[j] ? parts[j] : s, lens[j]);
            w += (uint32_t)lens[j];
        }
    }
    return w;
}

size_t sb__bpe_clean_spaces(char *t, size_t n) {
    /* The three passes of llama_vocab::impl::detokenize, in place and with
     * the same reads, so that their quirks carry over: pass 2 blanks the
     * space after a " ' " it collapsed, which pass 2 then reads again. */
    size_t total = n, w;
    /* 1: no space before ? ! . , */
    w = total ? 1 : 0;
    for (size_t i = 1; i < total; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
            w--;
        t[w++] = x;
    }
    total = w;
    /* 2: " ' " -> "'" */
    w = total ? 1 : 0;
    for (size_t i = 1; i < total; i++) {
        char x = t[i];
        if (x == '\'' && i + 1 < total && t[i - 1] == ' ' && t[i + 1] == ' ') {
            w--;
            t[++i] = '\0';
        }
        t[w++] = x;
    }
    total = w;
    /* 3: no space before 's 'm 're 've (but before 't 'd 'll) */
    w = total ? 1 : 0;
    for (size_t i = 1; i < total; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && x == '\'' && i + 1 < total) {
            char x1 = t[i + 1];
            if (x1 == 's' || x1 == 'm')
                w--;
            else if ((x1 == 'r' || x1 == 'v') && i + 2 < total && t[i + 2] == 'e')
                w--;
        }
        t[w++] = x;
    }
    return w;
}
