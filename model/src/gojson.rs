//! Byte-exact reproduction of Go `encoding/json` output for the `kruise.io/podprobe`
//! annotation.
//!
//! serde cannot be used here: k8s-openapi orders `Probe` fields alphabetically and has no notion
//! of Go's `omitempty` on non-pointer integers (Go drops `initialDelaySeconds: 0`, serde keeps
//! `Some(0)`), and serde_json does not apply Go's HTML-safe escaping. Sidecars and tools that
//! compare the annotation byte-for-byte with what OpenKruise writes must see identical bytes.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{
    ExecAction, GRPCAction, HTTPGetAction, HTTPHeader, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use podprobe_protocol::annotation::PodContainerProbe;

/// `json.Marshal([]PodContainerProbe)` with `markerPolicy` cleared.
pub fn probes_to_go_json(probes: &[PodContainerProbe]) -> String {
    let mut out = String::with_capacity(128 * probes.len());
    out.push('[');
    for (i, p) in probes.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let mut obj = Object::open(&mut out);
        obj.key("name");
        string(obj.out, &p.name);
        obj.key("containerName");
        string(obj.out, &p.container_name);
        obj.key("probe");
        probe(obj.out, &p.probe);
        if !p.pod_condition_type.is_empty() {
            obj.key("podConditionType");
            string(obj.out, &p.pod_condition_type);
        }
        obj.close();
    }
    out.push(']');
    out
}

/// Writes `{`, the keys and `}` while tracking whether a comma is due.
struct Object<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> Object<'a> {
    fn open(out: &'a mut String) -> Self {
        out.push('{');
        Object { out, first: true }
    }

    fn key(&mut self, name: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        string(self.out, name);
        self.out.push(':');
    }

    /// Go `int32 ... omitempty`: zero is omitted, so `Some(0)` and `None` look the same.
    fn int_omitempty(&mut self, name: &str, value: Option<i32>) {
        if let Some(v) = value.filter(|v| *v != 0) {
            self.key(name);
            let _ = write!(self.out, "{v}");
        }
    }

    fn close(self) {
        self.out.push('}');
    }
}

fn probe(out: &mut String, p: &Probe) {
    let mut obj = Object::open(out);
    if let Some(exec) = &p.exec {
        obj.key("exec");
        exec_action(obj.out, exec);
    }
    if let Some(http) = &p.http_get {
        obj.key("httpGet");
        http_get(obj.out, http);
    }
    if let Some(tcp) = &p.tcp_socket {
        obj.key("tcpSocket");
        tcp_socket(obj.out, tcp);
    }
    if let Some(grpc) = &p.grpc {
        obj.key("grpc");
        grpc_action(obj.out, grpc);
    }
    obj.int_omitempty("initialDelaySeconds", p.initial_delay_seconds);
    obj.int_omitempty("timeoutSeconds", p.timeout_seconds);
    obj.int_omitempty("periodSeconds", p.period_seconds);
    obj.int_omitempty("successThreshold", p.success_threshold);
    obj.int_omitempty("failureThreshold", p.failure_threshold);
    // A pointer in Go: present (even 0) whenever set.
    if let Some(v) = p.termination_grace_period_seconds {
        obj.key("terminationGracePeriodSeconds");
        let _ = write!(obj.out, "{v}");
    }
    obj.close();
}

fn exec_action(out: &mut String, exec: &ExecAction) {
    let mut obj = Object::open(out);
    if let Some(cmd) = exec.command.as_ref().filter(|c| !c.is_empty()) {
        obj.key("command");
        obj.out.push('[');
        for (i, arg) in cmd.iter().enumerate() {
            if i > 0 {
                obj.out.push(',');
            }
            string(obj.out, arg);
        }
        obj.out.push(']');
    }
    obj.close();
}

fn http_get(out: &mut String, http: &HTTPGetAction) {
    let mut obj = Object::open(out);
    if let Some(path) = http.path.as_deref().filter(|s| !s.is_empty()) {
        obj.key("path");
        string(obj.out, path);
    }
    obj.key("port");
    port(obj.out, &http.port);
    if let Some(host) = http.host.as_deref().filter(|s| !s.is_empty()) {
        obj.key("host");
        string(obj.out, host);
    }
    if let Some(scheme) = http.scheme.as_deref().filter(|s| !s.is_empty()) {
        obj.key("scheme");
        string(obj.out, scheme);
    }
    if let Some(headers) = http.http_headers.as_ref().filter(|h| !h.is_empty()) {
        obj.key("httpHeaders");
        obj.out.push('[');
        for (i, HTTPHeader { name, value }) in headers.iter().enumerate() {
            if i > 0 {
                obj.out.push(',');
            }
            let mut h = Object::open(obj.out);
            h.key("name");
            string(h.out, name);
            h.key("value");
            string(h.out, value);
            h.close();
        }
        obj.out.push(']');
    }
    obj.close();
}

fn tcp_socket(out: &mut String, tcp: &TCPSocketAction) {
    let mut obj = Object::open(out);
    obj.key("port");
    port(obj.out, &tcp.port);
    if let Some(host) = tcp.host.as_deref().filter(|s| !s.is_empty()) {
        obj.key("host");
        string(obj.out, host);
    }
    obj.close();
}

fn grpc_action(out: &mut String, grpc: &GRPCAction) {
    let mut obj = Object::open(out);
    obj.key("port");
    let _ = write!(obj.out, "{}", grpc.port);
    // `Service *string json:"service"` has no omitempty, and the CRD defaults it to "", so every
    // PPM the webhook sees carries a value; applying that default here keeps CLI renders of
    // un-defaulted manifests identical to what a cluster would produce.
    obj.key("service");
    string(obj.out, grpc.service.as_deref().unwrap_or(""));
    obj.close();
}

fn port(out: &mut String, port: &IntOrString) {
    match port {
        IntOrString::Int(n) => {
            let _ = write!(out, "{n}");
        }
        IntOrString::String(s) => string(out, s),
    }
}

/// Go's `encodeState.string` with `escapeHTML = true` (the `json.Marshal` default), Go ≥ 1.22
/// (short `\b` and `\f` escapes).
pub fn string(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{0}'..='\u{1f}' => {
                let b = c as u8;
                out.push_str("\\u00");
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 0xf)] as char);
            }
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> String {
        let mut out = String::new();
        string(&mut out, v);
        out
    }

    #[test]
    fn escapes_like_go_html_safe_encoder() {
        assert_eq!(s("a<b>&c"), r#""a\u003cb\u003e\u0026c""#);
        assert_eq!(s("q\"b\\"), r#""q\"b\\""#);
        assert_eq!(s("\n\r\t\u{8}\u{c}"), r#""\n\r\t\b\f""#);
        assert_eq!(s("\u{1}\u{1f}"), r#""\u0001\u001f""#);
        assert_eq!(s("\u{2028}\u{2029}"), r#""\u2028\u2029""#);
        // Non-ASCII text and DEL stay literal, as in Go.
        assert_eq!(s("é中\u{7f}"), "\"é中\u{7f}\"");
    }

    #[test]
    fn go_output_parses_back_to_the_same_strings() {
        let raw = "x<y>&z\u{2028}\"\\\u{1}";
        let parsed: String = serde_json::from_str(&s(raw)).unwrap();
        assert_eq!(parsed, raw);
    }

    fn entry(probe: Probe) -> PodContainerProbe {
        PodContainerProbe {
            name: "n".into(),
            container_name: "c".into(),
            probe,
            pod_condition_type: "t".into(),
            marker_policy: Vec::new(),
        }
    }

    #[test]
    fn zero_int32_fields_are_omitted_but_grace_period_pointer_is_kept() {
        let p = Probe {
            initial_delay_seconds: Some(0),
            period_seconds: Some(5),
            termination_grace_period_seconds: Some(0),
            ..Default::default()
        };
        assert_eq!(
            probes_to_go_json(&[entry(p)]),
            r#"[{"name":"n","containerName":"c","probe":{"periodSeconds":5,"terminationGracePeriodSeconds":0},"podConditionType":"t"}]"#
        );
    }

    #[test]
    fn handlers_serialize_in_go_key_order() {
        let p = Probe {
            http_get: Some(HTTPGetAction {
                scheme: Some("HTTPS".into()),
                host: Some("h".into()),
                port: IntOrString::Int(8080),
                path: Some("/p".into()),
                http_headers: Some(vec![HTTPHeader {
                    name: "X".into(),
                    value: "v".into(),
                }]),
            }),
            tcp_socket: Some(TCPSocketAction {
                host: Some("h".into()),
                port: IntOrString::String("web".into()),
            }),
            grpc: Some(GRPCAction {
                port: 9000,
                service: None,
            }),
            exec: Some(ExecAction { command: None }),
            ..Default::default()
        };
        assert_eq!(
            probes_to_go_json(&[entry(p)]),
            r#"[{"name":"n","containerName":"c","probe":{"exec":{},"httpGet":{"path":"/p","port":8080,"host":"h","scheme":"HTTPS","httpHeaders":[{"name":"X","value":"v"}]},"tcpSocket":{"port":"web","host":"h"},"grpc":{"port":9000,"service":""}},"podConditionType":"t"}]"#
        );
    }

    #[test]
    fn empty_list_is_an_empty_array() {
        assert_eq!(probes_to_go_json(&[]), "[]");
    }
}
