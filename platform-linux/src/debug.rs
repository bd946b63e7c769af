//! Debugging helpers: a hex diff of buffers that should be equal.

use std::fmt::Write;

/// Describes where `actual` differs from `expected`: the first differing offset, the number
/// of differing bytes, and up to `max_rows` 16-byte rows of both around the differences.
/// Returns `None` when they are equal.
pub fn hex_diff(expected: &[u8], actual: &[u8], max_rows: usize) -> Option<String> {
    if expected == actual {
        return None;
    }
    let mut out = String::new();
    if expected.len() != actual.len() {
        let _ = writeln!(
            out,
            "length differs: expected {} bytes, got {}",
            expected.len(),
            actual.len()
        );
    }
    let n = expected.len().min(actual.len());
    let diffs = (0..n).filter(|&i| expected[i] != actual[i]).count();
    let first = (0..n).find(|&i| expected[i] != actual[i]);
    if let Some(first) = first {
        let _ = writeln!(
            out,
            "{diffs} of {n} bytes differ; first at offset {first:#x}"
        );
    }
    let mut rows = 0;
    let mut row = first.map(|f| f / 16 * 16).unwrap_or(n / 16 * 16);
    while row < n.max(expected.len()).max(actual.len()) && rows < max_rows {
        let end = row + 16;
        let e = expected.get(row..end.min(expected.len())).unwrap_or(&[]);
        let a = actual.get(row..end.min(actual.len())).unwrap_or(&[]);
        if e != a {
            let _ = write!(out, "{row:08x}  exp ");
            for b in e {
                let _ = write!(out, "{b:02x} ");
            }
            let _ = write!(out, "\n          got ");
            for (i, b) in a.iter().enumerate() {
                let mark = if e.get(i) != Some(b) { "*" } else { " " };
                let _ = write!(out, "{b:02x}{mark}");
            }
            out.push('\n');
            rows += 1;
        }
        row = end;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_buffers_have_no_diff() {
        assert_eq!(hex_diff(&[1, 2, 3], &[1, 2, 3], 4), None);
    }

    #[test]
    fn diff_names_offset_count_and_marks_bytes() {
        let e = vec![0u8; 64];
        let mut a = e.clone();
        a[0x21] = 0xAB;
        a[0x30] = 1;
        let d = hex_diff(&e, &a, 8).unwrap();
        assert!(
            d.contains("2 of 64 bytes differ; first at offset 0x21"),
            "{d}"
        );
        assert!(d.contains("ab*"), "{d}");
        assert!(d.contains("00000030"), "{d}");
        let d = hex_diff(&e, &a[..10], 8).unwrap();
        assert!(d.contains("length differs"), "{d}");
    }
}
