//! The simulated engine's shared state, which its OpenAI routes (`server`) and its KV
//! routes (`kv_routes`) read: the engine actor's handle, its identity, its KV client and
//! the session fence.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use super::config::TimeMode;
use super::engine::EngineHandle;
use super::fence::{AcceptLog, AcceptedFor, EpochFence, FenceClaim};
use super::http_error::ApiError;
use super::kv_client::KvClient;
use super::kv_transfer::TransferConfig;
use super::response_store::ResponseStore;
use super::scheduler::SchedulerConfig;

/// Everything the handlers share.
pub(super) struct AppState {
    pub(super) engine: EngineHandle,
    pub(super) served_model: Arc<str>,
    pub(super) scheduler: SchedulerConfig,
    pub(super) started_unix: u64,
    /// Distinguishes this worker's response ids from other workers' (nanoseconds at start).
    pub(super) id_salt: u64,
    pub(super) next_id: AtomicU64,
    /// This engine's identity in `kv_transfer_params` and pull answers.
    pub(super) engine_id: Arc<str>,
    /// Where other engines reach this one.
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) tp_size: u32,
    pub(super) transfer: TransferConfig,
    pub(super) time: TimeMode,
    /// KV bytes of one block of this engine's model.
    pub(super) block_bytes: u64,
    pub(super) kv_client: KvClient,
    pub(super) fence: Mutex<EpochFence>,
    /// Every claim the fence accepted, for audits (`GET /ownerserve/v1/fence/accepted`).
    pub(super) accepted: Mutex<AcceptLog>,
    /// Stored Responses answers.
    pub(super) responses: Arc<ResponseStore>,
    /// Runs background responses (the server waits for them at shutdown).
    pub(super) tasks: tokio_util::task::TaskTracker,
}

impl AppState {
    /// Admits every claim through the session fence (raising it) and logs it as accepted
    /// `accepted_for`, or refuses the request.
    pub(super) fn check_fence(
        &self,
        claims: impl IntoIterator<Item = FenceClaim>,
        accepted_for: AcceptedFor,
    ) -> Result<(), ApiError> {
        let mut fence = self.fence.lock().unwrap_or_else(|e| e.into_inner());
        for claim in claims {
            if let Err(stale) = fence.admit(&claim) {
                drop(fence);
                self.engine.metrics().kv.stale_epoch_rejections += 1;
                tracing::debug!(session = %stale.session, epoch = stale.epoch, seen = stale.seen, "stale epoch refused");
                return Err(stale.into());
            }
            // Logged under the fence's lock, so the log's order is the fence's.
            self.accepted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(&claim, accepted_for, unix_ms());
        }
        Ok(())
    }
}

/// Wall-clock time in Unix milliseconds (0 before 1970, which no clock here reads).
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
