//! Stored responses: recording which worker's engine holds a response (`store: true`), for
//! a lease's lifetime and at most `ttl_ms`. Their expiry runs in `Tick` and the end of
//! their worker's lease in the lease cascade (`leases`).

use super::{Outcome, Rejection};
use crate::ids::LeaseId;
use crate::response_map::{StoredResponse, MAX_RESPONSE_ID_BYTES};
use crate::state::Directory;

impl Directory {
    pub(super) fn record_response(&mut self, id: &str, lease: LeaseId, ttl_ms: u64) -> Outcome {
        if id.is_empty() || id.len() > MAX_RESPONSE_ID_BYTES {
            return Rejection::BadResponseId {
                max: MAX_RESPONSE_ID_BYTES,
            }
            .into();
        }
        let worker = match self.live_lease(lease) {
            Ok(w) => w,
            Err(r) => return r.into(),
        };
        let expires_at_ms = self.now_ms.saturating_add(ttl_ms);
        self.responses.insert(
            id.to_owned(),
            StoredResponse {
                worker,
                lease,
                stored_at_ms: self.now_ms,
                expires_at_ms,
                lost: false,
                lapsed_until_ms: None,
            },
        );
        Outcome::ResponseRecorded {
            worker,
            expires_at_ms,
        }
    }
}
