//! The CPU sampler's passes over a vocabulary-sized row (the weights, the kept weights' block sums, the raw
//! log-sum-exp), written as branch-free loops over sixteen lanes that the compiler vectorizes, and compiled for
//! AVX-512 or AVX2 when the CPU has them ([`crate::quant::simd_level`]): 49,152 `exp` per sampled row cost ~0.3 ms
//! as libm calls, a few tens of µs here. Arithmetic only; the lanes are summed in a fixed order, so the results do
//! not depend on the instruction set (the compiler contracts nothing into FMAs without being asked).

use crate::quant::{SimdLevel, simd_level};

/// Lanes of the sums (a multiple of every vector width used).
const LANES: usize = 16;

/// `exp(x)` for `x ≤ 0` (0 below -87, for NaN and for -∞), within 2 ulp: Cody-Waite reduction and the Cephes
/// `expf` polynomial, branch-free, 2ⁿ built from the rounding constant's bits (no float-to-int conversion).
#[inline(always)]
pub(super) fn exp_nonpos(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // Adding 1.5 × 2^23 rounds to the nearest integer n (|x log2 e| < 2^22 here), which then sits in the low bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = if x >= -87.0 { x } else { -87.0 };
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (xc - n * 0.693_359_4) + n * 2.121_944_4e-4;
    let z = r * r;
    let poly = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 0.166_666_65)
        * r
        + 0.5;
    let y = poly * z + r + 1.0;
    // n is in [-126, 0]: 2^n is a normal float.
    let n_int = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let scale = f32::from_bits(((n_int + 127) as u32) << 23);
    if x >= -87.0 { y * scale } else { 0.0 }
}

/// Lane sums added in a fixed order.
#[inline(always)]
fn total(lanes: &[f32; LANES]) -> f32 {
    lanes.iter().sum()
}

/// Defines `$name`, which runs `$body` compiled for AVX-512 or AVX2 when the CPU has them.
macro_rules! dispatch {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $body:path) => {
        $(#[$doc])*
        pub(super) fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
                unsafe fn avx512($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                match simd_level() {
                    // SAFETY: simd_level detected AVX-512 F/BW/VL on this CPU.
                    SimdLevel::Avx512 | SimdLevel::Amx => return unsafe { avx512($($arg),*) },
                    // SAFETY: simd_level detected AVX2 on this CPU.
                    SimdLevel::Avx2 => return unsafe { avx2($($arg),*) },
                    SimdLevel::Scalar => {}
                }
            }
            $body($($arg),*)
        }
    };
}

/// Floors of the ladder [`weights_and_ladder`] counts and weighs the weights at (the candidate floors of
/// top-k / top-p: a nucleus or a top-k set is usually a few tokens of weight near 1, rarely thousands).
pub(super) const LADDER: [f32; 4] = [1.0 / 16.0, 1.0 / 256.0, 1.0 / 4096.0, 1.0 / 65536.0];

/// What the weights pass found: the weights' total, how many are positive, and (with the ladder) how many lie at
/// or above each [`LADDER`] floor and what they weigh.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct WeightStats {
    pub total: f32,
    pub positive: usize,
    pub ladder_count: [usize; LADDER.len()],
    pub ladder_mass: [f32; LADDER.len()],
}

#[inline(always)]
fn weights_body<const WITH_LADDER: bool>(
    logits: &[f32],
    max: f32,
    inv_t: f32,
    min_p: f32,
    out: &mut Vec<f32>,
) -> WeightStats {
    const L: usize = LADDER.len();
    out.clear();
    out.resize(logits.len(), 0.0);
    let mut sum = [0.0f32; LANES];
    let mut count = [0u32; LANES];
    let mut lc = [[0u32; LANES]; L];
    let mut lm = [[0.0f32; LANES]; L];
    let mut one = |i: usize, l: f32, o: &mut f32| {
        let w = exp_nonpos((l - max) * inv_t);
        let w = if w >= min_p { w } else { 0.0 };
        *o = w;
        sum[i] += w;
        count[i] += u32::from(w > 0.0);
        if WITH_LADDER {
            for j in 0..L {
                let at = w >= LADDER[j];
                lc[j][i] += u32::from(at);
                lm[j][i] += if at { w } else { 0.0 };
            }
        }
    };
    let rest = logits.len() / LANES * LANES;
    for (ls, os) in logits.chunks_exact(LANES).zip(out.chunks_exact_mut(LANES)) {
        for i in 0..LANES {
            one(i, ls[i], &mut os[i]);
        }
    }
    for (i, (&l, o)) in logits[rest..].iter().zip(&mut out[rest..]).enumerate() {
        one(i, l, o);
    }
    WeightStats {
        total: total(&sum),
        positive: count.iter().map(|&c| c as usize).sum(),
        ladder_count: std::array::from_fn(|j| lc[j].iter().map(|&c| c as usize).sum()),
        ladder_mass: std::array::from_fn(|j| total(&lm[j])),
    }
}

dispatch! {
    /// Each token's weight `exp((l − max) · inv_t)`, 0 below `min_p` (and for NaN and −∞), into `out`, with their
    /// total and how many are positive (no ladder).
    fn weights(logits: &[f32], max: f32, inv_t: f32, min_p: f32, out: &mut Vec<f32>) -> WeightStats =
        weights_body::<false>
}

dispatch! {
    /// [`weights`] and the [`LADDER`] counts and masses.
    fn weights_and_ladder(logits: &[f32], max: f32, inv_t: f32, min_p: f32, out: &mut Vec<f32>) -> WeightStats =
        weights_body::<true>
}

#[inline(always)]
fn collect_at_least_body(w: &[f32], floor: f32, out: &mut Vec<f32>) {
    out.clear();
    for c in w.chunks(LANES) {
        // A vectorized test of the lanes first: most chunks hold no candidate.
        if c.iter().fold(false, |a, &x| a | (x >= floor)) {
            out.extend(c.iter().copied().filter(|&x| x >= floor));
        }
    }
}

dispatch! {
    /// The weights at or above `floor` (positive), into `out`.
    fn collect_at_least(w: &[f32], floor: f32, out: &mut Vec<f32>) -> () = collect_at_least_body
}

#[inline(always)]
fn kept_block_sums_body(w: &[f32], tau: f32, block: usize, out: &mut Vec<f32>) -> f32 {
    out.clear();
    for b in w.chunks(block) {
        let mut sum = [0.0f32; LANES];
        let (bc, br) = (b.chunks_exact(LANES), b.len() / LANES * LANES);
        for c in bc {
            for i in 0..LANES {
                sum[i] += if c[i] >= tau { c[i] } else { 0.0 };
            }
        }
        for (i, &x) in b[br..].iter().enumerate() {
            sum[i] += if x >= tau { x } else { 0.0 };
        }
        out.push(total(&sum));
    }
    out.iter().sum()
}

dispatch! {
    /// The sum of the weights at or above `tau` in each block of `block` weights, into `out`; returns their
    /// total (the blocks' sums added in order).
    fn kept_block_sums(w: &[f32], tau: f32, block: usize, out: &mut Vec<f32>) -> f32 = kept_block_sums_body
}

#[inline(always)]
fn sum_exp_body(logits: &[f32], max: f32) -> f32 {
    let mut sum = [0.0f32; LANES];
    let (lc, lr) = (logits.chunks_exact(LANES), logits.len() / LANES * LANES);
    for c in lc {
        for i in 0..LANES {
            sum[i] += exp_nonpos(c[i] - max);
        }
    }
    for (i, &l) in logits[lr..].iter().enumerate() {
        sum[i] += exp_nonpos(l - max);
    }
    total(&sum)
}

dispatch! {
    /// `Σ exp(l − max)` over the logits (NaN and −∞ count 0): the raw softmax's denominator.
    fn sum_exp(logits: &[f32], max: f32) -> f32 = sum_exp_body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_exp_is_within_two_ulp() {
        let mut x = 0.0f32;
        while x > -90.0 {
            let want = (x as f64).exp();
            let got = exp_nonpos(x) as f64;
            if x >= -87.0 {
                assert!(
                    ((got - want) / want).abs() < 2.5e-7,
                    "exp({x}) = {got}, want {want}"
                );
            } else {
                assert_eq!(got, 0.0);
            }
            x -= 0.001_37;
        }
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpos(f32::NAN), 0.0);
    }

    #[test]
    fn every_instruction_set_gives_the_same_sums() {
        let l: Vec<f32> = (0..1003).map(|i| ((i * 37) % 101) as f32 / 9.0 - 11.0).collect();
        let mut w = Vec::new();
        let st = weights_and_ladder(&l, 0.5, 1.25, 1e-3, &mut w);
        let mut w2 = Vec::new();
        assert_eq!(st, weights_body::<true>(&l, 0.5, 1.25, 1e-3, &mut w2));
        assert_eq!(w, w2);
        assert_eq!(st.positive, w.iter().filter(|&&x| x > 0.0).count());
        for (j, floor) in LADDER.iter().enumerate() {
            assert_eq!(st.ladder_count[j], w.iter().filter(|&&x| x >= *floor).count());
            let mass: f32 = w.iter().filter(|&&x| x >= *floor).sum();
            assert!((st.ladder_mass[j] - mass).abs() <= 1e-4 * mass, "{j}");
        }
        assert_eq!(weights(&l, 0.5, 1.25, 1e-3, &mut w2).total, st.total);
        let (mut s, mut s2) = (Vec::new(), Vec::new());
        assert_eq!(
            kept_block_sums(&w, 0.01, 64, &mut s),
            kept_block_sums_body(&w, 0.01, 64, &mut s2)
        );
        assert_eq!((s.len(), &s), (16, &s2));
        assert_eq!(sum_exp(&l, 0.5), sum_exp_body(&l, 0.5));
        let exact: f64 = l.iter().map(|&x| (x as f64 - 0.5).exp()).sum();
        assert!((sum_exp(&l, 0.5) as f64 - exact).abs() < 1e-5 * exact);
    }
}
