//! The README's guarantees table names real tests: every `file::test` it cites is a test
//! function in `redlock/tests/<file>.rs` (and every `module::tests::test` one in the
//! module's file under `redlock/src/`), so a renamed or deleted test cannot leave a promise
//! unchecked.

use std::path::Path;

#[test]
fn every_test_the_guarantees_table_cites_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../README.md")).unwrap();
    let start = readme.find("## Guarantees, and the tests that check them").expect("the section");
    let section = &readme[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |end| end + 3)];
    let mut cited = 0;
    for cell in section.split('`') {
        // A unit test: `engine::round::tests::name` is in redlock/src/engine/round.rs.
        if let Some((module, test)) = cell.split_once("::tests::") {
            let file = root.join("src").join(format!("{}.rs", module.replace("::", "/")));
            let source = std::fs::read_to_string(&file)
                .unwrap_or_else(|_| panic!("`{cell}`: no {}", file.display()));
            assert!(source.contains(&format!("fn {test}(")), "`{cell}` is not a unit test there");
            cited += 1;
            continue;
        }
        let Some((file, test)) = cell.split_once("::") else { continue };
        if file.contains(' ') || test.contains(' ') || file == "redlock" {
            continue;
        }
        let source = std::fs::read_to_string(root.join("tests").join(format!("{file}.rs")))
            .unwrap_or_else(|_| panic!("`{file}::{test}`: no redlock/tests/{file}.rs"));
        assert!(
            source.contains(&format!("fn {test}(")),
            "`{file}::{test}` is not a test in {file}.rs"
        );
        cited += 1;
    }
    assert!(cited >= 30, "only {cited} tests cited: did the table's format change?");
}
