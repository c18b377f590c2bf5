//! Why a configuration was refused: every error names the file, the flag, or the
//! `section.key` at fault, so the operator knows what to change before anything starts.

use std::path::PathBuf;

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A key holds a value it may not.
    #[error("{section}.{key}: {reason}")]
    Invalid {
        /// The TOML table: `router`, `sim`, `fleet`, or `workers`.
        section: &'static str,
        key: String,
        reason: String,
    },
    /// A `--worker` flag that does not parse.
    #[error("--worker `{flag}`: {reason}")]
    WorkerFlag { flag: String, reason: String },
    #[error("cannot read config file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
}

impl ConfigError {
    /// `section.key` holds a value it may not, because `reason`.
    pub fn invalid(section: &'static str, key: impl Into<String>, reason: impl ToString) -> Self {
        Self::Invalid {
            section,
            key: key.into(),
            reason: reason.to_string(),
        }
    }

    /// A `[router]` key holds a value it may not.
    pub fn router(key: &str, reason: impl ToString) -> Self {
        Self::invalid("router", key, reason)
    }
}
