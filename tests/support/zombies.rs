//! Zombie accounting for tests of podprobe's process reaper.

/// Pids of zombie children of this process.
#[allow(dead_code)]
pub fn zombie_children() -> Vec<i32> {
    zombie_children_of(std::process::id() as i32)
}

/// Pids of zombie children of `me` (state `Z` in `/proc/<pid>/stat`, parent = `me`).
/// `comm` may contain spaces and parentheses, so fields are read after the last `)`.
pub fn zombie_children_of(me: i32) -> Vec<i32> {
    let mut zombies = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let ppid: i32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if state == Some("Z") && ppid == me {
            zombies.push(pid);
        }
    }
    zombies
}
