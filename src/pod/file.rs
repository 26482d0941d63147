//! The downward-API annotations file as the pod source: read when its content can have changed,
//! never because of the sidecar's own reads.
//!
//! The directory holding the file is watched with inotify, and only events that can change
//! what the path resolves to count: creation, modification, close after writing, rename and
//! deletion of the file's own name or of `..data` (the link the kubelet's atomic writer swaps).
//! Opens, reads and closes without writing, which every read of the file causes in that same
//! directory when it is a plain file, are ignored: reacting to them was a loop that never ended.
//! A relevant event waits for the write to settle (a writer's close, or [`SETTLE_MAX`]), so a
//! burst costs one read. A poll every `poll` covers what inotify cannot see (a symlink to
//! another directory, filesystems without events, a directory missing at start or replaced): it
//! compares the file's identity and times ([`Stamp`]) and reads only when they changed.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, watch};

use super::{PodError, PodView};
use crate::annotation;

/// The link the kubelet's atomic writer replaces on every update (`..data -> ..<timestamp>`).
const KUBELET_DATA_LINK: &str = "..data";

/// How long a write in progress (modified, not yet closed) may take before the file is read
/// anyway: the last good probe set stays if what is read then does not parse.
pub const SETTLE_MAX: Duration = Duration::from_millis(500);

/// How long to let a burst of events gather before reading once.
const SETTLE_BURST: Duration = Duration::from_millis(10);

/// What identifies one version of the file without reading it: the inode behind the path
/// (symlinks followed) with its size and times. A kubelet update resolves to a new inode; a
/// plain file rewritten in place changes size or times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// What an inotify event says about the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// Its content may have changed and the change is complete as far as events tell.
    Changed,
    /// It is being written (modified, not closed yet).
    Writing,
}

/// Reads the downward-API annotations file.
pub fn read_annotations_file(path: &Path) -> Result<BTreeMap<String, String>, PodError> {
    let text = std::fs::read_to_string(path).map_err(|source| PodError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    annotation::parse_downward_api(&text).map_err(|source| PodError::ParseFile {
        path: path.to_owned(),
        source,
    })
}

/// Follows the downward-API annotations file and publishes changed views; a file that cannot
/// be read or parsed keeps the last good view. `reads` counts the times the file was read
/// (`podprobe_annotation_file_reads_total`).
pub async fn watch_file(path: PathBuf, poll: Duration, tx: watch::Sender<PodView>, reads: Counter) {
    let (wake_tx, mut wake_rx) = mpsc::unbounded_channel::<Wake>();
    let mut events = DirWatch::new(&path, wake_tx, poll);
    let mut follower = Follower {
        path: &path,
        tx: &tx,
        reads: &reads,
        last_read: None,
        last_error: None,
    };
    follower.check();
    let mut ticker = tokio::time::interval(poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                events.keep_watching(poll);
                follower.check();
            }
            Some(wake) = wake_rx.recv() => {
                settle(wake, &mut wake_rx).await;
                follower.check();
            }
        }
    }
}

/// Waits until a burst of events is over: [`SETTLE_BURST`] after the last one, or, while the
/// file is being written, until the writer closes it (at most [`SETTLE_MAX`]).
async fn settle(first: Wake, wakes: &mut mpsc::UnboundedReceiver<Wake>) {
    let deadline = tokio::time::Instant::now() + SETTLE_MAX;
    let mut writing = first == Wake::Writing;
    loop {
        let quiet = if writing { SETTLE_MAX } else { SETTLE_BURST };
        let until = (tokio::time::Instant::now() + quiet).min(deadline);
        match tokio::time::timeout_at(until, wakes.recv()).await {
            Ok(Some(wake)) => writing = wake == Wake::Writing,
            Ok(None) | Err(_) => return,
        }
    }
}

/// Reads the file when its stamp changed and publishes the annotation when it changed.
struct Follower<'a> {
    path: &'a Path,
    tx: &'a watch::Sender<PodView>,
    reads: &'a Counter,
    last_read: Option<Stamp>,
    last_error: Option<String>,
}

impl Follower<'_> {
    fn check(&mut self) {
        let stamp = Stamp::of(self.path);
        if stamp.is_some() && stamp == self.last_read {
            return;
        }
        self.reads.inc();
        match read_annotations_file(self.path) {
            Ok(annotations) => {
                self.last_read = stamp;
                self.last_error = None;
                let view = PodView::from_annotations(&annotations);
                self.tx.send_if_modified(|current| {
                    let changed = current.annotation != view.annotation;
                    if changed {
                        current.annotation = view.annotation;
                    }
                    changed
                });
            }
            Err(e) => {
                // Read again at the next event or poll, whatever the stamp: a half-written file
                // may be completed without a change the stamp shows.
                self.last_read = None;
                let text = e.to_string();
                if self.last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!("{text}; keeping the last good probe set");
                    self.last_error = Some(text);
                }
            }
        }
    }
}

/// The inotify watch on the file's directory, re-established when the directory appears or is
/// replaced (a new inode under the same path).
struct DirWatch {
    dir: PathBuf,
    file_name: Option<std::ffi::OsString>,
    wakes: mpsc::UnboundedSender<Wake>,
    watcher: Option<(RecommendedWatcher, Option<(u64, u64)>)>,
    warned: bool,
}

impl DirWatch {
    fn new(path: &Path, wakes: mpsc::UnboundedSender<Wake>, poll: Duration) -> Self {
        let dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        };
        let mut watch = DirWatch {
            dir,
            file_name: path.file_name().map(OsStr::to_owned),
            wakes,
            watcher: None,
            warned: false,
        };
        watch.keep_watching(poll);
        watch
    }

    fn dir_identity(&self) -> Option<(u64, u64)> {
        std::fs::metadata(&self.dir)
            .ok()
            .map(|m| (m.dev(), m.ino()))
    }

    /// Watches the directory if it is not watched yet, or no longer the one at its path.
    fn keep_watching(&mut self, poll: Duration) {
        let identity = self.dir_identity();
        if let Some((_, watched)) = &self.watcher
            && *watched == identity
        {
            return;
        }
        self.watcher = None;
        let wakes = self.wakes.clone();
        let file_name = self.file_name.clone();
        let handler = move |event: notify::Result<notify::Event>| {
            if let Some(wake) = event.ok().and_then(|e| relevant(&e, file_name.as_deref())) {
                let _ = wakes.send(wake);
            }
        };
        let watched = notify::recommended_watcher(handler)
            .and_then(|mut w| w.watch(&self.dir, RecursiveMode::NonRecursive).map(|()| w));
        match watched {
            Ok(w) => {
                if self.warned {
                    tracing::info!(dir = %self.dir.display(), "watching the annotations file's directory again");
                }
                self.warned = false;
                self.watcher = Some((w, identity));
                // Whatever happened while nothing watched is for the next check to see.
                let _ = self.wakes.send(Wake::Changed);
            }
            Err(e) if !self.warned => {
                self.warned = true;
                tracing::warn!(dir = %self.dir.display(), "cannot watch the annotations file's directory, reading it when it changes on a poll every {poll:?}: {e}");
            }
            Err(_) => {}
        }
    }
}

/// Whether an event in the file's directory can change what the file's path resolves to.
fn relevant(event: &notify::Event, file_name: Option<&OsStr>) -> Option<Wake> {
    let wake = match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => Wake::Changed,
        // Opens, reads and closes after reading: the sidecar's own reads cause these.
        EventKind::Access(_) => return None,
        // Permissions or times only; the poll's stamp sees a change that matters.
        EventKind::Modify(ModifyKind::Metadata(_)) => return None,
        EventKind::Modify(ModifyKind::Data(_)) => Wake::Writing,
        EventKind::Create(_) | EventKind::Remove(_) | EventKind::Modify(_) => Wake::Changed,
        // The queue overflowed (notify's rescan) or an event notify could not classify.
        EventKind::Any | EventKind::Other => return Some(Wake::Changed),
    };
    let ours = |name: &OsStr| Some(name) == file_name || name == KUBELET_DATA_LINK;
    event
        .paths
        .iter()
        .any(|p| p.file_name().is_some_and(ours))
        .then_some(wake)
}

#[cfg(test)]
mod tests;
