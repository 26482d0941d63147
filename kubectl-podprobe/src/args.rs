//! The command line, following kubectl's plugin conventions (`kubectl podprobe ...` runs
//! `kubectl-podprobe ...` with the same global flags a user types for kubectl).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "kubectl podprobe",
    bin_name = "kubectl podprobe",
    version,
    about = "See every pod's PodProbeMarker probes, their conditions and markers, and why a marker is missing",
    long_about = "See every pod's PodProbeMarker probes, their conditions and markers, and why a \
        marker is missing.\n\nWorks with OpenKruise's kruise-manager \
        (EnablePodProbeMarkerOnServerless) and with podprobe-manager; reads pods, \
        PodProbeMarkers, nodes and events, and writes nothing."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// kubectl's own flags, as kubectl reads them.
#[derive(Debug, Args)]
pub struct Global {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context)
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace (default: the context's namespace, else "default")
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// The kubeconfig cluster to use (default: the context's)
    #[arg(long, global = true, value_name = "NAME")]
    pub cluster: Option<String>,
    /// The kubeconfig user to use (default: the context's)
    #[arg(long, global = true, value_name = "NAME")]
    pub user: Option<String>,
    /// The API server's address (default: the kubeconfig cluster's)
    #[arg(short = 's', long, global = true, value_name = "URL")]
    pub server: Option<String>,
    /// Bearer token for the API server, instead of the kubeconfig user's credentials
    #[arg(long, global = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// User to impersonate (needs `impersonate` permission, as with kubectl)
    #[arg(long = "as", global = true, value_name = "USER")]
    pub as_user: Option<String>,
    /// Group to impersonate; repeat for more
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub as_group: Vec<String>,
    /// How long to wait for each answer of the API server, e.g. 30s (default: no limit)
    #[arg(long, global = true, value_parser = parse_duration, value_name = "DURATION")]
    pub request_timeout: Option<Duration>,
    /// Name of the sidecar container podprobe-manager injects
    #[arg(long, global = true, default_value = "podprobe", value_name = "NAME")]
    pub sidecar_container: String,
    /// Label of the nodes whose pods get markers (Kruise and podprobe-manager: type=virtual-kubelet)
    #[arg(
        long,
        global = true,
        default_value = "type=virtual-kubelet",
        value_name = "KEY=VALUE"
    )]
    pub serverless_node_label: String,
    /// The sidecars' --refresh-interval: a condition not probed for twice this long is stale
    #[arg(long, global = true, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub refresh_interval: Duration,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One row per pod and probe: condition, status, message, ages, markers and warnings
    Get(GetArgs),
    /// Walk the chain from PodProbeMarker to marker for one pod and say where it breaks.
    /// Exits 0 when every link holds, 3 when one is broken, 1 on an error
    Explain(ExplainArgs),
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// Pods to show (default: every pod of the namespace that has probes or is selected)
    pub pods: Vec<String>,
    /// Every namespace
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Label selector, as kubectl's -l
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// Output format
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
    /// Leave out the header line of the table
    #[arg(long)]
    pub no_headers: bool,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The pod to explain
    pub pod: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Every column, messages and warnings in full
    Wide,
    Json,
    Yaml,
    /// `pod/NAME` once per pod with probes, for piping to kubectl
    Name,
}

/// `30s`, `10m`, `1h` (kubectl's duration flags); a bare number is seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 30s, 10m or 1h"))?;
    let seconds = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("{s:?}: the unit must be s, m or h")),
    };
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_kubectl_writes_them() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("10d").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn the_cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
