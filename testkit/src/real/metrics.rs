//! Reading kube-apiserver's own Prometheus metrics: request counts and latency histograms by
//! verb, resource and subresource, as a test or benchmark needs them (deltas between two
//! scrapes, quantiles the way Prometheus' `histogram_quantile` estimates them).

use std::collections::BTreeMap;

/// `(verb, resource, subresource)` → requests, summed over codes and other labels.
pub type RequestCounts = BTreeMap<(String, String, String), u64>;

/// The labels of one sample line `name{a="x",b="y"} value`, and its value.
fn sample<'a>(line: &'a str, name: &str) -> Option<(BTreeMap<&'a str, &'a str>, f64)> {
    let rest = line.strip_prefix(name)?.strip_prefix('{')?;
    let (labels, value) = rest.rsplit_once("} ")?;
    let mut map = BTreeMap::new();
    for pair in labels.split("\",") {
        let (key, value) = pair.split_once("=\"")?;
        map.insert(key, value.trim_end_matches('"'));
    }
    Some((map, value.trim().parse().ok()?))
}

/// Every `apiserver_request_total` sample for a resource, by verb/resource/subresource.
pub fn request_counts(metrics: &str) -> RequestCounts {
    let mut counts = RequestCounts::new();
    for line in metrics.lines() {
        let Some((labels, value)) = sample(line, "apiserver_request_total") else {
            continue;
        };
        let resource = labels.get("resource").copied().unwrap_or_default();
        if resource.is_empty() {
            continue; // /metrics, /readyz, discovery: not requests about objects
        }
        let key = (
            labels.get("verb").copied().unwrap_or_default().to_owned(),
            resource.to_owned(),
            labels
                .get("subresource")
                .copied()
                .unwrap_or_default()
                .to_owned(),
        );
        *counts.entry(key).or_default() += value as u64;
    }
    counts
}

/// What `after` counted beyond `before` (entries that did not move are left out).
pub fn request_delta(before: &RequestCounts, after: &RequestCounts) -> RequestCounts {
    after
        .iter()
        .filter_map(|(key, n)| {
            let d = n.saturating_sub(before.get(key).copied().unwrap_or(0));
            (d > 0).then(|| (key.clone(), d))
        })
        .collect()
}

/// The sum of the samples of gauge or counter `name` whose labels include `labels` (a label
/// absent from a sample counts as `""`): e.g. `apiserver_longrunning_requests` of pod watches.
pub fn sum(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .lines()
        .filter_map(|line| {
            if let Some(rest) = line.strip_prefix(name)
                && let Some(value) = rest.strip_prefix(' ')
            {
                return labels.is_empty().then(|| value.trim().parse().ok())?;
            }
            let (found, value) = sample(line, name)?;
            labels
                .iter()
                .all(|(k, v)| found.get(k).copied().unwrap_or_default() == *v)
                .then_some(value)
        })
        .sum()
}

/// The cumulative buckets (`le`, count) of `apiserver_request_duration_seconds` for one
/// verb/resource/subresource.
pub fn duration_buckets(
    metrics: &str,
    verb: &str,
    resource: &str,
    subresource: &str,
) -> Vec<(f64, u64)> {
    histogram_buckets(
        metrics,
        "apiserver_request_duration_seconds",
        &[
            ("verb", verb),
            ("resource", resource),
            ("subresource", subresource),
        ],
    )
}

/// The cumulative buckets (`le`, count) of histogram `name`, summed over the samples whose
/// labels include `labels` (a label absent from a sample counts as `""`).
pub fn histogram_buckets(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, u64)> {
    let bucket = format!("{name}_bucket");
    let mut buckets: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
    for line in metrics.lines() {
        let Some((found, value)) = sample(line, &bucket) else {
            continue;
        };
        if !labels
            .iter()
            .all(|(k, v)| found.get(k).copied().unwrap_or_default() == *v)
        {
            continue;
        }
        let le = match found.get("le") {
            Some(&"+Inf") => f64::INFINITY,
            Some(v) => v.parse().unwrap_or(f64::INFINITY),
            None => continue,
        };
        let entry = buckets.entry(le.to_bits()).or_insert((le, 0));
        entry.1 += value as u64;
    }
    let mut out: Vec<(f64, u64)> = buckets.into_values().collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// `after - before`, bucket by bucket.
pub fn bucket_delta(before: &[(f64, u64)], after: &[(f64, u64)]) -> Vec<(f64, u64)> {
    after
        .iter()
        .map(|(le, n)| {
            let old = before.iter().find(|(l, _)| l == le).map_or(0, |(_, n)| *n);
            (*le, n.saturating_sub(old))
        })
        .collect()
}

/// The `q` quantile (0..1) of cumulative buckets, interpolated linearly inside the bucket as
/// Prometheus does; `None` without observations.
pub fn quantile(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut lower = (0.0, 0u64);
    for &(le, count) in buckets {
        if count as f64 >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let inside = (count - lower.1) as f64;
            let fraction = if inside == 0.0 {
                1.0
            } else {
                (rank - lower.1 as f64) / inside
            };
            return Some(lower.0 + (le - lower.0) * fraction);
        }
        lower = (le, count);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = r#"apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 3
apiserver_request_total{code="422",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 9
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1",le="0.005"} 1
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1",le="0.01"} 3
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1",le="+Inf"} 4
"#;

    #[test]
    fn counts_sum_codes_and_skip_non_resource_requests() {
        let counts = request_counts(SCRAPE);
        let key = ("PATCH".to_owned(), "pods".to_owned(), "status".to_owned());
        assert_eq!(counts.get(&key), Some(&4));
        assert_eq!(counts.len(), 1);
        assert!(request_delta(&counts, &counts).is_empty());
    }

    #[test]
    fn sums_select_by_label_and_read_unlabelled_samples() {
        let text = "w{kind=\"Pod\",group=\"\"} 3\nw{kind=\"Pod\",group=\"x\"} 4\nw{kind=\"Node\"} 5\nsize 7\n";
        assert_eq!(sum(text, "w", &[("kind", "Pod")]), 7.0);
        assert_eq!(sum(text, "w", &[("kind", "Pod"), ("group", "")]), 3.0);
        assert_eq!(sum(text, "size", &[]), 7.0);
        assert_eq!(sum(text, "missing", &[]), 0.0);
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let buckets = duration_buckets(SCRAPE, "PATCH", "pods", "status");
        assert_eq!(buckets.len(), 3);
        assert_eq!(quantile(&buckets, 0.25), Some(0.005));
        // rank 2 of 4: halfway through the (0.005, 0.01] bucket, which holds 2.
        let median = quantile(&buckets, 0.5).unwrap();
        assert!((median - 0.0075).abs() < 1e-9, "{median}");
        assert_eq!(quantile(&buckets, 1.0), Some(0.01));
        assert_eq!(quantile(&bucket_delta(&buckets, &buckets), 0.5), None);
    }
}
