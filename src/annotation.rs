//! Reading the `kruise.io/podprobe` annotation: the protocol's types, parsing and per-probe
//! checks are the `podprobe-protocol` crate's (re-exported here); this module adds the kubelet
//! downward-API annotations file format (`downward_api`).

pub use podprobe_protocol::annotation::*;

mod downward_api;
#[cfg(test)]
mod tests;

pub use downward_api::{
    DownwardApiError, format_downward_api, go_quote, go_unquote, parse_downward_api,
    project_downward_api,
};
