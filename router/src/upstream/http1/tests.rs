use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::*;

/// A connection to a worker that writes `pieces` one by one (a pause between them, so
/// each arrives in its own read), then closes when `close`, else stays open.
async fn scripted(pieces: Vec<&'static [u8]>, close: bool) -> (Conn, JoinSet<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("address");
    let mut worker = JoinSet::new();
    worker.spawn(async move {
        let Ok((mut conn, _)) = listener.accept().await else {
            return;
        };
        for piece in pieces {
            if conn.write_all(piece).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if !close {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    });
    let stream = TcpStream::connect(addr).await.expect("connects");
    (Conn::new(stream), worker)
}

/// The whole body, or the first error.
async fn body(conn: &mut Conn, framing: &mut Framing) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    while let Some(piece) = std::future::poll_fn(|cx| conn.poll_body(framing, cx)).await {
        out.extend_from_slice(&piece?);
    }
    Ok(out)
}

#[tokio::test]
async fn a_chunked_body_split_anywhere_comes_back_whole_with_its_trailers_dropped() {
    let pieces: Vec<&'static [u8]> = vec![
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-",
        b"encoding: chunked\r\n\r\n5;ext=1\r",
        b"\nhel",
        b"lo\r\n6\r\n world\r",
        b"\n0\r\nx-trailer: y\r\n",
        b"\r\n",
    ];
    let (mut conn, _worker) = scripted(pieces, false).await;
    let (head, mut framing) = conn.read_head(&Method::POST).await.expect("a head");
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.headers["content-type"], "text/event-stream");
    assert_eq!(framing.exact_left(), None);
    let got = body(&mut conn, &mut framing).await.expect("a body");
    assert_eq!(got, b"hello world");
    assert!(framing.is_done() && framing.keep_alive);
    assert!(
        conn.still_open(),
        "nothing left over: it can carry the next request"
    );
}

#[tokio::test]
async fn a_length_body_after_a_continue_ends_at_its_length() {
    let pieces: Vec<&'static [u8]> = vec![
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 7\r\n\r\nabc",
        b"defg",
    ];
    let (mut conn, _worker) = scripted(pieces, false).await;
    let (head, mut framing) = conn.read_head(&Method::POST).await.expect("a head");
    assert_eq!(head.status, StatusCode::CREATED);
    assert_eq!(framing.exact_left(), Some(7));
    assert_eq!(
        body(&mut conn, &mut framing).await.expect("a body"),
        b"abcdefg"
    );
    assert!(framing.is_done() && framing.keep_alive);
}

#[tokio::test]
async fn a_body_without_length_runs_until_close_and_its_connection_is_not_kept() {
    let pieces: Vec<&'static [u8]> = vec![b"HTTP/1.0 200 OK\r\n\r\nall of ", b"it"];
    let (mut conn, _worker) = scripted(pieces, true).await;
    let (head, mut framing) = conn.read_head(&Method::GET).await.expect("a head");
    assert_eq!(head.version, Version::HTTP_10);
    assert!(!framing.keep_alive);
    assert_eq!(
        body(&mut conn, &mut framing).await.expect("a body"),
        b"all of it"
    );
    let pieces: Vec<&'static [u8]> = vec![b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n"];
    let (mut conn, _worker) = scripted(pieces, false).await;
    let (_, framing) = conn.read_head(&Method::GET).await.expect("a head");
    assert!(framing.is_done() && !framing.keep_alive);
    // No content and no length: nothing to read, and the connection stays.
    let pieces: Vec<&'static [u8]> = vec![b"HTTP/1.1 204 No Content\r\n\r\n"];
    let (mut conn, _worker) = scripted(pieces, false).await;
    let (_, framing) = conn.read_head(&Method::GET).await.expect("a head");
    assert!(framing.is_done() && framing.keep_alive);
}

#[tokio::test]
async fn bad_bytes_are_errors_never_a_wrong_body() {
    let cases: Vec<(&str, Vec<&'static [u8]>)> = vec![
        (
            "bad chunk size",
            vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"],
        ),
        (
            "chunk not ended by CRLF",
            vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXY"],
        ),
        (
            "connection closed inside the body",
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"],
        ),
        (
            "line too long",
            vec![
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                &[b'0'; 9000],
            ],
        ),
    ];
    for (want, pieces) in cases {
        let (mut conn, _worker) = scripted(pieces, true).await;
        let (_, mut framing) = conn.read_head(&Method::GET).await.expect("a head");
        let err = body(&mut conn, &mut framing).await.expect_err(want);
        assert!(err.to_string().contains(want), "{want}: {err}");
    }
    let heads: Vec<(&str, Vec<&'static [u8]>)> = vec![
        ("bad response head", vec![b"HTTP/1.1 2x0 OK\r\n\r\n"]),
        (
            "conflicting content-lengths",
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n"],
        ),
        (
            "unknown transfer-encoding",
            vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n"],
        ),
        (
            "an upgrade",
            vec![b"HTTP/1.1 101 Switching Protocols\r\n\r\n"],
        ),
        (
            "closed inside the response head",
            vec![b"HTTP/1.1 200 OK\r\n"],
        ),
        (
            "response head too large",
            vec![b"HTTP/1.1 200 OK\r\nx: ", &[b'a'; 70_000]],
        ),
    ];
    for (want, pieces) in heads {
        let (mut conn, _worker) = scripted(pieces, true).await;
        let err = conn.read_head(&Method::GET).await.err().expect(want);
        assert!(err.to_string().contains(want), "{want}: {err}");
    }
}

#[tokio::test]
async fn a_close_before_any_answer_says_so_and_an_idle_close_is_seen_without_a_request() {
    let (mut conn, _worker) = scripted(vec![], true).await;
    let err = conn.read_head(&Method::GET).await.err();
    assert!(
        matches!(err, Some(WireError::ClosedBeforeAnswer)),
        "{err:?}"
    );

    let (mut open, _worker) = scripted(vec![], false).await;
    let (mut closed, _closing) = scripted(vec![], true).await;
    let (mut chatty, _chatty) = scripted(vec![b"stray"], false).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(open.still_open());
    assert!(!closed.still_open(), "the worker closed it");
    assert!(!chatty.still_open(), "bytes no request asked for");
}

#[test]
fn a_request_head_has_its_line_headers_and_length() {
    let mut headers = HeaderMap::new();
    headers.insert("host", HeaderValue::from_static("w:1"));
    headers.insert("x-request-id", HeaderValue::from_static("r1"));
    let mut out = Vec::new();
    write_head(&mut out, &Method::POST, "/v1/completions", &headers, 12);
    assert_eq!(
        out,
        b"POST /v1/completions HTTP/1.1\r\nhost: w:1\r\nx-request-id: r1\r\ncontent-length: 12\r\n\r\n"
    );
    out.clear();
    write_head(&mut out, &Method::GET, "/health", &headers, 0);
    assert_eq!(
        out,
        b"GET /health HTTP/1.1\r\nhost: w:1\r\nx-request-id: r1\r\n\r\n"
    );
}
