//! Lines for people and scripts on stdout, from the evaluation and benchmark commands.

/// Prints one line to stdout. A closed pipe (`| head`) is not an error worth a panic: the
/// line is dropped.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}
