//! `sse-relay`: a worker's response body (scripted frames, maybe ending in an error)
//! through the router's relay: the client gets exactly the worker's bytes, plus one
//! error event and `[DONE]` on an SSE stream that broke.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use ownerserve_bench::fuzz::{Target, Verdict};
use ownerserve_planner::ids::{EngineKind, Role, WorkerId};
use ownerserve_planner::policy::PrefillCharge;
use ownerserve_router::config::WorkerSpec;
use ownerserve_router::error::ApiError;
use ownerserve_router::fleet::registry::Registry;
use ownerserve_router::proxy::relay::{relay, Patience, Watchers};
use ownerserve_shim::openai::Endpoint;

use super::tokens;

/// A worker body of scripted frames: data, then maybe an error.
struct Scripted(VecDeque<Result<Bytes, std::io::Error>>);

impl http_body::Body for Scripted {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|r| r.map(Frame::data)))
    }
}

/// Reads a relay script: byte 0's bit 0 = an SSE response, bit 1 = the worker fails after
/// its frames; then frames, each a length byte and that many bytes.
fn script(input: &[u8]) -> (bool, bool, Vec<Bytes>) {
    let flags = input.first().copied().unwrap_or(0);
    let mut frames = Vec::new();
    let mut rest = input.get(1..).unwrap_or_default();
    while let Some((&n, tail)) = rest.split_first() {
        let n = usize::from(n).min(tail.len());
        frames.push(Bytes::copy_from_slice(&tail[..n]));
        rest = &tail[n..];
    }
    (flags & 1 == 1, flags & 2 == 2, frames)
}

pub(super) fn target() -> anyhow::Result<Target> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let registry = Registry::new(vec![WorkerSpec::new(
        "w0",
        "http://127.0.0.1:9",
        Role::Hybrid,
        EngineKind::Vllm,
    )]);
    let worker = registry
        .get(WorkerId(0))
        .ok_or_else(|| anyhow::anyhow!("no worker"))?;
    let patience = Patience {
        first: Duration::from_secs(60),
        idle: Duration::from_secs(60),
        failure_threshold: 1_000_000,
    };
    let broken = ApiError::UpstreamUnreachable {
        worker: "w0".into(),
    }
    .sse_event();
    let sse_seed = |fail: bool| {
        let mut s = vec![u8::from(fail) << 1 | 1];
        for chunk in [
            &b"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"[..],
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n",
            b"data: [DONE]\n\n",
        ] {
            s.push(chunk.len() as u8);
            s.extend_from_slice(chunk);
        }
        s
    };
    Ok(Target {
        name: "sse-relay",
        seeds: vec![
            sse_seed(false),
            sse_seed(true),
            vec![0, 2, b'{', b'}'],
            vec![2, 1, b'{'],
        ],
        dictionary: tokens(&[
            "data: ",
            "\n\n",
            "\r\n",
            "[DONE]",
            ": keep-alive\n",
            "event: error\n",
            "\u{0}",
        ]),
        run: Box::new(move |input| {
            let (sse, fail, frames) = script(input);
            let sent: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
            let mut body: VecDeque<_> = frames.into_iter().map(Ok).collect();
            if fail {
                body.push_back(Err(std::io::Error::other("worker died")));
            }
            let mut resp = http::Response::new(Scripted(body));
            if sse {
                resp.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/event-stream"),
                );
            }
            let in_flight = worker.start_request(1, PrefillCharge::computed(1), 1);
            let got = runtime.block_on(async {
                let relayed = relay(
                    resp,
                    &worker,
                    in_flight,
                    Watchers::default(),
                    patience,
                    Endpoint::ChatCompletions,
                );
                relayed.into_body().collect().await
            });
            match (fail, sse, got) {
                (false, _, Ok(c)) => assert_eq!(c.to_bytes(), sent, "bytes relayed as sent"),
                (true, true, Ok(c)) => {
                    let mut want = sent;
                    want.extend_from_slice(&broken);
                    assert_eq!(
                        c.to_bytes(),
                        want,
                        "a broken SSE stream ends with one error event"
                    );
                }
                (true, false, Err(_)) => {}
                (fail, sse, got) => {
                    panic!("fail {fail}, sse {sse}: {:?}", got.map(|c| c.to_bytes()))
                }
            }
            assert_eq!(worker.in_flight(), 0, "the relay released the worker");
            Verdict::Accepted
        }),
    })
}
