//! The resource types testkit serves, and what each one's rules are.

/// One served resource type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceDef {
    /// API group, `""` for core.
    pub group: &'static str,
    /// Version, e.g. `v1`.
    pub version: &'static str,
    /// Kind, e.g. `Pod`.
    pub kind: &'static str,
    /// Plural resource name, e.g. `pods`.
    pub plural: &'static str,
    /// Singular name for discovery.
    pub singular: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Has a `status` subresource (status is kept apart from the main endpoint).
    pub status_subresource: bool,
    /// Custom resource: strategic merge patch is refused (415) like for CRDs.
    pub custom: bool,
    /// `metadata.generation` is set and bumped on spec changes.
    pub generation: bool,
    /// Short names (discovery).
    pub short_names: &'static [&'static str],
}

impl ResourceDef {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Is this the core pod resource?
    pub fn is_pod(&self) -> bool {
        self.group.is_empty() && self.plural == "pods"
    }
}

const fn def(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    status_subresource: bool,
) -> ResourceDef {
    ResourceDef {
        group,
        version,
        kind,
        plural,
        singular,
        namespaced,
        status_subresource,
        custom: false,
        generation: false,
        short_names: &[],
    }
}

/// Every resource testkit serves.
pub const RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        generation: true,
        short_names: &["po"],
        ..def("", "v1", "Pod", "pods", "pod", true, true)
    },
    ResourceDef {
        short_names: &["no"],
        ..def("", "v1", "Node", "nodes", "node", false, true)
    },
    ResourceDef {
        short_names: &["ns"],
        ..def(
            "",
            "v1",
            "Namespace",
            "namespaces",
            "namespace",
            false,
            true,
        )
    },
    ResourceDef {
        short_names: &["ev"],
        ..def("", "v1", "Event", "events", "event", true, false)
    },
    ResourceDef {
        short_names: &["ev"],
        ..def(
            "events.k8s.io",
            "v1",
            "Event",
            "events",
            "event",
            true,
            false,
        )
    },
    def(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        "lease",
        true,
        false,
    ),
    ResourceDef {
        custom: true,
        generation: true,
        short_names: &["ppm"],
        ..def(
            "apps.kruise.io",
            "v1alpha1",
            "PodProbeMarker",
            "podprobemarkers",
            "podprobemarker",
            true,
            true,
        )
    },
];

/// The API groups (other than core) in discovery order.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.iter().any(|(g, _)| *g == r.group) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// Find a resource by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Find a resource by `apiVersion` and `kind`.
pub fn find_kind(api_version: &str, kind: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// The resource whose objects share storage with `r`: core/v1 events and
/// events.k8s.io/v1 events are two views of one store in the real server;
/// testkit keeps them apart (documented), so this is `r` itself.
pub fn storage_key(r: &ResourceDef) -> String {
    format!("{}/{}", r.group, r.plural)
}

/// The resource part of an etcd key: `pods`, or `group/plural` for custom
/// resources.
pub fn qualified_plural(r: &ResourceDef) -> String {
    if r.custom {
        format!("{}/{}", r.group, r.plural)
    } else {
        r.plural.to_string()
    }
}
