// Sampling on the device (sample_rows, inference/src/backend/cuda/sample.rs) under the emulator, against
// inference/src/sampling.rs's rule computed here in double precision: for each configuration many rows of the same
// logits, each with its own seed, drawn in one launch; every token must be the one the rule's inverse CDF gives for
// the row's Philox uniform (except within 2e-6 of a boundary, where float and double sums may disagree), no token
// outside the kept set may appear, and the counts must pass Pearson's chi-square against the rule's probabilities
// (0.1 % level; bins of consecutive tokens expecting at least 5 draws each). Also: Philox's known answers, the raw log-probabilities, logits restored after the penalties, the
// same token for a seed whatever the row's place in the batch, and the bisection path for candidate sets larger
// than SAMPLE_CAND. Included by kernels_test.cpp (needs its CHECK and the kernels).
#include <numeric>

struct SampleCfg {
    float temp = 1, top_p = 1;
    int top_k = 0;
    float min_p = 0, pres = 0, freq = 0, rep = 1;
    int logprobs = -1;
};
struct HistEntry {
    int tok;
    unsigned word;
};
static const int DRAW_INDEX = 3;  // the output index every row draws for (Philox's counter)

static void put_params(int* w, const SampleCfg& c, unsigned long long seed, int hist_off, int hist_len) {
    for (int i = 0; i < SAMPLE_WORDS; i++) w[i] = 0;
    w[SP_MODE] = 1;
    w[SP_TEMPERATURE] = __float_as_int(c.temp);
    w[SP_TOP_P] = __float_as_int(c.top_p);
    w[SP_TOP_K] = c.top_k;
    w[SP_MIN_P] = __float_as_int(c.min_p);
    w[SP_PRESENCE] = __float_as_int(c.pres);
    w[SP_FREQUENCY] = __float_as_int(c.freq);
    w[SP_REPETITION] = __float_as_int(c.rep);
    w[SP_SEED_LO] = (int)(unsigned)seed;
    w[SP_SEED_HI] = (int)(unsigned)(seed >> 32);
    w[SP_INDEX_LO] = DRAW_INDEX;
    w[SP_INDEX_HI] = 0;
    w[SP_HIST_OFF] = hist_off;
    w[SP_HIST_LEN] = hist_len;
    w[SP_LOGPROBS] = c.logprobs;
}

// The penalized logits (the kernel's own penalize(), as sampling.rs's).
static std::vector<float> penalized(std::vector<float> l, const SampleCfg& c, const std::vector<HistEntry>& h) {
    if (c.pres != 0 || c.freq != 0 || c.rep != 1)
        for (auto& e : h) l[e.tok] = penalize(l[e.tok], e.word, c.pres, c.freq, c.rep);
    return l;
}

// The rule's probability of drawing each token, in double precision with a full sort.
static std::vector<double> rule_probs(const std::vector<float>& raw, const SampleCfg& c, const std::vector<HistEntry>& h) {
    auto l = penalized(raw, c, h);
    double mx = -INFINITY;
    for (float v : l) if (v > mx) mx = v;
    std::vector<double> w(l.size());
    for (size_t i = 0; i < l.size(); i++) { w[i] = std::exp(((double)l[i] - mx) / c.temp); if (w[i] < c.min_p) w[i] = 0; }
    std::vector<double> s; for (double x : w) if (x > 0) s.push_back(x);
    std::sort(s.begin(), s.end(), std::greater<double>());
    double tau = 0;
    if (c.top_k > 0 && c.top_k < (int)s.size()) tau = s[c.top_k - 1];
    if (c.top_p < 1) {
        double mass = 0; for (double x : s) if (x >= tau) mass += x;
        double acc = 0;
        for (double x : s) { if (x < tau) break; acc += x; if (acc >= c.top_p * mass) { tau = std::max(tau, x); break; } }
    }
    double tot = 0;
    for (auto& x : w) { if (x < tau) x = 0; tot += x; }
    for (auto& x : w) x /= tot;
    return w;
}

// The token the rule's inverse CDF (vocabulary order) gives for u, and u's distance to the nearest boundary.
static int rule_pick(const std::vector<double>& q, double u, double& margin) {
    double acc = 0; int pick = -1; margin = 1;
    for (size_t i = 0; i < q.size(); i++) {
        if (q[i] <= 0) continue;
        margin = std::min(margin, std::fabs(u - acc));
        acc += q[i];
        margin = std::min(margin, std::fabs(u - acc));
        if (pick < 0 && u < acc) pick = (int)i;
    }
    if (pick < 0) for (size_t i = q.size(); i-- > 0;) if (q[i] > 0) { pick = (int)i; break; }
    return pick;
}

struct Drawn {
    std::vector<int> tokens, lp;
    std::vector<float> logits_after;
};
// `rows` rows of the logits l (each with its own copy of the history, seed seeds[r]) in one launch of `threads`-thread
// blocks.
static Drawn draw_rows(const std::vector<float>& l, const SampleCfg& c, const std::vector<HistEntry>& h,
                       const std::vector<unsigned long long>& seeds, int threads) {
    int rows = seeds.size(), vocab = l.size(), hl = h.size();
    Drawn d;
    d.logits_after.resize((size_t)rows * vocab);
    for (int r = 0; r < rows; r++) std::copy(l.begin(), l.end(), d.logits_after.begin() + (size_t)r * vocab);
    std::vector<int> params(rows * SAMPLE_WORDS), hist(2 * std::max(1, rows * hl));
    std::vector<float> hist_raw(std::max(1, rows * hl));
    for (int r = 0; r < rows; r++) {
        put_params(&params[r * SAMPLE_WORDS], c, seeds[r], r * hl, hl);
        for (int e = 0; e < hl; e++) { hist[2 * (r * hl + e)] = h[e].tok; hist[2 * (r * hl + e) + 1] = (int)h[e].word; }
    }
    d.tokens.assign(rows, -1);
    d.lp.assign(rows * LOGPROB_WORDS, 0);
    launch({(unsigned)rows}, {(unsigned)threads}, [&] {
        sample_rows(d.logits_after.data(), vocab, params.data(), hist.data(), hist_raw.data(), d.tokens.data(), d.lp.data());
    });
    return d;
}

static float seed_uniform(unsigned long long seed) {
    return sample_uniform((unsigned)seed, (unsigned)(seed >> 32), DRAW_INDEX, 0);
}

// Draws `rows` tokens of one configuration and checks them against the rule (see the top of the file).
static void check_config(const char* name, const std::vector<float>& l, const SampleCfg& c, const std::vector<HistEntry>& h,
                         int rows, int threads) {
    std::vector<unsigned long long> seeds(rows);
    for (int r = 0; r < rows; r++) seeds[r] = 0x9E3779B97F4A7C15ull * (r + 1);
    Drawn d = draw_rows(l, c, h, seeds, threads);
    auto q = rule_probs(l, c, h);
    std::vector<int> counts(l.size(), 0);
    int mismatch = 0, outside = 0, near = 0;
    for (int r = 0; r < rows; r++) {
        int t = d.tokens[r];
        if (t < 0 || t >= (int)l.size() || q[t] == 0) { outside++; continue; }
        counts[t]++;
        double margin;
        int want = rule_pick(q, seed_uniform(seeds[r]), margin);
        if (margin < 2e-6) near++;
        else if (t != want) {
            if (mismatch < 3) printf("  %s row %d: token %d, the rule gives %d (u %.7f)\n", name, r, t, want, seed_uniform(seeds[r]));
            mismatch++;
        }
    }
    // Chi-square over bins of consecutive kept tokens, each expecting at least 5 draws (the test's validity rule).
    double chi2 = 0, bin_e = 0, bin_c = 0; int df = -1;
    for (size_t i = 0; i < q.size(); i++) {
        if (q[i] <= 0) continue;
        bin_e += q[i] * rows; bin_c += counts[i];
        if (bin_e >= 5) { chi2 += (bin_c - bin_e) * (bin_c - bin_e) / bin_e; df++; bin_e = bin_c = 0; }
    }
    if (bin_e > 0) { chi2 += (bin_c - bin_e) * (bin_c - bin_e) / bin_e; df++; }
    df = std::max(df, 1);
    double crit = df * std::pow(1 - 2.0 / (9 * df) + 3.09 * std::sqrt(2.0 / (9 * df)), 3);  // Wilson-Hilferty, 0.1 %
    bool restored = true;
    for (int r = 0; r < rows; r++) restored = restored && std::memcmp(&d.logits_after[(size_t)r * l.size()], l.data(), l.size() * 4) == 0;
    int kept = 0; for (double x : q) kept += x > 0;
    CHECK(mismatch == 0 && outside == 0, "sampling %s: %d tokens differ from the rule's, %d outside the kept set", name, mismatch, outside);
    CHECK(chi2 < crit, "sampling %s: chi-square %.1f over %d degrees of freedom (critical %.1f)", name, chi2, df, crit);
    CHECK(restored, "sampling %s: the logits were not restored after the penalties", name);
    printf("sampling %-36s %5d draws, %4d tokens kept, chi-square %6.1f (df %d, critical %.1f), %d within 2e-6 of a boundary\n", name, rows, kept, chi2, df, crit, near);
}

void test_sampling() {
    // Philox4x32-10's known answers (Random123's kat_vectors), through the kernels' own function.
    unsigned a[4] = {0, 0, 0, 0}, b[4] = {~0u, ~0u, ~0u, ~0u}, c3[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
    philox(a, 0, 0); philox(b, ~0u, ~0u); philox(c3, 0xa4093822u, 0x299f31d0u);
    CHECK(a[0] == 0x6627e8d5u && a[3] == 0x9b00dbd8u && b[0] == 0x408f276du && b[3] == 0x6d5451fdu && c3[0] == 0xd16cfe09u && c3[3] == 0x24126ea1u,
          "philox known answers: %08x %08x %08x", a[0], b[0], c3[0]);

    // 200 distinct logits spread over [-6, 6].
    std::vector<float> l(200);
    for (int i = 0; i < 200; i++) l[i] = ((i * 73) % 200) / 200.0f * 12.0f - 6.0f;
    const int T = 64;  // threads per block here (two warps); 1024 on the GPU
    SampleCfg plain; check_config("temperature 1", l, plain, {}, 3000, T);
    SampleCfg c1; c1.temp = 0.7f; c1.top_p = 0.9f; check_config("temperature 0.7, top_p 0.9", l, c1, {}, 3000, T);
    SampleCfg c2; c2.top_k = 10; check_config("top_k 10", l, c2, {}, 3000, T);
    SampleCfg c3c; c3c.temp = 1.3f; c3c.top_k = 50; c3c.top_p = 0.8f; c3c.min_p = 0.02f; check_config("top_k 50, top_p 0.8, min_p 0.02", l, c3c, {}, 3000, T);
    SampleCfg c4; c4.min_p = 0.1f; check_config("min_p 0.1", l, c4, {}, 3000, T);
    std::vector<HistEntry> h = {{3, 0x80000000u}, {17, 0x80000002u}, {40, 1}, {63, 3}, {199, 0x80000000u}, {120, 1}};
    // The history's tokens near the top of the distribution, so the penalties move it.
    std::vector<float> lh = l;
    for (auto& e : h) lh[e.tok] = 4.0f + 0.1f * (e.tok % 7);
    SampleCfg c5; c5.pres = 0.5f; c5.freq = 0.3f; c5.rep = 1.3f; c5.top_p = 0.95f; c5.logprobs = 5;
    check_config("penalties, top_p 0.95, logprobs 5", lh, c5, h, 3000, T);

    // Log-probabilities: the raw log-softmax, the chosen token's and the 5 most likely.
    {
        Drawn d = draw_rows(lh, c5, h, {11, 12, 13}, T);
        double mx = -INFINITY, s = 0;
        for (float v : lh) mx = std::max(mx, (double)v);
        for (float v : lh) s += std::exp(v - mx);
        double lse = mx + std::log(s);
        std::vector<int> order(lh.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return lh[x] > lh[y]; });
        for (int r = 0; r < 3; r++) {
            const int* w = &d.lp[r * LOGPROB_WORDS];
            double e = std::fabs(__int_as_float(w[0]) - (lh[d.tokens[r]] - lse));
            bool ids = w[1] == 5;
            for (int i = 0; i < 5 && ids; i++) {
                ids = w[2 + i] == order[i];
                e = std::max(e, std::fabs(__int_as_float(w[2 + MAX_TOP_LOGPROBS + i]) - (lh[order[i]] - lse)));
            }
            CHECK(ids && e < 1e-5, "logprobs row %d: ids %s, worst error %g", r, ids ? "ok" : "wrong", e);
        }
    }
    // Temperature 0 with penalties: the argmax of the penalized logits.
    {
        SampleCfg g; g.temp = 0; g.freq = 3.0f;
        std::vector<float> l2 = {2.0f, 1.9f, -1.0f};
        Drawn d = draw_rows(l2, g, {{0, 1}}, {5}, T);
        CHECK(d.tokens[0] == 1, "greedy with penalties: token %d, want 1", d.tokens[0]);
    }
    // A seed gives the same token wherever its row sits in the batch.
    {
        std::vector<unsigned long long> seeds;
        for (int r = 0; r < 40; r++) seeds.push_back(1000 + r);
        auto rev = seeds; std::reverse(rev.begin(), rev.end());
        Drawn x = draw_rows(l, c1, {}, seeds, T), y = draw_rows(l, c1, {}, rev, T);
        bool same = true;
        for (int r = 0; r < 40; r++) same = same && x.tokens[r] == y.tokens[39 - r];
        CHECK(same, "the same seed drew different tokens in another place of the batch");
    }
    // More candidates than fit in shared memory: the thresholds come from the bisection passes. 6000 tokens, every
    // weight in [e^-2, 1] (each value twice: ties at the boundary are kept).
    {
        std::vector<float> lf(6000);
        for (int i = 0; i < 6000; i++) lf[i] = -(float)(i % 3000) / 1500.0f;
        SampleCfg f1; f1.top_p = 0.9f; check_config("6000 tokens, top_p 0.9 (bisection)", lf, f1, {}, 400, T);
        SampleCfg f2; f2.top_k = 4001; check_config("6000 tokens, top_k 4001 (bisection)", lf, f2, {}, 400, T);
        SampleCfg f3; f3.top_k = 5000; f3.top_p = 0.5f; check_config("6000 tokens, top_k 5000, top_p 0.5", lf, f3, {}, 400, T);
    }
    printf("sampling done\n");
}
