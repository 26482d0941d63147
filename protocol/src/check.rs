//! One check of a probe's handler for every reader of one: podprobe-manager's PodProbeMarker
//! webhook, the sidecar and the kubectl plugin. It returns apimachinery field errors naming the
//! field, and, when there are none, the [`Handler`] an attempt runs.
//!
//! OpenKruise's webhook and its runtime read three things differently; [`Strictness`] picks
//! which reading applies (pinned by `tests::the_three_readings_that_differ`):
//!
//! | written | Kruise's webhook (and the apiserver's own validation) | kruise-daemon at run time | the kubelet |
//! |---|---|---|---|
//! | no `httpGet.scheme` | Unsupported value | HTTP | HTTP |
//! | no `httpGet.path` | Required value | `/` | `/` |
//! | port `"8080"` (a string) | a port name needs a letter | port 8080 (`util.ExtractPort`) | a name it never finds |
//!
//! The runtime reading follows kruise-daemon, not the kubelet, on the string port: kruise-daemon
//! is what runs PodProbeMarker probes elsewhere, and a probe it runs must run here too.

use std::fmt::Display;

use k8s_openapi::api::core::v1::{
    ContainerPort, ExecAction as ExecSpec, GRPCAction, HTTPGetAction, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::field::{ErrorKind, FieldError, err, invalid, quoted};
use crate::handler::{ExecAction, GrpcAction, Handler, HttpAction, Port, Scheme, TcpAction};
use crate::rules::{
    HEADER_NAME_RULE, PortViolation, is_header_name, port_name_violations, port_number_violation,
    url_violation,
};

/// Which reading of a probe applies where Kruise's webhook and runtime differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    /// What OpenKruise's PodProbeMarker webhook admits: podprobe-manager's webhook, so that a
    /// PodProbeMarker it admits is one kruise-manager would admit.
    Admission,
    /// What kruise-daemon runs: the sidecar and the kubectl plugin, so that a probe that
    /// reached a pod's annotation (written by kruise-manager, an older webhook or by hand) runs
    /// as it would on an ordinary node.
    Runtime,
}

type Checked<T> = Result<T, Vec<FieldError>>;

/// Checks the handler of `probe`, whose field path is `path` (`probe`, or
/// `spec.probes[0].probe`). `ports`: the target container's declared ports when the pod is
/// known; a port name must then be one of them (a pod's ports never change, so a probe naming
/// another could never run).
pub fn check_handler(
    probe: &Probe,
    path: &str,
    strictness: Strictness,
    ports: Option<&[ContainerPort]>,
) -> Checked<Handler> {
    let mut errors = Vec::new();
    let mut handler = None;
    let mut found = 0;
    // As Kruise's webhook: the first handler is checked, every further one is Forbidden.
    let mut one = |name: &str, check: &dyn Fn(&str) -> Checked<Handler>| {
        let at = format!("{path}.{name}");
        found += 1;
        if found > 1 {
            errors.push(err(
                &at,
                ErrorKind::Forbidden,
                None,
                "may not specify more than 1 handler type",
            ));
            return;
        }
        match check(&at) {
            Ok(checked) => handler = Some(checked),
            Err(e) => errors.extend(e),
        }
    };
    if let Some(exec) = &probe.exec {
        one("exec", &|at| check_exec(exec, at));
    }
    if let Some(http) = &probe.http_get {
        one("httpGet", &|at| check_http_get(http, at, strictness, ports));
    }
    if let Some(tcp) = &probe.tcp_socket {
        one("tcpSocket", &|at| {
            check_tcp_socket(tcp, at, strictness, ports)
        });
    }
    if let Some(grpc) = &probe.grpc {
        one("grpc", &|at| check_grpc(grpc, at));
    }
    if found == 0 {
        errors.push(err(
            path,
            ErrorKind::Required,
            None,
            "must specify a handler type",
        ));
    }
    match handler {
        Some(handler) if errors.is_empty() => Ok(handler),
        _ => Err(errors),
    }
}

fn check_exec(exec: &ExecSpec, path: &str) -> Checked<Handler> {
    match exec.command.as_ref().filter(|c| !c.is_empty()) {
        Some(command) => Ok(Handler::Exec(ExecAction {
            command: command.clone(),
        })),
        None => Err(vec![err(
            &format!("{path}.command"),
            ErrorKind::Required,
            None,
            "",
        )]),
    }
}

fn forbid_host(host: Option<&str>, path: &str) -> Option<FieldError> {
    host.filter(|h| !h.is_empty()).map(|_| {
        err(
            &format!("{path}.host"),
            ErrorKind::Forbidden,
            None,
            "probes always target the pod IP; a host would let a probe reach other endpoints (SSRF)",
        )
    })
}

fn check_tcp_socket(
    tcp: &TCPSocketAction,
    path: &str,
    strictness: Strictness,
    ports: Option<&[ContainerPort]>,
) -> Checked<Handler> {
    let mut errors: Vec<_> = forbid_host(tcp.host.as_deref(), path).into_iter().collect();
    let port = check_port(&tcp.port, &format!("{path}.port"), strictness, ports)
        .map_err(|e| errors.extend(e))
        .ok();
    match port {
        Some(port) if errors.is_empty() => Ok(Handler::Tcp(TcpAction { port })),
        _ => Err(errors),
    }
}

fn check_grpc(grpc: &GRPCAction, path: &str) -> Checked<Handler> {
    let port = port_number(i64::from(grpc.port), &format!("{path}.port"), grpc.port)?;
    Ok(Handler::Grpc(GrpcAction {
        port,
        service: grpc.service.clone().unwrap_or_default(),
    }))
}

/// httpGet; the `Host` *header* stays allowed (the contract uses it to set the request's Host
/// line), unlike OpenKruise releases that refuse it.
fn check_http_get(
    http: &HTTPGetAction,
    path: &str,
    strictness: Strictness,
    ports: Option<&[ContainerPort]>,
) -> Checked<Handler> {
    let mut errors: Vec<_> = forbid_host(http.host.as_deref(), path)
        .into_iter()
        .collect();
    let url_path = http.path.as_deref().unwrap_or("");
    let path_field = format!("{path}.path");
    if url_path.is_empty() && strictness == Strictness::Admission {
        errors.push(err(&path_field, ErrorKind::Required, None, ""));
    }
    if let Some(why) = url_violation(url_path) {
        errors.push(invalid(
            &path_field,
            quoted(url_path),
            format!("must be a valid URL path: {why}"),
        ));
    }
    let port = check_port(&http.port, &format!("{path}.port"), strictness, ports)
        .map_err(|e| errors.extend(e))
        .ok();
    let scheme = match (http.scheme.as_deref().unwrap_or(""), strictness) {
        ("HTTP", _) | ("", Strictness::Runtime) => Some(Scheme::Http),
        ("HTTPS", _) => Some(Scheme::Https),
        (other, _) => {
            errors.push(err(
                &format!("{path}.scheme"),
                ErrorKind::NotSupported,
                Some(quoted(other)),
                r#"supported values: "HTTP", "HTTPS""#,
            ));
            None
        }
    };
    let mut headers = Vec::new();
    for (i, header) in http.http_headers.iter().flatten().enumerate() {
        if is_header_name(&header.name) {
            headers.push((header.name.clone(), header.value.clone()));
        } else {
            errors.push(invalid(
                &format!("{path}.httpHeaders[{i}].name"),
                quoted(&header.name),
                HEADER_NAME_RULE,
            ));
        }
    }
    match (port, scheme) {
        (Some(port), Some(scheme)) if errors.is_empty() => Ok(Handler::Http(HttpAction {
            scheme,
            path: url_path.to_owned(),
            port,
            headers,
        })),
        _ => Err(errors),
    }
}

/// An int-or-string port: a number in range, or an IANA service name (which, with the pod's
/// ports known, must be one of them). Under [`Strictness::Runtime`] a string of digits is
/// that number, as kruise-daemon's `util.ExtractPort` reads it.
fn check_port(
    port: &IntOrString,
    path: &str,
    strictness: Strictness,
    ports: Option<&[ContainerPort]>,
) -> Checked<Port> {
    let name = match port {
        IntOrString::Int(n) => return port_number(i64::from(*n), path, n).map(Port::Number),
        IntOrString::String(name) => name,
    };
    if strictness == Strictness::Runtime
        && let Ok(n) = name.parse::<i64>()
    {
        return port_number(n, path, quoted(name)).map(Port::Number);
    }
    let errors: Vec<_> = port_name_violations(name)
        .into_iter()
        .map(|violation| invalid(path, quoted(name), violation.to_string()))
        .collect();
    if !errors.is_empty() {
        return Err(errors);
    }
    if let Some(ports) = ports
        && !ports.iter().any(|p| p.name.as_deref() == Some(name))
    {
        return Err(vec![invalid(
            path,
            quoted(name),
            "no port with this name in the target container",
        )]);
    }
    Ok(Port::Name(name.clone()))
}

/// A port number, 1-65535; `shown` is the value as written, for the message.
fn port_number(n: i64, path: &str, shown: impl Display) -> Checked<u16> {
    match (port_number_violation(n), u16::try_from(n)) {
        (None, Ok(port)) => Ok(port),
        (violation, _) => Err(vec![invalid(
            path,
            shown,
            violation.unwrap_or(PortViolation::OutOfRange).to_string(),
        )]),
    }
}

#[cfg(test)]
mod tests;
