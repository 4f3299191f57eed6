/* A native sequential VTC server: the compiled baseline of benchmarks/bench_native.py.

   The same model and the same integer units as tests/sequential.py `simulate_vtc` (docs/MODEL.md's
   VTC: policy vtc, lift by the last-left rule, unit weights, prefill charge w_p * (prompt - cached)
   at admission, w_q per decoded token, KV budget M, completion at arrival-of-admission + output - 1),
   one lane after another, so that a run over many lanes amortizes the process start.

   Input (binary, native-endian int32): lanes, w_p, w_q; then per lane: n, num_clients, kv_budget,
   steps, followed by n rows of (arrival, client, prompt, output, cached) in trace order.
   Output (text, one line per lane): lane, steps, max drift, best nanoseconds of the simulation over
   the repeats, then the service of each client, then the counter of each client.

   Usage: vtc_seed INPUT OUTPUT [REPEATS]   (REPEATS >= 1, default 1: each lane is simulated that many
   times and the fastest is reported; the results of every repeat are identical).
   Plain C99 and libc (POSIX clock_gettime); exit status 2 on bad input or a failed allocation. */

#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    int32_t arrival, client, prompt, output, cached;
} Row;

typedef struct {
    int64_t *counter, *service, *running;  /* per client */
    int32_t *head, *tail, *start;          /* per client: FIFO = by_client[start + head .. start + tail) */
    int32_t *by_client;                    /* request numbers grouped by client, in (arrival, number) order */
    int32_t *order;                        /* request numbers in (arrival, number) order */
    int32_t *leave_head;                   /* per step: first request completing then (-1: none) */
    int32_t *leave_next;                   /* per request: next request completing at the same step */
} Work;

static const Row *sort_rows;

static int by_arrival(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int32_t ax = sort_rows[x].arrival, ay = sort_rows[y].arrival;
    if (ax != ay) return ax < ay ? -1 : 1;
    return x < y ? -1 : (x > y);
}

static void die(const char *what) {
    fprintf(stderr, "vtc_seed: %s\n", what);
    exit(2);
}

static void *grab(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size);
    if (!p) die("out of memory");
    return p;
}

/* One lane of `steps` steps; returns the max drift (max over steps of max service - min service). */
static int64_t simulate(const Row *rows, int32_t n, int32_t k, int64_t m, int64_t w_p, int64_t w_q,
                        int32_t steps, Work *w) {
    int32_t i, j, t;
    for (i = 0; i < n; i++) w->order[i] = i;
    sort_rows = rows;
    for (i = 1; i < n && by_arrival(&w->order[i - 1], &w->order[i]) < 0; i++) {}
    if (i < n) qsort(w->order, (size_t)n, sizeof(int32_t), by_arrival);  /* trace order need not be sorted */
    for (j = 0; j < k; j++) {
        w->counter[j] = w->service[j] = w->running[j] = 0;
        w->head[j] = w->tail[j] = w->start[j] = 0;
    }
    for (i = 0; i < n; i++) w->start[rows[i].client]++;
    for (j = 0, i = 0; j < k; j++) {  /* counts -> offsets */
        int32_t c = w->start[j];
        w->start[j] = i;
        i += c;
    }
    for (i = 0; i < n; i++) {
        int32_t r = w->order[i], c = rows[r].client;
        w->by_client[w->start[c] + w->tail[c]++] = r;
    }
    for (j = 0; j < k; j++) w->tail[j] = 0;
    for (t = 0; t < steps; t++) w->leave_head[t] = -1;

    int64_t occupancy = 0, max_drift = 0;
    int32_t last_left = -1, cursor = 0;
    for (t = 0; t < steps; t++) {
        /* phase 1: arrivals in trace order; a client that was not backlogged is lifted */
        while (cursor < n && rows[w->order[cursor]].arrival == t) {
            int32_t c = rows[w->order[cursor++]].client;
            if (w->head[c] == w->tail[c]) {
                int64_t low = 0;
                int any = 0;
                for (j = 0; j < k; j++)
                    if (w->head[j] < w->tail[j] && (!any || w->counter[j] < low)) {
                        low = w->counter[j];
                        any = 1;
                    }
                if (any) {
                    if (low > w->counter[c]) w->counter[c] = low;
                } else if (last_left >= 0 && w->counter[last_left] > w->counter[c]) {
                    w->counter[c] = w->counter[last_left];
                }
            }
            w->tail[c]++;
        }
        /* phase 2: admit the least-served backlogged client's head while it fits */
        for (;;) {
            int32_t best = -1;
            for (j = 0; j < k; j++)
                if (w->head[j] < w->tail[j] && (best < 0 || w->counter[j] < w->counter[best])) best = j;
            if (best < 0) break;
            int32_t r = w->by_client[w->start[best] + w->head[best]];
            if (occupancy + rows[r].prompt > m) break;
            w->head[best]++;
            occupancy += rows[r].prompt;
            w->running[best]++;
            int64_t charge = w_p * (int64_t)(rows[r].prompt - rows[r].cached);
            w->service[best] += charge;
            w->counter[best] += charge;
            last_left = best;
            int64_t leave = (int64_t)t + rows[r].output - 1;
            if (leave >= t && leave < steps) {  /* later ones never complete within the horizon */
                w->leave_next[r] = w->leave_head[leave];
                w->leave_head[leave] = r;
            }
        }
        /* phase 3: every running request generates one token */
        int64_t hi = 0, lo = 0;
        for (j = 0; j < k; j++) {
            if (w->running[j]) {
                w->service[j] += w_q * w->running[j];
                w->counter[j] += w_q * w->running[j];
                occupancy += w->running[j];
            }
            if (j == 0 || w->service[j] > hi) hi = w->service[j];
            if (j == 0 || w->service[j] < lo) lo = w->service[j];
        }
        if (hi - lo > max_drift) max_drift = hi - lo;
        /* phase 4: completions */
        for (int32_t r = w->leave_head[t]; r >= 0; r = w->leave_next[r]) {
            w->running[rows[r].client]--;
            occupancy -= (int64_t)rows[r].prompt + rows[r].output;
        }
    }
    return max_drift;
}

static void read_ints(FILE *f, int32_t *out, size_t count) {
    if (fread(out, sizeof(int32_t), count, f) != count) die("input ends early");
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) die("usage: vtc_seed INPUT OUTPUT [REPEATS]");
    long repeats = argc == 4 ? strtol(argv[3], NULL, 10) : 1;
    if (repeats < 1) die("REPEATS must be at least 1");
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "w");
    if (!in || !out) die("cannot open the input or the output");
    int32_t head[3], lane_head[4];
    read_ints(in, head, 3);
    for (int32_t lane = 0; lane < head[0]; lane++) {
        read_ints(in, lane_head, 4);
        int32_t n = lane_head[0], k = lane_head[1], steps = lane_head[3];
        if (n < 0 || k < 1 || steps < 0 || lane_head[2] < 0) die("bad lane header");
        Row *rows = grab((size_t)n, sizeof(Row));
        read_ints(in, (int32_t *)rows, (size_t)n * 5);
        for (int32_t i = 0; i < n; i++)
            if (rows[i].client < 0 || rows[i].client >= k) die("a client number is out of range");
        Work w = {grab((size_t)k, 8), grab((size_t)k, 8), grab((size_t)k, 8), grab((size_t)k, 4),
                  grab((size_t)k, 4), grab((size_t)k, 4), grab((size_t)n, 4), grab((size_t)n, 4),
                  grab((size_t)steps, 4), grab((size_t)n, 4)};
        int64_t drift = 0, best_ns = -1;
        for (long rep = 0; rep < repeats; rep++) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            drift = simulate(rows, n, k, lane_head[2], head[1], head[2], steps, &w);
            clock_gettime(CLOCK_MONOTONIC, &b);
            int64_t ns = (int64_t)(b.tv_sec - a.tv_sec) * 1000000000 + (b.tv_nsec - a.tv_nsec);
            if (best_ns < 0 || ns < best_ns) best_ns = ns;
        }
        fprintf(out, "%d %d %lld %lld", lane, steps, (long long)drift, (long long)best_ns);
        for (int32_t j = 0; j < k; j++) fprintf(out, " %lld", (long long)w.service[j]);
        for (int32_t j = 0; j < k; j++) fprintf(out, " %lld", (long long)w.counter[j]);
        fputc('\n', out);
        free(rows);
        free(w.counter); free(w.service); free(w.running); free(w.head); free(w.tail); free(w.start);
        free(w.by_client); free(w.order); free(w.leave_head); free(w.leave_next);
    }
    if (fclose(out) != 0) die("cannot write the output");
    fclose(in);
    return 0;
}
