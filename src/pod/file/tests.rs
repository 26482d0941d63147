//! The file source on real files, one test per layout a volume can have. Each counts the reads
//! of the annotations file: one at start, one per change, none while idle, whatever else
//! happens in the directory (the sidecar's own reads included).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{SETTLE_MAX, watch_file};
use crate::annotation::go_quote;
use crate::pod::PodView;

const POLL: Duration = Duration::from_millis(200);
/// Long enough for several polls and, before the fix, hundreds of reads of a plain file.
const IDLE_WINDOW: Duration = Duration::from_millis(1200);
const WAIT: Duration = Duration::from_secs(5);

/// The downward-API file for one `kruise.io/podprobe` value, as the kubelet writes it.
fn file_text(value: &str) -> String {
    format!("app=\"game\"\nkruise.io/podprobe={}\n", go_quote(value))
}

struct Source {
    views: watch::Receiver<PodView>,
    reads: Counter,
    task: JoinHandle<()>,
}

impl Source {
    fn start(path: &Path) -> Source {
        let (tx, views) = watch::channel(PodView::default());
        let reads = Counter::default();
        let task = tokio::spawn(watch_file(path.to_owned(), POLL, tx, reads.clone()));
        Source { views, reads, task }
    }

    /// A plain annotations file in `dir` holding `v1`, and a source that has read it.
    async fn on_plain_file(dir: &Path) -> (PathBuf, Source) {
        let path = dir.join("annotations");
        fs::write(&path, file_text("v1")).unwrap();
        let mut source = Source::start(&path);
        source.sees("v1").await;
        (path, source)
    }

    fn reads(&self) -> u64 {
        self.reads.get()
    }

    /// Waits until the published annotation is `value`.
    async fn sees(&mut self, value: &str) {
        let seen = tokio::time::timeout(
            WAIT,
            self.views
                .wait_for(|v| v.annotation.as_deref() == Some(value)),
        )
        .await
        .is_ok();
        assert!(
            seen,
            "the source never published {value:?}; it has {:?}",
            self.views.borrow().annotation
        );
    }

    /// Waits until the file has been read `n` times in all.
    async fn until_reads(&self, n: u64) {
        let deadline = Instant::now() + WAIT;
        while self.reads() < n {
            assert!(
                Instant::now() < deadline,
                "{} reads, waited for {n}",
                self.reads()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Lets the source sit idle and checks it read nothing meanwhile and kept `value`.
    async fn stays_idle(&self, value: &str) {
        let before = self.reads();
        tokio::time::sleep(IDLE_WINDOW).await;
        assert_eq!(
            self.reads(),
            before,
            "the file was read while nothing changed it"
        );
        assert_eq!(self.views.borrow().annotation.as_deref(), Some(value));
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The kubelet's atomic writer: the files in a new `..<timestamp>` directory, `..data_tmp`
/// linked to it and renamed over `..data`, then the old directory removed; the visible name is
/// a link through `..data`, made once.
struct KubeletVolume {
    dir: PathBuf,
    version: u32,
}

impl KubeletVolume {
    fn new(dir: &Path, text: &str) -> KubeletVolume {
        let mut volume = KubeletVolume {
            dir: dir.to_owned(),
            version: 0,
        };
        volume.write(text);
        symlink("..data/annotations", dir.join("annotations")).unwrap();
        volume
    }

    fn write(&mut self, text: &str) {
        self.version += 1;
        let old = format!("..2026_11_24_00_00_00.{}", self.version - 1);
        let new = format!("..2026_11_24_00_00_00.{}", self.version);
        fs::create_dir(self.dir.join(&new)).unwrap();
        fs::write(self.dir.join(&new).join("annotations"), text).unwrap();
        symlink(&new, self.dir.join("..data_tmp")).unwrap();
        fs::rename(self.dir.join("..data_tmp"), self.dir.join("..data")).unwrap();
        if self.version > 1 {
            fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }
}

#[tokio::test]
async fn kubelet_atomic_writer_one_read_per_update() {
    let dir = tempfile::tempdir().unwrap();
    let mut volume = KubeletVolume::new(dir.path(), &file_text("v1"));
    let mut source = Source::start(&dir.path().join("annotations"));
    source.sees("v1").await;
    assert_eq!(source.reads(), 1);
    source.stays_idle("v1").await;
    for (n, value) in ["v2", "v3"].into_iter().enumerate() {
        volume.write(&file_text(value));
        source.sees(value).await;
        source.stays_idle(value).await;
        assert_eq!(source.reads(), 2 + n as u64, "one read per update");
    }
}

#[tokio::test]
async fn plain_file_replaced_by_rename() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut source) = Source::on_plain_file(dir.path()).await;
    source.stays_idle("v1").await;
    fs::write(dir.path().join(".annotations.tmp"), file_text("v2")).unwrap();
    fs::rename(dir.path().join(".annotations.tmp"), &path).unwrap();
    source.sees("v2").await;
    source.stays_idle("v2").await;
    assert_eq!(source.reads(), 2);
}

#[tokio::test]
async fn plain_file_rewritten_in_place_is_read_once_per_write() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut source) = Source::on_plain_file(dir.path()).await;
    source.stays_idle("v1").await;
    // Truncate, write, close: a burst of modify events and a close, one read.
    fs::write(&path, file_text("v2")).unwrap();
    source.sees("v2").await;
    source.stays_idle("v2").await;
    assert_eq!(source.reads(), 2);
}

#[tokio::test]
async fn a_write_seen_half_done_keeps_the_last_good_probes() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut source) = Source::on_plain_file(dir.path()).await;
    let text = file_text("v2-longer-than-half");
    let (first, rest) = text.split_at(text.len() - 8);
    let mut writer = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    writer.write_all(first.as_bytes()).unwrap();
    // The writer keeps the file open: after SETTLE_MAX the half is read, fails to parse, and
    // the last good value stays.
    let started = Instant::now();
    source.until_reads(2).await;
    assert!(
        started.elapsed() >= SETTLE_MAX / 2,
        "read before the write settled"
    );
    assert_eq!(source.views.borrow().annotation.as_deref(), Some("v1"));
    writer.write_all(rest.as_bytes()).unwrap();
    drop(writer);
    source.sees("v2-longer-than-half").await;
    source.stays_idle("v2-longer-than-half").await;
}

#[tokio::test]
async fn plain_file_in_a_busy_directory_is_not_read_for_its_neighbours() {
    let dir = tempfile::tempdir().unwrap();
    let (_, source) = Source::on_plain_file(dir.path()).await;
    let neighbour = dir.path().join("labels");
    let busy = tokio::task::spawn_blocking(move || {
        for i in 0..250 {
            fs::write(&neighbour, format!("n=\"{i}\"\n")).unwrap();
            fs::read(&neighbour).unwrap();
            std::thread::sleep(Duration::from_millis(4));
        }
    });
    source.stays_idle("v1").await;
    busy.await.unwrap();
    assert_eq!(source.reads(), 1);
}

#[tokio::test]
async fn deleted_then_recreated() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut source) = Source::on_plain_file(dir.path()).await;
    fs::remove_file(&path).unwrap();
    source.until_reads(2).await;
    assert_eq!(source.views.borrow().annotation.as_deref(), Some("v1"));
    let mut file = File::create(&path).unwrap();
    file.write_all(file_text("v2").as_bytes()).unwrap();
    drop(file);
    source.sees("v2").await;
    source.stays_idle("v2").await;
}

#[tokio::test]
async fn directory_missing_at_start_is_followed_once_it_appears() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("podinfo");
    let path = dir.join("annotations");
    let mut source = Source::start(&path);
    fs::create_dir(&dir).unwrap();
    fs::write(&path, file_text("v1")).unwrap();
    source.sees("v1").await;
    source.stays_idle("v1").await;
    // Watched now: a change is read without waiting for a poll to notice it.
    let reads = source.reads();
    fs::write(&path, file_text("v2")).unwrap();
    source.sees("v2").await;
    source.stays_idle("v2").await;
    assert_eq!(source.reads(), reads + 1);
}

/// A change no inotify event in the watched directory reports (the file is a link into
/// another directory, as on a filesystem without events): the poll sees its stamp change and
/// reads it once.
#[tokio::test]
async fn a_change_inotify_cannot_see_is_read_on_the_poll() {
    let root = tempfile::tempdir().unwrap();
    let elsewhere = root.path().join("elsewhere");
    let podinfo = root.path().join("podinfo");
    fs::create_dir(&elsewhere).unwrap();
    fs::create_dir(&podinfo).unwrap();
    fs::write(elsewhere.join("annotations"), file_text("v1")).unwrap();
    symlink(elsewhere.join("annotations"), podinfo.join("annotations")).unwrap();
    let mut source = Source::start(&podinfo.join("annotations"));
    source.sees("v1").await;
    source.stays_idle("v1").await;
    fs::write(elsewhere.join("annotations"), file_text("v2")).unwrap();
    source.sees("v2").await;
    source.stays_idle("v2").await;
    assert_eq!(source.reads(), 2);
}
