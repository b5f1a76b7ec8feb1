//! The pages that cite tests name real ones, and the README cites none. Every `module::test`
//! in a table of TESTING.md is a test function in `redlock/tests/<binary>/<module>.rs` (every
//! `module::tests::test` one in the module's file under `redlock/src/`, and every name in
//! parentheses after a `path.rs` in that file of the workspace), so a renamed or deleted
//! test cannot leave a promise unchecked. The README is the crate's page on crates.io,
//! where the tests are not shipped: it points to TESTING.md instead of naming tests.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The files where `module::test` may live: `redlock/tests/<binary>/<module>.rs` of each
/// test binary (a module name can appear in more than one binary).
fn test_files(module: &str) -> Vec<PathBuf> {
    let Ok(binaries) = std::fs::read_dir(root().join("tests")) else { return Vec::new() };
    binaries
        .filter_map(|entry| Some(entry.ok()?.path().join(format!("{module}.rs"))))
        .filter(|path| path.is_file())
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|_| panic!("no {}", path.display()))
}

#[test]
fn every_test_the_guarantees_table_cites_exists() {
    let testing = read(&root().join("../TESTING.md"));
    let mut cited = 0;
    for row in testing.lines().filter(|line| line.starts_with('|')) {
        let cells: Vec<&str> = row.split('`').collect();
        assert!(cells.len() % 2 == 1, "unbalanced backticks in TESTING.md: {row}");
        // Odd cells are the backticked ones.
        let mut i = 1;
        while i < cells.len() {
            let cell = cells[i];
            // `chaos/tests/fuzz.rs` (`name`, `name`): tests in that file.
            if cell.ends_with(".rs")
                && cell.contains('/')
                && cells.get(i + 1).is_some_and(|after| after.starts_with(" ("))
            {
                let source = read(&root().join("..").join(cell));
                let mut j = i + 2;
                while j < cells.len() {
                    let test = cells[j];
                    // A test function, or a module of compile-time checks.
                    let found = source.contains(&format!("fn {test}("))
                        || source.contains(&format!("mod {test} {{"));
                    assert!(found, "`{test}` is not in {cell}");
                    cited += 1;
                    if cells.get(j + 1).is_none_or(|after| after.contains(')')) {
                        break;
                    }
                    j += 2;
                }
                i = j + 2;
                continue;
            }
            i += 2;
            // A unit test: `engine::round::tests::name` is in redlock/src/engine/round.rs.
            if let Some((module, test)) = cell.split_once("::tests::") {
                let file = root().join("src").join(format!("{}.rs", module.replace("::", "/")));
                let source = read(&file);
                assert!(
                    source.contains(&format!("fn {test}(")),
                    "`{cell}` is not a unit test there"
                );
                cited += 1;
                continue;
            }
            let Some((file, test)) = cell.split_once("::") else { continue };
            if file.contains(' ') || test.contains(' ') || file == "redlock" {
                continue;
            }
            let paths = test_files(file);
            assert!(!paths.is_empty(), "`{file}::{test}`: no redlock/tests/<binary>/{file}.rs");
            assert!(
                paths.iter().any(|path| read(path).contains(&format!("fn {test}("))),
                "`{file}::{test}` is not a test in {paths:?}"
            );
            cited += 1;
        }
    }
    assert!(cited >= 30, "only {cited} tests cited: did the tables' format change?");
}

#[test]
fn the_readme_cites_no_test() {
    let readme = read(&root().join("../README.md"));
    let words = readme.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'));
    for word in words.filter(|word| word.contains("::")) {
        assert!(!word.contains("::tests::"), "the README cites the unit test `{word}`");
        let (file, rest) = word.split_once("::").unwrap();
        let test = rest.rsplit("::").next().unwrap();
        for path in test_files(file).into_iter().filter(|_| !test.is_empty()) {
            assert!(
                !read(&path).contains(&format!("fn {test}(")),
                "the README cites the test `{word}`: cite it in TESTING.md instead"
            );
        }
    }
}

/// The README is the front door: detail belongs in the crate docs, the guide and TESTING.md.
#[test]
fn the_readme_is_at_most_250_lines() {
    let lines = read(&root().join("../README.md")).lines().count();
    assert!(lines <= 250, "README.md has {lines} lines");
}
