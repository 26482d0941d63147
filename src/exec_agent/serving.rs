//! Serving exec probes on the agent's socket, within bounds: whatever reaches the socket, what
//! the agent spends in the game container (its memory, its pids limit) stays bounded.
//!
//! - At most [`MAX_ATTEMPTS`] attempts run at once, the most a pod's probes can ask for
//!   (`MAX_PROBES_PER_POD`, one attempt in flight each); another is answered with an error at
//!   once.
//! - At most [`MAX_CONNECTIONS`] connections are held; another is closed unread.
//! - A request is at most [`MAX_REQUEST_BYTES`] and must arrive within [`REQUEST_DEADLINE`].
//! - An attempt's timeout is at most the protocol's 300 s, whatever the request says.
//! - An attempt whose asker hangs up (the sidecar restarted or gave up) is stopped: its
//!   command's process group is killed, as at a timeout.
//! - A process of the agent's own container is refused ([`refused_peer`]), told apart before
//!   it holds a connection: at most [`MAX_REFUSALS`] refused askers wait, each at most
//!   [`REFUSAL_DEADLINE`], for their request and their answer; others are closed unread.

use std::sync::Arc;
use std::time::Duration;

use podprobe_protocol::annotation::{MAX_PROBES_PER_POD, MAX_TIMEOUT_SECONDS};
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

use crate::probe::ExecAction;
use crate::probe::exec::agent::{Request, Response, read_line_within, write_line};

/// Attempts run at once.
pub(super) const MAX_ATTEMPTS: usize = MAX_PROBES_PER_POD;
/// Connections held at once: every attempt, and as many again still sending their request.
const MAX_CONNECTIONS: usize = 2 * MAX_ATTEMPTS;
/// The longest request line: a command of this size is far beyond any probe's.
const MAX_REQUEST_BYTES: u64 = 64 << 10;
/// How long a connection may take to send its request.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// Refused askers answered at once: each waits at most [`REFUSAL_DEADLINE`] for its request;
/// another is closed unread.
const MAX_REFUSALS: usize = 4;
/// How long a refused asker may take to send its request before it is closed unread.
const REFUSAL_DEADLINE: Duration = Duration::from_secs(1);

/// Serves until the process ends; `guarded`: the processes of the agent's own container can be
/// told from others ([`refused_peer`]). Who asks is told first, so a refused asker never holds
/// one of the connections the sidecar's attempts need: a process of the container that opens
/// connection after connection only fills the few places of the refused.
pub(super) async fn serve(listener: UnixListener, guarded: bool) {
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let attempts = Arc::new(Semaphore::new(MAX_ATTEMPTS));
    let (mut full, mut strangers) = (Refusals::default(), Refusals::default());
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!("podprobe agent: accepting a probe connection failed: {e}");
                // EMFILE and the like: give what holds descriptors a moment to let go.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Some(message) = refused_peer(&stream, guarded) {
            // Said once: a process that asks again and again must not fill the game's log.
            strangers.say(format_args!("podprobe agent: {message}"));
            // With every place taken, closed unread: the refusal was said already.
            if let Ok(held) = refusals.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream, message).await;
                    drop(held);
                });
            }
            continue;
        }
        match connections.clone().try_acquire_owned() {
            Ok(held) => {
                let attempts = attempts.clone();
                tokio::spawn(async move {
                    answer(stream, &attempts).await;
                    drop(held);
                });
            }
            Err(_) => full.say(format_args!(
                "podprobe agent: {MAX_CONNECTIONS} probe connections are open already; \
                 closed another unread"
            )),
        }
    }
}

/// Answers a refused asker with why, once it has sent its request (an answer before it would
/// meet a closed socket).
async fn refuse(mut stream: UnixStream, message: String) {
    let read = read_line_within::<Request>(&mut stream, MAX_REQUEST_BYTES);
    let _ = tokio::time::timeout(REFUSAL_DEADLINE, read).await;
    let _ = write_line(&mut stream, &Response::Error { message }).await;
}

/// Runs one exec attempt with the same runner as the sidecar's `local` mode.
async fn answer(mut stream: UnixStream, attempts: &Semaphore) {
    let read = read_line_within::<Request>(&mut stream, MAX_REQUEST_BYTES);
    let request = match tokio::time::timeout(REQUEST_DEADLINE, read).await {
        Ok(Ok(request)) => request,
        Ok(Err(e)) => {
            let message = format!("the exec agent could not read the request: {e}");
            let _ = write_line(&mut stream, &Response::Error { message }).await;
            return;
        }
        Err(_) => return,
    };
    let Ok(_running) = attempts.try_acquire() else {
        let message = format!(
            "the exec agent already runs {MAX_ATTEMPTS} attempts, the most a pod's probes ask \
             for at once; this one was not started"
        );
        tracing::debug!("podprobe agent: {message}");
        let _ = write_line(&mut stream, &Response::Error { message }).await;
        return;
    };
    let action = ExecAction {
        command: request.command,
    };
    let attempt = crate::probe::exec::attempt(&action, bounded_timeout(request.timeout_millis));
    let result = tokio::select! {
        result = attempt => result,
        // Dropping the attempt kills its command's process group.
        () = hung_up(&mut stream) => return,
    };
    // The sidecar may have given up meanwhile; nothing to do about a failed write.
    let _ = write_line(&mut stream, &Response::of(result)).await;
}

/// Why the asker may not run commands here, if it may not: a process of the agent's own
/// container, which would otherwise run commands with the agent's user and capabilities (a
/// server that dropped root regaining it), or one the agent cannot tell apart from those
/// ([`super::peer`]). Started by a process of its own namespace (by hand, a test), the agent
/// cannot tell where its container ends and asks nothing (`guarded` false).
fn refused_peer(stream: &UnixStream, guarded: bool) -> Option<String> {
    if !guarded {
        return None;
    }
    match super::peer::verdict(stream) {
        super::peer::Verdict::Answer => None,
        super::peer::Verdict::Refuse(why) => Some(why),
    }
}

/// The requested timeout, at most the protocol's.
fn bounded_timeout(millis: u64) -> Duration {
    let most = Duration::from_secs(MAX_TIMEOUT_SECONDS.unsigned_abs().into());
    Duration::from_millis(millis).min(most)
}

/// Returns when the asker has closed its end (nothing is sent after the request).
async fn hung_up(stream: &mut UnixStream) {
    let mut byte = [0u8; 1];
    while let Ok(1..) = stream.read(&mut byte).await {}
}

/// Says a refusal at warn once, then at debug: a flood must not flood the game's log too.
#[derive(Default)]
struct Refusals {
    said: bool,
}

impl Refusals {
    fn say(&mut self, message: std::fmt::Arguments<'_>) {
        if std::mem::replace(&mut self.said, true) {
            tracing::debug!("{message}");
        } else {
            tracing::warn!("{message} (said once)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requested_timeout_is_at_most_the_protocols() {
        assert_eq!(bounded_timeout(1500), Duration::from_millis(1500));
        assert_eq!(bounded_timeout(u64::MAX), Duration::from_secs(300));
    }
}
