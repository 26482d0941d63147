//! The sidecar's pod's `metadata.resourceVersion`, and how two of them are ordered: read by the
//! pod watch and the condition writer alike, so a module below both.
//!
//! The API calls resourceVersions opaque: a client may only compare them for equality. Every
//! etcd-backed apiserver gives the object's etcd revision, a decimal integer that grows with
//! each write, so where both versions are such integers podprobe orders them; where either is
//! not, it does not guess, and its callers fall back to rules that need no order.

use std::cmp::Ordering;

/// One `metadata.resourceVersion`, as the apiserver gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceVersion(String);

impl ResourceVersion {
    pub fn new(version: impl Into<String>) -> Self {
        ResourceVersion(version.into())
    }

    /// How this version stands against `other`: `None` when either is not a decimal integer
    /// (an apiserver not backed by etcd), so not to be ordered.
    ///
    /// Not `PartialOrd`: two equal opaque versions have no order here, which `PartialOrd`
    /// would have to give them to agree with `Eq`.
    pub fn order(&self, other: &ResourceVersion) -> Option<Ordering> {
        let (Ok(this), Ok(other)) = (self.0.parse::<u64>(), other.0.parse::<u64>()) else {
            return None;
        };
        Some(this.cmp(&other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rv(version: &str) -> ResourceVersion {
        ResourceVersion::new(version)
    }

    #[test]
    fn etcd_revisions_are_ordered_as_numbers_not_as_text() {
        assert_eq!(rv("9").order(&rv("10")), Some(Ordering::Less));
        assert_eq!(rv("10").order(&rv("9")), Some(Ordering::Greater));
        assert_eq!(rv("42").order(&rv("42")), Some(Ordering::Equal));
    }

    #[test]
    fn opaque_versions_have_no_order() {
        assert_eq!(rv("a1").order(&rv("10")), None);
        assert_eq!(rv("10").order(&rv("")), None);
        assert_eq!(rv("x").order(&rv("x")), None, "equal, yet not ordered");
        assert_eq!(rv("-1").order(&rv("1")), None);
    }
}
