//! Every crate's modules form a layered graph: when one module uses another's items, the other
//! never uses the first's back, directly or around a loop. A cycle means two modules that can only
//! be understood together; the layering is what lets a newcomer read the code bottom up.
//!
//! The graph is read from the sources with `syn`: every `use` and every path that starts with
//! `crate`, `super` or `self`, in code that is not a test. A module's own submodules and its
//! ancestors do not count: a parent and its children are one unit. Paths inside macro calls are
//! not seen.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};
use syn::visit::Visit;

/// The crates whose graphs are checked, by directory.
const CRATES: &[&str] = &[
    "proto",
    "telemetry",
    "dataplane",
    "node-agent",
    "controller",
    "tests",
    "bench",
];

type Module = Vec<String>;

#[test]
fn no_crate_has_a_module_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (mut found, mut modules) = (Vec::new(), 0);
    for krate in CRATES {
        let graph = Graph::read(&root.join(krate).join("src"));
        modules += graph.edges.len();
        for cycle in graph.cycles() {
            found.push(format!("{krate}: {}", graph.describe(&cycle)));
        }
    }
    assert!(
        modules > 100,
        "only {modules} modules read: is the layout what this test expects?"
    );
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

#[test]
fn a_cycle_is_found_and_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |path: &str, text: &str| fs::write(dir.path().join(path), text).expect("write");
    write("lib.rs", "mod a; mod b; mod c;");
    write("a.rs", "use crate::b::B; pub struct A(B);");
    write("b.rs", "pub struct B(crate::c::C);");
    write(
        "c.rs",
        "pub struct C(Box<super::a::A>);\n#[cfg(test)]\nmod tests { use crate::a::A; }",
    );
    let graph = Graph::read(dir.path());
    let cycles = graph.cycles();
    assert_eq!(
        cycles,
        [BTreeSet::from([module("a"), module("b"), module("c")])]
    );
    let text = graph.describe(&cycles[0]);
    assert!(text.contains("a -> b") && text.contains("c -> a"), "{text}");

    // Cut one edge and the rest is a line, not a loop; a test module's use does not count.
    write(
        "c.rs",
        "pub struct C;\n#[cfg(test)]\nmod tests { use crate::a::A; }",
    );
    assert!(Graph::read(dir.path()).cycles().is_empty());
}

fn module(path: &str) -> Module {
    path.split("::").map(str::to_owned).collect()
}

/// Which module uses which.
struct Graph {
    edges: BTreeMap<Module, BTreeSet<Module>>,
}

impl Graph {
    /// The graph of the crate whose sources are under `src`.
    fn read(src: &Path) -> Self {
        let files = module_files(src);
        let known: BTreeSet<Module> = files.keys().cloned().collect();
        let mut edges = BTreeMap::new();
        for (module, file) in &files {
            let text = fs::read_to_string(file).expect("read a source file");
            let parsed =
                syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let mut uses = Uses {
                known: &known,
                from: module,
                scope: module.clone(),
                found: BTreeSet::new(),
            };
            for item in parsed.items.iter().filter(|item| !is_test(item)) {
                uses.visit_item(item);
            }
            edges.insert(module.clone(), uses.found);
        }
        Self { edges }
    }

    /// The strongly connected groups of more than one module (Tarjan's algorithm).
    fn cycles(&self) -> Vec<BTreeSet<Module>> {
        struct Walk<'g> {
            graph: &'g Graph,
            next: usize,
            index: BTreeMap<&'g Module, (usize, usize)>,
            stack: Vec<&'g Module>,
            cycles: Vec<BTreeSet<Module>>,
        }
        impl<'g> Walk<'g> {
            fn visit(&mut self, module: &'g Module) -> usize {
                let own = self.next;
                self.next += 1;
                self.index.insert(module, (own, own));
                self.stack.push(module);
                let mut low = own;
                for used in self.graph.edges.get(module).into_iter().flatten() {
                    low = low.min(match self.index.get(used) {
                        None => self.visit(used),
                        Some(&(at, _)) if self.stack.contains(&used) => at,
                        Some(_) => continue,
                    });
                }
                self.index.insert(module, (own, low));
                if low == own {
                    let at = self.stack.iter().rposition(|m| *m == module).unwrap_or(0);
                    let group: BTreeSet<Module> =
                        self.stack.drain(at..).map(|m| m.to_owned()).collect();
                    if group.len() > 1 {
                        self.cycles.push(group);
                    }
                }
                low
            }
        }
        let mut walk = Walk {
            graph: self,
            next: 0,
            index: BTreeMap::new(),
            stack: Vec::new(),
            cycles: Vec::new(),
        };
        for module in self.edges.keys() {
            if !walk.index.contains_key(module) {
                walk.visit(module);
            }
        }
        walk.cycles
    }

    /// The uses inside `group`, one per line.
    fn describe(&self, group: &BTreeSet<Module>) -> String {
        let mut lines = Vec::new();
        for from in group {
            for to in self.edges.get(from).into_iter().flatten() {
                if group.contains(to) {
                    lines.push(format!("{} -> {}", from.join("::"), to.join("::")));
                }
            }
        }
        lines.join(", ")
    }
}

/// Each module of the crate under `src` and its file, without test modules (`tests.rs` and what
/// is under a `tests` directory) and without the separate crates under `src/bin`.
fn module_files(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![src.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("read a source directory") {
            let path = entry.expect("a directory entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if path.is_dir() {
                if name != "tests" && !(dir == src && name == "bin") {
                    dirs.push(path);
                }
                continue;
            }
            let Some(stem) = name.strip_suffix(".rs") else {
                continue;
            };
            if stem == "tests" {
                continue;
            }
            let relative = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut module: Module = relative
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            if matches!(stem, "lib" | "main" | "mod") {
                module.pop();
            }
            files.insert(module, path);
        }
    }
    files
}

/// Whether `item` is built only for tests.
fn is_test(item: &syn::Item) -> bool {
    let attrs = match item {
        syn::Item::Mod(item) => &item.attrs,
        syn::Item::Fn(item) => &item.attrs,
        syn::Item::Impl(item) => &item.attrs,
        syn::Item::Use(item) => &item.attrs,
        syn::Item::Struct(item) => &item.attrs,
        syn::Item::Enum(item) => &item.attrs,
        syn::Item::Const(item) => &item.attrs,
        _ => return false,
    };
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|meta| meta.path().is_ident("test"))
    })
}

/// The modules one file's code uses.
struct Uses<'a> {
    known: &'a BTreeSet<Module>,
    /// The file's module, the user.
    from: &'a Module,
    /// The module the code being read is in: the file's, or an inline module inside it.
    scope: Module,
    found: BTreeSet<Module>,
}

impl Uses<'_> {
    /// Records the module `path` names, when it names one of this crate's other than the user,
    /// its ancestors and its descendants.
    fn record(&mut self, path: &[String]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let mut absolute = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.scope.clone(),
            "super" => self.scope[..self.scope.len().saturating_sub(1)].to_vec(),
            _ => return,
        };
        let mut rest = rest.iter().peekable();
        while rest.next_if(|part| *part == "super").is_some() {
            absolute.pop();
        }
        absolute.extend(rest.cloned());
        let Some(target) = (1..=absolute.len())
            .rev()
            .map(|len| &absolute[..len])
            .find(|prefix| self.known.contains(*prefix))
        else {
            return;
        };
        let related = target.starts_with(self.from) || self.from.starts_with(target);
        if !related {
            self.found.insert(target.to_vec());
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => self.record_with(prefix, &name.ident),
            syn::UseTree::Rename(rename) => self.record_with(prefix, &rename.ident),
            syn::UseTree::Glob(_) => self.record(&prefix.clone()),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    fn record_with(&mut self, prefix: &[String], last: &syn::Ident) {
        let mut path = prefix.to_vec();
        path.push(last.to_string());
        self.record(&path);
    }
}

impl<'ast> Visit<'ast> for Uses<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test(item) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.scope.push(item.ident.to_string());
        syn::visit::visit_item_mod(self, item);
        self.scope.pop();
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let parts: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.record(&parts);
        syn::visit::visit_path(self, path);
    }
}
