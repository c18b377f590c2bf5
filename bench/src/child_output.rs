//! Reading a benchmarked child process's stdout: the servers `bench` starts print the
//! address they listen on, and the rest of their output must keep draining.

use std::io::{BufRead, BufReader};

/// The first word after `marker` in a child's stdout (`None`: it closed first); the rest
/// of the stream is drained on a thread so the child never blocks on a full pipe.
pub fn url_after(out: std::process::ChildStdout, marker: &str) -> anyhow::Result<Option<String>> {
    let mut lines = BufReader::new(out).lines();
    while let Some(line) = lines.next().transpose()? {
        if let Some(rest) = line.split(marker).nth(1) {
            let url = rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            std::thread::spawn(move || lines.for_each(drop));
            return Ok(Some(url));
        }
    }
    Ok(None)
}
