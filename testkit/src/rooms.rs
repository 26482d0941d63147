//! Which modules of a crate import which, read from its sources with `syn`: for the tests
//! that keep every import pointing down.
//!
//! A module and the modules inside it are one room: they may use each other freely. Between
//! sibling rooms (the children of one module, the crate's top-level modules included) the
//! imports must form no circle, at every floor; otherwise one of them imports back up.
//! Paths count wherever `syn` sees them (`use` items and paths in code, test modules
//! included); intra-doc links and macro bodies do not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

#[derive(Debug, thiserror::Error)]
pub enum RoomsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {source}")]
    Parse { path: PathBuf, source: syn::Error },
}

/// A module's path inside the crate (`[]`: the crate root).
type ModulePath = Vec<String>;

/// An import between two sibling rooms: the floor they are on, the two rooms, and a file that
/// imports (one of those that do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Circle {
    /// The module whose children the rooms are (`crate` for the top floor).
    pub floor: String,
    /// The rooms that import each other, round the circle.
    pub rooms: Vec<String>,
    /// For each import along the circle, one file that makes it.
    pub by: Vec<String>,
}

/// The circles among sibling rooms of the library crate whose root is `src/lib.rs`.
pub fn circles(src: &Path) -> Result<Vec<Circle>, RoomsError> {
    let files = module_files(src)?;
    let known: BTreeSet<&ModulePath> = files.keys().collect();
    // floor -> room -> room it imports -> a file that does.
    let mut floors: BTreeMap<ModulePath, BTreeMap<String, BTreeMap<String, String>>> =
        BTreeMap::new();
    for (module, file) in &files {
        let text = std::fs::read_to_string(file).map_err(|source| RoomsError::Read {
            path: file.clone(),
            source,
        })?;
        let syntax = syn::parse_file(&text).map_err(|source| RoomsError::Parse {
            path: file.clone(),
            source,
        })?;
        let mut paths = Paths {
            inline: Vec::new(),
            found: Vec::new(),
        };
        paths.visit_file(&syntax);
        for (inline, path) in paths.found {
            let mut from = module.clone();
            from.extend(inline);
            let Some(target) = resolve(&from, &path, &known) else {
                continue;
            };
            let shared = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if shared == module.len() || shared == target.len() {
                continue; // within one room: a module and its own children
            }
            let shown = file.strip_prefix(src).unwrap_or(file).display().to_string();
            let room = floors.entry(module[..shared].to_vec()).or_default();
            let imports = room.entry(module[shared].clone()).or_default();
            imports.entry(target[shared].clone()).or_insert(shown);
        }
    }
    Ok(floors
        .iter()
        .flat_map(|(floor, graph)| {
            let name = if floor.is_empty() {
                "crate".to_owned()
            } else {
                floor.join("::")
            };
            cycles(graph).into_iter().map(move |rooms| {
                let by = (0..rooms.len())
                    .map(|i| graph[&rooms[i]][&rooms[(i + 1) % rooms.len()]].clone())
                    .collect();
                Circle {
                    floor: name.clone(),
                    rooms,
                    by,
                }
            })
        })
        .collect())
}

/// Asserts that the library crate at `manifest_dir` (its `CARGO_MANIFEST_DIR`) has no
/// circle among sibling rooms, naming each circle and the files that close it.
pub fn assert_every_import_points_down(manifest_dir: &str) {
    let src = Path::new(manifest_dir).join("src");
    let found = circles(&src).unwrap_or_else(|e| panic!("{e}"));
    assert!(found.is_empty(), "modules importing back up: {found:#?}");
}

/// Every module file of the crate under `src` (not `main.rs` or `bin/`, which are crates of
/// their own), by module path.
fn module_files(src: &Path) -> Result<BTreeMap<ModulePath, PathBuf>, RoomsError> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let read = |source| RoomsError::Read {
            path: dir.clone(),
            source,
        };
        for entry in std::fs::read_dir(&dir).map_err(read)? {
            let path = entry.map_err(read)?.path();
            let relative = path.strip_prefix(src).unwrap_or(&path);
            if path.is_dir() {
                if relative != Path::new("bin") {
                    dirs.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let mut module: ModulePath = relative
                .with_extension("")
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            match module.last().map(String::as_str) {
                Some("main") if module.len() == 1 => continue,
                Some("lib") if module.len() == 1 => module.clear(),
                Some("mod") => {
                    module.pop();
                }
                _ => {}
            }
            files.insert(module, path);
        }
    }
    Ok(files)
}

/// The deepest module of the crate that `path`, seen from module `from`, names; `None` for
/// paths outside the crate.
fn resolve(from: &[String], path: &[String], known: &BTreeSet<&ModulePath>) -> Option<ModulePath> {
    let (mut base, rest): (ModulePath, &[String]) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "super" => {
            let mut base = from.to_vec();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        "self" => (from.to_vec(), &path[1..]),
        _ => return None,
    };
    let mut deepest = base.clone();
    for segment in rest {
        base.push(segment.clone());
        if known.contains(&base) {
            deepest = base.clone();
        } else {
            break;
        }
    }
    Some(deepest)
}

/// The paths of one file that start with `crate`, `super` or `self`, each with the inline
/// modules (`mod tests { .. }`) it sits in.
struct Paths {
    inline: Vec<String>,
    found: Vec<(Vec<String>, Vec<String>)>,
}

impl Paths {
    fn keep(&mut self, path: Vec<String>) {
        if path
            .first()
            .is_some_and(|s| matches!(s.as_str(), "crate" | "super" | "self"))
        {
            self.found.push((self.inline.clone(), path));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                path.push(n.ident.to_string());
                self.keep(path);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                self.keep(path);
            }
            syn::UseTree::Glob(_) => self.keep(prefix.clone()),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.inline.push(item.ident.to_string());
        syn::visit::visit_item_mod(self, item);
        self.inline.pop();
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.keep(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
}

/// The circles of `graph` (its strongly connected components of more than one room), each
/// as a walk round it.
fn cycles(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    let reaches = |from: &String, to: &String| {
        let mut seen = BTreeSet::from([from]);
        let mut todo = vec![from];
        while let Some(room) = todo.pop() {
            for next in graph.get(room).into_iter().flat_map(|g| g.keys()) {
                if next == to {
                    return true;
                }
                if seen.insert(next) {
                    todo.push(next);
                }
            }
        }
        false
    };
    let mut done = BTreeSet::new();
    let mut circles = Vec::new();
    for room in graph.keys() {
        if done.contains(room) || !reaches(room, room) {
            continue;
        }
        // A shortest walk back to `room`, breadth first.
        let mut back: BTreeMap<&String, &String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([room]);
        let mut walk = Vec::new();
        'search: while let Some(at) = queue.pop_front() {
            for next in graph.get(at).into_iter().flat_map(|g| g.keys()) {
                if next == room {
                    let mut step = at;
                    walk.push(step.clone());
                    while step != room {
                        step = back[step];
                        walk.push(step.clone());
                    }
                    walk.reverse();
                    break 'search;
                }
                if !back.contains_key(next) && next != room {
                    back.insert(next, at);
                    queue.push_back(next);
                }
            }
        }
        // One circle per component: its other rooms are reported with it.
        let component = graph
            .keys()
            .filter(|r| reaches(room, r) && reaches(r, room));
        done.extend(component.cloned());
        circles.push(walk);
    }
    circles
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (path, text) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    #[test]
    fn a_room_importing_back_up_is_a_circle_at_its_floor() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[
                ("lib.rs", "pub mod low; pub mod high; pub mod mid;"),
                ("low.rs", "pub const A: u8 = 1;"),
                ("mid.rs", "pub mod a; pub mod b;"),
                ("mid/a.rs", "use super::b::B; pub const X: u8 = B;"),
                ("mid/b.rs", "pub const B: u8 = crate::low::A;"),
                (
                    "high.rs",
                    "use crate::{low, mid::a::X}; fn f() -> u8 { low::A + X }",
                ),
            ],
        );
        assert_eq!(circles(dir.path()).unwrap(), []);

        // The lower room reaches up, in a test module: mid::b -> mid::a -> mid::b.
        write(
            dir.path(),
            &[(
                "mid/b.rs",
                "pub const B: u8 = crate::low::A;\n#[cfg(test)] mod t { use super::super::a::X; }",
            )],
        );
        let found = circles(dir.path()).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].floor, "mid");
        assert_eq!(found[0].rooms, ["a", "b"]);
        assert_eq!(found[0].by, ["mid/a.rs", "mid/b.rs"]);

        // And across the top floor, by a path in code: low -> high -> low (mid, which
        // imports low and is imported by high, is in the circle too).
        write(
            dir.path(),
            &[(
                "low.rs",
                "pub const A: u8 = 1; fn g() { let _ = crate::high::f; }",
            )],
        );
        let found = circles(dir.path()).unwrap();
        let top: Vec<_> = found.iter().filter(|c| c.floor == "crate").collect();
        assert_eq!(top.len(), 1, "{found:?}");
        assert_eq!(top[0].rooms, ["high", "low"]);
        assert_eq!(top[0].by, ["high.rs", "low.rs"]);
    }
}
