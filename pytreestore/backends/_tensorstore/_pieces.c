/* The direct reader's hot loop (pytreestore/backends/_tensorstore/direct.py, direct_reads.py).
 *
 * A read is a table of pieces, each a byte range of an open file: a plain chunk, or one inner
 * chunk of a zarr v3 shard. For each piece a worker reads the range with pread, checks its
 * crc32c trailer, decodes it (zstd, or none) and copies the rows the read wants into their
 * destinations (straight into the destination when the piece is wanted whole). The caller
 * runs pts_run on several threads at once: they take pieces from one shared counter. Nothing
 * here touches Python: the caller (ctypes) releases the GIL for the whole call.
 *
 * The libraries are the ones the Python packages already use, loaded by path at pts_load:
 * libzstd (the system's, or numcodecs' copy) and google-crc32c's libcrc32c. No header of
 * theirs is needed: their few stable C functions are declared here.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

typedef struct {
    int64_t offset;  /* the piece's first byte in its file */
    int64_t length;  /* stored bytes, the checksum trailer included */
    int64_t decoded; /* bytes once decoded */
    int64_t copy_lo; /* its copies: copies[copy_lo:copy_hi] */
    int64_t copy_hi;
    int64_t detail;  /* out: errno, bytes read or the decoder's error code */
    int32_t fd;
    int32_t codec;   /* PTS_NONE or PTS_ZSTD */
    int32_t checksum;/* 1: the stored bytes end in a crc32c of the rest */
    int32_t status;  /* out: PTS_OK or an error below */
} pts_piece;

typedef struct {
    int64_t src;     /* offset in the decoded piece */
    int64_t dst;     /* destination address */
    int64_t nbytes;
} pts_copy;

enum { PTS_NONE = 0, PTS_ZSTD = 1 };
enum {
    PTS_OK = 0,
    PTS_OS_ERROR = 1,   /* detail: errno */
    PTS_SHORT = 2,      /* detail: bytes the file held */
    PTS_CHECKSUM = 3,
    PTS_DECODE = 4,     /* detail: the decoder's error code */
    PTS_SIZE = 5,       /* detail: bytes decoded */
    PTS_MEMORY = 6,
    PTS_NO_CODEC = 7,
    PTS_BOUNDS = 8,     /* a copy outside the decoded piece */
};

static size_t (*zstd_decompress_dctx)(void *, void *, size_t, const void *, size_t);
static void *(*zstd_create_dctx)(void);
static unsigned (*zstd_is_error)(size_t);
static uint32_t (*crc32c_extend)(uint32_t, const uint8_t *, size_t);

/* Loads the libraries; returns a bit mask: 1 crc32c, 2 zstd. */
int pts_load(const char *crc_path, const char *zstd_path) {
    int have = 0;
    if (crc_path != NULL && crc32c_extend == NULL) {
        void *lib = dlopen(crc_path, RTLD_NOW | RTLD_LOCAL);
        if (lib != NULL) {
            crc32c_extend = (uint32_t(*)(uint32_t, const uint8_t *, size_t))dlsym(lib, "crc32c_extend");
        }
    }
    if (zstd_path != NULL && zstd_decompress_dctx == NULL) {
        void *lib = dlopen(zstd_path, RTLD_NOW | RTLD_LOCAL);
        if (lib != NULL) {
            void *d = dlsym(lib, "ZSTD_decompressDCtx");
            void *c = dlsym(lib, "ZSTD_createDCtx");
            void *e = dlsym(lib, "ZSTD_isError");
            if (d != NULL && c != NULL && e != NULL) {
                zstd_create_dctx = (void *(*)(void))c;
                zstd_is_error = (unsigned (*)(size_t))e;
                zstd_decompress_dctx =
                    (size_t(*)(void *, void *, size_t, const void *, size_t))d;
            }
        }
    }
    if (crc32c_extend != NULL) have |= 1;
    if (zstd_decompress_dctx != NULL) have |= 2;
    return have;
}

/* Each thread's reused buffers and zstd context (threads of the caller's pool live long). */
static __thread uint8_t *stored_buf;
static __thread size_t stored_cap;
static __thread uint8_t *decoded_buf;
static __thread size_t decoded_cap;
static __thread void *dctx;

static uint8_t *grow(uint8_t **buf, size_t *cap, size_t n) {
    if (n > *cap) {
        size_t want = n < 65536 ? 65536 : n;
        uint8_t *fresh = (uint8_t *)malloc(want);
        if (fresh == NULL) return NULL;
        free(*buf);
        *buf = fresh;
        *cap = want;
    }
    return *buf;
}

/* Reads exactly n bytes at off unless the file ends first; the bytes read, or -1 (errno). */
static int64_t read_at(int fd, uint8_t *buf, int64_t n, int64_t off) {
    int64_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, buf + done, (size_t)(n - done), (off_t)(off + done));
        if (got < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (got == 0) break;
        done += got;
    }
    return done;
}

static int fail(pts_piece *p, int status, int64_t detail) {
    p->status = status;
    p->detail = detail;
    return status;
}

static int copy_out(pts_piece *p, const pts_copy *copies, const uint8_t *decoded) {
    for (int64_t c = p->copy_lo; c < p->copy_hi; c++) {
        const pts_copy *k = &copies[c];
        if (k->src < 0 || k->nbytes < 0 || k->src + k->nbytes > p->decoded)
            return fail(p, PTS_BOUNDS, c);
        memcpy((void *)(intptr_t)k->dst, decoded + k->src, (size_t)k->nbytes);
    }
    return PTS_OK;
}

/* The piece's destination when one copy takes it whole, else NULL. */
static uint8_t *whole_target(const pts_piece *p, const pts_copy *copies) {
    if (p->copy_hi - p->copy_lo != 1) return NULL;
    const pts_copy *k = &copies[p->copy_lo];
    return (k->src == 0 && k->nbytes == p->decoded) ? (uint8_t *)(intptr_t)k->dst : NULL;
}

static int check(pts_piece *p, const uint8_t *body, int64_t n, const uint8_t *trailer) {
    if (!p->checksum) return PTS_OK;
    uint32_t want = (uint32_t)trailer[0] | (uint32_t)trailer[1] << 8 |
                    (uint32_t)trailer[2] << 16 | (uint32_t)trailer[3] << 24;
    return crc32c_extend(0, body, (size_t)n) == want ? PTS_OK : fail(p, PTS_CHECKSUM, 0);
}

static int raw_piece(pts_piece *p, const pts_copy *copies, int64_t body) {
    if (body != p->decoded) return fail(p, PTS_SIZE, body);
    uint8_t *target = whole_target(p, copies);
    uint8_t *out = target != NULL ? target : grow(&decoded_buf, &decoded_cap, (size_t)body);
    if (out == NULL) return fail(p, PTS_MEMORY, 0);
    uint8_t trailer[4];
    struct iovec parts[2] = {{out, (size_t)body}, {trailer, p->checksum ? 4u : 0u}};
    int64_t want = p->length, done = 0;
    while (done < want) {  /* preadv until full or the file ends */
        ssize_t got = preadv(p->fd, parts, 2, (off_t)(p->offset + done));
        if (got < 0) {
            if (errno == EINTR) continue;
            return fail(p, PTS_OS_ERROR, errno);
        }
        if (got == 0) break;
        done += got;
        for (int i = 0; i < 2 && got > 0; i++) {
            size_t take = (size_t)got < parts[i].iov_len ? (size_t)got : parts[i].iov_len;
            parts[i].iov_base = (uint8_t *)parts[i].iov_base + take;
            parts[i].iov_len -= take;
            got -= (ssize_t)take;
        }
    }
    if (done != want) return fail(p, PTS_SHORT, done);
    if (check(p, out, body, trailer) != PTS_OK) return p->status;
    return target != NULL ? PTS_OK : copy_out(p, copies, out);
}

static int zstd_piece(pts_piece *p, const pts_copy *copies, int64_t body) {
    if (zstd_decompress_dctx == NULL) return fail(p, PTS_NO_CODEC, 0);
    if (dctx == NULL && (dctx = zstd_create_dctx()) == NULL) return fail(p, PTS_MEMORY, 0);
    uint8_t *stored = grow(&stored_buf, &stored_cap, (size_t)p->length);
    if (stored == NULL) return fail(p, PTS_MEMORY, 0);
    int64_t got = read_at(p->fd, stored, p->length, p->offset);
    if (got < 0) return fail(p, PTS_OS_ERROR, errno);
    if (got != p->length) return fail(p, PTS_SHORT, got);
    if (check(p, stored, body, stored + body) != PTS_OK) return p->status;
    uint8_t *target = whole_target(p, copies);
    uint8_t *out = target != NULL ? target : grow(&decoded_buf, &decoded_cap, (size_t)p->decoded);
    if (out == NULL) return fail(p, PTS_MEMORY, 0);
    size_t n = zstd_decompress_dctx(dctx, out, (size_t)p->decoded, stored, (size_t)body);
    if (zstd_is_error(n)) return fail(p, PTS_DECODE, (int64_t)n);
    if ((int64_t)n != p->decoded) return fail(p, PTS_SIZE, (int64_t)n);
    return target != NULL ? PTS_OK : copy_out(p, copies, out);
}

static void one_piece(pts_piece *p, const pts_copy *copies) {
    p->status = PTS_OK;
    p->detail = 0;
    if (p->checksum && crc32c_extend == NULL) {
        fail(p, PTS_NO_CODEC, 0);
        return;
    }
    int64_t body = p->length - (p->checksum ? 4 : 0);
    if (body < 0) {
        fail(p, PTS_SHORT, p->length);
        return;
    }
    if (p->codec == PTS_NONE)
        raw_piece(p, copies, body);
    else if (p->codec == PTS_ZSTD)
        zstd_piece(p, copies, body);
    else
        fail(p, PTS_NO_CODEC, p->codec);
}

/* Works through pieces[*next...n) with the other threads of the call, at most `limit` of
 * them (the caller's thread comes back often enough to see a signal); returns the pieces
 * that failed on this thread (their status says why). */
int64_t pts_run(pts_piece *pieces, int64_t n, const pts_copy *copies, int64_t *next,
                int64_t limit) {
    int64_t failed = 0;
    for (int64_t done = 0; done < limit; done++) {
        int64_t i = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (i >= n) break;
        one_piece(&pieces[i], copies);
        failed += pieces[i].status != PTS_OK;
    }
    return failed;
}

/* The size of the structs, so that the caller can check its layout against them. */
int64_t pts_layout(void) { return (int64_t)sizeof(pts_piece) * 1000 + (int64_t)sizeof(pts_copy); }
