//! Percentiles of sorted samples.

/// The `p`-th percentile (nearest rank) of `sorted`, 0 when empty.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median, p99 and max of `samples` (sorted here).
pub fn summary(samples: &mut [u64]) -> (u64, u64, u64) {
    samples.sort_unstable();
    (
        percentile(samples, 50.0),
        percentile(samples, 99.0),
        samples.last().copied().unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&[7u64], 99.0), 7);
    }
}
