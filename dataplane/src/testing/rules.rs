//! Comparing rendered rule text: a failure shows a line diff, not two walls of text.

/// Fails with a line diff (`-` expected, `+` actual) when the payloads differ.
#[track_caller]
pub(crate) fn assert_rules_eq(actual: &str, expected: &str) {
    if actual != expected {
        panic!(
            "rules differ (-expected +actual):\n{}",
            line_diff(expected, actual)
        );
    }
}

/// A longest-common-subsequence line diff, good enough for a few hundred lines.
fn line_diff(old: &str, new: &str) -> String {
    let old: Vec<&str> = old.lines().collect();
    let new: Vec<&str> = new.lines().collect();
    let mut lcs = vec![vec![0usize; new.len() + 1]; old.len() + 1];
    for i in (0..old.len()).rev() {
        for j in (0..new.len()).rev() {
            lcs[i][j] = if old[i] == new[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < old.len() || j < new.len() {
        if i < old.len() && j < new.len() && old[i] == new[j] {
            out += &format!("  {}\n", old[i]);
            (i, j) = (i + 1, j + 1);
        } else if j < new.len() && (i == old.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out += &format!("+ {}\n", new[j]);
            j += 1;
        } else {
            out += &format!("- {}\n", old[i]);
            i += 1;
        }
    }
    out
}
