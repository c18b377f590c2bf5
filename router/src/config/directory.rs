//! `[router.directory]`: where the ownership directory lives (nowhere, in this process,
//! or a remote cluster), validated.

use ownerserve_ownership::node::secret::ClusterSecret;

use super::{worker_url, ConfigError, DirectoryMode, RouterSettings};

/// The validated directory choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectorySetup {
    Off,
    Embedded {
        data_dir: std::path::PathBuf,
        /// The per-process temp folder (no `directory_data_dir` set): removed at shutdown,
        /// since no later process would find it.
        ephemeral: bool,
    },
    Remote {
        urls: Vec<String>,
        secret: Option<ClusterSecret>,
        /// How long the replica is read as current after a read (`read_lease_ms`).
        read_lease: std::time::Duration,
    },
}

/// Where the directory lives: nowhere, in this process, or a remote cluster.
pub(super) fn directory_setup(s: &RouterSettings) -> Result<DirectorySetup, ConfigError> {
    Ok(match s.directory {
        DirectoryMode::Off => DirectorySetup::Off,
        DirectoryMode::Embedded => DirectorySetup::Embedded {
            data_dir: s
                .directory_data_dir
                .clone()
                .unwrap_or_else(|| crate::ops::scratch_dir::scratch_dir("directory")),
            ephemeral: s.directory_data_dir.is_none(),
        },
        DirectoryMode::Remote => {
            if s.directory_urls.is_empty() {
                return Err(ConfigError::router(
                    "directory_urls",
                    "directory = \"remote\" needs at least one url",
                ));
            }
            let urls = s
                .directory_urls
                .iter()
                .map(|u| worker_url(u).map_err(|e| ConfigError::router("directory_urls", e)))
                .collect::<Result<Vec<_>, _>>()?;
            let secret = match &s.directory_secret {
                Some(v) => Some(
                    ClusterSecret::new(v)
                        .map_err(|e| ConfigError::router("directory_secret", e))?,
                ),
                None => {
                    tracing::warn!("router.directory_secret is not set: the directory's nodes must run with --no-cluster-secret");
                    None
                }
            };
            DirectorySetup::Remote {
                urls,
                secret,
                read_lease: std::time::Duration::from_millis(s.read_lease_ms),
            }
        }
    })
}
