//! `worker-http`: a worker's HTTP/1.1 response, arriving in pieces, through the router's
//! own reader (`upstream::http1::Received`): no body holds more bytes than came in, and
//! every input ends framed or refused.

use ownerserve_bench::fuzz::{Target, Verdict};
use ownerserve_router::upstream::http1::{Piece, Received};

use super::tokens;

/// A worker's response as read from its socket: the input's first byte sets the size of
/// the pieces the rest arrives in (1–31 bytes), the rest is the bytes. Accepted when the
/// head parses and the body ends by its framing (or at the input's end, for a body that
/// runs until close).
pub(super) fn target() -> Target {
    let seeds: [&[u8]; 5] = [
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}",
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\nf\r\ndata: {\"a\":1}\n\n\r\ne;x=1\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\n\r\nuntil the worker closes",
        b"HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n",
    ];
    let dictionary = tokens(&[
        "\r\n",
        "HTTP/1.1 ",
        "HTTP/1.0 ",
        "content-length: ",
        "transfer-encoding: chunked",
        "transfer-encoding: gzip, chunked",
        "connection: close",
        "0\r\n\r\n",
        "ffffffffffffffff",
        ";ext=1",
        "100 Continue\r\n\r\n",
        "101 Switching Protocols",
    ]);
    Target {
        name: "worker-http",
        seeds: seeds.iter().map(|s| [&[7u8][..], s].concat()).collect(),
        dictionary,
        run: Box::new(|input| {
            let Some((split, bytes)) = input.split_first() else {
                return Verdict::Refused;
            };
            let mut pieces = bytes.chunks(usize::from(split % 31) + 1);
            let mut received = Received::default();
            let mut framing = None;
            let mut body = 0usize;
            loop {
                let progressed = match framing.as_mut() {
                    None => match received.head(&axum::http::Method::POST) {
                        Err(_) => return Verdict::Refused,
                        Ok(Some((_, f))) => {
                            framing = Some(f);
                            true
                        }
                        Ok(None) => false,
                    },
                    Some(f) => match received.piece(f) {
                        Err(_) => return Verdict::Refused,
                        Ok(Piece::Data(d)) => {
                            assert!(!d.is_empty(), "an empty piece of body");
                            body += d.len();
                            assert!(body <= bytes.len(), "more body than bytes read");
                            true
                        }
                        Ok(Piece::End) => return Verdict::Accepted,
                        Ok(Piece::NeedMore) => false,
                    },
                };
                if !progressed {
                    let Some(piece) = pieces.next() else {
                        // The worker closed: only a body that runs until close ends well.
                        return match framing {
                            Some(f) if f.runs_until_close() => Verdict::Accepted,
                            _ => Verdict::Refused,
                        };
                    };
                    received.push(piece);
                }
            }
        }),
    }
}
