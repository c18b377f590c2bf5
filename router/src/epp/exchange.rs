//! One ext_proc stream (one HTTP request through the gateway): its messages in, the
//! answers out. The request's headers and body are gathered (buffered: the body in one
//! message after the headers are answered; full duplex: chunks that keep coming, the
//! headers' answer held until the body ends, then the body passed back), the pick is made
//! once the body is whole, and the response's headers say which endpoint served, which is
//! what the directory records.

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::IntoResponse;
use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};

use super::pick::{self, Picked};
use super::protocol::{self as p, BodyMode};
use crate::error::ApiError;
use crate::server::state::AppState;

/// What the exchange knows so far.
pub struct Exchange {
    st: Arc<AppState>,
    /// Endpoints after the decision's (`x-gateway-destination-endpoint` fallbacks).
    fallbacks: usize,
    mode: Option<BodyMode>,
    headers: HeaderMap,
    path: String,
    subset: Option<Vec<String>>,
    body: BytesMut,
    picked: Option<Picked>,
}

impl Exchange {
    pub fn new(st: Arc<AppState>, fallbacks: usize) -> Self {
        Self {
            st,
            fallbacks,
            mode: None,
            headers: HeaderMap::new(),
            path: String::new(),
            subset: None,
            body: BytesMut::new(),
            picked: None,
        }
    }

    /// The answers to one message (none while a full-duplex body is still arriving).
    pub async fn on(&mut self, req: ProcessingRequest) -> Vec<ProcessingResponse> {
        if self.mode.is_none() {
            let mode = req.protocol_config.as_ref().map(|c| c.request_body_mode);
            self.mode = Some(BodyMode::of(mode.unwrap_or(0)));
        }
        let full_duplex = self.mode == Some(BodyMode::FullDuplex);
        match req.request.clone() {
            Some(Msg::RequestHeaders(h)) => {
                (self.headers, self.path) = p::http_headers(h.headers.as_ref());
                self.subset = p::subset_hint(&req);
                if h.end_of_stream {
                    return vec![self.decide(true).await];
                }
                if full_duplex {
                    return Vec::new();
                }
                vec![p::continue_headers(false)]
            }
            Some(Msg::RequestBody(b)) => {
                self.body.extend_from_slice(&b.body);
                if !b.end_of_stream {
                    return Vec::new();
                }
                if full_duplex {
                    let body = self.body.clone().freeze();
                    let answer = self.decide(true).await;
                    let passed = matches!(
                        answer.response,
                        Some(p::ProcessingResponseKind::RequestHeaders(_))
                    );
                    let mut out = vec![answer];
                    if passed {
                        out.push(p::streamed_body(body.to_vec(), true, false));
                    }
                    return out;
                }
                vec![self.decide(false).await]
            }
            Some(Msg::ResponseHeaders(h)) => {
                let (headers, _) = p::http_headers(h.headers.as_ref());
                let served = p::served_endpoint(&req, &headers);
                if let Some(picked) = &mut self.picked {
                    pick::record_served(&self.st, picked, served.as_deref());
                }
                vec![p::continue_headers(true)]
            }
            Some(Msg::ResponseBody(b)) => {
                if b.end_of_stream {
                    self.release();
                }
                if full_duplex {
                    return vec![p::streamed_body(b.body, b.end_of_stream, true)];
                }
                vec![p::continue_response_body()]
            }
            Some(Msg::RequestTrailers(_)) => vec![p::continue_trailers(false)],
            Some(Msg::ResponseTrailers(_)) => {
                self.release();
                vec![p::continue_trailers(true)]
            }
            None => Vec::new(),
        }
    }

    /// The pick for the gathered request, on its headers or on its body; an error is the
    /// gateway's immediate answer (503 when nothing eligible, 429 to shed, 400 for a bad
    /// body).
    async fn decide(&mut self, on_headers: bool) -> ProcessingResponse {
        let body: Bytes = std::mem::take(&mut self.body).freeze();
        let picked = pick::pick(
            &self.st,
            &self.path,
            &self.headers,
            body,
            self.subset.as_deref(),
            self.fallbacks,
        )
        .await;
        match picked {
            Ok(picked) => {
                let endpoints = picked.endpoints.join(",");
                self.picked = Some(picked);
                if on_headers {
                    p::pick_on_headers(&endpoints)
                } else {
                    p::pick_on_body(&endpoints)
                }
            }
            Err(e) => refusal(e).await,
        }
    }

    /// The stream ended: a step whose response headers never came (a gateway that does not
    /// send them) is recorded against its pick.
    pub fn finish(&mut self) {
        if let Some(picked) = &mut self.picked {
            pick::record_served(&self.st, picked, None);
        }
        self.release();
    }

    /// The response is over: the admission slot and the in-flight count go back.
    fn release(&mut self) {
        if let Some(picked) = &mut self.picked {
            picked.held = None;
        }
    }
}

/// An error as the gateway's immediate response, with the proxy's status and JSON body.
async fn refusal(e: ApiError) -> ProcessingResponse {
    let response = e.into_response();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    p::immediate(status, body.to_vec())
}
