//! Medians and ranges of repeated measurements: what every bench reports (never single runs).

/// The `q` quantile of `v` (nearest rank; sorts `v`); NaN when empty.
pub(super) fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// (median, min, max) of `v` (sorts `v`); NaN and infinities when empty.
pub(super) fn median_range(v: &mut [f64]) -> (f64, f64, f64) {
    let med = pct(v, 0.5);
    let (lo, hi) = v
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
    (med, lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_ranges() {
        let mut v = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(pct(&mut v, 0.5), 3.0);
        assert_eq!(pct(&mut v, 0.95), 5.0);
        assert_eq!(pct(&mut v, 0.0), 1.0);
        assert_eq!(median_range(&mut v), (3.0, 1.0, 5.0));
        assert!(pct(&mut [], 0.5).is_nan());
    }
}
