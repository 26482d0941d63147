//! httpGet probe handler against real HTTP servers on loopback (kubelet conformance H1–H31).
//!
//! Servers run in-process as tokio tasks. H26 re-executes this test binary with HTTP_PROXY set
//! (setting the variable in-process would be `unsafe` in edition 2024 and racy).
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::ContainerPort;
use podprobe::probe::http::{DEFAULT_USER_AGENT, HttpProber};
use podprobe::probe::{
    AttemptError, Handler, HttpAction, MAX_READ_BYTES, Observation, Outcome, Port, Prober, Scheme,
    Target,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const SEC: Duration = Duration::from_secs(1);

type Reply = Response<Full<Bytes>>;

fn reply(status: u16, body: &str) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    r
}

fn redirect(status: u16, location: &str, body: &str) -> Reply {
    let mut r = reply(status, body);
    r.headers_mut()
        .insert(http::header::LOCATION, location.parse().unwrap());
    r
}

/// What a handler sees of a request.
#[derive(Debug, Clone)]
struct Seen {
    path_and_query: String,
    headers: HeaderMap,
    port: u16,
}

/// A hyper HTTP/1 server on `addr` (port 0), answering with `handler`; counts requests.
async fn serve_on<F, Fut>(addr: &str, handler: F) -> (u16, Arc<AtomicUsize>)
where
    F: Fn(Seen) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let listener = TcpListener::bind(addr).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let seen = Seen {
                        path_and_query: req
                            .uri()
                            .path_and_query()
                            .map(|p| p.to_string())
                            .unwrap_or_default(),
                        headers: req.headers().clone(),
                        port,
                    };
                    let fut = handler(seen);
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (port, count)
}

async fn serve<F, Fut>(handler: F) -> (u16, Arc<AtomicUsize>)
where
    F: Fn(Seen) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    serve_on("127.0.0.1:0", handler).await
}

/// How a raw server behaves after reading the request head.
#[derive(Clone)]
enum Raw {
    /// Write these bytes and close.
    Respond(&'static [u8]),
    /// Write these bytes, then keep the connection open without writing more.
    RespondThenStall(&'static [u8]),
    /// Close without answering.
    Close,
    /// Write these bytes as soon as a connection is accepted (without reading), then close.
    Greet(&'static [u8]),
}

/// A server speaking raw bytes; every request head (as received, byte for byte) is sent on
/// the channel.
async fn raw_server(mode: Raw) -> (u16, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            let mode = mode.clone();
            tokio::spawn(async move {
                if let Raw::Greet(bytes) = mode {
                    let _ = stream.write_all(bytes).await;
                    return;
                }
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
                match mode {
                    Raw::Respond(bytes) => {
                        let _ = stream.write_all(bytes).await;
                    }
                    Raw::RespondThenStall(bytes) => {
                        let _ = stream.write_all(bytes).await;
                        std::future::pending::<()>().await;
                    }
                    Raw::Close | Raw::Greet(_) => {}
                }
            });
        }
    });
    (port, rx)
}

/// Header lines of a raw request head (request line excluded), as written on the wire.
fn header_lines(head: &str) -> Vec<(String, String)> {
    head.split("\r\n")
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.to_string(), v.trim_start().to_string())
        })
        .collect()
}

fn action(path: &str, headers: &[(&str, &str)]) -> HttpAction {
    HttpAction {
        scheme: Scheme::Http,
        path: path.into(),
        port: Port::Number(0),
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
    }
}

/// One attempt through the runner-facing API.
async fn probe(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Observation, AttemptError> {
    let mut a = action(path, headers);
    a.port = Port::Number(port);
    Prober::default()
        .attempt(&Handler::Http(a), &Target::new("127.0.0.1"), SEC)
        .await
}

/// One attempt at handler level (message not capped at 1024 bytes).
async fn probe_uncapped(port: u16, path: &str) -> Result<Observation, AttemptError> {
    HttpProber::new(DEFAULT_USER_AGENT.into())
        .attempt(&action(path, &[]), "127.0.0.1", port, SEC)
        .await
}

async fn one_request_head(headers: &[(&str, &str)]) -> String {
    let (port, mut heads) = raw_server(Raw::Respond(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ))
    .await;
    let obs = probe(port, "/", headers).await.unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded, "{}", obs.message);
    heads.recv().await.unwrap()
}

fn values<'a>(lines: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    lines
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

// ---------------------------------------------------------------- status and body

/// H1: 200 with a body → Succeeded, message = body.
#[tokio::test]
async fn h1_ok_with_body() {
    let (port, _) = serve(|_| async { reply(200, "ok body") }).await;
    let obs = probe(port, "/healthz", &[]).await.unwrap();
    assert_eq!(obs, Observation::succeeded("ok body"));
}

/// H2: 204, empty body → Succeeded, "".
#[tokio::test]
async fn h2_no_content() {
    let (port, _) = serve(|_| async { reply(204, "") }).await;
    assert_eq!(
        probe(port, "/", &[]).await.unwrap(),
        Observation::succeeded("")
    );
}

/// H3: 399 → kubelet "warning", counted as Succeeded.
#[tokio::test]
async fn h3_399_is_a_warning_success() {
    let (port, _) = serve(|_| async { reply(399, "odd") }).await;
    assert_eq!(
        probe(port, "/", &[]).await.unwrap(),
        Observation::succeeded("Probe terminated redirects, Response body: odd")
    );
}

/// H4: 400 → Failed with the status code.
#[tokio::test]
async fn h4_client_error_fails() {
    let (port, _) = serve(|_| async { reply(400, "") }).await;
    assert_eq!(
        probe(port, "/", &[]).await.unwrap(),
        Observation::failed("HTTP probe failed with statuscode: 400")
    );
}

/// H5: 500 with a body → Failed, the body is not in the message.
#[tokio::test]
async fn h5_server_error_hides_body() {
    let (port, _) = serve(|_| async { reply(500, "fail body") }).await;
    let obs = probe(port, "/", &[]).await.unwrap();
    assert_eq!(obs.outcome, Outcome::Failed);
    assert!(!obs.message.contains("fail body"));
    assert_eq!(obs.message, "HTTP probe failed with statuscode: 500");
}

/// H6: the server closes without a response → Failed (not errored), Go's text.
#[tokio::test]
async fn h6_abort_without_response_fails() {
    let (port, _) = raw_server(Raw::Close).await;
    assert_eq!(
        probe(port, "/", &[]).await.unwrap(),
        Observation::failed(format!("Get \"http://127.0.0.1:{port}/\": EOF"))
    );
}

/// H7: no response headers within the timeout → Failed with the client timeout text.
#[tokio::test]
async fn h7_timeout_before_headers_fails() {
    let (port, _) = serve(|_| std::future::pending::<Reply>()).await;
    let started = Instant::now();
    let obs = probe(port, "/slow", &[]).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(
        obs,
        Observation::failed(format!(
            "Get \"http://127.0.0.1:{port}/slow\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        ))
    );
    assert!(elapsed >= SEC && elapsed < 3 * SEC, "{elapsed:?}");
}

#[tokio::test]
async fn connection_refused_fails_with_go_text() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    assert_eq!(
        probe(port, "/healthz", &[]).await.unwrap(),
        Observation::failed(format!(
            "Get \"http://127.0.0.1:{port}/healthz\": dial tcp 127.0.0.1:{port}: connect: connection refused"
        ))
    );
}

// ---------------------------------------------------------------- request headers

/// H8: without custom headers exactly Host, User-Agent, Accept and Connection are sent.
#[tokio::test]
async fn h8_default_headers_exactly() {
    let head = one_request_head(&[]).await;
    assert!(head.starts_with("GET / HTTP/1.1\r\n"), "{head}");
    let mut lines = header_lines(&head);
    lines.sort();
    let port = values(&lines, "Host")[0]
        .rsplit_once(':')
        .unwrap()
        .1
        .to_string();
    let mut want = vec![
        ("Accept".to_string(), "*/*".to_string()),
        ("Connection".to_string(), "close".to_string()),
        ("Host".to_string(), format!("127.0.0.1:{port}")),
        ("User-Agent".to_string(), DEFAULT_USER_AGENT.to_string()),
    ];
    want.sort();
    assert_eq!(lines, want, "{head}");
    assert!(DEFAULT_USER_AGENT.starts_with("kube-probe/"));
}

/// H9: a custom User-Agent replaces the default.
#[tokio::test]
async fn h9_custom_user_agent() {
    let lines = header_lines(&one_request_head(&[("User-Agent", "foo/1.0")]).await);
    assert_eq!(values(&lines, "User-Agent"), ["foo/1.0"]);
}

/// H10: an empty User-Agent removes the header.
#[tokio::test]
async fn h10_empty_user_agent_removes_it() {
    let lines = header_lines(&one_request_head(&[("User-Agent", "")]).await);
    assert!(values(&lines, "User-Agent").is_empty(), "{lines:?}");
}

/// H11: a custom Accept is sent verbatim.
#[tokio::test]
async fn h11_custom_accept() {
    for accept in ["text/html", "foo/*"] {
        let lines = header_lines(&one_request_head(&[("Accept", accept)]).await);
        assert_eq!(values(&lines, "Accept"), [accept]);
    }
}

/// H12: an empty Accept removes the header.
#[tokio::test]
async fn h12_empty_accept_removes_it() {
    let lines = header_lines(&one_request_head(&[("Accept", "")]).await);
    assert!(values(&lines, "Accept").is_empty(), "{lines:?}");
}

/// H13: Accept-Encoding only when the user sets it, verbatim (even empty).
#[tokio::test]
async fn h13_accept_encoding_verbatim() {
    let lines = header_lines(&one_request_head(&[]).await);
    assert!(values(&lines, "Accept-Encoding").is_empty());
    let lines = header_lines(&one_request_head(&[("Accept-Encoding", "gzip")]).await);
    assert_eq!(values(&lines, "Accept-Encoding"), ["gzip"]);
    let lines = header_lines(&one_request_head(&[("Accept-Encoding", "")]).await);
    assert_eq!(values(&lines, "Accept-Encoding"), [""]);
}

/// H14: a Host header changes the Host line only; the probe still connects to the target.
#[tokio::test]
async fn h14_host_header_overrides_host_line() {
    let lines = header_lines(&one_request_head(&[("Host", "muffins.cupcakes.org")]).await);
    assert_eq!(values(&lines, "Host"), ["muffins.cupcakes.org"]);
}

/// H15/H16 on the wire: canonical names, repeated values kept in order.
#[tokio::test]
async fn h15_h16_canonical_names_on_the_wire() {
    let head = one_request_head(&[
        ("accept", "application/json"),
        ("Accept", "*/*"),
        ("FOO-bAR", "1"),
        ("HOST", "example.test"),
    ])
    .await;
    let lines = header_lines(&head);
    assert_eq!(
        values(&lines, "Accept"),
        ["application/json", "*/*"],
        "{head}"
    );
    assert_eq!(values(&lines, "Foo-Bar"), ["1"], "{head}");
    assert_eq!(values(&lines, "Host"), ["example.test"], "{head}");
}

#[tokio::test]
async fn path_query_and_fragment() {
    let (port, _) = serve(|seen: Seen| async move { reply(200, &seen.path_and_query) }).await;
    let cases = [
        ("", "/"),
        ("healthz", "/healthz"),
        ("?foo", "/?foo"),
        ("/healthz?x=1&y=2#frag", "/healthz?x=1&y=2"),
    ];
    for (path, want) in cases {
        assert_eq!(
            probe(port, path, &[]).await.unwrap(),
            Observation::succeeded(want),
            "path {path:?}"
        );
    }
}

// ---------------------------------------------------------------- redirects

/// H17: 301/302/303/307/308 to "/new" which answers 200 → Succeeded; the hop carries a
/// Referer like Go's client.
#[tokio::test]
async fn h17_redirect_to_ok() {
    for code in [301, 302, 303, 307, 308] {
        let (port, count) = serve(move |seen: Seen| async move {
            match seen.path_and_query.as_str() {
                "/old" => redirect(code, "/new", ""),
                "/new" => {
                    let referer = seen
                        .headers
                        .get("referer")
                        .map(|v| v.to_str().unwrap().to_string())
                        .unwrap_or_default();
                    reply(200, &format!("new ok, referer {referer}"))
                }
                _ => reply(404, ""),
            }
        })
        .await;
        let obs = probe(port, "/old", &[]).await.unwrap();
        assert_eq!(
            obs,
            Observation::succeeded(format!("new ok, referer http://127.0.0.1:{port}/old")),
            "code {code}"
        );
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }
}

/// H18: redirect to "/new" which answers 500 → Failed.
#[tokio::test]
async fn h18_redirect_to_error() {
    for code in [301, 302, 307, 308] {
        let (port, _) = serve(move |seen: Seen| async move {
            match seen.path_and_query.as_str() {
                "/old" => redirect(code, "/new", ""),
                _ => reply(500, "bad"),
            }
        })
        .await;
        assert_eq!(
            probe(port, "/old", &[]).await.unwrap(),
            Observation::failed("HTTP probe failed with statuscode: 500")
        );
    }
}

/// H19: a 3xx without Location is final → warning with the body.
#[tokio::test]
async fn h19_redirect_without_location_is_final() {
    let (port, _) = serve(|seen: Seen| async move {
        match seen.path_and_query.as_str() {
            "/" => redirect(308, "/new", ""),
            _ => reply(308, "ok body"),
        }
    })
    .await;
    assert_eq!(
        probe(port, "/", &[]).await.unwrap(),
        Observation::succeeded("Probe terminated redirects, Response body: ok body")
    );
}

/// H20: same hostname, other port → followed.
#[tokio::test]
async fn h20_redirect_to_other_port_is_followed() {
    let (other, other_count) = serve(|_| async { reply(200, "other port") }).await;
    let (port, _) =
        serve(move |_| async move { redirect(302, &format!("http://127.0.0.1:{other}/"), "") })
            .await;
    assert_eq!(
        probe(port, "/", &[]).await.unwrap(),
        Observation::succeeded("other port")
    );
    assert_eq!(other_count.load(Ordering::SeqCst), 1);
}

/// H21: a different hostname is not followed: the redirect is the (warning) result.
#[tokio::test]
async fn h21_redirect_to_other_host_is_not_followed() {
    let (port, count) = serve(|_| async { redirect(302, "http://0.0.0.0/fail", "moved") }).await;
    assert_eq!(
        probe(port, "/", &[]).await.unwrap(),
        Observation::succeeded("Probe terminated redirects, Response body: moved")
    );
    assert_eq!(count.load(Ordering::SeqCst), 1);
    // "localhost" is a different hostname from "127.0.0.1" too (exact string compare).
    let (port, _) = serve(move |seen: Seen| async move {
        redirect(302, &format!("http://localhost:{}/x", seen.port), "")
    })
    .await;
    assert_eq!(
        probe(port, "/", &[]).await.unwrap(),
        Observation::succeeded("Probe terminated redirects, Response body: ")
    );
}

/// H22: a redirect loop stops after 10 requests → Failed with Go's text.
#[tokio::test]
async fn h22_redirect_loop_fails_after_10_requests() {
    let (port, count) = serve(|_| async { redirect(302, "/loop", "") }).await;
    assert_eq!(
        probe(port, "/loop", &[]).await.unwrap(),
        Observation::failed("Get \"/loop\": stopped after 10 redirects")
    );
    assert_eq!(count.load(Ordering::SeqCst), 10);
}

/// Nine redirects then a 200: the 10th request may still succeed.
#[tokio::test]
async fn nine_redirects_are_followed() {
    let (port, count) = serve(|seen: Seen| async move {
        let n: u32 = seen.path_and_query[1..].parse().unwrap();
        if n < 9 {
            redirect(307, &format!("/{}", n + 1), "")
        } else {
            reply(200, "tenth")
        }
    })
    .await;
    assert_eq!(
        probe(port, "/0", &[]).await.unwrap(),
        Observation::succeeded("tenth")
    );
    assert_eq!(count.load(Ordering::SeqCst), 10);
}

/// H23: the custom Host header survives a relative redirect (not an absolute one).
#[tokio::test]
async fn h23_host_header_preserved_on_relative_redirect() {
    let handler = |seen: Seen| async move {
        let host = seen
            .headers
            .get("host")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        match seen.path_and_query.as_str() {
            "/" => redirect(302, "/success", ""),
            "/success" if host == "www.success.com" => reply(200, "success"),
            "/success" => reply(500, ""),
            "/absolute" => redirect(302, &format!("http://127.0.0.1:{}/echo", seen.port), ""),
            "/echo" => reply(200, &host),
            _ => reply(404, ""),
        }
    };
    let (port, _) = serve(handler).await;
    assert_eq!(
        probe(port, "/", &[("Host", "www.success.com")])
            .await
            .unwrap(),
        Observation::succeeded("success")
    );
    assert_eq!(
        probe(port, "/", &[("Host", "www.fail.com")]).await.unwrap(),
        Observation::failed("HTTP probe failed with statuscode: 500")
    );
    assert_eq!(
        probe(port, "/absolute", &[("Host", "www.success.com")])
            .await
            .unwrap(),
        Observation::succeeded(format!("127.0.0.1:{port}"))
    );
}

// ---------------------------------------------------------------- body limits

/// H24: a 10241-byte body → the first 10240 bytes, no error (also exactly 10240 and a big one).
#[tokio::test]
async fn h24_body_is_truncated_at_10_kib() {
    let (port, _) = serve(|seen: Seen| async move {
        let n: usize = seen.path_and_query[1..].parse().unwrap();
        reply(200, &"x".repeat(n))
    })
    .await;
    for n in [MAX_READ_BYTES + 1, MAX_READ_BYTES, 5 * 1024 * 1024] {
        let obs = probe_uncapped(port, &format!("/{n}")).await.unwrap();
        assert_eq!(obs.outcome, Outcome::Succeeded);
        assert_eq!(obs.message.len(), MAX_READ_BYTES, "body of {n}");
    }
    // The runner-facing message is further capped at 1024 bytes.
    let obs = probe(port, "/10241", &[]).await.unwrap();
    assert_eq!(obs.message.len(), 1024);
}

/// H25: a 10239-byte body is kept whole.
#[tokio::test]
async fn h25_body_under_the_limit_is_whole() {
    let body = "y".repeat(MAX_READ_BYTES - 1);
    let expected = body.clone();
    let (port, _) = serve(move |_| {
        let body = body.clone();
        async move { reply(200, &body) }
    })
    .await;
    assert_eq!(
        probe_uncapped(port, "/").await.unwrap(),
        Observation::succeeded(expected)
    );
}

/// H30: headers arrive, the body stalls past the deadline → errored attempt (no state change).
#[tokio::test]
async fn h30_stalled_body_is_an_error() {
    let (port, _) = raw_server(Raw::RespondThenStall(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial",
    ))
    .await;
    let started = Instant::now();
    let err = probe(port, "/", &[]).await.unwrap_err();
    assert!(matches!(err, AttemptError::HttpBody(_)), "{err:?}");
    assert!(started.elapsed() >= SEC);
}

/// A body cut short by the server (connection closed mid-body) is an errored attempt too.
#[tokio::test]
async fn truncated_body_is_an_error() {
    let (port, _) = raw_server(Raw::Respond(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial",
    ))
    .await;
    let err = probe(port, "/", &[]).await.unwrap_err();
    assert!(matches!(err, AttemptError::HttpBody(_)), "{err:?}");
}

/// A body without Content-Length ends at connection close: not an error.
#[tokio::test]
async fn close_delimited_body_is_fine() {
    let (port, _) = raw_server(Raw::Respond(b"HTTP/1.1 200 OK\r\n\r\nuntil close")).await;
    assert_eq!(
        probe(port, "/", &[]).await.unwrap(),
        Observation::succeeded("until close")
    );
}

// ---------------------------------------------------------------- transport

/// H26: HTTP_PROXY in the environment is ignored. The handler dials its own sockets and no code
/// path reads proxy variables; to check it for real, this binary is re-run (child process) with
/// HTTP_PROXY/http_proxy pointing at a listener here and must still reach the target directly.
#[tokio::test]
async fn h26_proxy_environment_is_ignored() {
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let proxied = Arc::new(AtomicUsize::new(0));
    let proxied_in = proxied.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = proxy.accept().await {
            proxied_in.fetch_add(1, Ordering::SeqCst);
        }
    });
    let (port, direct) = serve(|_| async { reply(200, "direct") }).await;
    let exe = std::env::current_exe().unwrap();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(exe)
            .args([
                "--exact",
                "h26_child_probe_under_proxy_env",
                "--ignored",
                "--nocapture",
            ])
            .env("HTTP_PROXY", &proxy_url)
            .env("http_proxy", &proxy_url)
            .env("HTTPS_PROXY", &proxy_url)
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .env("PODPROBE_H26_TARGET_PORT", port.to_string())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("1 passed"), "child ran no test: {stdout}");
    assert_eq!(direct.load(Ordering::SeqCst), 1);
    assert_eq!(proxied.load(Ordering::SeqCst), 0);
}

/// Child half of H26 (run only by `h26_proxy_environment_is_ignored`).
#[tokio::test]
#[ignore = "run by h26_proxy_environment_is_ignored in a child process"]
async fn h26_child_probe_under_proxy_env() {
    let port: u16 = std::env::var("PODPROBE_H26_TARGET_PORT")
        .expect("run by h26_proxy_environment_is_ignored")
        .parse()
        .unwrap();
    assert!(std::env::var("HTTP_PROXY").is_ok());
    assert_eq!(
        probe(port, "/", &[]).await.unwrap(),
        Observation::succeeded("direct")
    );
}

/// H28: IPv6 pod IP → URL and Host bracketed, request line "/".
#[tokio::test]
async fn h28_ipv6_host() {
    if TcpListener::bind("[::1]:0").await.is_err() {
        println!("skipped: no IPv6 loopback on this machine");
        return;
    }
    let (port, _) = serve_on("[::1]:0", |seen: Seen| async move {
        let host = seen
            .headers
            .get("host")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        reply(200, &format!("{host} {}", seen.path_and_query))
    })
    .await;
    let a = HttpAction {
        port: Port::Number(port),
        ..action("", &[])
    };
    let obs = Prober::default()
        .attempt(&Handler::Http(a), &Target::new("::1"), SEC)
        .await
        .unwrap();
    assert_eq!(obs, Observation::succeeded(format!("[::1]:{port} /")));
}

/// H29: HTTPS with a self-signed, expired certificate for another name → Succeeded.
#[tokio::test]
async fn h29_https_without_verification() {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["not-this-host.example".into()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2000, 1, 1);
    params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    let cert = params.self_signed(&key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let host = req
                        .headers()
                        .get("host")
                        .unwrap()
                        .to_str()
                        .unwrap()
                        .to_string();
                    Ok::<_, Infallible>(reply(200, &format!("secure {host}")))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    let a = HttpAction {
        scheme: Scheme::Https,
        port: Port::Number(port),
        ..action("/", &[])
    };
    let obs = Prober::default()
        .attempt(&Handler::Http(a), &Target::new("127.0.0.1"), SEC)
        .await
        .unwrap();
    assert_eq!(
        obs,
        Observation::succeeded(format!("secure 127.0.0.1:{port}"))
    );
}

/// HTTPS against a plain-HTTP server: Failed (a TLS error), not errored.
#[tokio::test]
async fn https_to_plain_http_fails() {
    let (port, _) = raw_server(Raw::Greet(b"HTTP/1.1 400 Bad Request\r\n\r\n")).await;
    let started = Instant::now();
    let a = HttpAction {
        scheme: Scheme::Https,
        port: Port::Number(port),
        ..action("/", &[])
    };
    let obs = Prober::default()
        .attempt(&Handler::Http(a), &Target::new("127.0.0.1"), SEC)
        .await
        .unwrap();
    assert_eq!(obs.outcome, Outcome::Failed);
    assert!(
        obs.message
            .starts_with(&format!("Get \"https://127.0.0.1:{port}/\": tls: ")),
        "{}",
        obs.message
    );
    assert!(started.elapsed() < SEC, "{:?}", started.elapsed());
}

/// H31: an unresolvable named port is an errored attempt; a declared one resolves.
#[tokio::test]
async fn h31_named_ports() {
    let (port, _) = serve(|_| async { reply(200, "named") }).await;
    let target = Target {
        host: "127.0.0.1".into(),
        container_ports: vec![ContainerPort {
            name: Some("http".into()),
            container_port: port.into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let prober = Prober::default();
    let mut a = action("/", &[]);
    a.port = Port::Name("http".into());
    assert_eq!(
        prober
            .attempt(&Handler::Http(a.clone()), &target, SEC)
            .await
            .unwrap(),
        Observation::succeeded("named")
    );
    a.port = Port::Name("web".into());
    let err = prober
        .attempt(&Handler::Http(a), &target, SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(err, AttemptError::UnresolvedPort { .. }),
        "{err:?}"
    );
}

/// A custom user agent configured on the prober is used by default.
#[tokio::test]
async fn configured_user_agent() {
    let (port, mut heads) = raw_server(Raw::Respond(
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    ))
    .await;
    let mut a = action("/", &[]);
    a.port = Port::Number(port);
    Prober::new("kube-probe/1.31")
        .attempt(&Handler::Http(a), &Target::new("127.0.0.1"), SEC)
        .await
        .unwrap();
    let lines = header_lines(&heads.recv().await.unwrap());
    assert_eq!(values(&lines, "User-Agent"), ["kube-probe/1.31"]);
}
