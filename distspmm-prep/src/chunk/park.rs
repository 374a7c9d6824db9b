//! The edge arrays parked on disk while the partitioner runs.
//!
//! A partitioner needs only the symmetric adjacency it is given, yet the edge arrays (8 bytes
//! per edge, 12 with weights) are needed again afterwards, to normalise Â or to bucket the
//! edges by part. Parking them in a work directory beside the output for that time takes them
//! out of the partition phase's peak, which is the run's peak. The files are written once and
//! read once, sequentially, so they mostly stay in the page cache: memory the kernel can take
//! back, and resident set it is not.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::vec::Vec;

use crate::graph::Graph;

use super::io_error;
use chunk_format::dir::{ChunkDirError, DirLock};
use chunk_format::workdir::WorkDir;

/// What to do when the edges read back do not fit.
const MEMORY_HINT: &str = "use a machine with more memory, or a smaller graph";

/// A graph's edge arrays (sources, targets, weights), written to files in a work directory
/// beside the output directory and taken out of the graph until [`ParkedEdges::restore`]. The
/// files go with the directory when this is dropped.
#[derive(Debug)]
pub struct ParkedEdges {
    dir: WorkDir,
    edges: usize,
    weighted: bool,
}

impl ParkedEdges {
    /// Writes `graph`'s edge arrays into a work directory beside the directory `lock` holds
    /// and releases them from `graph` (its node data stay). On an error the graph is unchanged.
    pub fn park(lock: &DirLock, graph: &mut Graph) -> Result<Self, ChunkDirError> {
        let dir = super::write::scratch_dir(lock)?;
        write_array(&src_path(dir.path()), &graph.src)?;
        write_array(&dst_path(dir.path()), &graph.dst)?;
        if let Some(weights) = &graph.weights {
            write_array(&weights_path(dir.path()), weights)?;
        }
        let parked = Self {
            dir,
            edges: graph.src.len(),
            weighted: graph.weights.is_some(),
        };
        graph.src = Vec::new();
        graph.dst = Vec::new();
        graph.weights = None;
        Ok(parked)
    }

    /// The number of edges parked.
    pub fn edges(&self) -> usize {
        self.edges
    }

    /// Reads the edge arrays back into `graph` and removes the files. On an error `graph`'s
    /// edge arrays stay empty and the error says why (a file changed or removed under us, or
    /// no memory for the arrays).
    pub fn restore(self, graph: &mut Graph) -> Result<(), ChunkDirError> {
        let src = read_array::<u32>(&src_path(self.dir.path()), self.edges)?;
        let dst = read_array::<u32>(&dst_path(self.dir.path()), self.edges)?;
        let weights = if self.weighted {
            Some(read_array::<f32>(
                &weights_path(self.dir.path()),
                self.edges,
            )?)
        } else {
            None
        };
        graph.src = src;
        graph.dst = dst;
        graph.weights = weights;
        Ok(())
    }
}

fn src_path(dir: &Path) -> PathBuf {
    dir.join("edges-src.u32")
}

fn dst_path(dir: &Path) -> PathBuf {
    dir.join("edges-dst.u32")
}

fn weights_path(dir: &Path) -> PathBuf {
    dir.join("edges-weight.f32")
}

/// Whether `name` is one of the files above ([`src_path`], [`dst_path`], [`weights_path`]).
pub(super) fn is_work_file(name: &str) -> bool {
    matches!(name, "edges-src.u32" | "edges-dst.u32" | "edges-weight.f32")
}

/// Writes `values` as their in-memory bytes (this machine's byte order: the file is read back
/// by this process only).
fn write_array<T: bytemuck::NoUninit>(path: &Path, values: &[T]) -> Result<(), ChunkDirError> {
    let mut file = File::create(path).map_err(io_error(path))?;
    file.write_all(bytemuck::cast_slice(values))
        .map_err(io_error(path))
}

/// Reads the `len` values [`write_array`] wrote to `path`: exactly that many bytes, or an error.
fn read_array<T: bytemuck::Pod>(path: &Path, len: usize) -> Result<Vec<T>, ChunkDirError> {
    let mut file = File::open(path).map_err(io_error(path))?;
    let expected = distspmm_sparse::memory::bytes_of::<T>(len as u64);
    let found = file.metadata().map_err(io_error(path))?.len();
    if found != expected {
        return Err(ChunkDirError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                std::format!(
                    "the parked edge array holds {found} bytes, expected {expected}: the work \
                     directory was changed while the partitioner ran; run again"
                ),
            ),
        });
    }
    let what = std::format!("{len} parked edge ids read back");
    let mut values = distspmm_sparse::memory::try_filled(len, T::zeroed(), what, MEMORY_HINT)
        .map_err(super::out_of_memory)?;
    file.read_exact(bytemuck::cast_slice_mut(&mut values))
        .map_err(io_error(path))?;
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;
    use std::vec;

    #[test]
    fn parked_edges_come_back_unchanged_and_leave_no_files() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("chunks");
        let lock = DirLock::acquire(&out).unwrap();
        for weighted in [false, true] {
            let mut graph = Graph::from_edges(5, vec![0, 1, 2, 4, 3], vec![1, 2, 0, 4, 0]);
            if weighted {
                graph.weights = Some(vec![0.5, 1.0, -2.0, 3.25, 7.0]);
            }
            let before = graph.clone();
            let parked = ParkedEdges::park(&lock, &mut graph).unwrap();
            assert_eq!(parked.edges(), 5);
            assert!(graph.src.is_empty() && graph.dst.is_empty() && graph.weights.is_none());
            parked.restore(&mut graph).unwrap();
            assert_eq!(graph, before);
            let left: Vec<_> = std::fs::read_dir(root.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .filter(|n| n.to_string_lossy().contains("buckets"))
                .collect();
            assert!(left.is_empty(), "work directory left: {left:?}");
        }
    }

    #[test]
    fn a_changed_parking_file_is_an_error_not_wrong_edges() {
        let root = tempfile::tempdir().unwrap();
        let lock = DirLock::acquire(&root.path().join("chunks")).unwrap();
        let mut graph = Graph::from_edges(3, vec![0, 1], vec![1, 2]);
        let parked = ParkedEdges::park(&lock, &mut graph).unwrap();
        let path = dst_path(parked.dir.path());
        std::fs::write(&path, [0u8; 4]).unwrap();
        let err = parked.restore(&mut graph).unwrap_err().to_string();
        assert!(err.contains("holds 4 bytes, expected 8"), "{err}");
        assert!(graph.src.is_empty());
    }
}
