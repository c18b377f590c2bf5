//! HTTP/1.1 to a worker, written by hand: a request goes out as one vectored write (head
//! and body), the response head is parsed with `httparse`, and the body is read from the
//! socket by whoever polls it (the relay, in the client's own task), with its framing
//! (length, chunked, until close) undone here (`http1/framing.rs`).
//!
//! Why not hyper's client connection: it runs each connection in a task of its own, so
//! every response crosses a channel and wakes a second task, and its dispatcher costs
//! ~5 µs of CPU per request more than this path (measured: 990 sequential 2 KB POSTs per
//! connection to an nginx backend, 19.4 against 13.9–14.6 µs). The router only ever sends
//! a complete body it already holds and reads one response per request, so the general
//! machinery (pipelining, request streaming, upgrades) buys it nothing.

use std::io::{self, IoSlice, Write as _};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};
use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use framing::{chunk_size, State};
pub use framing::{Framing, Piece};

/// Most bytes of a response head (status line and headers).
const MAX_HEAD: usize = 64 * 1024;
/// Most headers in a response head.
const MAX_HEADERS: usize = 100;
/// Most bytes of a chunk-size line or of all trailers together.
const MAX_LINE: usize = 8 * 1024;
/// How much room a read asks for when less than [`MIN_ROOM`] is left.
const READ_SIZE: usize = 16 * 1024;
/// The least room a read is given (a smaller read would split a response needlessly).
const MIN_ROOM: usize = 4 * 1024;

/// Why a request or its response failed on the wire.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The connection closed (or was reset) before any byte of the response: the worker
    /// read nothing it answered, so the request may be sent again on another connection.
    #[error("the connection closed before the response began")]
    ClosedBeforeAnswer,
    /// Reading or writing the socket failed after the response began.
    #[error("the connection failed: {0}")]
    Io(#[from] io::Error),
    /// The worker's bytes are not an HTTP/1.1 response the router can read.
    #[error("not an HTTP/1.1 response: {0}")]
    Malformed(&'static str),
}

/// One open connection to a worker, with the bytes read from it but not yet used.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    read: Received,
}

/// The bytes read from a worker and not yet used, and what they say: the half of the wire
/// that does no IO, fed from the socket by [`Conn`] (and from memory by `ownerserve fuzz`).
/// Bounded: a head over 64 KB or a line over 8 KB is an error, and body bytes leave as
/// they are framed.
#[derive(Debug, Default)]
pub struct Received {
    buf: BytesMut,
}

/// A response's status, version and headers.
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
}

impl Conn {
    pub fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            read: Received::default(),
        }
    }

    /// True when an idle connection can take a request: the worker has not closed it and
    /// sent nothing since its last response. Costs no system call while the socket has had
    /// no event since it was last read to empty.
    pub fn still_open(&mut self) -> bool {
        if !self.read.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        match self.stream.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            // Readable: an end of stream, an error or stray bytes all retire it; only a
            // stale readiness (nothing there) leaves it usable.
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// Writes a request: `head` (from [`write_head`]) then `body`, in as few writes as the
    /// socket takes.
    pub async fn write_request(&mut self, head: &[u8], body: &[u8]) -> Result<(), WireError> {
        let (mut h, mut b) = (0, 0);
        while h < head.len() || b < body.len() {
            let parts = [IoSlice::new(&head[h..]), IoSlice::new(&body[b..])];
            let n = self
                .stream
                .write_vectored(&parts)
                .await
                .map_err(closed_or_io)?;
            if n == 0 {
                return Err(WireError::ClosedBeforeAnswer);
            }
            let into_head = n.min(head.len() - h);
            h += into_head;
            b += n - into_head;
        }
        Ok(())
    }

    /// Reads the response head (skipping any `100 Continue`) and the body's framing for a
    /// request made with `method`.
    pub async fn read_head(&mut self, method: &Method) -> Result<(Head, Framing), WireError> {
        let mut answered = false;
        loop {
            if let Some(parsed) = self.read.head(method)? {
                return Ok(parsed);
            }
            let n = std::future::poll_fn(|cx| self.poll_fill(cx))
                .await
                .map_err(|e| {
                    if answered {
                        WireError::Io(e)
                    } else {
                        closed_or_io(e)
                    }
                })?;
            if n == 0 {
                return Err(if answered || !self.read.buf.is_empty() {
                    WireError::Malformed("connection closed inside the response head")
                } else {
                    WireError::ClosedBeforeAnswer
                });
            }
            answered = true;
        }
    }

    /// Reads what the socket has into `read`; `Ok(0)` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let buf = &mut self.read.buf;
        if buf.capacity() - buf.len() < MIN_ROOM {
            buf.reserve(READ_SIZE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, buf)
    }

    /// The next piece of a body framed by `framing`: `None` at its end.
    pub fn poll_body(
        &mut self,
        framing: &mut Framing,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, WireError>>> {
        loop {
            match self.read.piece(framing) {
                Err(e) => return Poll::Ready(Some(Err(e))),
                Ok(Piece::Data(data)) => return Poll::Ready(Some(Ok(data))),
                Ok(Piece::End) => return Poll::Ready(None),
                Ok(Piece::NeedMore) => {}
            }
            match self.poll_fill(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(WireError::Io(e)))),
                Poll::Ready(Ok(0)) if framing.runs_until_close() => {
                    framing.state = State::Done;
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Some(Err(WireError::Malformed(
                        "connection closed inside the body",
                    ))))
                }
                Poll::Ready(Ok(_)) => {}
            }
        }
    }
}

impl Received {
    /// Appends bytes read from the worker.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The response head at the front of what was read, if it is all there (1xx heads are
    /// dropped), and its body's framing for a request made with `method`.
    pub fn head(&mut self, method: &Method) -> Result<Option<(Head, Framing)>, WireError> {
        loop {
            let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut resp = httparse::Response::new(&mut slots);
            let len = match resp.parse(&self.buf) {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) if self.buf.len() >= MAX_HEAD => {
                    return Err(WireError::Malformed("response head too large"))
                }
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(WireError::Malformed("too many headers"))
                }
                Err(_) => return Err(WireError::Malformed("bad response head")),
            };
            let code = resp.code.ok_or(WireError::Malformed("no status"))?;
            let status =
                StatusCode::from_u16(code).map_err(|_| WireError::Malformed("bad status"))?;
            if status.is_informational() {
                if status == StatusCode::SWITCHING_PROTOCOLS {
                    return Err(WireError::Malformed(
                        "an upgrade the router never asked for",
                    ));
                }
                self.buf.advance(len);
                continue;
            }
            let version = if resp.version == Some(0) {
                Version::HTTP_10
            } else {
                Version::HTTP_11
            };
            let empty = *method == Method::HEAD
                || status == StatusCode::NO_CONTENT
                || status == StatusCode::NOT_MODIFIED;
            let (headers, framing) = read_headers(resp.headers, version, empty)?;
            self.buf.advance(len);
            let head = Head {
                status,
                version,
                headers,
            };
            return Ok(Some((head, framing)));
        }
    }

    /// What the bytes read so far give of a body framed by `framing`, reading nothing.
    pub fn piece(&mut self, framing: &mut Framing) -> Result<Piece, WireError> {
        loop {
            match framing.state {
                State::Done => return Ok(Piece::End),
                State::Length(0) => {
                    framing.state = State::Done;
                    return Ok(Piece::End);
                }
                State::Length(left) | State::ChunkData(left) if !self.buf.is_empty() => {
                    let take = (self.buf.len() as u64).min(left);
                    let data = self.buf.split_to(take as usize).freeze();
                    framing.state = match framing.state {
                        State::ChunkData(_) if take == left => State::ChunkEnd,
                        State::ChunkData(_) => State::ChunkData(left - take),
                        _ => State::Length(left - take),
                    };
                    return Ok(Piece::Data(data));
                }
                State::UntilClose if !self.buf.is_empty() => {
                    return Ok(Piece::Data(self.buf.split().freeze()));
                }
                State::ChunkSize => match self.take_line()? {
                    Some(line) => {
                        framing.state = match chunk_size(&line)? {
                            0 => State::Trailers,
                            n => State::ChunkData(n),
                        };
                    }
                    None => return Ok(Piece::NeedMore),
                },
                State::ChunkEnd if self.buf.len() >= 2 => {
                    if &self.buf[..2] != b"\r\n" {
                        return Err(WireError::Malformed("chunk not ended by CRLF"));
                    }
                    self.buf.advance(2);
                    framing.state = State::ChunkSize;
                }
                // Trailers are read and dropped; an empty line ends the body.
                State::Trailers => match self.take_line()? {
                    Some(line) if line.is_empty() => {
                        framing.state = State::Done;
                        return Ok(Piece::End);
                    }
                    Some(line) => {
                        framing.trailer_bytes += line.len();
                        if framing.trailer_bytes > MAX_LINE {
                            return Err(WireError::Malformed("trailers too large"));
                        }
                    }
                    None => return Ok(Piece::NeedMore),
                },
                _ => return Ok(Piece::NeedMore),
            }
        }
    }

    /// A whole CRLF-ended line from the front of what was read, without its CRLF; `None`
    /// until it is all there.
    fn take_line(&mut self) -> Result<Option<BytesMut>, WireError> {
        match self.buf.windows(2).position(|w| w == b"\r\n") {
            Some(end) => {
                let line = self.buf.split_to(end);
                self.buf.advance(2);
                Ok(Some(line))
            }
            None if self.buf.len() > MAX_LINE => Err(WireError::Malformed("line too long")),
            None => Ok(None),
        }
    }
}

/// A response's headers, and its body's framing as they set it (none when `empty`, else
/// length, chunked or until close; kept alive unless they or an HTTP/1.0 answer say
/// otherwise).
fn read_headers(
    raw: &[httparse::Header<'_>],
    version: Version,
    empty: bool,
) -> Result<(HeaderMap, Framing), WireError> {
    let mut headers = HeaderMap::with_capacity(raw.len());
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut keep_alive = version == Version::HTTP_11;
    for h in raw {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| WireError::Malformed("bad header name"))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|_| WireError::Malformed("bad header value"))?;
        if name == header::CONTENT_LENGTH {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or(WireError::Malformed("bad content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(WireError::Malformed("conflicting content-lengths"));
            }
            length = Some(n);
        } else if name == header::TRANSFER_ENCODING {
            // Chunked must be the last coding; an engine applies no other, and a body the
            // router cannot frame is refused.
            let last = h.value.rsplit(|b| *b == b',').next().unwrap_or_default();
            if !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return Err(WireError::Malformed("unknown transfer-encoding"));
            }
            chunked = true;
        } else if name == header::CONNECTION {
            for token in h.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                }
            }
        }
        headers.append(name, value);
    }
    let state = match (chunked, length) {
        _ if empty => State::Done,
        (true, _) => State::ChunkSize,
        (false, Some(n)) => State::Length(n),
        (false, None) => {
            keep_alive = false;
            State::UntilClose
        }
    };
    let framing = Framing {
        state,
        keep_alive,
        trailer_bytes: 0,
    };
    Ok((headers, framing))
}

/// Writes a request head into `out`: the request line, `headers` (which must hold `host`)
/// and, for a method that carries a body, its `content-length`.
pub fn write_head(
    out: &mut Vec<u8>,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body_len: usize,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if body_len > 0 || !matches!(*method, Method::GET | Method::HEAD) {
        // Writing into a Vec cannot fail.
        let _ = write!(out, "content-length: {body_len}\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A failed read or write before any answer: a closed or reset connection means the
/// worker took nothing from it.
fn closed_or_io(e: io::Error) -> WireError {
    use io::ErrorKind::*;
    match e.kind() {
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => {
            WireError::ClosedBeforeAnswer
        }
        _ => WireError::Io(e),
    }
}

mod framing;
#[cfg(test)]
mod tests;
