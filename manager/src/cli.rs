//! The `podprobe-manager` command line: its flags, and the offline commands built on the pure
//! core, which return text so they can be tested. [`main`] dispatches every command.

mod entry;

pub use entry::main;

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::admission::{self, Injection, Mutation};
use crate::config::{ConfigError, InjectionConfig};
use crate::crd::PodProbeMarker;
use crate::manifest::{self, ManifestError};
use crate::patch::PatchError;
use crate::validate::{ValidationErrors, validate};
use crate::{inject, markers};

#[derive(Debug, Parser)]
#[command(
    name = "podprobe-manager",
    version,
    about = "PodProbeMarker for clusters without OpenKruise: CRD, pod annotations, markers, sidecar injection"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the PodProbeMarker CustomResourceDefinition (apps.kruise.io/v1alpha1) as YAML.
    Crd,
    /// Show a pod as the pod webhook would admit it: the kruise.io/podprobe and
    /// kruise.io/podprobemarker-list annotations and, with --config, the injected sidecar.
    Render(RenderArgs),
    /// Show the label/annotation patch the markers controller would send for the pod's current
    /// conditions (status.conditions in the pod file).
    CheckMarkers(CheckMarkersArgs),
    /// Run the manager: the HTTPS admission webhooks (pod annotations and sidecar injection,
    /// PodProbeMarker validation) on every replica, and in standalone mode the markers,
    /// annotation-propagation and status controllers on the replica holding the leader Lease.
    /// Uses the in-cluster service account, or KUBECONFIG. Stops gracefully on SIGTERM.
    Run(Box<crate::run::RunArgs>),
    /// Wait until the apiserver reaches the PodProbeMarker webhook (a server-side dry-run
    /// create, which stores nothing): what the chart's install check Job runs after `helm
    /// install` and `helm upgrade`, so they return only once PodProbeMarkers and pods are
    /// admitted. Exits 0 once answered, 1 on --timeout with the last refusal.
    CheckWebhooks(crate::check::CheckWebhooksArgs),
    /// Issue the sidecar token of every pod still held by the podprobe.io/sidecar-token
    /// scheduling gate and release it, as the running manager's issuer does, then exit: what
    /// the chart's hook runs before `helm uninstall` and before a `helm upgrade` that turns
    /// injection off, so that no pod waits for an issuer that is going away; also for an
    /// operator whose manager replicas cannot run. A refused token is asked again until 30 s
    /// after the pod's creation, then the pod is released without it, with a Warning Event.
    /// Exits 0 once no pod waits (or when the account may not list pods: it has no injection
    /// grants, so it gated none), 1 on --timeout naming the pods still waiting.
    /// Uses the in-cluster service account (the manager's: it needs the manager's RBAC), or
    /// KUBECONFIG.
    ReleaseGates(ReleaseGatesArgs),
}

#[derive(Debug, clap::Args)]
pub struct ReleaseGatesArgs {
    /// Give up after this long (e.g. 2m).
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub timeout: std::time::Duration,
    /// The lifetime of the tokens issued (the injection config's `sidecarTokenLifetime`, which
    /// the chart passes; the sidecars renew them at 80 % of it, or daily). From 10m to 8760h.
    #[arg(long, default_value = "8760h", value_parser = sidecar_token_lifetime)]
    pub sidecar_token_lifetime: std::time::Duration,
}

fn sidecar_token_lifetime(text: &str) -> Result<std::time::Duration, String> {
    let lifetime = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    let (least, most) = (600, 365 * 24 * 3600);
    if (least..=most).contains(&lifetime.as_secs()) {
        Ok(lifetime)
    } else {
        Err(format!("{text} is not between 10m and 8760h"))
    }
}

#[derive(Debug, clap::Args)]
pub struct InputArgs {
    /// File with one or more PodProbeMarkers (multi-document YAML or a `kind: List`); repeat
    /// the flag for several files. Markers in another namespace than the pod's are ignored.
    #[arg(long = "marker", short = 'm', value_name = "FILE", required = true)]
    pub markers: Vec<PathBuf>,
    /// File with exactly one Pod (YAML or JSON).
    #[arg(long, short = 'p', value_name = "FILE")]
    pub pod: PathBuf,
    /// Output format.
    #[arg(long = "output", short = 'o', value_enum, default_value_t = Output::Yaml)]
    pub output: Output,
}

#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Sidecar injection config (YAML); without it no sidecar is injected.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A label of the pod's namespace, KEY=VALUE, for the injection opt-in; repeatable.
    #[arg(long = "namespace-label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub namespace_labels: Vec<(String, String)>,
    /// Assume the cluster runs native sidecars (Kubernetes >= 1.29) when the config says
    /// `nativeSidecar: auto`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub native_sidecars: bool,
    /// The webhook's mode: `standalone` writes the `kruise.io/podprobe` annotations itself;
    /// `companion` leaves them to OpenKruise's webhook and tells the sidecar to probe only on
    /// `type=virtual-kubelet` nodes (kruise-daemon probes pods on the others).
    #[arg(long, value_enum, default_value_t = RenderMode::Standalone)]
    pub mode: RenderMode,
}

/// `render --mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RenderMode {
    Standalone,
    Companion,
}

#[derive(Debug, clap::Args)]
pub struct CheckMarkersArgs {
    #[command(flatten)]
    pub input: InputArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Yaml,
    Json,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{path}: PodProbeMarker {name}: {errors}")]
    Invalid {
        path: String,
        name: String,
        errors: ValidationErrors,
    },
    #[error("internal error: {0}")]
    Patch(#[from] PatchError),
    #[error("internal error: cannot serialize output: {0}")]
    Output(String),
}

impl CliError {
    /// 2 for input the user can fix, 1 for bugs.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Patch(_) | CliError::Output(_) => 1,
            _ => 2,
        }
    }
}

/// What a command printed: `stdout` is the result, `notes` go to stderr.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Printed {
    pub stdout: String,
    pub notes: Vec<String>,
}

pub fn run(command: &Command) -> Result<Printed, CliError> {
    match command {
        Command::Crd => Ok(Printed {
            stdout: format(&crate::crd::crd(), Output::Yaml)?,
            notes: vec![],
        }),
        Command::Render(args) => render(args),
        Command::CheckMarkers(args) => check_markers(args),
        // Long-running and asynchronous: [`main`] runs them.
        Command::Run(_) => Err(CliError::Output("`run` is not an offline command".into())),
        Command::CheckWebhooks(_) => Err(CliError::Output(
            "`check-webhooks` is not an offline command".into(),
        )),
        Command::ReleaseGates(_) => Err(CliError::Output(
            "`release-gates` is not an offline command".into(),
        )),
    }
}

fn format<T: Serialize>(value: &T, output: Output) -> Result<String, CliError> {
    match output {
        Output::Yaml => serde_saphyr::to_string(value).map_err(|e| CliError::Output(e.to_string())),
        Output::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| CliError::Output(e.to_string())),
    }
}

/// The pod and the validated markers of its namespace.
fn load(input: &InputArgs) -> Result<(Pod, Vec<PodProbeMarker>), CliError> {
    let pod = manifest::load_pod(&input.pod)?;
    let pod_ns = pod.metadata.namespace.as_deref();
    let mut ppms = Vec::new();
    for path in &input.markers {
        for ppm in manifest::load_markers(path)? {
            validate(&ppm, None).map_err(|errors| CliError::Invalid {
                path: path.display().to_string(),
                name: ppm.metadata.name.clone().unwrap_or_default(),
                errors,
            })?;
            let ppm_ns = ppm.metadata.namespace.as_deref();
            if pod_ns.is_none() || ppm_ns.is_none() || pod_ns == ppm_ns {
                ppms.push(ppm);
            }
        }
    }
    Ok((pod, ppms))
}

fn render(args: &RenderArgs) -> Result<Printed, CliError> {
    let config = args
        .config
        .as_deref()
        .map(InjectionConfig::from_file)
        .transpose()?;
    let (pod, ppms) = load(&args.input)?;
    let namespace_labels: BTreeMap<String, String> =
        args.namespace_labels.iter().cloned().collect();
    let injection = config.as_ref().map(|config| Injection {
        config,
        namespace_labels: Some(&namespace_labels),
        native_sidecars_supported: args.native_sidecars,
        // No admission request: the token Secret (virtual-node shape) gets a fixed name.
        request_uid: "",
        companion: args.mode == RenderMode::Companion,
        // Offline: the shape is read from the pod alone, and no replica issues.
        virtual_nodes: &[],
        issuer: "",
    });
    // As the webhook (in companion mode OpenKruise writes the annotations).
    let standalone = args.mode == RenderMode::Standalone;
    let mutation = admission::mutate(&pod, &ppms, standalone, injection);
    let mut notes = Vec::new();
    if mutation.annotations.is_none() {
        notes.push("no probe accepted (no matching marker, podConditionType or container): annotations left unchanged".into());
    }
    if let Some(config) = &config {
        notes.extend(injection_notes(&pod, config, &mutation, standalone));
    }
    notes.extend(mutation.warnings);
    let ops = mutation.ops;
    let mut doc = serde_json::to_value(&pod).map_err(|e| CliError::Output(e.to_string()))?;
    crate::patch::apply(&mut doc, &ops)?;
    Ok(Printed {
        stdout: format(&doc, args.input.output)?,
        notes,
    })
}

/// What `render` says of the sidecar's injection into `pod`: whether and in which shape, and
/// where each probed container's exec probes run.
fn injection_notes(
    pod: &Pod,
    config: &InjectionConfig,
    mutation: &Mutation,
    standalone: bool,
) -> Vec<String> {
    let (true, Some(spec)) = (mutation.injected, &pod.spec) else {
        return vec![format!(
            "sidecar not injected: the pod is not opted in (label {}=enabled on the pod or, via --namespace-label, its namespace) or already has container {:?}",
            config.inject_label, config.container_name
        )];
    };
    let shape = inject::shape::of(spec, config, &[]);
    let probes = mutation
        .annotations
        .as_ref()
        .map(|a| admission::probes(&a.probes))
        .unwrap_or_default();
    let exec_containers = admission::exec_containers(&probes);
    let virtual_node = shape == inject::shape::Shape::VirtualNode;
    let agent = inject::agent::plan(pod, config, &exec_containers, virtual_node);
    let executor = if standalone {
        ""
    } else {
        "; companion mode: it probes only if the pod's node is labelled type=virtual-kubelet, and stands down on other nodes, where OpenKruise's kruise-daemon probes the pod"
    };
    let injected = format!(
        "sidecar injected in the {} shape ({}){executor}",
        shape.as_str(),
        inject::shape::explain(spec, config, &[])
    );
    std::iter::once(injected)
        .chain(agent.decisions.iter().map(|d| d.note()))
        .collect()
}

fn check_markers(args: &CheckMarkersArgs) -> Result<Printed, CliError> {
    let (pod, ppms) = load(&args.input)?;
    const NO_CHANGES: &str =
        "no changes: the pod's labels and annotations already match its probe conditions";
    Ok(match markers::marker_patch(&pod, &ppms) {
        Some(patch) => Printed {
            stdout: format(&patch, args.input.output)?,
            notes: vec![],
        },
        None => match args.input.output {
            // A comment is a valid (empty) YAML document, so scripts can still parse stdout.
            Output::Yaml => Printed {
                stdout: format!("# {NO_CHANGES}\n"),
                notes: vec![],
            },
            Output::Json => Printed {
                stdout: "null\n".into(),
                notes: vec![NO_CHANGES.into()],
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    const PPM: &str = r#"
apiVersion: apps.kruise.io/v1alpha1
kind: PodProbeMarker
metadata: {name: ppm-test, namespace: test}
spec:
  selector: {matchLabels: {app: test}}
  probes:
  - name: healthy
    containerName: main
    probe:
      exec: {command: ["/bin/sh", "-c", "/healthy.sh"]}
      initialDelaySeconds: 10
      timeoutSeconds: 3
      periodSeconds: 10
      successThreshold: 1
      failureThreshold: 3
    podConditionType: game.kruise.io/healthy
    markerPolicy:
    - {state: Succeeded, labels: {server-healthy: "true"}}
    - {state: Failed, labels: {server-healthy: "false"}}
"#;

    const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: test, labels: {app: test, server-healthy: "true"}, annotations: {keep: me}}
spec:
  containers: [{name: main, image: busybox}]
status:
  conditions: [{type: game.kruise.io/healthy, status: "False"}]
"#;

    fn parse(args: &[&str]) -> Command {
        Cli::try_parse_from(std::iter::once("podprobe-manager").chain(args.iter().copied()))
            .unwrap()
            .command
    }

    #[test]
    fn crd_prints_yaml() {
        let out = run(&parse(&["crd"])).unwrap().stdout;
        assert!(
            out.contains("name: podprobemarkers.apps.kruise.io"),
            "{out}"
        );
        assert!(out.contains("x-kubernetes-int-or-string: true"));
    }

    #[test]
    fn render_writes_tv03_annotation_and_injects_on_request() {
        let (ppm, pod) = (file(PPM), file(POD));
        let (m, p) = (ppm.path().to_str().unwrap(), pod.path().to_str().unwrap());
        let out = run(&parse(&["render", "--marker", m, "--pod", p, "-o", "json"])).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let annotations = &doc["metadata"]["annotations"];
        assert_eq!(annotations["keep"], "me");
        assert_eq!(annotations["kruise.io/podprobemarker-list"], "ppm-test");
        assert_eq!(
            annotations["kruise.io/podprobe"],
            r#"[{"name":"healthy","containerName":"main","probe":{"exec":{"command":["/bin/sh","-c","/healthy.sh"]},"initialDelaySeconds":10,"timeoutSeconds":3,"periodSeconds":10,"successThreshold":1,"failureThreshold":3},"podConditionType":"game.kruise.io/healthy"}]"#
        );
        assert!(doc["spec"].get("initContainers").is_none());

        let cfg = file("image: podprobe:dev\nreadinessGates: ['*']\n");
        let c = cfg.path().to_str().unwrap();
        let args = [
            "render",
            "-m",
            m,
            "-p",
            p,
            "--config",
            c,
            "--namespace-label",
            "podprobe.io/inject=enabled",
        ];
        let out = run(&parse(&args)).unwrap();
        let pod: Pod = serde_saphyr::from_str(&out.stdout).unwrap();
        let spec = pod.spec.unwrap();
        let inits = spec.init_containers.unwrap();
        let names: Vec<_> = inits.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["podprobe-agent-install", "podprobe"]);
        assert_eq!(
            spec.readiness_gates.unwrap()[0].condition_type,
            "game.kruise.io/healthy"
        );
        assert_eq!(out.notes.len(), 2, "{:?}", out.notes);
        assert!(
            out.notes[0].starts_with("sidecar injected in the kubelet shape"),
            "{:?}",
            out.notes
        );
        // The test pod's container has no command: the agent starts beside its entrypoint.
        assert!(
            out.notes[1].contains("\"main\"") && out.notes[1].contains("postStart hook"),
            "{:?}",
            out.notes
        );

        assert!(!out.notes[0].contains("kruise-daemon"), "{:?}", out.notes);

        let companion: Vec<&str> = args
            .iter()
            .copied()
            .chain(["--mode", "companion"])
            .collect();
        let out = run(&parse(&companion)).unwrap();
        let pod: serde_json::Value = serde_saphyr::from_str(&out.stdout).unwrap();
        assert!(
            pod["metadata"]["annotations"]
                .get("kruise.io/podprobe")
                .is_none(),
            "OpenKruise writes the annotations in companion mode"
        );
        assert!(
            out.notes[0].contains("stands down on other nodes, where OpenKruise's kruise-daemon"),
            "{:?}",
            out.notes
        );

        let out = run(&parse(&["render", "-m", m, "-p", p, "--config", c])).unwrap();
        assert!(out.notes[0].contains("not injected"), "{:?}", out.notes);
    }

    #[test]
    fn check_markers_prints_removal_patch_or_no_changes() {
        let (ppm, pod) = (file(PPM), file(POD));
        let (m, p) = (ppm.path().to_str().unwrap(), pod.path().to_str().unwrap());
        let out = run(&parse(&["check-markers", "-m", m, "-p", p, "-o", "json"])).unwrap();
        let patch: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(
            patch,
            serde_json::json!({"metadata": {"labels": {"server-healthy": "false"}}})
        );
        let marked = file(&POD.replace(r#"server-healthy: "true""#, r#"server-healthy: "false""#));
        let out = run(&parse(&[
            "check-markers",
            "-m",
            m,
            "-p",
            marked.path().to_str().unwrap(),
        ]))
        .unwrap();
        assert!(out.stdout.starts_with("# no changes"), "{}", out.stdout);
    }

    #[test]
    fn markers_of_other_namespaces_are_ignored() {
        let ppm = file(&PPM.replace("namespace: test", "namespace: other"));
        let pod = file(POD);
        let args = [
            "check-markers",
            "-m",
            ppm.path().to_str().unwrap(),
            "-p",
            pod.path().to_str().unwrap(),
        ];
        assert!(
            run(&parse(&args))
                .unwrap()
                .stdout
                .starts_with("# no changes")
        );
    }

    #[test]
    fn bad_input_is_exit_2_with_file_and_field() {
        let ppm = file(
            &PPM.replace("port", "x")
                .replace("containerName: main", "containerName: main\n    probe2: 1")
                .replace(
                    "exec: {command: [\"/bin/sh\", \"-c\", \"/healthy.sh\"]}",
                    "httpGet: {path: /, port: 70000, scheme: HTTP}",
                ),
        );
        let pod = file(POD);
        let path = ppm.path().to_str().unwrap().to_owned();
        let args = ["render", "-m", &path, "-p", pod.path().to_str().unwrap()];
        let err = run(&parse(&args)).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let msg = err.to_string();
        assert!(msg.starts_with(&path), "{msg}");
        assert!(msg.contains("spec.probes[0].probe.httpGet.port"), "{msg}");

        let missing = [
            "render",
            "-m",
            "/nonexistent.yaml",
            "-p",
            "/nonexistent-pod.yaml",
        ];
        let err = run(&parse(&missing)).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("/nonexistent-pod.yaml"), "{err}");
    }

    #[test]
    fn help_documents_every_flag() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        for sub in ["render", "check-markers"] {
            let sub = cmd.find_subcommand_mut(sub).unwrap();
            for arg in sub.get_arguments() {
                if arg.get_id() != "help" {
                    assert!(arg.get_help().is_some(), "{} lacks help", arg.get_id());
                }
            }
        }
    }
}
