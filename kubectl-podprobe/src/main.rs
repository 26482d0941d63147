//! The `kubectl-podprobe` binary: parse, connect, read, print.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use kubectl_podprobe::args::{Cli, Command, Global};
use kubectl_podprobe::facts::{Cluster, Events, FactsError};
use kubectl_podprobe::inspect::{self, Settings};
use kubectl_podprobe::{explain, get, render};

/// `explain`'s exit code when a link of the chain is broken (errors exit 1), so scripts and
/// CI checks can tell "the pod's markers are not working" from "could not look".
const BROKEN_LINK: u8 = 3;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            // An apiserver's message can quote what a pod or webhook wrote.
            let message = e.to_string();
            eprintln!("error: {}", render::terminal_safe(&message));
            ExitCode::from(1)
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Facts(#[from] FactsError),
    #[error("--serverless-node-label must be KEY=VALUE, not {0:?}")]
    NodeLabel(String),
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
}

fn settings(global: &Global) -> Result<Settings, Error> {
    let (key, value) = global
        .serverless_node_label
        .split_once('=')
        .ok_or_else(|| Error::NodeLabel(global.serverless_node_label.clone()))?;
    Ok(Settings {
        sidecar_container: global.sidecar_container.clone(),
        serverless_label: (key.to_owned(), value.to_owned()),
        refresh_interval: global.refresh_interval,
        now: jiff::Timestamp::now(),
    })
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    let settings = settings(&cli.global)?;
    let cluster = Cluster::connect(&cli.global).await?;
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Get(args) => {
            let pods = if args.pods.is_empty() {
                cluster
                    .pods(args.all_namespaces, args.selector.as_deref())
                    .await?
            } else {
                let mut pods = Vec::new();
                for name in &args.pods {
                    pods.push(cluster.pod(name).await?);
                }
                pods
            };
            let facts = cluster.facts(pods, Events::Skip).await?;
            warn_unread(&facts);
            let rows: Vec<get::ProbeRow> =
                facts.iter().flat_map(|f| get::rows(f, &settings)).collect();
            if rows.is_empty() && args.output.is_none() {
                eprintln!("No pods with PodProbeMarker probes found.");
            } else {
                render::rows(
                    &mut out,
                    &rows,
                    args.output,
                    args.all_namespaces,
                    !args.no_headers,
                )?;
            }
        }
        Command::Explain(args) => {
            let pod = cluster.pod(&args.pod).await?;
            let facts = cluster.facts(vec![pod], Events::Read).await?;
            warn_unread(&facts);
            let facts = &facts[0];
            let links = explain::chain(facts, &settings);
            let events = explain::event_lines(facts, &settings);
            render::explain(&mut out, &inspect::pod_name(&facts.pod), &links, &events)?;
            out.flush()?;
            if links.iter().any(|l| !l.ok) {
                return Ok(ExitCode::from(BROKEN_LINK));
            }
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// One warning per distinct read the credentials were refused (403): what was skipped.
fn warn_unread(facts: &[kubectl_podprobe::facts::PodFacts]) {
    let notes: std::collections::BTreeSet<String> =
        facts.iter().flat_map(|f| f.unread.notes()).collect();
    for note in notes {
        eprintln!("warning: {note}");
    }
}
