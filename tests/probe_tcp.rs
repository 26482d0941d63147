//! tcpSocket probe handler against real loopback listeners.
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ContainerPort;
use podprobe::probe::{AttemptError, Handler, Outcome, Port, Prober, Target, TcpAction, tcp};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const SEC: Duration = Duration::from_secs(1);

async fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// T1: a listening port → Succeeded, empty message.
#[tokio::test]
async fn t1_listening_port_succeeds() {
    let (l, port) = listener().await;
    let obs = tcp::attempt("127.0.0.1", port, SEC).await;
    assert_eq!(obs.outcome, Outcome::Succeeded);
    assert_eq!(obs.message, "");
    // The probe connected and sent nothing.
    let (mut conn, _) = l.accept().await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::io::AsyncReadExt::read(&mut conn, &mut buf)
        .await
        .unwrap();
    assert_eq!(n, 0, "the probe sent bytes");
}

/// T3: a closed port → Failed at once, Go's text.
#[tokio::test]
async fn t3_refused_fails_immediately() {
    let (l, port) = listener().await;
    drop(l);
    let started = Instant::now();
    let obs = tcp::attempt("127.0.0.1", port, 5 * SEC).await;
    assert!(started.elapsed() < SEC, "{:?}", started.elapsed());
    assert_eq!(obs.outcome, Outcome::Failed);
    assert_eq!(
        obs.message,
        format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
    );
}

/// T4: an address that never answers the SYN → Failed after the timeout with "i/o timeout".
/// Loopback only: a listener whose accept queue is full makes Linux drop further SYNs, so the
/// connect hangs exactly like a black-holed address.
#[tokio::test]
async fn t4_unanswered_syn_times_out() {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = socket.local_addr().unwrap().port();
    let _listener = socket.listen(0).unwrap();
    // Fill the accept queue until a connect no longer completes.
    let mut held: Vec<TcpStream> = Vec::new();
    loop {
        assert!(held.len() < 64, "the accept queue never filled up");
        match tokio::time::timeout(
            Duration::from_millis(300),
            TcpStream::connect(("127.0.0.1", port)),
        )
        .await
        {
            Ok(Ok(s)) => held.push(s),
            Ok(Err(e)) => panic!("filling the backlog: {e}"),
            Err(_) => break,
        }
    }
    let started = Instant::now();
    let obs = tcp::attempt("127.0.0.1", port, SEC).await;
    let elapsed = started.elapsed();
    assert_eq!(obs.outcome, Outcome::Failed);
    assert_eq!(
        obs.message,
        format!("dial tcp 127.0.0.1:{port}: i/o timeout")
    );
    assert!(elapsed >= SEC && elapsed < 3 * SEC, "{elapsed:?}");
}

/// T5: a listener that never calls accept() still passes (the kernel completes the handshake).
#[tokio::test]
async fn t5_never_accepting_listener_succeeds() {
    let (_l, port) = listener().await;
    for _ in 0..3 {
        let obs = tcp::attempt("127.0.0.1", port, SEC).await;
        assert_eq!(obs.outcome, Outcome::Succeeded, "{}", obs.message);
    }
}

#[tokio::test]
async fn hostnames_are_resolved() {
    let (_l, port) = listener().await;
    let obs = tcp::attempt("localhost", port, SEC).await;
    // localhost may resolve to ::1 first; the 127.0.0.1 address is tried within the deadline.
    assert_eq!(obs.outcome, Outcome::Succeeded, "{}", obs.message);
}

#[tokio::test]
async fn unknown_hostname_fails_with_lookup_text() {
    let obs = tcp::attempt("no-such-host.invalid", 80, SEC).await;
    assert_eq!(obs.outcome, Outcome::Failed);
    assert!(
        obs.message
            .starts_with("dial tcp: lookup no-such-host.invalid"),
        "{}",
        obs.message
    );
}

#[tokio::test]
async fn ipv6_loopback() {
    let Ok(l) = TcpListener::bind("[::1]:0").await else {
        println!("skipped: no IPv6 loopback on this machine");
        return;
    };
    let port = l.local_addr().unwrap().port();
    let obs = tcp::attempt("::1", port, SEC).await;
    assert_eq!(obs.outcome, Outcome::Succeeded, "{}", obs.message);
    drop(l);
    let obs = tcp::attempt("::1", port, SEC).await;
    assert_eq!(
        obs.message,
        format!("dial tcp [::1]:{port}: connect: connection refused")
    );
}

fn target_with_port(name: &str, port: u16) -> Target {
    Target {
        host: "127.0.0.1".into(),
        container_ports: vec![ContainerPort {
            name: Some(name.into()),
            container_port: port.into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Named ports resolve through `Prober::attempt`; an unknown name is an errored attempt.
#[tokio::test]
async fn named_port_resolution() {
    let (_l, port) = listener().await;
    let target = target_with_port("web", port);
    let prober = Prober::default();
    let named = Handler::Tcp(TcpAction {
        port: Port::Name("web".into()),
    });
    let obs = prober.attempt(&named, &target, SEC).await.unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded);

    let unknown = Handler::Tcp(TcpAction {
        port: Port::Name("metrics".into()),
    });
    let err = prober.attempt(&unknown, &target, SEC).await.unwrap_err();
    assert!(
        matches!(err, AttemptError::UnresolvedPort { .. }),
        "{err:?}"
    );
}
