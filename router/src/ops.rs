//! Running the router: the whole stack in one process ([`up`]; [`ha_directory`]: `up
//! --ha`'s 3-node directory; [`scratch_dir`]: its never-reused temp folders), its
//! Prometheus [`metrics`] and its [`logging`].

pub mod ha_directory;
pub mod logging;
pub mod metrics;
pub mod scratch_dir;
pub mod up;
