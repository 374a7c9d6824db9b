//! The one error type of graph reading, writing and generation.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::string::String;

/// Where in the input an error was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// Nowhere more precise than the file (or the parameters of a generator).
    Whole,
    /// A 1-based line of a text file.
    Line(u64),
    /// A named array of an `.npz` file (or the [`Graph`](super::Graph) field of that name).
    Array(String),
}

/// What is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphErrorKind {
    /// Reading or writing the file failed.
    #[error("{0}")]
    Io(io::Error),
    /// The extension names no format [`load`](super::load) knows.
    #[error(
        "unknown graph format {0:?}: expected .npz, .mtx, .graph/.metis, or an edge list \
         (.txt/.tsv/.csv/.el/.edges), text formats optionally .gz"
    )]
    UnknownFormat(String),
    /// A header (Matrix Market banner or size line, METIS header, `.npy` header) is malformed.
    #[error("bad header: {0}")]
    BadHeader(String),
    /// A token that should be a number is not one.
    #[error("expected a number, found {token:?}")]
    NotANumber {
        /// The offending token (truncated to 40 characters).
        token: String,
    },
    /// A node id is negative.
    #[error("negative node id {0}")]
    NegativeId(i64),
    /// A node id is not below the node count.
    #[error("node id {id} is out of range: the graph has {num_nodes} nodes")]
    IdOutOfRange {
        /// The id, 0-based.
        id: u64,
        /// The node count it must stay below.
        num_nodes: u64,
    },
    /// A weight or feature is NaN or infinite.
    #[error("value {0} is not finite")]
    NonFinite(f64),
    /// A line has a different number of fields than the lines before it (or than the format needs).
    #[error("ragged row: expected {expected} fields, found {found}")]
    RaggedRow {
        /// Fields the format (or the first data line) fixed.
        expected: usize,
        /// Fields on this line.
        found: usize,
    },
    /// Counts that must agree do not (entries vs header, array lengths vs node count).
    #[error("length mismatch: {0}")]
    LengthMismatch(String),
    /// More nodes than `u32` ids can number.
    #[error("{0} nodes exceed the limit of {max} (node ids are u32)", max = u32::MAX)]
    TooManyNodes(u64),
    /// An `.npz` array has a dtype this reader does not accept.
    #[error("unsupported dtype {found:?}: expected {expected}")]
    Dtype {
        /// The `.npy` `descr` found.
        found: String,
        /// The accepted ones.
        expected: &'static str,
    },
    /// A required `.npz` array is absent.
    #[error("required array is missing")]
    MissingArray,
    /// The graph (or the one a generator was asked for) needs more memory than there is.
    #[error(transparent)]
    Memory(#[from] distspmm_sparse::memory::MemoryError),
    /// The input file changed (truncated, or rewritten in place) while it was mapped and read.
    #[error(
        "the input changed while it was being read (another process truncated or rewrote it): \
         nothing was written; run again once the file is complete and nothing writes to it"
    )]
    InputChanged,
    /// Anything else malformed: a broken zip, truncated data, an invalid label or parameter.
    #[error("{0}")]
    Invalid(String),
}

/// An error reading, writing or generating a graph: the file, the place in it, and what is wrong.
///
/// Displays as `cora.npz: array "x": value NaN is not finite` or
/// `web.mtx: line 17: node id 912 is out of range: the graph has 900 nodes`.
#[derive(Debug)]
pub struct GraphError {
    file: Option<PathBuf>,
    location: Location,
    kind: GraphErrorKind,
}

impl GraphError {
    /// An error at `location`, not yet tied to a file.
    pub fn new(location: Location, kind: GraphErrorKind) -> Self {
        GraphError {
            file: None,
            location,
            kind,
        }
    }

    /// An error on 1-based line `line`.
    pub fn at_line(line: u64, kind: GraphErrorKind) -> Self {
        Self::new(Location::Line(line), kind)
    }

    /// An error in the `.npz` array `array`.
    pub fn in_array(array: &str, kind: GraphErrorKind) -> Self {
        Self::new(Location::Array(array.into()), kind)
    }

    /// Ties the error to `path` (kept if one is already set: the innermost file wins).
    #[must_use]
    pub fn in_file(mut self, path: &Path) -> Self {
        if self.file.is_none() {
            self.file = Some(path.to_path_buf());
        }
        self
    }

    /// What is wrong.
    pub fn kind(&self) -> &GraphErrorKind {
        &self.kind
    }

    /// The file, when known.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Where in the file.
    pub fn location(&self) -> &Location {
        &self.location
    }
}

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        match &self.location {
            Location::Whole => {}
            Location::Line(line) => write!(f, "line {line}: ")?,
            Location::Array(name) => write!(f, "array {name:?}: ")?,
        }
        write!(f, "{}", self.kind)
    }
}

// No `source()`: the message already carries the I/O error's text (reachable through
// `kind()`), and error-chain printers would repeat it.
impl std::error::Error for GraphError {}

impl From<GraphErrorKind> for GraphError {
    fn from(kind: GraphErrorKind) -> Self {
        Self::new(Location::Whole, kind)
    }
}

impl From<distspmm_sparse::memory::MemoryError> for GraphError {
    fn from(e: distspmm_sparse::memory::MemoryError) -> Self {
        GraphErrorKind::Memory(e).into()
    }
}

impl From<io::Error> for GraphError {
    fn from(e: io::Error) -> Self {
        GraphErrorKind::Io(e).into()
    }
}

/// A number as an error message shows it: as written for everyday magnitudes, in scientific
/// notation otherwise (`1e300`, not its 301 digits).
pub fn show_float(x: f64) -> String {
    let magnitude = x.abs();
    if x == 0.0 || !x.is_finite() || (1e-4..1e9).contains(&magnitude) {
        std::format!("{x}")
    } else {
        std::format!("{x:e}")
    }
}

/// A token shortened for an error message.
pub(crate) fn show_token(token: &[u8]) -> String {
    let s = String::from_utf8_lossy(token);
    match s.char_indices().nth(40) {
        Some((i, _)) => std::format!("{}…", &s[..i]),
        None => s.into_owned(),
    }
}
