//! Reader for the Azure LLM inference CSV traces (`TIMESTAMP,ContextTokens,GeneratedTokens`):
//! arrivals and lengths only, no prefix or session data.

use std::path::Path;

use super::error::{LineProblem, WorkloadError};
use super::jsonl::{line_error, read_text};

const HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens";

/// One request of the Azure trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AzureRequest {
    /// Arrival, ms after the first row's.
    pub at_ms: f64,
    /// Prompt length, tokens.
    pub context_tokens: u32,
    /// Output length, tokens.
    pub generated_tokens: u32,
}

/// Reads an Azure CSV trace into requests in file order, times relative to the first row.
pub fn read_arrivals(path: impl AsRef<Path>) -> Result<Vec<AzureRequest>, WorkloadError> {
    let path = path.as_ref();
    parse_arrivals(&read_text(path)?, path)
}

/// Parses the text of an Azure CSV trace; `path` is only used in errors.
pub fn parse_arrivals(text: &str, path: &Path) -> Result<Vec<AzureRequest>, WorkloadError> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.trim().trim_start_matches('\u{feff}') == HEADER => {}
        _ => {
            let problem = LineProblem::Header { expected: HEADER };
            return Err(line_error(path, 1, problem));
        }
    }
    let mut out = Vec::new();
    let mut origin: Option<(i64, f64)> = None;
    for (i, line) in lines {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |problem| line_error(path, i + 1, problem);
        let fields: Vec<&str> = line.split(',').collect();
        let [ts, ctx, generated] = fields.as_slice() else {
            return Err(bad(LineProblem::FieldCount {
                expected: 3,
                found: fields.len(),
            }));
        };
        let (secs, frac_ms) =
            parse_timestamp(ts.trim()).ok_or_else(|| bad(LineProblem::Timestamp))?;
        let context_tokens = ctx.trim().parse().map_err(|_| {
            bad(LineProblem::Number {
                field: "ContextTokens",
            })
        })?;
        let generated_tokens = generated.trim().parse().map_err(|_| {
            bad(LineProblem::Number {
                field: "GeneratedTokens",
            })
        })?;
        let (secs0, frac0) = *origin.get_or_insert((secs, frac_ms));
        let at_ms = (secs - secs0) as f64 * 1000.0 + (frac_ms - frac0);
        out.push(AzureRequest {
            at_ms,
            context_tokens,
            generated_tokens,
        });
    }
    if out.is_empty() {
        return Err(WorkloadError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(out)
}

/// `YYYY-MM-DD HH:MM:SS[.fraction]` to (whole seconds since 1970, fraction in ms).
fn parse_timestamp(s: &str) -> Option<(i64, f64)> {
    let (date, time) = s.split_once(' ')?;
    let mut d = date.split('-');
    let (y, m, day) = (num(d.next()?)?, num(d.next()?)?, num(d.next()?)?);
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let (hms, frac) = match time.split_once('.') {
        Some((hms, frac)) => (hms, Some(frac)),
        None => (time, None),
    };
    let mut t = hms.split(':');
    let (hh, mm, ss) = (num(t.next()?)?, num(t.next()?)?, num(t.next()?)?);
    if t.next().is_some() || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let frac_ms = match frac {
        Some(f) if !f.is_empty() && f.len() <= 12 && f.bytes().all(|b| b.is_ascii_digit()) => {
            format!("0.{f}").parse::<f64>().ok()? * 1000.0
        }
        Some(_) => return None,
        None => 0.0,
    };
    let secs = days_from_civil(y, m, day) * 86_400 + hh * 3600 + mm * 60 + ss;
    Some((secs, frac_ms))
}

/// A field of digits only (no sign), at most 4 digits: enough for any date part.
fn num(s: &str) -> Option<i64> {
    if s.is_empty() || s.len() > 4 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/traces/azure_llm_inference_trace_code_2023.csv"
    );

    #[test]
    fn shipped_trace_has_8819_rows_over_an_hour() {
        let rows = read_arrivals(TRACE).expect("read azure");
        assert_eq!(rows.len(), 8819);
        let first = rows.first().expect("rows");
        assert_eq!(
            (first.at_ms, first.context_tokens, first.generated_tokens),
            (0.0, 4808, 10)
        );
        // Second row: 18:17:04.0319600 - 18:17:03.9799600 = 52 ms.
        let second = rows.get(1).expect("rows");
        assert!((second.at_ms - 52.0).abs() < 1e-6, "{}", second.at_ms);
        let last = rows.last().expect("rows");
        assert!((last.at_ms / 1000.0 - 3436.0).abs() < 1.0, "{}", last.at_ms);
        assert!(rows.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    }

    #[test]
    fn timestamps_cross_midnight_and_month_ends() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-02-28 23:59:59.5,1,1\n\
                    2023-03-01 00:00:00,2,2\n\
                    2024-03-01 00:00:00.25,3,3\n";
        let rows = parse_arrivals(text, Path::new("a.csv")).expect("parse");
        let at: Vec<f64> = rows.iter().map(|r| r.at_ms).collect();
        let year_ms = 366.0 * 86_400_000.0; // 2024 is a leap year
        assert_eq!(at, vec![0.0, 500.0, 500.0 + year_ms + 250.0]);
    }

    #[test]
    fn bad_lines_name_the_line() {
        let good = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n";
        let bad_rows = [
            "2023-11-16 18:17:04,4808",
            "2023-11-16T18:17:04,1,1",
            "2023-13-16 18:17:04,1,1",
            "2023-11-16 18:17:04.x,1,1",
            "2023-11-16 18:17:04,-1,1",
            "2023-11-16 18:17:04,1,99999999999",
            "2023-11-16 25:17:04,1,1",
            "\u{1F600},,",
        ];
        for row in bad_rows {
            let text = format!("{good}{row}\n");
            let err = parse_arrivals(&text, Path::new("a.csv")).expect_err(row);
            assert_eq!(err.line(), Some(3), "{row}: {err}");
            assert!(err.to_string().contains("a.csv:3"), "{err}");
        }
        let err = parse_arrivals("a,b,c\n", Path::new("a.csv")).expect_err("header");
        assert_eq!(err.line(), Some(1));
        assert!(matches!(
            parse_arrivals(HEADER, Path::new("a.csv")),
            Err(WorkloadError::Empty { .. })
        ));
    }
}
