//! The one error type of the plotting module.

use std::path::PathBuf;

/// Why a chart could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The embedded font could not be parsed (a broken build, not bad input).
    #[error("embedded chart font is not a valid TrueType font")]
    Font,
    /// `plotters` failed while drawing into the in-memory buffer.
    #[error("cannot draw chart {path:?}")]
    Draw {
        /// The PNG being produced.
        path: PathBuf,
        /// The drawing error (boxed to keep `plotters` types out of this API).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A data slice does not line up with the categories it describes.
    #[error("part {part:?} has {got} values for {expected} categories")]
    LengthMismatch {
        /// Label of the offending part.
        part: String,
        /// Number of categories.
        expected: usize,
        /// Number of values given for the part.
        got: usize,
    },
    /// Creating the directory or file failed.
    #[error("cannot write {path:?}")]
    Io {
        /// The file or directory being created.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// PNG encoding failed.
    #[error("cannot encode PNG {path:?}")]
    Encode {
        /// The PNG being produced.
        path: PathBuf,
        /// The encoder's error.
        #[source]
        source: png::EncodingError,
    },
}
