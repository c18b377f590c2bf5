//! Test helpers: a unique temp path per test, and a hand-rolled PNG header check.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh path under the system temp dir, unique per process and call.
pub(super) fn temp_png(name: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir()
        .join(format!("ownerserve-plot-{}-{n}", std::process::id()))
        .join(format!("{name}.png"))
}

/// Reads the file, checks the PNG signature and that IHDR comes first, and returns the
/// image's (width, height). Panics with a message on anything else.
pub(super) fn png_size(path: &std::path::Path) -> (u32, u32) {
    const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
    let bytes = std::fs::read(path).expect("png was written");
    assert!(
        bytes.len() > 33,
        "file too short for a PNG: {}",
        bytes.len()
    );
    assert_eq!(bytes[..8], SIGNATURE, "not a PNG signature");
    // Chunk layout: 4-byte big-endian length, 4-byte type, data. IHDR must be first, 13 bytes.
    assert_eq!(bytes[8..12], 13u32.to_be_bytes(), "IHDR length");
    assert_eq!(&bytes[12..16], b"IHDR", "first chunk is IHDR");
    let be =
        |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    (be(16), be(20))
}

/// Removes the test's temp directory; failures are ignored (the OS cleans temp anyway).
pub(super) fn remove(path: &std::path::Path) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}
