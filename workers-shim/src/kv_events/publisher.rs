//! The publishing side, as vLLM's `ZmqEventPublisher` does it: a PUB socket sends
//! `[topic, seq u64 BE, payload]` per batch, and a ROUTER socket answers replay requests
//! (`[identity, b"", start_seq]`) with every buffered batch from `start_seq` on, then the
//! end marker `ff×8` with an empty payload. The simulated engine runs this.

use std::collections::VecDeque;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::wire::{encode_batch, Encoding, WireBatch};

/// The replay end marker: `(-1).to_bytes(8, "big", signed=True)`.
pub const END_SEQ: [u8; 8] = [0xff; 8];

/// Bound sockets of a publisher, ready to run.
pub struct Publisher {
    pub_socket: PubSocket,
    replay: Option<RouterSocket>,
    /// Where subscribers connect (port resolved).
    pub endpoint: String,
    /// Where replay requests go, if enabled.
    pub replay_endpoint: Option<String>,
    encoding: Encoding,
    topic: Bytes,
    buffer_steps: usize,
}

/// A socket could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot bind KV-event socket {endpoint}")]
pub struct BindError {
    pub endpoint: String,
    #[source]
    pub source: zeromq::ZmqError,
}

impl Publisher {
    /// Binds the PUB socket (and the ROUTER replay socket, if given).
    pub async fn bind(
        endpoint: &str,
        replay_endpoint: Option<&str>,
        encoding: Encoding,
        topic: &str,
        buffer_steps: usize,
    ) -> Result<Self, BindError> {
        let err = |endpoint: &str| {
            let endpoint = endpoint.to_owned();
            move |source| BindError { endpoint, source }
        };
        let mut pub_socket = PubSocket::new();
        let bound = pub_socket.bind(endpoint).await.map_err(err(endpoint))?;
        let (replay, replay_endpoint) = match replay_endpoint {
            Some(ep) => {
                let mut router = RouterSocket::new();
                let bound = router.bind(ep).await.map_err(err(ep))?;
                (Some(router), Some(bound.to_string()))
            }
            None => (None, None),
        };
        Ok(Self {
            pub_socket,
            replay,
            endpoint: bound.to_string(),
            replay_endpoint,
            encoding,
            topic: Bytes::copy_from_slice(topic.as_bytes()),
            buffer_steps: buffer_steps.max(1),
        })
    }

    /// Publishes every batch from `batches` until it closes or `cancel` fires.
    pub async fn run(
        mut self,
        mut batches: mpsc::UnboundedReceiver<WireBatch>,
        cancel: CancellationToken,
    ) {
        let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::new();
        let mut seq: u64 = 0;
        loop {
            tokio::select! {
                batch = batches.recv() => {
                    let Some(batch) = batch else { return };
                    let payload = Bytes::from(encode_batch(&batch, self.encoding));
                    let frames = vec![
                        self.topic.clone(),
                        Bytes::copy_from_slice(&seq.to_be_bytes()),
                        payload.clone(),
                    ];
                    if let Ok(msg) = ZmqMessage::try_from(frames) {
                        // PUB drops when nobody listens, as ZMQ does at its high-water mark.
                        if let Err(e) = self.pub_socket.send(msg).await {
                            tracing::debug!(error = %e, "kv event publish failed");
                        }
                    }
                    buffer.push_back((seq, payload));
                    if buffer.len() > self.buffer_steps {
                        buffer.pop_front();
                    }
                    seq += 1;
                }
                request = recv_replay(&mut self.replay) => {
                    match request {
                        Ok(msg) => self.serve_replay(msg, &buffer).await,
                        Err(e) => tracing::debug!(error = %e, "replay socket error"),
                    }
                }
                () = cancel.cancelled() => return,
            }
        }
    }

    async fn serve_replay(&mut self, msg: ZmqMessage, buffer: &VecDeque<(u64, Bytes)>) {
        let Some(router) = self.replay.as_mut() else {
            return;
        };
        let frames = msg.into_vec();
        // [identity, b"", start_seq]: anything else is dropped, as vLLM does.
        let [identity, _empty, start] = frames.as_slice() else {
            tracing::warn!(frames = frames.len(), "malformed replay request");
            return;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else {
            tracing::warn!("malformed replay start sequence");
            return;
        };
        let reply = |seq: Bytes, payload: Bytes| {
            ZmqMessage::try_from(vec![identity.clone(), Bytes::new(), seq, payload])
        };
        for (seq, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
            if let Ok(m) = reply(Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()) {
                if router.send(m).await.is_err() {
                    return;
                }
            }
        }
        if let Ok(m) = reply(Bytes::from_static(&END_SEQ), Bytes::new()) {
            let _ = router.send(m).await;
        }
    }
}

async fn recv_replay(socket: &mut Option<RouterSocket>) -> Result<ZmqMessage, zeromq::ZmqError> {
    match socket {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}
