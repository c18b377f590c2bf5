//! openraft's storage conformance suite on our redb log store and state machine.
#![allow(clippy::expect_used, reason = "tests: a failure should panic")]
#![cfg(feature = "raft")]
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use ownerserve_ownership::raft::log_store::LogStore;
use ownerserve_ownership::raft::state_machine::StateMachineStore;
use ownerserve_ownership::raft::{NodeId, TypeConfig};

/// A scratch folder removed when the suite drops the store.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Builder;

static NEXT: AtomicU64 = AtomicU64::new(0);

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, Scratch> for Builder {
    async fn build(&self) -> Result<(Scratch, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = std::env::temp_dir().join(format!(
            "ownerserve-raft-suite-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let log = LogStore::open(&dir.join("log.redb")).unwrap();
        let sm = StateMachineStore::open(Some(&dir), 500).unwrap();
        Ok((Scratch(dir), log, sm))
    }
}

#[test]
fn the_redb_store_passes_openraft_s_storage_suite() {
    Suite::test_all(Builder).unwrap();
}
