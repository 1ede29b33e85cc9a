//! The CPU backend's attention kernel: the query heads of one KV head over their sequence's cached keys and values,
//! read through the paged cache's block table (causal: positions `0 .. len`).
//!
//! One pass with an online softmax (running max and sum, Milakov & Gimelshein 2018): the positions go in runs of
//! up to [`RUN`] consecutive cache slots (one block, or a piece of one); a run's scores are computed together, the
//! running max and sum are rescaled once per run (not once per position), and every K/V slot is read once. The
//! AVX-512 kernel ([`avx512`]) keeps the queries and the output accumulators in registers for head sizes that are a
//! multiple of 16 up to [`avx512::MAX_HEAD_DIM`] (several heads per pass where they fit, each key and value row then
//! loaded once for all), and computes a run's `exp`s as one vector; anything else runs the portable loop below, a
//! head at a time (through [`crate::quant::dot`] / [`crate::quant::axpy`]). Never allocates.

use crate::quant;

#[cfg(target_arch = "x86_64")]
mod avx512;

/// Most positions whose scores are computed together (one vector of 16 f32 scores).
pub const RUN: usize = 16;

/// An IEEE half (its bits): the element of an f16 KV cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct F16(pub u16);

/// An element type of the KV cache: f32, or [`F16`] (half the memory and half the bytes attention reads per
/// position; rounding to nearest even, relative error ≤ 2⁻¹¹).
pub trait KvElem: Copy + Default + Send + Sync + std::fmt::Debug + 'static {
    /// The type's name as `--kv-cache-dtype` spells it.
    const NAME: &'static str;

    /// The value as f32 (exact).
    fn to_f32(self) -> f32;

    /// Writes `src` converted into `dst` (same length).
    fn store_row(src: &[f32], dst: &mut [Self]);

    /// `q · row`.
    fn dot(q: &[f32], row: &[Self]) -> f32;

    /// `y += a · row`.
    fn axpy(a: f32, row: &[Self], y: &mut [f32]);
}

/// A [`KvElem`] the AVX-512 kernel also reads (every one, on x86_64).
#[cfg(target_arch = "x86_64")]
pub trait Kernel: avx512::Lanes {}
#[cfg(target_arch = "x86_64")]
impl<T: avx512::Lanes> Kernel for T {}
/// A [`KvElem`] (every one; no SIMD kernel off x86_64).
#[cfg(not(target_arch = "x86_64"))]
pub trait Kernel: KvElem {}
#[cfg(not(target_arch = "x86_64"))]
impl<T: KvElem> Kernel for T {}

impl KvElem for f32 {
    const NAME: &'static str = "f32";

    fn to_f32(self) -> f32 {
        self
    }

    fn store_row(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    fn dot(q: &[f32], row: &[f32]) -> f32 {
        quant::dot(q, row)
    }

    fn axpy(a: f32, row: &[f32], y: &mut [f32]) {
        quant::axpy(a, row, y);
    }
}

impl KvElem for F16 {
    const NAME: &'static str = "f16";

    fn to_f32(self) -> f32 {
        quant::f16_to_f32(self.0)
    }

    fn store_row(src: &[f32], dst: &mut [F16]) {
        assert_eq!(src.len(), dst.len(), "KV row lengths differ");
        #[cfg(target_arch = "x86_64")]
        if quant::simd_level() >= quant::SimdLevel::Avx512 {
            // SAFETY: AVX-512 F is available (`simd_level` detected it); the lengths are equal (asserted).
            return unsafe { avx512::store_f16(src, dst) };
        }
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = F16(quant::f32_to_f16(v));
        }
    }

    fn dot(q: &[f32], row: &[F16]) -> f32 {
        q.iter().zip(row).map(|(a, b)| a * b.to_f32()).sum()
    }

    fn axpy(a: f32, row: &[F16], y: &mut [f32]) {
        for (yi, x) in y.iter_mut().zip(row) {
            *yi += a * x.to_f32();
        }
    }
}

/// One layer's paged K/V cache as the kernel reads it.
#[derive(Debug)]
pub struct PagedKv<'a, T: KvElem = f32> {
    /// K cache, `[slot][stride]` with slot = block × `block_size` + offset in the block.
    pub k: &'a [T],
    /// V cache, same layout.
    pub v: &'a [T],
    /// Elements per slot (all KV heads).
    pub stride: usize,
    /// Slots per block.
    pub block_size: usize,
}

// Copy without `T: Copy` bounds from a derive (the fields are references and sizes).
impl<T: KvElem> Clone for PagedKv<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: KvElem> Copy for PagedKv<'_, T> {}

/// What one sequence's query heads attend over: one KV head (`offset` elements into each slot) of the cache slots
/// holding positions `0 .. len`, found through the sequence's block `table`.
#[derive(Debug, Clone, Copy)]
pub struct KvHead<'a, T: KvElem = f32> {
    /// The layer's cache.
    pub cache: PagedKv<'a, T>,
    /// The sequence's blocks.
    pub table: &'a [u32],
    /// Where the KV head starts in a slot (elements).
    pub offset: usize,
    /// Positions attended.
    pub len: usize,
}

impl<'a, T: KvElem> KvHead<'a, T> {
    /// The runs of consecutive slots holding positions `0 .. len`, in position order, as (first slot, count); runs
    /// never cross a block and hold at most [`RUN`] slots.
    fn runs(&self) -> Runs<'a> {
        Runs {
            table: self.table,
            block_size: self.cache.block_size,
            len: self.len,
            pos: 0,
        }
    }

    /// The key of `slot`, `hd` elements.
    ///
    /// # Panics
    /// If the head lies outside the cache.
    fn key(&self, slot: usize, hd: usize) -> &'a [T] {
        let base = slot * self.cache.stride + self.offset;
        &self.cache.k[base..base + hd]
    }

    /// The value of `slot`, `hd` elements.
    ///
    /// # Panics
    /// If the head lies outside the cache.
    fn value(&self, slot: usize, hd: usize) -> &'a [T] {
        let base = slot * self.cache.stride + self.offset;
        &self.cache.v[base..base + hd]
    }
}

/// Iterator of [`KvHead::runs`] (an iterator, not a callback, so the kernels' accumulators stay in registers).
struct Runs<'t> {
    table: &'t [u32],
    block_size: usize,
    len: usize,
    pos: usize,
}

impl Iterator for Runs<'_> {
    type Item = (usize, usize);

    /// # Panics
    /// If the table has fewer than `len / block_size` (rounded up) blocks.
    fn next(&mut self) -> Option<(usize, usize)> {
        if self.pos >= self.len {
            return None;
        }
        let (p, bs) = (self.pos, self.block_size);
        let within = p % bs;
        let cnt = RUN.min(bs - within).min(self.len - p);
        self.pos += cnt;
        Some((self.table[p / bs] as usize * bs + within, cnt))
    }
}

/// Writes into `out` the attention of the query heads `q` (consecutive heads of `head_dim` f32 that all read the
/// KV head `head`; unscaled: `scale` multiplies the scores). `out` is laid out as `q`. A `head` of no positions
/// writes zeros.
///
/// # Panics
/// If `q` and `out` differ in length or are not whole heads, if the block table does not cover the positions, or
/// if a slot's head lies outside the cache.
pub fn attend<T: Kernel>(q: &[f32], head_dim: usize, head: &KvHead<'_, T>, scale: f32, out: &mut [f32]) {
    assert!(
        q.len() == out.len() && head_dim > 0 && q.len().is_multiple_of(head_dim),
        "queries and output are not the same whole heads"
    );
    #[cfg(target_arch = "x86_64")]
    if quant::simd_level() >= quant::SimdLevel::Avx512 && avx512::supports(head_dim) {
        // SAFETY: AVX-512 F is available (`simd_level` detected it), the head size is supported and the slices are
        // whole heads (asserted above).
        unsafe { avx512::attend(q, head_dim, head, scale, out) };
        return;
    }
    for (qh, oh) in q.chunks_exact(head_dim).zip(out.chunks_exact_mut(head_dim)) {
        attend_portable(qh, head, scale, oh);
    }
}

/// The portable kernel for one query head (any head size; an f32 cache at any SIMD level through `quant::dot` /
/// `quant::axpy`).
fn attend_portable<T: KvElem>(q: &[f32], head: &KvHead<'_, T>, scale: f32, out: &mut [f32]) {
    let hd = q.len();
    out.fill(0.0);
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    let mut sc = [0f32; RUN];
    for (slot0, cnt) in head.runs() {
        let mut run_max = f32::NEG_INFINITY;
        for (j, s) in sc[..cnt].iter_mut().enumerate() {
            *s = T::dot(q, head.key(slot0 + j, hd)) * scale;
            run_max = run_max.max(*s);
        }
        if run_max > max {
            let r = (max - run_max).exp();
            sum *= r;
            out.iter_mut().for_each(|o| *o *= r);
            max = run_max;
        }
        for (j, &s) in sc[..cnt].iter().enumerate() {
            let w = (s - max).exp();
            sum += w;
            T::axpy(w, head.value(slot0 + j, hd), out);
        }
    }
    if sum > 0.0 {
        let inv = 1.0 / sum;
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::pseudo_random;

    /// Softmax attention in f64, positions in order, straight from the definition.
    fn reference<T: KvElem>(q: &[f32], head: &KvHead<'_, T>, scale: f32) -> Vec<f64> {
        let (hd, bs) = (q.len(), head.cache.block_size);
        let slot = |p: usize| head.table[p / bs] as usize * bs + p % bs;
        let scores: Vec<f64> = (0..head.len)
            .map(|p| {
                let k = head.key(slot(p), hd);
                (0..hd)
                    .map(|i| f64::from(q[i]) * f64::from(k[i].to_f32()))
                    .sum::<f64>()
                    * f64::from(scale)
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = w.iter().sum();
        (0..hd)
            .map(|i| {
                (0..head.len)
                    .map(|p| w[p] * f64::from(head.value(slot(p), hd)[i].to_f32()))
                    .sum::<f64>()
                    / total
            })
            .collect()
    }

    /// Both kernels against the f64 definition: head sizes the AVX-512 kernel takes (64 — in passes of up to 3
    /// query heads — and 128) and one it leaves to the portable loop (48), 1 to 7 query heads per KV head, block
    /// sizes smaller and larger than a run, lengths that end mid-block, a shuffled block table, KV heads at an
    /// offset in the slot, and scores large enough that the running max moves; f32 and f16 caches (the
    /// definition reads the same stored halves).
    #[test]
    fn kernels_match_the_definition() {
        kernels_match_the_definition_for(|v| v);
        kernels_match_the_definition_for(|v| F16(quant::f32_to_f16(v)));
    }

    fn kernels_match_the_definition_for<T: Kernel>(store: fn(f32) -> T) {
        for (hd, kv_heads, bs) in [(64, 3, 16), (128, 2, 32), (48, 2, 5), (64, 1, 7)] {
            let stride = hd * kv_heads;
            let blocks = 12usize;
            let k: Vec<T> = pseudo_random(blocks * bs * stride, 1 + hd as u32)
                .into_iter()
                .map(store)
                .collect();
            let v: Vec<T> = pseudo_random(blocks * bs * stride, 2 + bs as u32)
                .into_iter()
                .map(store)
                .collect();
            let kv = PagedKv {
                k: &k,
                v: &v,
                stride,
                block_size: bs,
            };
            // Blocks out of order, as the pool hands them out.
            let table: Vec<u32> = (0..blocks as u32).map(|b| (b * 5 + 3) % blocks as u32).collect();
            for len in [1, 2, bs - 1, bs, bs + 1, 3 * bs + 2, blocks * bs] {
                for head in 0..kv_heads {
                    // 1 to 7 query heads on this KV head: passes of 3 and 2 heads, and single ones.
                    let group = 1 + (len + head) % 7;
                    let q: Vec<f32> = pseudo_random(group * hd, (len * 31 + head) as u32)
                        .iter()
                        .map(|x| x * 4.0)
                        .collect();
                    let kvh = KvHead {
                        cache: kv,
                        table: &table,
                        offset: head * hd,
                        len,
                    };
                    let mut fast = vec![f32::NAN; group * hd];
                    attend(&q, hd, &kvh, 0.125, &mut fast);
                    for (g, qh) in q.chunks_exact(hd).enumerate() {
                        let want = reference(qh, &kvh, 0.125);
                        let mut portable = vec![f32::NAN; hd];
                        attend_portable(qh, &kvh, 0.125, &mut portable);
                        for i in 0..hd {
                            for (name, got) in [("dispatched", fast[g * hd + i]), ("portable", portable[i])] {
                                assert!(
                                    (f64::from(got) - want[i]).abs() < 2e-6,
                                    "{} {name} hd {hd} bs {bs} len {len} head {head}.{g} of {group} [{i}]: {got} vs {}",
                                    T::NAME,
                                    want[i]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Writing a row of halves rounds as `quant::f32_to_f16` does (nearest, ties to even), on the vector path and
    /// its scalar tail: exact values, ties, subnormals, overflow to infinity, NaN.
    #[test]
    fn f16_rows_round_as_the_scalar_conversion() {
        let mut src: Vec<f32> = pseudo_random(37, 9).iter().map(|x| x * 3.0).collect();
        let halfway = 1.0 + 2f32.powi(-11);
        src.extend([
            0.0,
            -0.0,
            1.0,
            halfway,
            -halfway,
            1.0 + 3.0 * 2f32.powi(-11),
            6.0e-8,
            1.0e-5,
            65504.0,
            70000.0,
        ]);
        src.extend([f32::NAN, f32::INFINITY, -1.0e-9]);
        let mut dst = vec![F16(0); src.len()];
        F16::store_row(&src, &mut dst);
        for (&v, h) in src.iter().zip(&dst) {
            let want = quant::f32_to_f16(v);
            if v.is_nan() {
                assert!(h.to_f32().is_nan(), "NaN stored as {:#x}", h.0);
            } else {
                assert_eq!(h.0, want, "{v}: {:#x} vs {want:#x}", h.0);
            }
        }
    }

    #[test]
    fn runs_stay_inside_blocks() {
        let (k, v) = (vec![0f32; 1], vec![0f32; 1]);
        let kv = PagedKv {
            k: &k,
            v: &v,
            stride: 1,
            block_size: 20,
        };
        let head = KvHead {
            cache: kv,
            table: &[4, 1, 7],
            offset: 0,
            len: 45,
        };
        let got: Vec<_> = head.runs().collect();
        assert_eq!(got, [(80, 16), (96, 4), (20, 16), (36, 4), (140, 5)]);
    }
}
