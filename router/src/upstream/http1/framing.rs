//! A response body's framing (length, chunked, until close) and what the bytes read so
//! far give of it.

use bytes::Bytes;

use super::WireError;

/// What the bytes already read give of a body.
#[derive(Debug)]
pub enum Piece {
    /// Body bytes (never empty).
    Data(Bytes),
    /// The body has ended.
    End,
    /// More bytes must be read first.
    NeedMore,
}

/// The size of a chunk-size line (hex, any `;extension` ignored).
pub(super) fn chunk_size(line: &[u8]) -> Result<u64, WireError> {
    let digits = line
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let bad = WireError::Malformed("bad chunk size");
    if digits.is_empty() || digits.len() > 15 {
        return Err(bad);
    }
    let text = std::str::from_utf8(digits).map_err(|_| WireError::Malformed("bad chunk size"))?;
    u64::from_str_radix(text, 16).map_err(|_| bad)
}

/// How a response's body is framed, and where its reading stands.
#[derive(Debug)]
pub struct Framing {
    pub(super) state: State,
    /// Whether the connection can carry another request once the body has ended.
    pub keep_alive: bool,
    pub(super) trailer_bytes: usize,
}

impl Framing {
    /// The body has been read to its end.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done | State::Length(0))
    }

    /// The body ends when the worker closes the connection (no length, not chunked).
    pub fn runs_until_close(&self) -> bool {
        matches!(self.state, State::UntilClose)
    }

    /// The body's bytes still to come, when its framing says.
    pub fn exact_left(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum State {
    /// This many bytes left.
    Length(u64),
    /// A chunk-size line next.
    ChunkSize,
    /// This many bytes of the current chunk left.
    ChunkData(u64),
    /// The CRLF after a chunk's data next.
    ChunkEnd,
    /// Trailer lines, then an empty line.
    Trailers,
    /// Everything until the worker closes the connection.
    UntilClose,
    Done,
}
